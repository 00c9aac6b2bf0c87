// Text generation with a decoder (nn/decoder.h), as the book's generate(): token by token, past context_length
// only the last context_length tokens are seen; greedy at temperature 0, otherwise sampled from
// softmax(logits / temperature) over the top k.
#pragma once
#include <cstdint>
#include <vector>

#include "nn/decoder.h"

namespace headlab::nn {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 0.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: all tokens
  int64_t end_id = -1;       // stop once this token is generated; -1: none
  bool keep_end = false;     // return the end token too (it is dropped by default)
  uint64_t seed = 0;         // sampling only
  // Prompt tokens per forward when filling the key/value cache: a long prompt's activations then take this
  // many rows (memory), while its GEMMs keep their rate. 0: the whole prompt at once.
  int64_t prefill_chunk = 512;
};

// The new tokens after `prompt` (at most max_new_tokens). The model
// runs in eval mode without gradients; its mode is restored afterwards.
std::vector<int64_t> generate(DecoderModel& model, const std::vector<int64_t>& prompt, const GenerateOptions& options);

}  // namespace headlab::nn
