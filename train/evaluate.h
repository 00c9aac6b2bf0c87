// One evaluation for training and analysis alike: teacher-forced loss and argmax scores of a GPT
// on task batches. B = batch rows, T = tokens, V = vocabulary.
#pragma once
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "tasks/task.h"

namespace headlab::train {

// loss: mean cross entropy per scored token. NaN where nothing was scored, and exact_match NaN
// where it does not apply (chars).
struct Scores {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double token_accuracy = std::numeric_limits<double>::quiet_NaN();
  double exact_match = std::numeric_limits<double>::quiet_NaN();
  bool has_exact_match = false;
  int64_t tokens = 0;  // scored targets
};

// Scores accumulated over batches: the summed cross entropy and the argmax metrics.
struct ScoreSum {
  double loss_sum = 0;
  tasks::Metrics metrics;
  // logits: (B, T, V) for batch.inputs; targets: batch.targets as a (B, T) tensor on the logits' device.
  void add(const tasks::Batch& batch, const Tensor& logits, const Tensor& targets);
  Scores scores() const;
};

// A batch's inputs and targets as (B, T) int64 tensors on `device`.
std::pair<Tensor, Tensor> batch_tensors(const tasks::Batch& batch, Device device);

// The model as it stands (its head controls included) in eval mode, without gradients; the
// model's train/eval mode is restored afterwards.
Scores evaluate(nn::GPTModel& model, const std::vector<tasks::Batch>& batches);
// Batches 0..n-1 of the task's validation stream, each (batch_size, T).
Scores evaluate(nn::GPTModel& model, const tasks::Task& task, int64_t batches, int64_t batch_size, int64_t T);

}  // namespace headlab::train
