// The fused scaled_dot_product_attention against its composite peer (matmul, causal_softmax,
// matmul: what CausalMultiHeadAttention ran before), causal, float32, on (B, H, T, D) =
// (8, 8, 256, 32), (32, 4, 64, 32), (8, 8, 1024, 32) and GPT-2's prefill (1, 12, 1024, 64), forward alone (no tape) and
// forward + backward, with 1 and 2 OpenMP threads. Counters: GFLOP/s of the work needed (2 GEMMs forward, 4 backward,
// 2*B*H*T*T*D flops each, halved by the causal mask), and the CPU backend's bytes: saved_MiB (held between forward and
// backward: what the tape keeps) and peak_MiB (over the step, above what the inputs take). BM_memory runs T = 256, 512,
// 1024 to show the slope of both.
//   build: cmake --build build --target bench_attention; run: build/bench/bench_attention
#include <benchmark/benchmark.h>
#include <omp.h>

#include <array>

#include "backends/backend.h"
#include "ops/ops.h"

using namespace headlab;

namespace {

struct Inputs {
  Tensor q, k, v, dout;
};

// q, k, v: (B, H, T, D) views of (B, T, H, D) projections, as the multi-head module hands them over.
Inputs make_inputs(int64_t B, int64_t H, int64_t T, int64_t D, bool grad) {
  Generator g(1);
  Inputs in;
  in.q = randn({B, T, H, D}, g).transpose(1, 2).detach();
  in.k = randn({B, T, H, D}, g).transpose(1, 2).detach();
  in.v = randn({B, T, H, D}, g).transpose(1, 2).detach();
  in.dout = randn({B, H, T, D}, g);
  if (grad) {
    in.q.requires_grad_();
    in.k.requires_grad_();
    in.v.requires_grad_();
  }
  return in;
}

Tensor attend(bool fused, const Inputs& in) {
  if (!fused) return scaled_dot_product_attention_composite(in.q, in.k, in.v, AttentionMask::causal());
  set_fused_attention(FusedAttention::always);  // the kernel itself, wherever the automatic choice would go
  Tensor out = scaled_dot_product_attention(in.q, in.k, in.v, AttentionMask::causal());
  set_fused_attention(FusedAttention::automatic);
  return out;
}

constexpr double kMiB = 1.0 / (1024.0 * 1024.0);

// args: B, H, T, D, threads
template <bool Fused, bool Backward>
void BM_attention(benchmark::State& state) {
  const int64_t B = state.range(0), H = state.range(1), T = state.range(2), D = state.range(3);
  const int prev_threads = omp_get_max_threads();
  omp_set_num_threads(static_cast<int>(state.range(4)));
  Inputs in = make_inputs(B, H, T, D, Backward);
  Backend& be = cpu_backend();
  size_t saved = 0, peak = 0;
  for (auto _ : state) {
    const size_t base = be.bytes_in_use();
    be.reset_peak();
    if (Backward) {
      Tensor out = attend(Fused, in);
      saved = be.bytes_in_use() - base - static_cast<size_t>(out.numel()) * 4;  // the tape's share
      out.backward(in.dout);
      in.q.zero_grad();
      in.k.zero_grad();
      in.v.zero_grad();
    } else {
      NoGradGuard no_grad;
      Tensor out = attend(Fused, in);
      benchmark::DoNotOptimize(out.raw_data());
    }
    peak = be.peak_bytes() - base;
  }
  omp_set_num_threads(prev_threads);
  const double flops = (Backward ? 12.0 : 4.0) * B * H * T * (T + 1) / 2.0 * D;
  state.counters["GFLOP/s"] =
      benchmark::Counter(1e-9 * flops * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_MiB"] = static_cast<double>(peak) * kMiB;
  if (Backward) state.counters["saved_MiB"] = static_cast<double>(saved) * kMiB;
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (auto [B, H, T, D] :
         {std::array<int64_t, 4>{8, 8, 256, 32}, {32, 4, 64, 32}, {8, 8, 1024, 32}, {1, 12, 1024, 64}})
      b->Args({B, H, T, D, threads});
  b->ArgNames({"B", "H", "T", "D", "threads"});
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.3);
}

// Where the fused kernel starts to pay against the composite path: 2048 tokens (B = 2048 / T),
// H = 4, T = 32 to 256, D = 32 and 64, 1 and 2 threads; forward + backward only.
void crossover_shapes(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2})
    for (int64_t D : {32, 64})
      for (int64_t T : {32, 64, 96, 128, 192, 256}) b->Args({2048 / T, 4, T, D, threads});
  b->ArgNames({"B", "H", "T", "D", "threads"});
  b->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.2);
}

// Bytes only (one forward + backward each): T = 256, 512, 1024 at B = 8, H = 8, D = 32, 2 threads.
template <bool Fused>
void BM_memory(benchmark::State& state) {
  BM_attention<Fused, true>(state);
}

void memory_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t T : {256, 512, 1024}) b->Args({8, 8, T, 32, 2});
  b->ArgNames({"B", "H", "T", "D", "threads"});
  b->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(1);
}

}  // namespace

BENCHMARK(BM_attention<true, false>)->Name("fused/forward")->Apply(shapes);
BENCHMARK(BM_attention<false, false>)->Name("composite/forward")->Apply(shapes);
BENCHMARK(BM_attention<true, true>)->Name("fused/fwd+bwd")->Apply(shapes);
BENCHMARK(BM_attention<false, true>)->Name("composite/fwd+bwd")->Apply(shapes);
BENCHMARK(BM_attention<true, true>)->Name("crossover/fused")->Apply(crossover_shapes);
BENCHMARK(BM_attention<false, true>)->Name("crossover/composite")->Apply(crossover_shapes);
BENCHMARK(BM_memory<true>)->Name("fused/memory")->Apply(memory_shapes);
BENCHMARK(BM_memory<false>)->Name("composite/memory")->Apply(memory_shapes);

BENCHMARK_MAIN();
