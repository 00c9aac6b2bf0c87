// Teacher-forced evaluation: the one loop behind the trainer's eval steps, `headlab eval` and
// every head-analysis score.
#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace headlab::train {

std::pair<Tensor, Tensor> batch_tensors(const tasks::Batch& b, Device device) {
  return {tensor(b.inputs, {b.B, b.T}).to(device), tensor(b.targets, {b.B, b.T}).to(device)};
}

nn::ModelInputs model_inputs(const tasks::Batch& b, Device device) {
  nn::ModelInputs in;
  in.tokens = tensor(b.inputs, {b.B, b.T}).to(device);
  if (b.has_source()) {
    in.source = tensor(b.source, {b.B, b.S}).to(device);
    in.source_valid_lens = tensor(b.source_valid_lens, {b.B}).to(device);
  }
  return in;
}

void ScoreSum::add(const tasks::Batch& b, const Tensor& logits, const Tensor& targets) {
  const int64_t V = logits.size(-1);
  loss_sum +=
      cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}), kIgnoreIndex, Reduction::sum).item<double>();
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

namespace {
ScoreSum score_batches(nn::Model& model, const std::vector<tasks::Batch>& batches) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  ScoreSum sum;
  for (const tasks::Batch& b : batches) {
    const Tensor tgt = tensor(b.targets, {b.B, b.T}).to(model.device());
    sum.add(b, model.logits(model_inputs(b, model.device())), tgt);  // logits (B, T, V)
  }
  model.train(was_training);
  return sum;
}
}  // namespace

Scores evaluate(nn::Model& model, const std::vector<tasks::Batch>& batches) {
  return score_batches(model, batches).scores();
}

Scores evaluate(nn::Model& model, const tasks::Task& task, int64_t batches, int64_t batch_size, int64_t T,
                Collectives* ranks) {
  const int rank = ranks ? ranks->rank() : 0, size = ranks ? ranks->size() : 1;
  std::vector<tasks::Batch> data;
  for (int64_t i = rank; i < batches; i += size)
    data.push_back(task.batch(tasks::Split::val, static_cast<uint64_t>(i), batch_size, T));
  ScoreSum sum = score_batches(model, data);
  if (size == 1) return sum.scores();
  // The ranks' sums summed (the counts exactly: in double, they stay far below 2^53).
  const tasks::Metrics& m = sum.metrics;
  double v[] = {sum.loss_sum,
                static_cast<double>(m.tokens),
                static_cast<double>(m.tokens_correct),
                static_cast<double>(m.rows),
                static_cast<double>(m.rows_correct),
                m.has_exact_match ? 1.0 : 0.0};
  ranks->allreduce_sum(v, std::size(v));
  ScoreSum all;
  all.loss_sum = v[0];
  tasks::Metrics counts;
  counts.tokens = static_cast<int64_t>(v[1]);
  counts.tokens_correct = static_cast<int64_t>(v[2]);
  counts.rows = static_cast<int64_t>(v[3]);
  counts.rows_correct = static_cast<int64_t>(v[4]);
  counts.has_exact_match = v[5] > 0;
  all.metrics += counts;  // (+= derives the accuracies)
  return all.scores();
}

namespace {
// evaluate_text's head product takes as many positions at a time as keep its logits near 8 MB.
constexpr int64_t kHeadChunkLogits = int64_t{1} << 21;
}  // namespace

TextScores evaluate_text(nn::DecoderModel& model, const std::vector<int64_t>& ids, int64_t stride) {
  const int64_t n = static_cast<int64_t>(ids.size()), ctx = model.shape().context_length;
  HL_CHECK(n >= 2, "evaluate_text: ", n, " tokens; need at least 2 (a token and the next)");
  HL_CHECK(stride >= 1 && stride <= ctx, "evaluate_text: stride ", stride, " must be in [1, context_length ", ctx, "]");
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  double nll = 0;
  TextScores s;
  int64_t scored_to = 1;  // targets at positions < scored_to are scored
  for (int64_t begin = 0; scored_to < n; begin += stride) {
    const int64_t end = std::min(begin + ctx + 1, n);  // inputs [begin, end - 1), targets [begin + 1, end)
    const int64_t T = end - 1 - begin;
    std::vector<int64_t> targets(ids.begin() + begin + 1, ids.begin() + end);
    for (int64_t t = 0; t < T; ++t)  // scored by an earlier window, with more context
      if (begin + 1 + t < scored_to) targets[static_cast<size_t>(t)] = kIgnoreIndex;
    const std::vector<int64_t> inputs(ids.begin() + begin, ids.begin() + end - 1);
    const Tensor hidden = model.run_blocks(model.embed(tensor(inputs, {1, T}).to(model.device())), 0, model.n_layers());
    // The head a chunk of positions at a time: GPT-2's (1, 1024, 50257) logits would be 200 MB, more
    // than a third of its weights; chunks without a scored target are skipped.
    const int64_t chunk = std::max<int64_t>(16, kHeadChunkLogits / model.shape().out_vocab_size);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t rows = std::min(chunk, T - t0);
      const std::vector<int64_t> chunk(targets.begin() + t0, targets.begin() + t0 + rows);
      if (std::all_of(chunk.begin(), chunk.end(), [](int64_t y) { return y == kIgnoreIndex; })) continue;
      const Tensor logits = model.unembed(hidden.narrow(1, t0, rows));  // (1, rows, V)
      nll += cross_entropy(logits, tensor(chunk, {1, rows}).to(model.device()), kIgnoreIndex, Reduction::sum)
                 .item<double>();
    }
    s.tokens += end - scored_to;
    scored_to = end;
    ++s.windows;
  }
  model.train(was_training);
  s.loss = nll / static_cast<double>(s.tokens);
  s.perplexity = std::exp(s.loss);
  return s;
}

DecodeScores evaluate_decoding(nn::EncoderDecoder& model, const tasks::Seq2SeqTask& task,
                               const std::vector<tasks::Batch>& batches) {
  DecodeScores d;
  double bleu_sum = 0;
  int64_t correct = 0;
  for (const tasks::Batch& b : batches) {
    HL_CHECK(b.has_source(), "evaluate_decoding: the batches are not seq2seq batches");
    const nn::ModelInputs in = model_inputs(b, model.device());
    // One token more than the longest target lets a row that misses eos show it.
    const std::vector<std::vector<int64_t>> out =
        nn::greedy_decode(model, in.source, in.source_valid_lens, task.bos_id(), task.end_id(), b.T + 1);
    for (int64_t r = 0; r < b.B; ++r) {
      // The reference: the row's target tokens without the end token.
      std::vector<int64_t> label;
      for (int64_t t = 0; t < b.answer_end[static_cast<size_t>(r)] - 1; ++t) label.push_back(b.target(r, t));
      const std::vector<int64_t>& pred = out[static_cast<size_t>(r)];
      correct += pred == label;
      bleu_sum += tasks::bleu(pred, label);
      ++d.rows;
    }
  }
  if (d.rows > 0) {
    d.exact_match = static_cast<double>(correct) / static_cast<double>(d.rows);
    d.bleu = bleu_sum / static_cast<double>(d.rows);
  }
  return d;
}

}  // namespace headlab::train
