// Internal to train/'s trainer files (trainer.cpp, trainer_files.cpp, trainer_parallel.cpp): the session
// of one run, its model, optimizer and state, which the loop, the checkpoints and data parallelism share.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "train/progress.h"
#include "train/trainer.h"

namespace headlab::train {

struct Trainer::Session {
  RunConfig config;
  std::unique_ptr<tasks::Task> task;
  std::shared_ptr<nn::Model> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<Tensor> params;
  io::TrainerState state;
  int64_t first_step = 0;  // the step this process started from
  // The window of steps since the last evaluation, for the logged train loss and tokens/s.
  double window_loss = 0, last_norm = 0, rate = 0;
  int64_t window_steps = 0, window_tokens = 0, tokens_trained = 0;  // (tokens: decoder positions)
  std::chrono::steady_clock::time_point window_start = std::chrono::steady_clock::now();
  int64_t skipped_in_a_row = 0, skipped_total = 0;
  // What this process has written: the step of the checkpoint it saved or resumed from (-1: none), and
  // whether metrics.csv was written; the closing messages claim no more.
  int64_t good_checkpoint_step = -1;
  bool wrote_checkpoint = false, wrote_metrics = false;
  double allreduce_seconds = 0;  // in the allreduce, waiting for the slowest rank included
  bool stop_agreed = false;      // data parallelism: some rank saw a signal during the last step
  Progress progress{true, false, 1};
};

}  // namespace headlab::train
