#include "train/memory.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "backends/backend.h"
#include "base/error.h"

namespace headlab::train {

MemoryEstimate estimate_memory(const nlohmann::json& model, int64_t batch_size, int64_t tokens, bool training,
                               int optimizer_slots) {
  constexpr double kFloat = 4;
  const nn::ModelFamily& family = io::family_of(model).model;
  MemoryEstimate e;
  e.parameters = family.parameter_count(model) * kFloat;
  if (training) {
    e.gradients = e.parameters;
    e.optimizer_state = optimizer_slots * e.parameters;
  }
  e.activations = static_cast<double>(batch_size) * static_cast<double>(tokens) *
                  family.activation_floats(model, training) * kFloat;
  return e;
}

double estimate_batches_memory(int64_t batches, int64_t batch_size, int64_t tokens) {
  constexpr double kId = 8, kIdsPerPosition = 4;
  return static_cast<double>(batches) * static_cast<double>(batch_size) * static_cast<double>(tokens) *
         kIdsPerPosition * kId;
}

MemoryEstimate estimate_generation_memory(const nlohmann::json& model, int64_t prompt_tokens, int64_t new_tokens,
                                          int64_t prefill_chunk) {
  const nn::ModelFamily& family = io::family_of(model).model;
  const int64_t window = family.row_tokens(model);  // what the cache holds at most (it slides past it)
  const double sequence = static_cast<double>(prompt_tokens) + static_cast<double>(new_tokens);
  const double cache = family.cache_floats(model);
  const int64_t held = static_cast<int64_t>(std::min(sequence, static_cast<double>(window)));
  // With a cache a forward reads a chunk of the prompt (0: all of it); without, the whole window each step.
  const int64_t forward = std::max<int64_t>(
      1, cache > 0 ? std::min({prompt_tokens, prefill_chunk > 0 ? prefill_chunk : window, window}) : held);
  MemoryEstimate e = estimate_memory(model, 1, forward, false, 0);
  e.activations += static_cast<double>(held) * cache * 4;
  e.data = sequence * 2 * 8;
  return e;
}

void check_generation_fits(const nlohmann::json& model, bool on_cuda, int64_t prompt_tokens, int64_t new_tokens,
                           int64_t prefill_chunk, const std::string& who, double also) {
  MemoryEstimate need = estimate_generation_memory(model, prompt_tokens, new_tokens, prefill_chunk);
  if (on_cuda) need = MemoryEstimate{0, 0, 0, 0, need.data};
  need.activations += also;
  check_memory_fits(need, who,
                    "lower --max-new-tokens (now " + std::to_string(new_tokens) + ") or shorten the prompt (" +
                        std::to_string(prompt_tokens) + " tokens)");
}

void check_evaluation_fits(const RunConfig& config, bool on_cuda, int64_t batches, int64_t batch_size,
                           const std::string& who, const std::string& advice, int64_t tokens) {
  const int64_t T = tokens > 0 ? tokens : config.batch_tokens();
  MemoryEstimate need;  // activations scale with the rows' length
  if (!on_cuda) need = estimate_memory(config.model, batch_size, std::min(config.batch_tokens(), T), false, 0);
  need.data = estimate_batches_memory(batches, batch_size, T);
  check_memory_fits(need, who, advice);
}

void check_memory_fits(const MemoryEstimate& need, const std::string& who, const std::string& advice) {
  const double have = available_memory();
  if (have <= 0 || need.total() <= have) return;
  std::ostringstream os;
  os << who << ": needs about " << format_bytes(need.total()) << " of memory (parameters "
     << format_bytes(need.parameters);
  if (need.gradients > 0) os << ", gradients " << format_bytes(need.gradients);
  if (need.optimizer_state > 0) os << ", optimizer state " << format_bytes(need.optimizer_state);
  os << ", activations " << format_bytes(need.activations);
  if (need.data > 0) os << ", token ids " << format_bytes(need.data);
  os << "), more than the " << format_bytes(have) << " this machine has available; " << advice;
  HL_FAIL(os.str());
}

}  // namespace headlab::train
