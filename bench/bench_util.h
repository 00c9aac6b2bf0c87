// What the benchmark programs share: GPT-2 small's config, the SGEMM rate (the floor's denominator) and the
// memory read bandwidth (decoding's floor) of the CPU (on the threads OpenMP/OpenBLAS have) or of a GPU,
// each measured here, now.
#pragma once
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <vector>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "nn/gpt.h"
#include "ops/ops.h"

namespace headlab::bench {

// GPT-2 small's shape (12 x 12 heads, emb 768, context 1024, vocabulary 50257, qkv bias, tied head): the
// model the GPT-2 benchmarks build with random weights, whose values do not change the cost.
inline nn::GPTConfig gpt2_small_config() {
  nn::GPTConfig c;
  c.n_layers = 12, c.n_heads = 12, c.emb_dim = 768, c.context_length = 1024, c.vocab_size = 50257;
  c.qkv_bias = true, c.tie_embeddings = true;
  return c;
}

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// cblas_sgemm at 1024^3 for about a second: GFLOP/s.
inline double sgemm_gflops_cpu() {
  const int n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a.data(), n, b.data(), n, 0, c.data(), n);
  };
  run();
  const auto t0 = clock_type::now();
  int reps = 0;
  while (seconds_since(t0) < 1.0) {
    run();
    ++reps;
  }
  return 2.0 * n * n * n / (seconds_since(t0) / reps) / 1e9;
}

// Reading a 512 MiB buffer (a dot product through OpenBLAS, threaded as the model's GEMVs are): GB/s.
inline double read_gbytes_per_s() {
  const size_t n = size_t(128) << 20;  // floats
  std::vector<float> x(n, 1.0f);
  volatile float sink = cblas_sdot(static_cast<int>(n), x.data(), 1, x.data(), 1);
  const auto t0 = clock_type::now();
  int reps = 0;
  while (seconds_since(t0) < 1.0) {
    sink = cblas_sdot(static_cast<int>(n), x.data(), 1, x.data(), 1);
    ++reps;
  }
  (void)sink;
  return double(n) * sizeof(float) * reps / seconds_since(t0) / 1e9;
}

// The device's float32 GEMM rate through headlab's matmul (cuBLAS on a GPU) at 4096^3 for about a second.
inline double sgemm_gflops_device(Device device) {
  const int64_t n = 4096;
  const NoGradGuard no_grad;
  const Tensor a = ones({n, n}).to(device), b = full({n, n}, 0.5).to(device);
  Backend& be = backend_for(device);
  (void)matmul(a, b);
  be.synchronize();
  const auto t0 = clock_type::now();
  int reps = 0;
  while (seconds_since(t0) < 1.0) {
    (void)matmul(a, b);
    be.synchronize();
    ++reps;
  }
  return 2.0 * n * n * n / (seconds_since(t0) / reps) / 1e9;
}

// The device's read bandwidth: a sum over 1 GiB of float32 (one pass, headlab's reduction) for about a second.
inline double read_gbytes_per_s_device(Device device) {
  const int64_t n = int64_t(256) << 20;
  const NoGradGuard no_grad;
  const Tensor x = ones({n}, DType::f32, device);
  Backend& be = backend_for(device);
  (void)sum(x);
  be.synchronize();
  const auto t0 = clock_type::now();
  int reps = 0;
  while (seconds_since(t0) < 1.0) {
    (void)sum(x);
    be.synchronize();
    ++reps;
  }
  return double(n) * sizeof(float) * reps / seconds_since(t0) / 1e9;
}

}  // namespace headlab::bench
