// A GPT's forward with named hook points, TransformerLens's names and shapes: read any activation
// (run_with_cache keeps only the names asked for, the memory complaint of TransformerLens users) or
// replace it (run_with_hooks). The forward is written out from the model's own modules and weights,
// per block: resid_pre -> LayerNorm -> q, k, v per head -> causal softmax pattern -> z per head ->
// out_proj -> attn_out; resid_mid -> LayerNorm -> MLP -> mlp_out; resid_post. It equals
// GPTModel::forward in eval mode (tests); dropout and the model's head controls are not applied.
//
// Hook points (B = rows, T = tokens, C = emb_dim, H = the layer's heads, D = head size):
//   hook_embed                      (B, T, C)  token + position embeddings, the stream entering block 0
//   blocks.{l}.hook_resid_pre       (B, T, C)
//   blocks.{l}.attn.hook_q/k/v      (B, T, H, D)
//   blocks.{l}.attn.hook_pattern    (B, H, T, T)  softmax weights, query x key
//   blocks.{l}.attn.hook_z          (B, T, H, D)  each head's weighted values, before out_proj
//   blocks.{l}.attn.hook_result     (B, T, H, C)  each head's output, its share of attn_out (computed only
//                                                 when cached or hooked: H times attn_out's memory)
//   blocks.{l}.hook_attn_out        (B, T, C)
//   blocks.{l}.hook_resid_mid       (B, T, C)  not in attention-only models
//   blocks.{l}.hook_mlp_out         (B, T, C)  not in attention-only models
//   blocks.{l}.hook_resid_post      (B, T, C)
//   ln_final.hook_normalized        (B, T, C)
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "nn/gpt.h"

namespace headlab::analysis {

// Every hook point of the model, in the order the forward reaches them.
std::vector<std::string> hook_names(const nn::GPTModel& model);

// Called with the hook's name and the activation; returns the activation to go on with (the same
// shape and dtype), or an undefined Tensor to go on with the argument (which the hook may have edited in
// place: it is the forward's own tensor).
using Hook = std::function<Tensor(const std::string& name, const Tensor& activation)>;

struct HookedRun {
  Tensor logits;                        // (B, T, vocab_size)
  std::map<std::string, Tensor> cache;  // the names asked for, as the forward went on with them
};

// tokens: (B, T) int64. cache: names to keep; hooks: names to call. Unknown names are refused, naming
// the name and where the list is (hook_names). Runs without a tape.
HookedRun run_hooked(nn::GPTModel& model, const Tensor& tokens, const std::set<std::string>& cache = {},
                     const std::map<std::string, Hook>& hooks = {});

}  // namespace headlab::analysis
