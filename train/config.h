// The one configuration of a training run: model, task, optimizer, schedule and the run's own
// settings. Every checkpoint stores it as its `config` JSON (ARCHITECTURE.md section 7), and
// every command rebuilds what it needs from that.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "io/checkpoint.h"
#include "io/families.h"
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

struct RunConfig {
  // The model: its family's config section, as the checkpoint stores it ("arch" says whose: io/families.h).
  nlohmann::json model;
  TaskConfig task;
  optim::OptimizerOptions optimizer;
  optim::LRSchedule schedule;
  RunSettings run;

  // What `headlab train` runs without options (with nn::ModelOptions' defaults: a 2-layer, 4-head, emb-64
  // fused GPT): reverse, AdamW at 3e-3 with 100 warmup steps and cosine decay to 1e-4; it learns reverse
  // to high exact match in a few minutes on two cores.
  static RunConfig defaults();
  // {"model", "tokenizer": {"type": "char", "vocab"}, "task": {"name", "options"}, "training"}; a
  // subword tokenizer is {"type": its files' type}, its files beside the config (tokenizer_files, config_of).
  nlohmann::json to_json() const;
  // Checkpoints from elsewhere (tools/import_torch.py) may lack "training": its defaults apply.
  static RunConfig from_json(const nlohmann::json& j);
  const io::Family& family() const { return io::family_of(model); }
  // The files of the config's subword tokenizer (empty for the character tokenizer): what a checkpoint
  // stores beside to_json().
  io::TokenizerFiles tokenizer_files() const;
  // The task this config describes (a source -> target family's: a tasks::Seq2SeqTask); text_override
  // replaces a chars task's text file.
  std::unique_ptr<tasks::Task> make_task(const std::string& text_override = "") const;
  // A freshly initialised model of this config (draws from the default generator).
  std::shared_ptr<nn::Model> make_model() const { return family().model.build(model); }
  // The T that batch() and make_eval_set are asked for: a decoder's context length; for a source ->
  // target model (whose batches are padded to their longest row) the longest target it may meet.
  int64_t batch_tokens() const { return family().model.row_tokens(model); }
  std::string describe_model() const { return family().model.describe(model); }
};

// A checkpoint's config (from_json), with the BPE tokenizer its files hold. Errors name `path`.
RunConfig config_of(const io::Checkpoint& ckpt, const std::string& path);

// A fresh run's config from what a user chose: the model's section from the options and the task (its
// vocabularies; a context_length of 0: the task's need, chars: 64), or `init_model` as it is (fine-tuning:
// checked against the task), the tokenizer's vocabulary and the schedule's peak and length from the
// optimizer and the run, then validates everything.
RunConfig resolve(const nn::ModelOptions& model, RunConfig chosen, const nlohmann::json& init_model = nullptr);

}  // namespace headlab::train
