// headlab::matmul / linear against cblas_sgemm called directly on the same buffers: the peer and
// the floor for the op layer's overhead (shape checks, output allocation, dispatch, batching).
// Square M = N = K (512, 1024), a batched (8, 256, 64) @ (8, 64, 256), and a linear forward
// (64*64, 128) x (512, 128)^T + bias; and on one thread, the toy GPT step's and GPT-2's products through
// backends/cpu/blas.h (libxsmm where it serves) against cblas_sgemm. GFLOP/s = 2 M N K per product over
// wall time.
//   build: cmake --build build --target bench; run: OMP_NUM_THREADS=2 build/bench/bench_matmul
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <cstring>

#include <vector>

#include "backends/cpu/blas.h"
#include "ops/ops.h"

using namespace headlab;

namespace {

void report_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] = benchmark::Counter(1e-9 * flops_per_iteration * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
}

// ---- square: (n, n) @ (n, n) ----
void BM_headlab_matmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  Generator gen(1);
  const Tensor a = randn({n, n}, gen), b = randn({n, n}, gen);
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  report_flops(state, 2.0 * n * n * n);
}

void BM_cblas_sgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  Generator gen(1);
  const Tensor a = randn({n, n}, gen), b = randn({n, n}, gen), c = zeros({n, n});
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                c.data<float>(), n);
    benchmark::DoNotOptimize(c.raw_data());
  }
  report_flops(state, 2.0 * n * n * n);
}

// ---- batched: (8, 256, 64) @ (8, 64, 256) ----
constexpr int64_t kB = 8, kM = 256, kK = 64, kN = 256;

void BM_headlab_matmul_batched(benchmark::State& state) {
  Generator gen(2);
  const Tensor a = randn({kB, kM, kK}, gen), b = randn({kB, kK, kN}, gen);
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  report_flops(state, 2.0 * kB * kM * kN * kK);
}

void BM_cblas_sgemm_batched(benchmark::State& state) {  // one threaded sgemm per matrix
  Generator gen(2);
  const Tensor a = randn({kB, kM, kK}, gen), b = randn({kB, kK, kN}, gen), c = zeros({kB, kM, kN});
  for (auto _ : state) {
    for (int64_t i = 0; i < kB; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kM, kN, kK, 1.0f, a.data<float>() + i * kM * kK, kK,
                  b.data<float>() + i * kK * kN, kN, 0.0f, c.data<float>() + i * kM * kN, kN);
    benchmark::DoNotOptimize(c.raw_data());
  }
  report_flops(state, 2.0 * kB * kM * kN * kK);
}

// ---- linear: x (64*64, 128), weight (512, 128), bias (512) ----
constexpr int64_t kRows = 64 * 64, kIn = 128, kOut = 512;

void BM_headlab_linear(benchmark::State& state) {
  Generator gen(3);
  const Tensor x = randn({kRows, kIn}, gen), w = randn({kOut, kIn}, gen), bias = randn({kOut}, gen);
  for (auto _ : state) {
    Tensor y = linear(x, w, bias);
    benchmark::DoNotOptimize(y.raw_data());
  }
  report_flops(state, 2.0 * kRows * kIn * kOut);
}

void BM_cblas_linear(benchmark::State& state) {  // the same work by hand: rows of bias, then beta = 1
  Generator gen(3);
  const Tensor x = randn({kRows, kIn}, gen), w = randn({kOut, kIn}, gen), bias = randn({kOut}, gen);
  const Tensor y = zeros({kRows, kOut});
  for (auto _ : state) {
    float* py = y.data<float>();
    for (int64_t r = 0; r < kRows; ++r) std::memcpy(py + r * kOut, bias.data<float>(), kOut * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, kOut, kIn, 1.0f, x.data<float>(), kIn, w.data<float>(),
                kIn, 1.0f, py, kOut);
    benchmark::DoNotOptimize(y.raw_data());
  }
  report_flops(state, 2.0 * kRows * kIn * kOut);
}

