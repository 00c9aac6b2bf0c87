// What the text task, generation and the analyses ask of a subword tokenizer, whatever its files: byte-level
// BPE (GPT-2's files or a tokenizer.json: tasks/bpe_tokenizer.h), SentencePiece (tasks/sentencepiece_tokenizer.h)
// or llama2.c's tokenizer.bin (tasks/llama2c_tokenizer.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace headlab::tasks {

// A subword tokenizer as the files it was read from: what a checkpoint stores (/tokenizer/<name>) and export
// writes beside the weights, so that a model keeps its tokenizer wherever it goes. type: "bpe" (GPT-2's
// vocab.json and merges.txt), "tokenizer.json" (with tokenizer_config.json where the folder had one),
// "sentencepiece" (tokenizer.model), "llama2c" (llama2.c's tokenizer.bin), "ids" (ids.json: tasks/id_tokenizer.h),
// "wordpiece" (BERT's vocab.txt or WordPiece tokenizer.json [, tokenizer_config.json]: tasks/wordpiece_tokenizer.h).
struct TokenizerFiles {
  std::string type;                                        // "" with no files (the character tokenizer)
  std::vector<std::pair<std::string, std::string>> files;  // (file name, contents)
  bool empty() const { return files.empty(); }
  const std::string* find(std::string_view name) const {
    for (const auto& [n, bytes] : files)
      if (n == name) return &bytes;
    return nullptr;
  }
};

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
  // A prompt's ids: the tokenizer's BOS first where it has one and prepend_bos (SentencePiece LLaMA models: <s>),
  // then encode(text), and a masked-LM tokenizer's [SEP] after (BertTokenizer's [CLS] ... [SEP]). The one rule of
  // the commands' prompts (Task::encode_prompt, headlab tokenize) and Python's to_tokens, so that they give a text
  // the same tokens.
  std::vector<int64_t> encode_prompt(std::string_view text, bool prepend_bos = true,
                                     std::string_view label = "prompt") const {
    std::vector<int64_t> ids = encode(text, label);
    if (const std::optional<int64_t> b = bos(); b && prepend_bos) ids.insert(ids.begin(), *b);
    if (const std::optional<int64_t> e = eos(); e && mask() && prepend_bos) ids.push_back(*e);
    return ids;
  }
  // Ids -> the text they stand for; ids outside [0, size) throw.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // A token as text to show (attention pages, tables): valid UTF-8.
  virtual std::string token_text(int64_t id) const = 0;
  // The token a prompt starts with where the model was trained so (SentencePiece LLaMA models: <s>), and the
  // token that ends a generation.
  virtual std::optional<int64_t> bos() const { return std::nullopt; }
  virtual std::optional<int64_t> eos() const = 0;
  // A masked-LM tokenizer's [MASK] (BERT's WordPiece; bos and eos are then its [CLS] and [SEP]).
  virtual std::optional<int64_t> mask() const { return std::nullopt; }
  virtual std::string describe() const = 0;  // "GPT-2's byte-level BPE tokenizer of 50257 tokens"
  virtual TokenizerFiles files() const = 0;  // what it was read from, to be read again by tokenizer_from_files
};

}  // namespace headlab::tasks
