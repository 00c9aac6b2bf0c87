// headlab compare: wrapper vs fused causal attention (multi-head, grouped-query, multi-query), same weights, timed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/stats.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Wrapper vs fused multi-head attention (headlab compare). A config is the book's:
// wrapper = `heads` CausalAttention heads of width d_out/heads with out_proj (d_out -> d_out);
// fused = CausalMultiHeadAttention d_in -> d_out with `heads` heads; the fused module holds the
// wrapper's weights (wrapper_to_fused), so the outputs must agree. With kv_heads, both are grouped-query: the
// wrapper's heads of a group share one W_key/W_value module, the fused W_key/W_value have kv_heads heads.
struct CompareConfig {
  std::string name;
  int64_t B = 0, T = 0, d_in = 0, d_out = 0, heads = 0;
  int64_t kv_heads = 0;  // 0: multi-head (as many as heads); a divisor of heads: grouped-query; 1: multi-query
  int64_t kv() const { return kv_heads ? kv_heads : heads; }
};
// "name,B,T,d_in,d_out,heads[,kv_heads]", as the PyTorch peer's --config.
CompareConfig parse_compare_config(const std::string& spec);
// The peer's default grid (torch_mha_cpu.py): seed-toy, small, medium, gpt2-ctx256.
std::vector<CompareConfig> peer_compare_grid();

struct CompareOptions {
  Device device = kCPU;
  int64_t warmup = 2, repeats = 10;
  uint64_t seed = 0;
};
struct FormMeasurement {
  int64_t params = 0;
  double flops_forward = 0, flops_backward = 0;         // GEMM FLOPs (2 per multiply-add); f+b = both
  TimeStats forward, forward_backward;                  // forward under no-grad; f+b: loss = sum(y), backward
  int64_t peak_forward = 0, peak_forward_backward = 0;  // bytes: backend peak during the call above what was live
};
// The PyTorch eager peer's times for one form of the same config (bench/torch_mha_peer.py).
struct PeerTimes {
  TimeStats forward, forward_backward;
};
struct CompareResult {
  CompareConfig config;
  FormMeasurement wrapper, fused;
  int64_t kv_cache_bytes_per_token = 0;    // what one token adds to a float32 key/value cache: 2 * kv * head size * 4
  double max_abs_out = 0, max_abs_dx = 0;  // fused vs wrapper, same weights, same input (and dL/dy)
  std::optional<PeerTimes> torch_wrapper, torch_fused;  // when the peer ran
  std::string torch_version;
};
// FLOPs of one forward: projections 2*B*T*d_in*(d_out + 2*kv*D) + scores and context 2 * 2*B*T*T*d_out + out_proj
// 2*B*T*d_out*d_out (D = d_out / heads). per_head_keys (the wrapper): every head projects its group's keys and
// values itself, 2*B*T*d_in*3*d_out. A backward costs twice the forward.
double attention_flops_forward(const CompareConfig& c, bool per_head_keys = false);
CompareResult compare_attention(const CompareConfig& config, const CompareOptions& options);
// Reads one line of bench/torch_mha_peer.py's output (JSON: name, sizes, wrapper/fused ->
// forward/forward_backward -> median/p25/p75 in ms) into r's torch fields; the sizes must be r's.
void attach_torch_peer(CompareResult& r, const std::string& json_line);

}  // namespace headlab::analysis
