// Teacher-forced evaluation: the one loop behind the trainer's eval steps, `headlab eval` and
// every head-analysis score.
#include "train/evaluate.h"

namespace headlab::train {

std::pair<Tensor, Tensor> batch_tensors(const tasks::Batch& b, Device device) {
  return {tensor(b.inputs, {b.B, b.T}).to(device), tensor(b.targets, {b.B, b.T}).to(device)};
}

void ScoreSum::add(const tasks::Batch& b, const Tensor& logits, const Tensor& targets) {
  const int64_t V = logits.size(-1);
  loss_sum += cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}), kIgnoreIndex, Reduction::sum).item<double>();
  metrics += tasks::score(b, argmax(logits, -1).to_vector<int64_t>());
}

Scores ScoreSum::scores() const {
  Scores s;
  s.tokens = metrics.tokens;
  s.has_exact_match = metrics.has_exact_match;
  if (metrics.tokens > 0) {
    s.loss = loss_sum / static_cast<double>(metrics.tokens);
    s.token_accuracy = metrics.token_accuracy;
  }
  if (metrics.has_exact_match) s.exact_match = metrics.exact_match;
  return s;
}

Scores evaluate(nn::GPTModel& model, const std::vector<tasks::Batch>& batches) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  ScoreSum sum;
  for (const tasks::Batch& b : batches) {
    auto [idx, tgt] = batch_tensors(b, model.device());
    sum.add(b, model.forward(idx), tgt);  // logits (B, T, V)
  }
  model.train(was_training);
  return sum.scores();
}

Scores evaluate(nn::GPTModel& model, const tasks::Task& task, int64_t batches, int64_t batch_size, int64_t T) {
  std::vector<tasks::Batch> data;
  for (int64_t i = 0; i < batches; ++i) data.push_back(task.batch(tasks::Split::val, static_cast<uint64_t>(i), batch_size, T));
  return evaluate(model, data);
}

}  // namespace headlab::train
