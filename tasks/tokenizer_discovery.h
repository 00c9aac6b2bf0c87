// A model folder's tokenizer files, found by name, and the tokenizer they hold: what loading, inspect and
// tokenize ask of a folder. It knows file names only; the folder's format (io/) says where its vocab.json and
// merges.txt are, so that tasks/ needs nothing of io/.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

// The tokenizer files of a model folder, the first found of: tokenizer.model (SentencePiece); vocab.json +
// merges.txt (GPT-2's files); tokenizer.json (byte-level BPE, or BERT's WordPiece where its model.type says so),
// with tokenizer_config.json for BOS and EOS where the folder has one; vocab.txt (BERT's WordPiece, with
// tokenizer_config.json for its case and special tokens); tokenizer.bin (llama2.c's, as export writes a llama2.c
// model's). --tokenizer FILE overrides them all. A checkpoint made from the folder carries the files
// (io::Checkpoint::tokenizer).
struct FolderTokenizer {
  enum class Kind { none, sentencepiece, gpt2_files, tokenizer_json, wordpiece, llama2c } kind = Kind::none;
  std::string path, second;      // the file, and merges.txt or tokenizer_config.json ("" if none)
  std::string describe() const;  // the files, or "none (...)": inspect's line
  // The tokenizer they hold; vocab_size > 0: the model's (see the tokenizers' checks). none throws.
  std::shared_ptr<const TextTokenizer> make(int64_t vocab_size) const;
};
// vocab_path, merges_path: GPT-2's vocab.json and merges.txt as the folder's reader found them ("" where the folder
// lacks them: io::FolderModel's); a folder with no model (tokenizer files alone) passes those two where they exist.
FolderTokenizer folder_tokenizer(const std::string& folder, const std::string& vocab_path,
                                 const std::string& merges_path);

}  // namespace headlab::tasks
