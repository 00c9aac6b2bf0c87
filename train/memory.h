// What a run will need, estimated before anything is allocated, so that an impossible size is a
// clear error at once instead of minutes of swapping or an OOM kill. Figures are float32 bytes.
#pragma once
#include <cstdint>
#include <string>

#include "nn/gpt.h"

namespace headlab::train {

struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double activations = 0;  // one step's peak (training) or one batch's (evaluation)
  double total() const { return parameters + gradients + optimizer_state + activations; }
};

// optimizer_slots: tensors of state per parameter (AdamW 2, SGD with momentum 1); training: whether
// the batch is a training step (saved activations and gradients) or an evaluation (no tape).
// Activations: about 24 x emb_dim floats per token and layer when training (measured peak: 42 MiB
// of an estimated 52 for bench/gpt_step's default config), 12 when not, plus the logits.
MemoryEstimate estimate_memory(const nn::GPTConfig& model, int64_t batch_size, bool training, int optimizer_slots);

// MemAvailable of /proc/meminfo (bytes); 0 when it cannot be read.
double available_memory();

// Fails, naming who asks, the estimate's parts, what the machine has and `advice` (the options to
// change), when the estimate exceeds the available memory.
void check_memory_fits(const MemoryEstimate& need, const std::string& who, const std::string& advice);

}  // namespace headlab::train
