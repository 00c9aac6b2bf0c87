// Generation: one decoder for `headlab generate`, the analysis commands and the examples.
#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace headlab::nn {

namespace {

// The next token from the last position's logits (V).
int64_t pick_token(const Tensor& last_logits, double temperature, int64_t top_k, Generator& gen) {
  // Greedy: the argmax where the logits are (on a GPU only the token's id crosses to the host).
  if (temperature <= 0) return argmax(last_logits, 0).item<int64_t>();
  std::vector<double> logits = last_logits.to_vector<double>();
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

// Greedy decoding inside the context with a key/value cache: each step's argmax stays on the device and feeds
// the next step, and the host reads the new ids `every` steps at a time (to stop at end_id), so the device
// never waits for the host between tokens. Steps past an end token are computed and dropped (fewer than
// `every`). Calls take(id) for each new id in order until it returns true (stop); returns whether it did.
template <typename Take>
bool greedy_in_cache(DecoderModel& model, std::vector<KVCache>& caches, const std::vector<int64_t>& prompt,
                     int64_t steps, const GenerateOptions& o, Take take) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (KVCache& c : caches) c = KVCache{.keys = {}, .values = {}, .length = 0, .start = 0, .expected = n + steps - 1};
  Tensor last = model.forward_cached(tensor(prompt, {1, n}).to(model.device()), caches, o.prefill_chunk);  // (1, V)
  const int64_t every = o.end_id >= 0 ? 16 : steps;
  std::vector<Tensor> unread;  // (1, 1) ids on the device
  for (int64_t i = 0; i < steps; ++i) {
    const Tensor next = argmax(last, -1, true);
    unread.push_back(next);
    if (i + 1 < steps) last = model.forward_cached(next, caches);  // queued before the host reads anything
    if (static_cast<int64_t>(unread.size()) < every && i + 1 < steps) continue;
    for (int64_t id : cat(unread, 0).to_vector<int64_t>())
      if (take(id)) return true;
    unread.clear();
  }
  return false;
}

}  // namespace

std::vector<int64_t> generate(DecoderModel& model, const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  HL_CHECK(!prompt.empty(), "generate: the prompt is empty; expected at least one token");
  HL_CHECK(model.shape().causal, "generate: ", model.type_name(),
           " is an encoder (bidirectional attention): each position predicts itself, not the next token, so it "
           "does not generate text");
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
  const auto take = [&](int64_t next) {  // true: stop here
    if (next == o.end_id && !o.keep_end) return true;
    ids.push_back(next);
    generated.push_back(next);
    return next == o.end_id;
  };
  bool stopped = false;
  // The tokens whose positions fit the context (a prompt of n gives ctx - n + 1 of them) without a round trip each.
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (cached && o.temperature <= 0 && n_prompt <= ctx && o.max_new_tokens > 0)
    stopped = greedy_in_cache(model, caches, prompt, std::min(o.max_new_tokens, ctx - n_prompt + 1), o, take);
  for (int64_t i = static_cast<int64_t>(generated.size()); !stopped && i < o.max_new_tokens; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - ctx);
    const std::vector<int64_t> window(ids.begin() + start, ids.end());
    const int64_t n = static_cast<int64_t>(window.size());
    Tensor last;  // (V): the logits after the window
    if (cached && i > 0 && caches.front().length + 1 == n) {
      last = model.forward_cached(tensor(std::vector<int64_t>{ids.back()}, {1, 1}).to(model.device()), caches);
    } else if (cached) {
      for (KVCache& c : caches)
        c = KVCache{.keys = {}, .values = {}, .length = 0, .start = 0, .expected = n + o.max_new_tokens - i};
      last = model.forward_cached(tensor(window, {1, n}).to(model.device()), caches, o.prefill_chunk);
    } else {
      last = model.forward(tensor(window, {1, n}).to(model.device())).select(1, n - 1);  // (1, V)
    }
    stopped = take(pick_token(last.select(0, 0), o.temperature, o.top_k, gen));
  }
  model.train(was_training);
  return generated;
}

}  // namespace headlab::nn
