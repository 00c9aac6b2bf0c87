// The training loop: a GPT on a toy task, evaluation on the validation stream, metrics.csv,
// progress on the terminal, checkpoints every N steps (keeping the last K), exact resume, and a
// checkpoint on Ctrl-C. Deterministic given the seed: the data stream is a function of the step.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "nn/gpt.h"
#include "train/checkpoint.h"
#include "train/tasks.h"

namespace headlab::train {

struct TrainOptions {
  // task
  std::string task = "reverse";
  std::string text;  // chars: text file (default data/tiny.txt)
  int64_t min_len = 4, max_len = 8, n_digits = 3;
  // model (book's config keys)
  std::string attention = "fused";
  int64_t emb_dim = 64, n_heads = 4, n_layers = 2;
  int64_t context_length = 0;  // 0: the task's need (algorithmic) or 64 (chars)
  double drop_rate = 0.0;
  bool qkv_bias = false;
  // optimisation
  int64_t steps = 600, batch_size = 64;
  std::string optimizer = "adamw";
  double lr = 3e-3, min_lr = 1e-4, weight_decay = -1;  // weight_decay < 0: the optimizer's default
  std::string schedule = "cosine";
  int64_t warmup = 100;
  double grad_clip = 1.0;  // 0: off
  uint64_t seed = 1;
  std::string device = "cpu";
  // bookkeeping
  std::string out = "runs/reverse";
  bool resume = false;
  int64_t eval_every = 100, eval_batches = 8, save_every = 200, keep_last = 3, log_every = 50;
  bool quiet = false;  // no progress output (tests)
};

struct EvalResult {
  double loss = 0, token_accuracy = 0, exact_match = 0;
  bool has_exact_match = false;
  int64_t tokens = 0;
};

struct TrainResult {
  int64_t steps_done = 0;
  bool interrupted = false;
  double seconds = 0, tokens_per_s = 0;
  EvalResult final_eval;
  std::string checkpoint;  // path of the latest checkpoint
};

// Set by SIGINT; the loop saves a checkpoint and stops at the next step boundary.
std::atomic<bool>& stop_requested();
void install_sigint_handler();

// The task a checkpoint (or a fresh run's options) describes.
std::unique_ptr<Task> task_from_config(const nlohmann::json& config, const std::string& text_override = "");

EvalResult evaluate(nn::GPTModel& model, const Task& task, int64_t batches, int64_t batch_size, int64_t T);

class Trainer {
 public:
  explicit Trainer(TrainOptions opts);
  TrainResult run();

 private:
  void log(const std::string& line) const;
  TrainOptions opts_;
};

}  // namespace headlab::train
