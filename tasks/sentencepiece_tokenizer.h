// A SentencePiece model file (tokenizer.model: Llama 2, TinyLlama, Mistral 7B v0.1, llama2.c's tok*.model),
// read and run by Debian's libsentencepiece (the reference implementation, not a rewrite): ids, pieces, byte
// fallback, the dummy space and the model's own normalisation. BOS and EOS are the model's.
#pragma once
#include <memory>
#include <string>

#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

class SentencePieceTokenizer : public TextTokenizer {
 public:
  // vocab_size > 0: the model's, which the file must cover exactly.
  static std::shared_ptr<const SentencePieceTokenizer> from_file(const std::string& path, int64_t vocab_size = 0);
  // A serialized model (a tokenizer.model's bytes); name names it in errors.
  static std::shared_ptr<const SentencePieceTokenizer> from_bytes(std::string bytes, std::string name,
                                                                  int64_t vocab_size = 0);
  ~SentencePieceTokenizer() override;
  int64_t size() const override;
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const override;
  // Without the dummy space SentencePiece puts before a text: " Tom" is the one piece "▁Tom" that follows a
  // prompt, "00" the pieces after " 17".
  std::vector<int64_t> encode_continuation(std::string_view text, std::string_view label = "prompt") const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;
  std::optional<int64_t> bos() const override;
  std::optional<int64_t> eos() const override;
  std::string describe() const override;
  TokenizerFiles files() const override;  // {"sentencepiece", tokenizer.model}

 private:
  struct Impl;
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A tokenizer file as --tokenizer gives it: a SentencePiece model (protobuf), llama2.c's tokenizer.bin, a
// Hugging Face tokenizer.json of byte-level BPE or of WordPiece, or BERT's vocab.txt (a .txt file), with the
// tokenizer_config.json beside it, if any; told apart by their contents; errors name the file.
std::shared_ptr<const TextTokenizer> tokenizer_from_file(const std::string& path, int64_t vocab_size);
// A tokenizer from the files it was read from (TextTokenizer::files(): a checkpoint's /tokenizer); where
// ("checkpoint 'x.h5': tokenizer/") starts the names in errors.
std::shared_ptr<const TextTokenizer> tokenizer_from_files(const TokenizerFiles& files, const std::string& where,
                                                          int64_t vocab_size);

}  // namespace headlab::tasks
