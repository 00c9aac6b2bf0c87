// Generation: one decoder for `headlab generate`, the analysis commands and the examples.
#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace headlab::nn {

namespace {

// The next token from the last position's logits (V).
int64_t pick_token(const Tensor& last_logits, double temperature, int64_t top_k, Generator& gen) {
  std::vector<double> logits = last_logits.to_vector<double>();
  if (temperature <= 0) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  const int64_t V = static_cast<int64_t>(logits.size());
  if (top_k > 0 && top_k < V) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<double>());
    const double cut = sorted[static_cast<size_t>(top_k - 1)];
    for (double& x : logits)
      if (x < cut) x = -INFINITY;
  }
  const double m = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (double& x : logits) total += (x = std::exp((x - m) / temperature));
  const double u = rand({1}, gen, DType::f64).item<double>() * total;
  double acc = 0;
  for (int64_t i = 0; i < V; ++i)
    if ((acc += logits[static_cast<size_t>(i)]) > u) return i;
  return V - 1;
}

}  // namespace

std::vector<int64_t> generate(DecoderModel& model, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  HL_CHECK(!prompt.empty(), "generate: the prompt is empty; expected at least one token");
  HL_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", o.max_new_tokens);
  HL_CHECK(o.prefill_chunk >= 0, "generate: prefill_chunk must be >= 0, got ", o.prefill_chunk);
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  Generator gen(o.seed);
  const int64_t ctx = model.shape().context_length;
  // With a key/value cache a step computes one token; a window that slides past context_length
  // renumbers every position, so the cache is refilled from the window then (as without one).
  const bool cached = model.supports_kv_cache();
  std::vector<KVCache> caches(static_cast<size_t>(model.n_layers()));
  std::vector<int64_t> ids = prompt, generated;
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - ctx);
    const std::vector<int64_t> window(ids.begin() + start, ids.end());
    const int64_t n = static_cast<int64_t>(window.size());
    Tensor last;  // (V): the logits after the window
    if (cached && i > 0 && caches.front().length + 1 == n) {
      last = model.forward_cached(tensor(std::vector<int64_t>{ids.back()}, {1, 1}).to(model.device()), caches);
    } else if (cached) {
      for (KVCache& c : caches)
        c = KVCache{.keys = {}, .values = {}, .length = 0, .expected = n + o.max_new_tokens - i};
      last = model.forward_cached(tensor(window, {1, n}).to(model.device()), caches, o.prefill_chunk);
    } else {
      last = model.forward(tensor(window, {1, n}).to(model.device())).select(1, n - 1);  // (1, V)
    }
    const int64_t next = pick_token(last.select(0, 0), o.temperature, o.top_k, gen);
    if (next == o.end_id && !o.keep_end) break;
    ids.push_back(next);
    generated.push_back(next);
    if (next == o.end_id) break;
  }
  model.train(was_training);
  return generated;
}

}  // namespace headlab::nn
