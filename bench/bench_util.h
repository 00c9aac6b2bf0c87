// What the benchmark programs share: GPT-2 small's config, the SGEMM rate (the floor's denominator) and the
// memory read bandwidth (decoding's floor) of the CPU (on the threads OpenMP/OpenBLAS have) or of a GPU,
// each measured here, now.
#pragma once
#include <cblas.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"

namespace headlab::bench {

// GPT-2 small's shape (12 x 12 heads, emb 768, context 1024, vocabulary 50257, qkv bias, tied head): the
// model the GPT-2 benchmarks build with random weights, whose values do not change the cost.
inline nn::DecoderConfig gpt2_small_config() {
  nn::DecoderConfig c;
  c.n_layers = 12, c.n_heads = 12, c.emb_dim = 768, c.context_length = 1024, c.vocab_size = 50257;
  c.qkv_bias = true, c.tie_embeddings = true;
  return c;
}

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// cblas_sgemm at 1024^3 for about a second, its fastest pass: GFLOP/s. The fastest pass is what the cores
// can do; the mean over the second, the measure before, moved with another tenant's load (150-260 GFLOP/s
// within minutes here) and with it every floor.
inline double sgemm_gflops_cpu() {
  const int n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a.data(), n, b.data(), n, 0, c.data(), n);
  };
  run();
  const auto t0 = clock_type::now();
  double fastest = 1e30;
  while (seconds_since(t0) < 1.0) {
    const auto t1 = clock_type::now();
    run();
    fastest = std::min(fastest, seconds_since(t1));
  }
  return 2.0 * n * n * n / fastest / 1e9;
}

// Bytes a decoding step reads where they lie: a weight, or one head's cached keys or values.
struct ByteSpan {
  const void* p;
  size_t bytes;
};

// The rate (GB/s) at which every thread reads `spans` where they lie, each thread its share of each span in turn
// (as the GEMV bands split a weight), the fastest of `passes`: decoding's floor on the very pages it reads, taken
// beside each timed decoding. A fresh 1 GiB buffer (read_bandwidth_cpu) read at 28.5 to 60.1 GB/s within an hour
// on one VM while decoding held its pace: the rate moves with the other tenants of the memory bus and with where the
// pages lie, so the floor is measured on the step's own pages, with the step it bounds.
inline double read_spans_gbps(const std::vector<ByteSpan>& spans, int passes) {
  double total = 0;
  for (const ByteSpan& s : spans) total += double(s.bytes / sizeof(uint32_t) * sizeof(uint32_t));
  std::vector<uint32_t> folds(static_cast<size_t>(omp_get_max_threads()) * 16);
  double best = 1e30;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = clock_type::now();
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      uint32_t acc[64] = {};  // words folded with xor: any bits (a bfloat16 pair may be a float denormal) cost alike
      for (const ByteSpan& s : spans) {
        const int64_t n = int64_t(s.bytes / sizeof(uint32_t)), lo = n * t / nt / 64 * 64,
                      hi = t + 1 == nt ? n : n * (t + 1) / nt / 64 * 64;
        const uint32_t* x = static_cast<const uint32_t*>(s.p);
        int64_t i = lo;
        for (; i + 64 <= hi; i += 64)
#pragma omp simd
          for (int k = 0; k < 64; ++k) acc[k] ^= x[i + k];
        for (; i < hi; ++i) acc[0] ^= x[i];
      }
      uint32_t f = 0;
      for (const uint32_t a : acc) f ^= a;
      folds[static_cast<size_t>(t) * 16] = f;  // one cache line a thread
    }
    best = std::min(best, seconds_since(t0));
  }
  volatile uint32_t sink = folds[0];  // the reads cannot be optimised away
  (void)sink;
  return total / best / 1e9;
}

// The read bandwidth of a fresh buffer (decoding's floor on a GPU's terms; on the CPU printed beside the floor read
// in place), the best of two ways of streaming 1 GiB of float32 (far past every cache) on every thread, each its
// fastest pass: read_spans_gbps over it (each thread its contiguous share, 16 passes), and OpenBLAS's sgemv reading
// it as a 16384 x 16384 matrix against one vector for about half a second, as decoding's matrix-vector products
// read their weights. (One cblas_sdot over 512 MiB, the measure before, gave 18-21 GB/s where GPT-2's decoding
// itself read 32.)
struct ReadBandwidth {
  double sum_gbps = 0, gemv_gbps = 0;
  double best() const { return std::max(sum_gbps, gemv_gbps); }
};

inline ReadBandwidth read_bandwidth_cpu() {
  const int64_t side = 16384, n = side * side;                               // 1 GiB of float
  const std::unique_ptr<float[]> buffer(new float[static_cast<size_t>(n)]);  // untouched until the threads write it
  float* const x = buffer.get();
#pragma omp parallel for schedule(static)  // first touch on the threads that read it
  for (int64_t i = 0; i < n; ++i) x[i] = 1.0f;
  const auto fastest_pass = [&](auto&& pass) {
    pass();
    double best = 1e30;
    const auto t0 = clock_type::now();
    while (seconds_since(t0) < 0.5) {
      const auto t = clock_type::now();
      pass();
      best = std::min(best, seconds_since(t));
    }
    return double(n) * sizeof(float) / best / 1e9;
  };
  ReadBandwidth bw;
  bw.sum_gbps = read_spans_gbps({{x, size_t(n) * sizeof(float)}}, 16);
  std::vector<float> v(static_cast<size_t>(side), 1.0f), y(static_cast<size_t>(side));
  bw.gemv_gbps = fastest_pass(
      [&] { cblas_sgemv(CblasRowMajor, CblasNoTrans, side, side, 1.0f, x, side, v.data(), 1, 0.0f, y.data(), 1); });
  return bw;
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
