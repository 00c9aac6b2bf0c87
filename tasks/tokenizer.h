// The character tokenizer: token id = position of a single-character entry in the vocabulary.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"  // every bad input throws headlab::Error

namespace headlab::tasks {

// ---------------------------------------------------------------------------------------------
// Tokenizer: character level. The vocabulary is a list of single-character tokens (one Unicode
// code point each, stored as UTF-8); token id = position in the list. The list is the whole
// serialised form: a checkpoint stores vocab() as a JSON array and rebuilds with Tokenizer(list).
class Tokenizer {
 public:
  Tokenizer() = default;
  // owner prefixes error messages ("task reverse"). Entries must be single characters, unique.
  explicit Tokenizer(std::vector<std::string> vocab, std::string owner = "tokenizer");
  // Vocabulary = the sorted (by code point) unique characters of text.
  static Tokenizer from_text(std::string_view text, std::string owner = "tokenizer");

  const std::vector<std::string>& vocab() const { return vocab_; }
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  // label names the input in errors ("prompt", "text 'war.txt'"). An unknown character throws
  // "<owner>: <label> '<text>' has character 'a' outside the vocabulary \"...\"", or, when the
  // text is long, multi-line or quote_text is false, "... <label> has character 'a' at line L,
  // column C outside ...". Invalid UTF-8 throws too.
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "text", bool quote_text = true) const;
  // Ids outside [0, size) throw.
  std::string decode(const std::vector<int64_t>& ids) const;
  // Id of one character (given as UTF-8), or nullopt.
  std::optional<int64_t> find(std::string_view ch) const;
  // Vocabulary for messages: "\"0123456789>._\"" when short, "of 65 characters" when long.
  std::string describe() const;

 private:
  std::vector<std::string> vocab_;
  std::string owner_ = "tokenizer";
  std::map<uint32_t, int64_t> index_;  // code point -> id
  std::vector<int32_t> ascii_;         // (128,) fast path of index_ for ASCII; -1 = absent
};

}  // namespace headlab::tasks
