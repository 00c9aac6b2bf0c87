// A model with its task, from a headlab checkpoint, a Hugging Face model folder of any family the registry
// reads (io/families.h) or a llama2.c checkpoint: what the commands, the Python module and C++ programs load.
#pragma once
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "io/families.h"
#include "nn/transformer.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/seq2seq.h"
#include "tasks/task.h"
#include "train/config.h"

namespace headlab::train {

// A model with its task, from a headlab checkpoint, a Hugging Face model folder or a llama2.c checkpoint; the
// last two load as a checkpoint of the task "text" would: the model, its tokenizer (the folder's, or --tokenizer),
// and --text (when given) as the task's text.
struct Loaded {
  io::Checkpoint ckpt;  // a folder's: its config, tokenizer and (shared, not copied) parameters
  train::RunConfig config;
  std::shared_ptr<nn::Model> model;
  std::unique_ptr<tasks::Task> task;
  bool from_folder = false;  // a pretrained model's file or folder, not a headlab checkpoint
  // The model as a decoder, for what only decoders have (a clear error naming cmd for an encoder-decoder).
  nn::DecoderModel& decoder(const char* cmd) const;
  // The model and task as an encoder-decoder's, or null for a decoder.
  nn::EncoderDecoder* seq2seq() const { return dynamic_cast<nn::EncoderDecoder*>(model.get()); }
  const tasks::Seq2SeqTask* seq2seq_task() const { return dynamic_cast<const tasks::Seq2SeqTask*>(task.get()); }
  // The subword tokenizer when the model has one (pretrained models, their conversions and fine-tunings), else null.
  const tasks::TextTokenizer* subword() const;
};

// The tokenizer files of a model folder, the first found of: tokenizer.model (SentencePiece); vocab.json +
// merges.txt (GPT-2's files); tokenizer.json (byte-level BPE), with tokenizer_config.json for BOS and EOS where
// the folder has one; tokenizer.bin (llama2.c's, as export writes a llama2.c model's). --tokenizer FILE
// overrides them all. A checkpoint made from the folder carries the files (io::Checkpoint::tokenizer).
struct FolderTokenizer {
  enum class Kind { none, sentencepiece, gpt2_files, tokenizer_json, llama2c } kind = Kind::none;
  std::string path, second;      // the file, and merges.txt or tokenizer_config.json ("" if none)
  std::string describe() const;  // the files, or "none (...)": inspect's line
  // The tokenizer they hold; vocab_size > 0: the model's (see the tokenizers' checks). none throws.
  std::shared_ptr<const tasks::TextTokenizer> make(int64_t vocab_size) const;
};
// m: the folder's model as read (its vocab.json and merges.txt paths); a folder with no model (tokenizer files
// alone) passes a FolderModel with those two paths where the files exist.
FolderTokenizer folder_tokenizer(const std::string& folder, const io::FolderModel& m);

// path: a checkpoint file, a model folder or a llama2.c checkpoint (errors start with cmd); text replaces a chars
// or text task's text file; tokenizer: a tokenizer file for a llama2.c checkpoint (required there; llama2.c's
// tokenizer.bin format).
Loaded load(const char* cmd, const std::string& path, const std::string& device, const std::string& text = "",
            const std::string& tokenizer = "");

}  // namespace headlab::train
