// Internal to nn/'s attention files: the head control's checks and its application to head contexts,
// and what head surgery shares (the rows a head owns, a new module made like another, a Linear's size).
// B = batch, H = heads, T = tokens, D = head size.
#pragma once
#include <vector>

#include "nn/attention.h"

namespace headlab::nn::detail {

void check_given_context(const char* who, const Tensor& given, int64_t B, int64_t H, int64_t T, int64_t D);
// Gates (H), (B, H) or (B, H, T) and offsets (H, D), (B, H, D) or (B, H, T, D) for a context (B, H, T, D).
void check_control(const char* who, const Tensor& gates, const Tensor& offsets, int64_t B, int64_t H, int64_t T,
                   int64_t D);
// Gates and offsets as views that broadcast against the context (B, H, T, D).
Tensor gates_4d(const Tensor& g, int64_t B, int64_t H, int64_t T);
Tensor offsets_4d(const Tensor& o, int64_t B, int64_t H, int64_t D);
// ctx: (B, H, T, D) -> gates * ctx + offsets (gates_arg, when defined, instead of hc.gates); keeps the
// ungated context in hc.context when hc.keep_context.
Tensor apply_head_control(const char* who, const Tensor& ctx, HeadControl& hc, const Tensor& gates_arg);
// Rows [h*D, (h+1)*D) of every kept head h, as an index tensor: the heads' rows of a (H*D, in)
// projection, or their columns of an (out, H*D) output projection.
Tensor head_rows(const std::vector<int64_t>& keep, int64_t D, Device device);
// A freshly built module made to match `src`: its dtype (from its first parameter), device and mode.
void like(Module& dst, const Module& src);
// What Linear(in, out, bias) holds.
double linear_parameters(int64_t in, int64_t out, bool bias);

}  // namespace headlab::nn::detail
