// Teacher-forced evaluation: the one loop behind the trainer's eval steps, `headlab eval` and
// every head-analysis score.
#include "train/evaluate.h"

namespace headlab::train {

std::pair<Tensor, Tensor> batch_tensors(const tasks::Batch& b, Device device) {
  return {tensor(b.inputs, {b.B, b.T}).to(device), tensor(b.targets, {b.B, b.T}).to(device)};
}

Scores evaluate(nn::GPTModel& model, const std::vector<tasks::Batch>& batches) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  const Device device = model.device();
  const int64_t V = model.config().vocab_size;
  double loss_sum = 0;
  tasks::Metrics total;
  for (const tasks::Batch& b : batches) {
    auto [idx, tgt] = batch_tensors(b, device);
    const Tensor logits = model.forward(idx);  // (B, T, V)
    loss_sum += cross_entropy(logits.reshape({-1, V}), tgt.reshape({-1}), kIgnoreIndex, Reduction::sum).item<double>();
    total += tasks::score(b, argmax(logits, -1).to_vector<int64_t>());
  }
  model.train(was_training);
  Scores s;
  s.tokens = total.tokens;
  s.has_exact_match = total.has_exact_match;
  if (total.tokens > 0) {
    s.loss = loss_sum / static_cast<double>(total.tokens);
    s.token_accuracy = total.token_accuracy;
  }
  if (total.has_exact_match) s.exact_match = total.exact_match;
  return s;
}

Scores evaluate(nn::GPTModel& model, const tasks::Task& task, int64_t batches, int64_t batch_size, int64_t T) {
  std::vector<tasks::Batch> data;
  for (int64_t i = 0; i < batches; ++i) data.push_back(task.batch(tasks::Split::val, static_cast<uint64_t>(i), batch_size, T));
  return evaluate(model, data);
}

}  // namespace headlab::train
