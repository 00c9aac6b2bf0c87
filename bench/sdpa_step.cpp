// One causal scaled_dot_product_attention call, forward alone (no tape) and forward + backward, on
// (B, H, T, D) float32 inputs laid out as (B, T, H, D) projections, fused kernel, composite path or the
// automatic choice between them (set_fused_attention), on
// the CPU or a GPU; bench/torch_sdpa_peer.py times torch's F.scaled_dot_product_attention the same
// way. Medians of --repeats runs after 3 warm-ups, each ending with a device synchronisation; GFLOP/s
// count the work needed (2 products forward, 5 with backward's recomputation, 2*B*H*T*T*D flops each,
// halved by the mask); peak is the backend's bytes above the inputs over a forward + backward.
// Usage: sdpa_step [--device cpu|cuda] [--form fused|composite|auto] [--B 8 --H 12 --T 1024 --D 64] [--repeats 20]
//                  [--deterministic 0|1] (set_deterministic_attention: dQ in its own pass, no atomics)
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "bench/bench_util.h"
#include "ops/ops.h"

using namespace headlab;
using headlab::bench::clock_type;
using headlab::bench::seconds_since;

int main(int argc, char** argv) {
  prepare_process(argv);
  Device device = kCPU;
  std::string form = "fused";
  int64_t B = 8, H = 12, T = 1024, D = 64;
  int repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device")
      device = Device::parse(v);
    else if (k == "--form")
      form = v;
    else if (k == "--B")
      B = std::stoll(v);
    else if (k == "--H")
      H = std::stoll(v);
    else if (k == "--T")
      T = std::stoll(v);
    else if (k == "--D")
      D = std::stoll(v);
    else if (k == "--repeats")
      repeats = std::stoi(v);
    else if (k == "--deterministic")
      set_deterministic_attention(v == "1");
    else {
      std::fprintf(stderr, "sdpa_step: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (form != "fused" && form != "composite" && form != "auto") {
    std::fprintf(stderr, "sdpa_step: --form must be fused, composite or auto, got %s\n", form.c_str());
    return 2;
  }
  set_fused_attention(form == "fused" ? FusedAttention::always : FusedAttention::automatic);
  try {
    Generator g(1);
    const auto input = [&] { return randn({B, T, H, D}, g).to(device).transpose(1, 2).detach().requires_grad_(); };
    Tensor q = input(), k = input(), v = input();
    const Tensor dout = randn({B, H, T, D}, g).to(device);
    Backend& be = backend_for(device);
    const auto attend = [&] {
      return form == "composite" ? scaled_dot_product_attention_composite(q, k, v, AttentionMask::causal())
                                 : scaled_dot_product_attention(q, k, v, AttentionMask::causal());
    };
    const auto forward = [&] {
      const NoGradGuard no_grad;
      (void)attend();
      be.synchronize();
    };
    const auto step = [&] {
      q.zero_grad(), k.zero_grad(), v.zero_grad();
      attend().backward(dout);
      be.synchronize();
    };
    const auto median_ms = [&](auto&& f) {
      for (int i = 0; i < 3; ++i) f();
      std::vector<double> t;
      for (int i = 0; i < repeats; ++i) {
        const auto t0 = clock_type::now();
        f();
        t.push_back(seconds_since(t0) * 1e3);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const double fwd = median_ms(forward);
    const size_t live = be.bytes_in_use();
    be.reset_peak();
    const double both = median_ms(step);
    const double peak = double(be.peak_bytes() - live) / 1048576.0;
    const double unit = 2.0 * B * H * T * T * D / 2 / 1e9;  // one causal product, GFLOP
    std::printf(
        "headlab sdpa %s%s device=%s B=%lld H=%lld T=%lld D=%lld causal float32: forward %.3f ms (%.0f GFLOP/s), "
        "forward+backward %.3f ms (%.0f GFLOP/s), peak %.1f MiB\n",
        form.c_str(), deterministic_attention() ? " deterministic" : "", device.str().c_str(), (long long)B,
        (long long)H, (long long)T, (long long)D, fwd, 2 * unit / fwd * 1e3, both, 7 * unit / both * 1e3, peak);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sdpa_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