// ---- one thread, the toy GPT step's products and GPT-2's (one_thread_shapes) ----
// blas_gemm (libxsmm where it serves, backends/cpu/xsmm_gemm.cpp) against cblas_sgemm, both on the calling
// thread (OpenMP's team set to one for the run: OpenBLAS's OpenMP build would otherwise take every thread).
// Args: ta, tb, M, N, K of row-major C (M, N) = op(A) op(B).
template <bool kViaBlasGemm>
void BM_one_thread_gemm(benchmark::State& state) {
  struct OneThread {
    int before = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(before); }
  } one_thread;
  const bool ta = state.range(0) != 0, tb = state.range(1) != 0;
  const int64_t M = state.range(2), N = state.range(3), K = state.range(4);
  Generator gen(4);
  const Tensor a = randn({M * K}, gen), b = randn({K * N}, gen), c = zeros({M * N});
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  for (auto _ : state) {
    if constexpr (kViaBlasGemm)
      cpu::blas_gemm<float>(ta, tb, M, N, K, 1.0f, a.data<float>(), lda, b.data<float>(), ldb, 0.0f, c.data<float>(),
                            N);
    else
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                  a.data<float>(), lda, b.data<float>(), ldb, 0.0f, c.data<float>(), N);
    benchmark::DoNotOptimize(c.raw_data());
  }
  report_flops(state, 2.0 * M * N * K);
}

// The toy GPT step's products (each data-parallel thread's: 1024 rows of d = 128, FF 512), then each thread's
// products past L2 at GPT-2 small's shape (an exact sweep's 120-240 rows, prefill's bands, the LM head) and the
// long config's (d 256 over 2,048 rows).
void one_thread_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ta", "tb", "M", "N", "K"});
  for (const auto& s :
       std::vector<std::vector<int64_t>>{{0, 1, 1024, 128, 128},    // x W^T
                                         {0, 1, 1024, 512, 128},    // FF up
                                         {0, 0, 1024, 128, 512},    // dX through FF down
                                         {1, 0, 128, 128, 1024},    // dW = dY^T x
                                         {1, 0, 512, 128, 1024},    // dW of FF up
                                         {1, 0, 128, 512, 1024},    // dW of FF down
                                         {0, 1, 64, 64, 32},        // attention's tiles (T 64, D 32): Q K^T
                                         {0, 0, 64, 32, 64},        // P V, dS K
                                         {1, 0, 64, 32, 64},        // P^T dO, dS^T Q
                                         {0, 1, 240, 1152, 768},    // GPT-2: x W_QKV^T
                                         {0, 1, 240, 384, 768},     // x W_O^T
                                         {0, 1, 240, 1536, 768},    // x W_up^T
                                         {0, 1, 240, 384, 3072},    // x W_down^T
                                         {0, 1, 120, 1536, 768},    // fewer rows
                                         {0, 0, 240, 384, 2304},    // dX through W_QKV
                                         {0, 0, 240, 1536, 768},    // dX through W_down
                                         {0, 0, 120, 1536, 768},    // fewer rows
                                         {0, 1, 512, 768, 768},     // prefill's bands of rows
                                         {0, 0, 512, 768, 3072},    // prefill's bands of rows, backward
                                         {0, 1, 1024, 1152, 768},   // prefill's bands of columns
                                         {0, 1, 1024, 1536, 768},   // prefill's bands of columns
                                         {0, 0, 1024, 1536, 768},   // prefill's bands of columns, backward
                                         {0, 1, 1024, 25129, 768},  // the LM head's half
                                         {0, 1, 2048, 768, 256},    // the long config (d 256): x W_QKV^T
                                         {0, 1, 2048, 1024, 256},   // its FF up
                                         {0, 0, 2048, 256, 1024},   // dX through its FF down
                                         {1, 0, 256, 1024, 2048},   // its dW of FF up
                                         {0, 0, 1024, 1024, 1024},  // square
                                         {0, 0, 2048, 2048, 2048}})
    b->Args(s);
}

}  // namespace

BENCHMARK(BM_one_thread_gemm<true>)
    ->Apply(one_thread_shapes)
    ->Name("BM_blas_gemm_one_thread")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_one_thread_gemm<false>)
    ->Apply(one_thread_shapes)
    ->Name("BM_cblas_sgemm_one_thread")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_headlab_matmul)->Arg(512)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cblas_sgemm)->Arg(512)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_headlab_matmul_batched)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cblas_sgemm_batched)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_headlab_linear)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_cblas_linear)->UseRealTime()->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
