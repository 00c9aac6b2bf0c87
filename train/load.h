// A model with its task, from a headlab checkpoint or a Hugging Face GPT-2 folder: what the command,
// the Python module and C++ programs load.
#pragma once
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "io/hf_gpt2.h"
#include "nn/transformer.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/seq2seq.h"
#include "tasks/task.h"
#include "train/config.h"

namespace headlab::train {

// A model with its task, from a headlab checkpoint or a Hugging Face GPT-2 folder (io/hf_gpt2.h),
// which loads as a checkpoint of the BPE task "text" would: its GPTModel, the folder's tokenizer, and
// --text (when given) as the task's text.
struct Loaded {
  io::Checkpoint ckpt;  // a folder's: its config, tokenizer and (shared, not copied) parameters
  train::RunConfig config;
  std::shared_ptr<nn::Model> model;
  std::unique_ptr<tasks::Task> task;
  bool from_folder = false;
  // The model as a GPT, for what only the GPT has (clear error naming cmd for an encoder-decoder).
  nn::GPTModel& gpt(const char* cmd) const;
  // The model and task as an encoder-decoder's, or null for a GPT checkpoint.
  nn::EncoderDecoder* seq2seq() const { return dynamic_cast<nn::EncoderDecoder*>(model.get()); }
  const tasks::Seq2SeqTask* seq2seq_task() const { return dynamic_cast<const tasks::Seq2SeqTask*>(task.get()); }
  // GPT-2's tokenizer when the model has one (folders, their conversions and fine-tunings), else null.
  const tasks::BpeTokenizer* bpe() const;
};
// path: a checkpoint file or a model folder (errors start with cmd); text replaces a chars or text
// task's text file.
Loaded load(const char* cmd, const std::string& path, const std::string& device, const std::string& text = "");

}  // namespace headlab::train
