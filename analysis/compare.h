// headlab compare: wrapper vs fused multi-head attention, same weights, timed.
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
// wrapper's weights (wrapper_to_fused), so the outputs must agree.
struct CompareConfig {
  std::string name;
  int64_t B = 0, T = 0, d_in = 0, d_out = 0, heads = 0;
};
// "name,B,T,d_in,d_out,heads", as the PyTorch peer's --config.
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
  double max_abs_out = 0, max_abs_dx = 0;               // fused vs wrapper, same weights, same input (and dL/dy)
  std::optional<PeerTimes> torch_wrapper, torch_fused;  // when the peer ran
  std::string torch_version;
};
// FLOPs of one forward of either form: projections 2*B*T*d_in*3*d_out + scores and context
// 2 * 2*B*T*T*d_out + out_proj 2*B*T*d_out*d_out. A backward costs twice the forward.
double attention_flops_forward(const CompareConfig& c);
CompareResult compare_attention(const CompareConfig& config, const CompareOptions& options);
// Reads one line of bench/torch_mha_peer.py's output (JSON: name, sizes, wrapper/fused ->
// forward/forward_backward -> median/p25/p75 in ms) into r's torch fields; the sizes must be r's.
void attach_torch_peer(CompareResult& r, const std::string& json_line);

}  // namespace headlab::analysis
