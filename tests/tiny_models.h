// The tiny GPTs the suites build: three sizes (each the smallest that gives its tests what they need),
// the two attention forms, with and without qkv_bias, and pruned kept_heads. Configs only, so that a
// test picks its own seed and dtype; headlab::core is all it needs (the CUDA suites use it too).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"

namespace headlab::testing {

// The sizes of a tiny GPT; vocab_size and context_length are usually a task's.
struct TinyGpt {
  int64_t vocab_size, context_length, emb_dim, n_heads, n_layers;

  // The same model width for another vocabulary and context.
  constexpr TinyGpt sized_for(int64_t vocab, int64_t context) const {
    return {vocab, context, emb_dim, n_heads, n_layers};
  }
};

// 2 layers of 2 heads of size 4: the smallest with more than one of each (names, checkpoints).
inline constexpr TinyGpt kTwoHeadGpt{13, 10, 8, 2, 2};
// 2 layers of 3 heads of size 8: an odd head count that prunes unevenly (kPrunedHeads).
inline constexpr TinyGpt kThreeHeadGpt{13, 10, 24, 3, 2};
// 2 layers of 4 heads of size 8: wide enough to learn a toy task in 150 steps (analysis, explorer).
inline constexpr TinyGpt kFourHeadGpt{13, 12, 32, 4, 2};

// The original heads a pruned kThreeHeadGpt keeps: two in layer 0, one in layer 1.
inline const std::vector<std::vector<int64_t>> kPrunedHeads = {{0, 2}, {1}};
// The same counts with other heads, for the other attention form.
inline const std::vector<std::vector<int64_t>> kPrunedHeadsOther = {{1}, {0, 2}};

// A tiny GPT of sizes `s` in one attention form; drop_rate 0 and every head kept unless the caller
// sets them on the result.
inline nn::GPTConfig tiny_gpt_config(const TinyGpt& s, nn::AttentionForm form = nn::AttentionForm::fused,
                                     bool qkv_bias = false) {
  nn::GPTConfig c;
  c.vocab_size = s.vocab_size;
  c.context_length = s.context_length;
  c.emb_dim = s.emb_dim;
  c.n_heads = s.n_heads;
  c.n_layers = s.n_layers;
  c.attention = form;
  c.qkv_bias = qkv_bias;
  return c;
}

// A pruned copy of c keeping `kept` (original head indices per layer).
inline nn::GPTConfig pruned(nn::GPTConfig c, std::vector<std::vector<int64_t>> kept) {
  c.kept_heads = std::move(kept);
  return c;
}

// Every form a head-level computation must handle, by name: fused, wrapper, and both pruned (fused
// keeping kPrunedHeads, wrapper kPrunedHeadsOther); a kThreeHeadGpt-like size (3 heads, 2 layers).
inline std::vector<std::pair<std::string, nn::GPTConfig>> tiny_gpt_forms(const TinyGpt& s, bool qkv_bias = false) {
  using nn::AttentionForm;
  return {{"fused", tiny_gpt_config(s, AttentionForm::fused, qkv_bias)},
          {"wrapper", tiny_gpt_config(s, AttentionForm::wrapper, qkv_bias)},
          {"pruned fused", pruned(tiny_gpt_config(s, AttentionForm::fused, qkv_bias), kPrunedHeads)},
          {"pruned wrapper", pruned(tiny_gpt_config(s, AttentionForm::wrapper, qkv_bias), kPrunedHeadsOther)}};
}

}  // namespace headlab::testing
