// GPT-2's byte-level BPE tokenizer: vocab.json + merges.txt as Hugging Face and OpenAI ship them.
// Text is split on the special token <|endoftext|>, then pre-tokenized by GPT-2's regex over
// Unicode categories (PCRE2), each pre-token's bytes mapped to printable characters and merged by rank.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"  // every bad input throws headlab::Error
#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

// GPT-2's pre-tokenizer pattern (encoder.py), matched with Unicode categories. Implementations
// differ on what \s holds among rare characters: PCRE2 counts U+180E as a space, JavaScript
// (js-tiktoken, gpt-3-encoder) counts U+FEFF; ids around those two may differ from theirs.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kEndOfText = "<|endoftext|>";

// bytes_to_unicode of GPT-2's encoder.py: byte b -> the code point that stands for it in vocab.json
// (printable bytes map to themselves, the rest to 256 + n in order), so "Ġ" (U+0120) is the space.
char32_t gpt2_byte_to_unicode(uint8_t b);

// ---------------------------------------------------------------------------------------------
// BpeTokenizer: ids are vocab.json's; the vocabulary must hold the 256 byte tokens, its ids must be
// 0..n-1 each once, and every merge's parts and result must be tokens. encode is exact against the
// reference implementations on any valid UTF-8 text; it is safe to call from several threads.
class BpeTokenizer : public TextTokenizer {
 public:
  // From the files' contents; vocab_name and merges_name name them in errors. vocab_size > 0 must
  // equal the number of tokens (a model's embedding rows); 0 accepts any.
  BpeTokenizer(std::string_view vocab_json, std::string_view merges_txt, std::string vocab_name = "vocab.json",
               std::string merges_name = "merges.txt", int64_t vocab_size = 0);
  static BpeTokenizer from_files(const std::string& vocab_path, const std::string& merges_path, int64_t vocab_size = 0);
  ~BpeTokenizer() override;
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  int64_t size() const override;
  // The two files' contents as given (a checkpoint stores them; export writes them back).
  const std::string& vocab_json() const;
  const std::string& merges_txt() const;
  // Text (UTF-8) -> ids. Invalid UTF-8 throws "<label>: invalid UTF-8 at byte offset N ...";
  // label names the text's source ("prompt", a file name).
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const override;
  // Ids -> the bytes they stand for (not necessarily valid UTF-8 when a character is cut).
  // Ids outside [0, size) throw.
  std::string decode(const std::vector<int64_t>& ids) const override;
  // A token as vocab.json spells it ("Ġworld"), and the bytes it stands for (" world").
  const std::string& token_string(int64_t id) const;
  const std::string& token_bytes(int64_t id) const;
  // The token's bytes as text to show (attention pages, tables): valid UTF-8, a byte that does not
  // complete a character (GPT-2 splits some characters across tokens) shown as U+FFFD.
  std::string token_text(int64_t id) const override;
  // Id of a token spelled as in vocab.json, or nullopt.
  std::optional<int64_t> find(std::string_view token) const;
  // <|endoftext|>'s id (50256 in GPT-2), or nullopt when the vocabulary lacks it.
  std::optional<int64_t> end_of_text() const;
  std::optional<int64_t> eos() const override { return end_of_text(); }
  std::string describe() const override;  // "GPT-2's byte-level BPE tokenizer of 50257 tokens"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace headlab::tasks
