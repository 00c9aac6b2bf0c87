// What a run will need, estimated before anything is allocated, so that an impossible size is a
// clear error at once instead of minutes of swapping or an OOM kill. Figures are float32 bytes.
#pragma once
#include <cstdint>
#include <string>

#include "base/sizes.h"  // available_memory, format_bytes
#include "train/config.h"

namespace headlab::train {

struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double activations = 0;  // one step's peak (training) or one batch's (evaluation)
  double data = 0;         // token ids held at once: evaluation batches, a generated sequence
  double total() const { return parameters + gradients + optimizer_state + activations + data; }
};

// A model (its config section: io/families.h) on batch_size rows of `tokens` tokens. optimizer_slots: tensors
// of state per parameter (AdamW 2, SGD with momentum 1); training: whether the batch is a training step
// (saved activations and gradients) or an evaluation (no tape). Activations: the family's estimate per
// token (nn::ModelFamily::activation_floats).
MemoryEstimate estimate_memory(const nlohmann::json& model, int64_t batch_size, int64_t tokens, bool training,
                               int optimizer_slots);

// The token ids of `batches` evaluation batches of batch_size x tokens, all held at once (a
// tasks::Batch keeps int64 inputs and targets, an encoder-decoder's its source too: 4 ids a position
// covers both). In double, so that no user's number overflows on the way to the comparison.
double estimate_batches_memory(int64_t batches, int64_t batch_size, int64_t tokens);

// Generating new_tokens after a prompt of prompt_tokens with a key/value cache: the model, one forward over
// a chunk of at most prefill_chunk prompt tokens (and the context), the cache of every token the window
// holds, and the growing sequence (the ids and the generated copy, int64 each).
MemoryEstimate estimate_generation_memory(const nlohmann::json& model, int64_t prompt_tokens, int64_t new_tokens,
                                          int64_t prefill_chunk);
// check_memory_fits for that and `also` bytes the caller allocates besides (attention's maps), naming who
// and --max-new-tokens (on a GPU only the host's sequence counts).
void check_generation_fits(const nlohmann::json& model, bool on_cuda, int64_t prompt_tokens, int64_t new_tokens,
                           int64_t prefill_chunk, const std::string& who, double also = 0);

// Fails, naming who asks, the estimate's parts, what the machine has and `advice` (the options to
// change), when the estimate exceeds the available memory.
void check_memory_fits(const MemoryEstimate& need, const std::string& who, const std::string& advice);

// check_memory_fits for evaluating `batches` batches of batch_size rows of config's model, all held at
// once: their ids, and one batch's forward (on the CPU).
// tokens: per row (0: config.batch_tokens()).
void check_evaluation_fits(const RunConfig& config, bool on_cuda, int64_t batches, int64_t batch_size,
                           const std::string& who, const std::string& advice, int64_t tokens = 0);

}  // namespace headlab::train
