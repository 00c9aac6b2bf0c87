// The one configuration of a training run: model, task, optimizer, schedule and the run's own
// settings. Every checkpoint stores it as its `config` JSON (README, "Checkpoint schema"), and
// every command rebuilds what it needs from that.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/checkpoint.h"
#include "nn/gpt.h"
#include "nn/transformer.h"
#include "optim/optim.h"
#include "tasks/seq2seq.h"

namespace headlab::train {

struct TaskConfig {
  std::string name = "reverse";  // one of tasks::task_names()
  tasks::TaskOptions options;    // options.vocabulary is the tokenizer's list once resolved
};

// The training loop's own settings (the JSON section "training", with the optimizer and schedule).
struct RunSettings {
  int64_t steps = 600, batch_size = 64;
  double grad_clip = 1.0;  // global gradient norm; 0: off
  uint64_t seed = 1;       // initialisation, dropout and data
  std::string device = "cpu";
  int64_t eval_every = 100, eval_batches = 8, save_every = 200, keep_last = 3;
  // A step whose loss or gradient norm is not finite stops the run (exit 1; nothing is saved for
  // it), or with skip_nonfinite is skipped (no optimizer step, as PyTorch's GradScaler does) up to
  // max_skipped_steps in a row.
  bool skip_nonfinite = false;
  int64_t max_skipped_steps = 10;
  void validate() const;  // errors name the command-line option
};

// The two architectures a run can train: the book's decoder-only GPT, d2l's encoder-decoder Transformer.
// The config's model section names it by "arch" (absent: gpt).
enum class Arch { gpt, encoder_decoder };
constexpr auto enum_table(Arch) {  // enum_name, parse_enum (base/enum_names.h)
  return std::to_array<EnumName<Arch>>({{Arch::gpt, "gpt"}, {Arch::encoder_decoder, "encoder-decoder"}});
}

struct RunConfig {
  Arch arch = Arch::gpt;
  nn::GPTConfig model;            // arch gpt
  nn::TransformerConfig seq2seq;  // arch encoder_decoder (src/tgt vocabularies from the task)
  TaskConfig task;
  optim::OptimizerOptions optimizer;
  optim::LRSchedule schedule;
  RunSettings run;

  // What `headlab train` runs without options: reverse, a 2-layer, 4-head, emb-64 fused GPT, AdamW at
  // 3e-3 with 100 warmup steps and cosine decay to 1e-4; it learns reverse to high exact match in
  // a few minutes on two cores.
  static RunConfig defaults();
  // {"model", "tokenizer": {"type": "char", "vocab"}, "task": {"name", "options"}, "training"}; a
  // BPE tokenizer is {"type": "bpe"}, its files beside the config (tokenizer_files, config_of).
  nlohmann::json to_json() const;
  // Checkpoints from elsewhere (tools/import_torch.py) may lack "training": its defaults apply.
  static RunConfig from_json(const nlohmann::json& j);
  // The files of the config's BPE tokenizer (empty for the character tokenizer): what a checkpoint
  // stores beside to_json().
  io::TokenizerFiles tokenizer_files() const;
  // The task this config describes (a tasks::Seq2SeqTask for the encoder-decoder); text_override
  // replaces a chars task's text file.
  std::unique_ptr<tasks::Task> make_task(const std::string& text_override = "") const;
  // A freshly initialised model of this config's architecture (draws from the default generator).
  std::shared_ptr<nn::Model> make_model() const;
  // The T that batch() and make_eval_set are asked for: the GPT's context length; for the
  // encoder-decoder (whose batches are padded to their longest row) the longest target it may meet.
  int64_t batch_tokens() const;
  std::string describe_model() const;  // "fused attention, 2 layers x 4 heads, emb 64, context 18"
};

// A checkpoint's config (from_json), with the BPE tokenizer its files hold. Errors name `path`.
RunConfig config_of(const io::Checkpoint& ckpt, const std::string& path);

// The encoder-decoder form of the config's task (tasks::make_seq2seq_task with its options).
std::unique_ptr<tasks::Seq2SeqTask> make_seq2seq_task_for(const RunConfig& c);

// A fresh run's config from what a user chose: fills the model's vocab_size, a context_length of 0
// (the task's need; chars: 64), the tokenizer's vocabulary and the schedule's peak and length
// from the optimizer and the run, then validates everything.
RunConfig resolve(RunConfig chosen);

}  // namespace headlab::train
