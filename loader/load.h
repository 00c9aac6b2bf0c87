// A model with its task, from any source io/sources.h reads (a headlab checkpoint, a Hugging Face model folder of
// any family io/families.h reads, a llama2.c checkpoint): what the commands, the Python module and C++ programs
// load. Its own floor, above train/ (a checkpoint's RunConfig and task) and below the analyses that take it.
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

namespace headlab::loader {

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
  nn::EncoderDecoder* seq2seq() const { return model->as_encoder_decoder(); }
  const tasks::Seq2SeqTask* seq2seq_task() const { return dynamic_cast<const tasks::Seq2SeqTask*>(task.get()); }
  // The subword tokenizer when the model has one (pretrained models, their conversions and fine-tunings), else null.
  const tasks::TextTokenizer* subword() const;
};

// path: a checkpoint file, a model folder or a llama2.c checkpoint (errors start with cmd); text replaces a chars
// or text task's text file; tokenizer: a tokenizer file for a llama2.c checkpoint (required there; llama2.c's
// tokenizer.bin format) or a folder (instead of its own files).
Loaded load(const char* cmd, const std::string& path, const std::string& device, const std::string& text = "",
            const std::string& tokenizer = "");

}  // namespace headlab::loader
