// Byte-level BPE tokenizers: GPT-2's vocab.json + merges.txt as Hugging Face and OpenAI ship them, and a
// Hugging Face tokenizer.json whose model is byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM). Added tokens
// (GPT-2's <|endoftext|>) split the text, a pre-tokenizer of PCRE2 regexes over Unicode categories splits
// each part, and each pre-token's bytes, mapped to printable characters, are merged by rank.
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
// BpeTokenizer: ids are the files'; the vocabulary must hold the 256 byte tokens, its ids must be
// 0..n-1 each once, and every merge's parts and result must be tokens. encode is exact against the
// reference implementations on any valid UTF-8 text; it is safe to call from several threads.
class BpeTokenizer : public TextTokenizer {
 public:
  // From the files' contents; vocab_name and merges_name name them in errors. vocab_size > 0 must
  // equal the number of tokens (a model's embedding rows); 0 accepts any.
  BpeTokenizer(std::string_view vocab_json, std::string_view merges_txt, std::string vocab_name = "vocab.json",
               std::string merges_name = "merges.txt", int64_t vocab_size = 0);
  static BpeTokenizer from_files(const std::string& vocab_path, const std::string& merges_path, int64_t vocab_size = 0);
  // A tokenizer.json's contents (name names it in errors) and, when the folder has one, its
  // tokenizer_config.json's ("" if none; config_name names it). What it reads: model BPE (vocab,
  // merges as "a b" or [a, b], ignore_merges), normalizer null or NFC, pre_tokenizer ByteLevel, Split
  // (Isolated), Digits or a Sequence of them, added_tokens, decoder ByteLevel, post_processor
  // TemplateProcessing (BOS); anything else it refuses by name. vocab_size > 0: the model's embedding
  // rows, which may exceed the tokenizer's tokens (real folders pad the table) but not fall short.
  // BOS: tokenizer_config.json's add_bos_token decides whether prompts start with its bos_token;
  // without add_bos_token, the post-processor's template decides (Llama 3: <|begin_of_text|> $A).
  // EOS: tokenizer_config.json's eos_token, else the first of <|endoftext|>, <|end_of_text|>,
  // <|im_end|> that is a token.
  static BpeTokenizer from_tokenizer_json(std::string_view tokenizer_json, std::string name, int64_t vocab_size = 0,
                                          std::string_view tokenizer_config_json = "",
                                          std::string config_name = "tokenizer_config.json");
  // The same from files; config_path "" when the folder has no tokenizer_config.json.
  static BpeTokenizer from_tokenizer_json_file(const std::string& path, int64_t vocab_size = 0,
                                               const std::string& config_path = "");
  ~BpeTokenizer() override;
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  // The model's vocabulary size: tokens(), or the larger vocab_size given (ids of padding rows).
  int64_t size() const override;
  int64_t tokens() const;  // ids 0..tokens()-1 name a token
  // The files as given (GPT-2's two, or the tokenizer.json and its config): a checkpoint stores them, export
  // writes them back.
  TokenizerFiles files() const override;
  // Text (UTF-8) -> ids. Invalid UTF-8 throws "<label>: invalid UTF-8 at byte offset N ...";
  // label names the text's source ("prompt", a file name).
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const override;
  // Ids -> the bytes they stand for (not necessarily valid UTF-8 when a character is cut).
  // Ids outside [0, tokens()) throw, naming the id (a padding row's too).
  std::string decode(const std::vector<int64_t>& ids) const override;
  // A token as vocab.json spells it ("Ġworld"), and the bytes it stands for (" world").
  const std::string& token_string(int64_t id) const;
  const std::string& token_bytes(int64_t id) const;
  // The token's bytes as text to show (attention pages, tables): valid UTF-8, a byte that does not
  // complete a character (GPT-2 splits some characters across tokens) shown as U+FFFD; a padding
  // row (tokens() <= id < size()) as "<unused N>", so predictions of any id can be shown.
  std::string token_text(int64_t id) const override;
  // Id of a token spelled as in vocab.json (or an added token's content), or nullopt.
  std::optional<int64_t> find(std::string_view token) const;
  // <|endoftext|>'s id (50256 in GPT-2), or nullopt when the vocabulary lacks it.
  std::optional<int64_t> end_of_text() const;
  std::optional<int64_t> bos() const override;
  std::optional<int64_t> eos() const override;
  std::string describe() const override;  // "GPT-2's byte-level BPE tokenizer of 50257 tokens"

 private:
  struct Impl;
  BpeTokenizer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace headlab::tasks
