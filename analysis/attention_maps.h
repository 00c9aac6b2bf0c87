// Attention maps: every head's weights for one input.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Attention maps for one input.
struct AttentionMaps {
  std::vector<int64_t> ids;                     // (T) the input
  int64_t layers = 0, heads = 0, T = 0;         // heads: the original n_heads
  std::vector<float> weights;                   // (layers, heads, T, T); NaN for pruned heads
  std::vector<std::vector<int64_t>> kept;       // per layer, the original indices present
};
AttentionMaps attention_maps(nn::GPTModel& model, const std::vector<int64_t>& ids);

}  // namespace headlab::analysis
