// llama2.c's tokenizer file (tokenizer.bin, tok512.bin): int32 max_token_length, then per token a float32
// score, an int32 byte length and the bytes. Its vocabulary is a SentencePiece BPE model's (ids 0 <unk>, 1 <s>,
// 2 </s>, 3-258 the bytes <0x00>..<0xFF>), and encoding follows SentencePiece's: a dummy space before the text,
// each character its token (or its bytes' tokens where the vocabulary lacks it), then the adjacent pair whose
// merge has the highest score merged until none is in the vocabulary. Decoding drops the dummy space.
// A vocabulary without a piece of two spaces was trained on text whose runs of spaces SentencePiece collapsed
// (its remove_extra_whitespaces, on by default: tok512's model has it, Llama 2's has not and holds "  " pieces),
// so its text is collapsed the same way first: the tokens are then those of the SentencePiece model it came from.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>

#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

class Llama2cTokenizer : public TextTokenizer {
 public:
  // The file's contents; name names it in errors. vocab_size > 0: the model's, which the file must cover.
  Llama2cTokenizer(std::string_view bytes, std::string name, int64_t vocab_size = 0);
  static std::shared_ptr<const Llama2cTokenizer> from_file(const std::string& path, int64_t vocab_size = 0);
  // From a SentencePiece model's pieces ("\u2581the", "<0x0A>") and scores held in memory (a GGUF file's
  // tokenizer.ggml.tokens and .scores): written as llama2.c's tokenizer.py writes tokenizer.bin (U+2581 as a space,
  // <s> and </s> as "\n<s>\n" and "\n</s>\n"), so that files() gives a tokenizer.bin like any other.
  static std::shared_ptr<const Llama2cTokenizer> from_pieces(const std::vector<std::string>& pieces,
                                                             const std::vector<float>& scores, std::string name,
                                                             int64_t vocab_size = 0);
  int64_t size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const override;
  std::vector<int64_t> encode_continuation(std::string_view text, std::string_view label = "prompt") const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;
  std::optional<int64_t> bos() const override { return 1; }
  std::optional<int64_t> eos() const override { return 2; }
  std::string describe() const override;
  TokenizerFiles files() const override { return {"llama2c", {{"tokenizer.bin", bytes_}}}; }
  const std::string& piece(int64_t id) const;  // as the file spells it ("<0x0A>", " the")

 private:
  std::string bytes_of(int64_t id) const;
  // SentencePiece's remove_extra_whitespaces: runs of spaces as one, none at the end, and at the start one
  // (a continuation's own) or none (a prompt's, whose dummy space stands for it).
  std::string collapsed(std::string_view text, bool dummy_space) const;
  std::vector<int64_t> encode_pieces(std::string_view text, std::string_view label, bool dummy_space)
      const;  // what the token stands for: a byte token's byte, else its piece
  std::string name_;
  std::string bytes_;  // the file as read (a checkpoint carries it)
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int64_t> ids_;
  bool collapse_spaces_ = false;  // no piece holds two spaces: see above
};

}  // namespace headlab::tasks
