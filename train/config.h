// The one configuration of a training run: model, task, optimizer, schedule and the run's own
// settings. Every checkpoint stores it as its `config` JSON (README, "Checkpoint schema"), and
// every command rebuilds what it needs from that.
#pragma once
#include <nlohmann/json.hpp>
#include <memory>
#include <string>

#include "nn/gpt.h"
#include "optim/optim.h"
#include "tasks/task.h"

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
  nn::GPTConfig model;
  TaskConfig task;
  optim::OptimizerOptions optimizer;
  optim::LRSchedule schedule;
  RunSettings run;

  // What `headlab train` runs without options: reverse, a 2-layer, 4-head, emb-64 fused GPT, AdamW at
  // 3e-3 with 100 warmup steps and cosine decay to 1e-4; it learns reverse to high exact match in
  // a few minutes on two cores.
  static RunConfig defaults();
  // {"model", "tokenizer": {"type": "char", "vocab"}, "task": {"name", "options"}, "training"}.
  nlohmann::json to_json() const;
  // Checkpoints from elsewhere (tools/import_torch.py) may lack "training": its defaults apply.
  static RunConfig from_json(const nlohmann::json& j);
  // The task this config describes; text_override replaces a chars task's text file.
  std::unique_ptr<tasks::Task> make_task(const std::string& text_override = "") const;
};

// A fresh run's config from what a user chose: fills the model's vocab_size, a context_length of 0
// (the task's need; chars: 64), the tokenizer's vocabulary and the schedule's peak and length
// from the optimizer and the run, then validates everything.
RunConfig resolve(RunConfig chosen);

}  // namespace headlab::train
