// What the text task, generation and the analyses ask of a subword tokenizer, whatever its files: GPT-2's
// byte-level BPE (tasks/bpe_tokenizer.h) or llama2.c's SentencePiece-style vocabulary (tasks/llama2c_tokenizer.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace headlab::tasks {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual int64_t size() const = 0;
  // Text (UTF-8) -> ids, without BOS; label names the text's source in errors ("prompt", a file name).
  virtual std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const = 0;
  // Text as it continues other text (an answer token such as " Tom"): SentencePiece's dummy space left out.
  virtual std::vector<int64_t> encode_continuation(std::string_view text, std::string_view label = "prompt") const {
    return encode(text, label);
  }
  // Ids -> the text they stand for; ids outside [0, size) throw.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // A token as text to show (attention pages, tables): valid UTF-8.
  virtual std::string token_text(int64_t id) const = 0;
  // The token a prompt starts with where the model was trained so (SentencePiece LLaMA models: <s>), and the
  // token that ends a generation.
  virtual std::optional<int64_t> bos() const { return std::nullopt; }
  virtual std::optional<int64_t> eos() const = 0;
  virtual std::string describe() const = 0;  // "GPT-2's byte-level BPE tokenizer of 50257 tokens"
};

}  // namespace headlab::tasks
