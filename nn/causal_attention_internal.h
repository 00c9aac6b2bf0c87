// Internal to nn/'s causal attention files: what the per-head forms (causal_attention.cpp) and the fused
// form (causal_attention_fused.cpp) share, the input check and the rotary embedding of queries and keys.
// B = batch, T = tokens, H = heads, D = head size.
#pragma once
#include <cstdint>

#include "nn/attention.h"

namespace headlab::nn::detail {

// x must be (B, T, d_in) with T <= context_length; throws naming who.
void check_causal_input(const char* who, const Tensor& x, int64_t d_in, int64_t context_length);
// Rotary dims fit a head of head_dim: even, at most head_dim.
void check_rotary(const char* who, const Rotary& r, int64_t head_dim);
// Queries or keys (B, T, H, D) at positions [offset, offset + T) rotated, through `point` (the rotary
// table is computed once per (R, theta, dtype, device) and shared).
Tensor rotate(const Tensor& x, const Rotary& r, int64_t offset, HookPoint point, const HookSite& site);

}  // namespace headlab::nn::detail
