// Internal to tasks/'s byte-level BPE files: the tokenizer's state (BpeTokenizer::Impl), which
// bpe_vocab.cpp builds, bpe_sources.cpp reads from GPT-2's files or a tokenizer.json and bpe_tokenizer.cpp
// encodes with, and what they share (the token index, the merges' keys, PCRE2's patterns and messages).
#pragma once
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tasks/bpe_tokenizer.h"

namespace headlab::tasks {

namespace detail {

using json = nlohmann::json;

inline constexpr const char* kWho = "BPE tokenizer";

// A hash that lets unordered maps keyed by std::string be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// ---- PCRE2 ----

inline std::string pcre2_message(int error) {
  std::array<PCRE2_UCHAR, 256> msg{};
  pcre2_get_error_message(error, msg.data(), msg.size());
  return reinterpret_cast<const char*>(msg.data());
}

struct CodeFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Pcre2Code = std::unique_ptr<pcre2_code, CodeFree>;

struct Fields;  // a JSON file's fields, every error naming the file and the field's path (bpe_sources.cpp)

}  // namespace detail

// What a BpeTokenizer holds: built by bpe_vocab.cpp from either source, read by the encoder.
struct BpeTokenizer::Impl {
  std::string name;                    // in errors: "BPE tokenizer", or the tokenizer.json's name
  bool gpt2_files = false;             // read from vocab.json + merges.txt
  std::vector<std::string> spellings;  // (n,) id -> its vocabulary spelling, or an added token's content
  std::vector<std::string> bytes;      // (n,) id -> the bytes it stands for
  detail::TokenIndex index;            // spelling -> id
  int64_t rows = 0;                    // size(): the model's embedding rows, n or more
  std::array<int32_t, 256> byte_id{};  // byte -> id of its single-byte token
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id) -> rank, merged id
  // Added tokens, split out of the text before anything else: longest first, so that of two
  // starting at the same place the longer wins (as Hugging Face's leftmost-longest matcher).
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added;
  bool nfc = false;  // the normalizer
  // The pre-tokenizer, a chain of steps: each splits its piece into matches and the stretches
  // between them (Hugging Face's "Isolated"), or prefixes a space (ByteLevel's add_prefix_space).
  struct Step {
    detail::Pcre2Code split;  // null: the prefix space
  };
  std::vector<Step> steps;
  bool ignore_merges = false;      // a pre-token that is a model token is that token (Llama 3)
  detail::TokenIndex model_bytes;  // ignore_merges: the bytes of each model token -> its id
  std::optional<int32_t> bos, eos;
  TokenizerFiles files;  // the files as given, for a checkpoint to carry

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, detail::StringHash, std::equal_to<>> cache;

  void read_vocab(const detail::json& vocab, const std::string& vn);
  std::optional<int32_t> add_merge(std::string_view left, std::string_view right, const std::string& where,
                                   const std::string& vn);
  void add_token(const std::string& content, int64_t id, const std::string& where);
  void finish(size_t model_tokens, int64_t vocab_size, const std::string& vn);
  void check_id(int64_t id) const;
  // tokenizer.json's parts
  void read_model(const detail::json& j, const detail::Fields& f);
  void read_added_tokens(const detail::json& j, const detail::Fields& f);
  void read_normalizer(const detail::json& j, const detail::Fields& f);
  void read_pre_tokenizer(const detail::json& v, const std::string& p, const detail::Fields& f, bool& byte_level);
  std::optional<int32_t> read_post_processor(const detail::json& v, const std::string& p,
                                             const detail::Fields& f) const;
  std::optional<int32_t> config_token(const detail::json& config, const char* key, const detail::Fields& f) const;

  template <typename OnText>
  void split_added(std::string_view text, std::vector<int64_t>& out, OnText&& on_text) const;
  void pre_tokenize(std::string_view piece, size_t step, pcre2_match_data* match, std::vector<int64_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<int64_t>& out) const;
};

}  // namespace headlab::tasks
