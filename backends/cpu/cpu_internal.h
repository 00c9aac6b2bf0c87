// Internal to the CPU backend: the dtype-dispatch helpers and the CpuBackend class (memory accounting
// inline here), whose kernels are defined in cpu_backend.cpp (elementwise, reductions, GEMM, randomness,
// gather/scatter), cpu_nn.cpp (softmax family, layer norm, dropout, cross entropy, optimizers) and
// cpu_attention.cpp (fused scaled-dot-product attention), cpu_sparse.cpp (sparse rows: top-k, gather, scatter).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backends/backend.h"
#include "backends/cpu/block_cache.h"
#include "backends/cpu/cpu_loops.h"
#include "backends/cpu/fast_math.h"
#include "backends/scalar_math.h"

namespace headlab::cpu {

using smath::Acc;
using Fast = FastExpTanh;  // the exp/tanh of the shared formulas (backends/scalar_math.h)

// The sum of term(j) for j in [0, n): the terms in one vector of T's SIMD lanes over chunks of 256, the lanes
// folded in halves in Acc<T> (vector adds) and the chunks added in Acc<T>. A loop that adds T terms straight into a
// double compiles to scalar or gather code (in the toy step layer norm's backward and cross entropy's log-sum-exp ran
// ~5x slower, the attention kernel ~2x), one long sum in float lanes would lose digits, and an `omp simd reduction`
// ended in GCC's in-order sum of the 16 lanes, 16 dependent scalar adds (in the attention kernel's rows of 1-64
// keys, the largest part of their cost).
// Give term its pointers by value ([=]): through a captured reference, a pointer it writes through is
// reloaded every term and the loop stays scalar.
template <typename T, typename Term>
[[gnu::always_inline]] inline Acc<T> lane_sum(int64_t n, Term&& term) {
  constexpr int64_t kChunk = 256, kLanes = 64 / sizeof(T);  // one 512-bit vector
  Acc<T> sum = 0;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t j1 = std::min(n, j0 + kChunk);
    T lanes[kLanes] = {};
    int64_t j = j0;
    for (; j + kLanes <= j1; j += kLanes)
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) lanes[l] += term(j + l);
    const int64_t tail = j1 - j;
#pragma omp simd
    for (int64_t l = 0; l < tail; ++l) lanes[l] += term(j + l);
    Acc<T> wide[kLanes];  // folded in Acc<T>: a row of up to 16 terms is summed as in double
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) wide[l] = lanes[l];
    for (int64_t width = kLanes / 2; width > 0; width /= 2)
#pragma omp simd
      for (int64_t l = 0; l < width; ++l) wide[l] += wide[l + width];
    sum += wide[0];
  }
  return sum;
}

// The max of term(j) for j in [0, n), in T's SIMD lanes; term takes what it reads by value ([=]), as in
// lane_sum.
template <typename T, typename Term>
[[gnu::always_inline]] inline T lane_max(int64_t n, Term&& term) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = std::max(m, term(j));
  return m;
}

// dtype dispatch: the body is a generic lambda taking a value of the element type.
template <typename F>
void dispatch_float(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      break;
    case DType::f64:
      f(double{});
      break;
    default:
      HL_FAIL(who, ": expected a floating dtype, got ", dtype_name(dt));
  }
}

template <typename F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      break;
    case DType::f64:
      f(double{});
      break;
    case DType::i64:
      f(int64_t{});
      break;
    case DType::b8:
      f(uint8_t{});
      break;
    default:  // bfloat16: only copies (conversions) and linear layers' weights take it
      HL_FAIL("cpu: ", dtype_name(dt), " is a storage type; convert it with .to(float32) first");
  }
}

struct CpuBackend final : Backend {
  std::atomic<size_t> in_use{0}, peak{0};
  // Never destroyed: tensors freed during static destruction may still come back to it.
  BlockCache& cache = *new BlockCache;

  const char* name() const override { return "cpu"; }

  // ---- memory ----
  // Blocks are 64-byte aligned behind a 64-byte header that keeps their size; large ones come from
  // and go back to the block cache.
  void* alloc(size_t nbytes) override {
    size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = nullptr;
    if (rounded >= BlockCache::kMinBytes) {
      rounded = BlockCache::size_class(rounded);
      p = cache.take(rounded);
    }
    // New blocks take the system's pages (4 KiB unless transparent huge pages are "always"). Asking for
    // huge pages (MADV_HUGEPAGE) made first touch slower on this project's VMs, where the host backs a
    // guest page when it is first touched: 0.4-0.7 GB/s against 1.7-1.9 (1 GiB; huge pages ran at 5 only
    // when the host had backed them already), GPT-2's load 1.1-1.3 s against 0.4-0.5, path patching's
    // 0.9 GB of stored runs 5.2 s against 3.0; GPT-2's prefill the same (625 against 622 tokens/s).
    if (!p) p = std::aligned_alloc(64, rounded + 64);
    if (!p) {  // give the cached blocks back and try once more
      cache.clear([](void* b) { std::free(b); });
      p = std::aligned_alloc(64, rounded + 64);
    }
    HL_CHECK(p != nullptr, out_of_memory_message(nbytes, "cpu"));
    *static_cast<size_t*>(p) = rounded;
    const size_t now = in_use += rounded;
    size_t prev = peak.load();
    while (now > prev && !peak.compare_exchange_weak(prev, now)) {}
    return static_cast<char*>(p) + 64;
  }
  void free(void* p) override {
    if (!p) return;
    char* base = static_cast<char*>(p) - 64;
    const size_t bytes = *reinterpret_cast<size_t*>(base);
    in_use -= bytes;
    if (bytes < BlockCache::kMinBytes || !cache.give(base, bytes)) std::free(base);
  }
  void copy_from_host(void* dst, const void* src, size_t n) override {
    if (n) std::memcpy(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    if (n) std::memcpy(dst, src, n);
  }
  void synchronize() override {}
  size_t bytes_in_use() const override { return in_use.load(); }
  size_t peak_bytes() const override { return peak.load(); }
  void reset_peak() override { peak = in_use.load(); }

  // Defined in cpu_backend.cpp.
  // ---- fill, copy, elementwise ----
  void fill(DType dt, const Loop& l, double value) override;
  void arange(DType dt, void* out, int64_t n, double start, double step) override;
  void copy(DType dst_dt, DType src_dt, const Loop& l) override;
  void unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) override;
  void unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y, int64_t n,
                      double alpha) override;
  void binary(BinaryOp op, DType dt, const Loop& l) override;
  void where(DType dt, const Loop& l) override;
  void reduce(ReduceOp op, DType dt, void* out, const void* in, int n_outer, const int64_t* outer_sizes,
              const int64_t* outer_strides, int n_inner, const int64_t* inner_sizes,
              const int64_t* inner_strides) override;
  template <typename T>
  void reduce_typed(ReduceOp op, void* out, const T* in, int n_outer, const int64_t* osz, const int64_t* ost,
                    int n_inner, const int64_t* isz, const int64_t* ist);
  bool all_finite(DType dt, const void* p, int64_t n) override;
  bool indices_in_range(const int64_t* idx, int64_t n, int64_t lo, int64_t hi) override;
  void check_indices(const char* op, const int64_t* idx, int64_t n, int64_t size) override;
  // ---- GEMM ----
  void gemm(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void* A, int64_t lda,
            int64_t sa, const void* B, int64_t ldb, int64_t sb, double beta, void* C, int64_t ldc, int64_t sc,
            int64_t batch) override;
  bool linear_rows(DType dt, void* out, const void* x, int64_t ldx, const void* w, const void* bias, int64_t rows,
                   int64_t N, int64_t K) override;
  bool linear_stored(DType wdt, void* out, const void* x, int64_t ldx, const void* w, const void* bias, int64_t rows,
                     int64_t N, int64_t K) override;
  bool linear_gelu_rows(DType dt, void* pre, void* post, const void* x, int64_t ldx, const void* w, const void* bias,
                        int64_t rows, int64_t N, int64_t K, bool tanh_approximation) override;
  // ---- randomness ----
  void random_uniform(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) override;
  void random_normal(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) override;
  void random_int(void* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) override;
  // ---- gather / scatter ----
  void index_select(DType dt, void* out, const void* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                    int64_t inner, int64_t n_idx) override;
  void index_add(DType dt, void* dst, const void* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                 int64_t inner, int64_t n_idx) override;

  // Defined in cpu_sparse.cpp.
  // ---- sparse rows ----
  void topk_rows(DType dt, void* values, int64_t* idx, const void* x, int64_t rows, int64_t cols, int64_t k) override;
  void sparse_rows_gather(DType dt, void* out, const void* values, const int64_t* idx, const void* table, int64_t rows,
                          int64_t k, int64_t n) override;
  void sparse_rows_dot(DType dt, void* dots, const void* a, const int64_t* idx, const void* table, int64_t rows,
                       int64_t k, int64_t n) override;
  void sparse_rows_scatter(DType dt, void* out, const void* values, const int64_t* idx, const void* src, int64_t rows,
                           int64_t k, int64_t n, int64_t entries) override;

  // Defined in cpu_nn.cpp.
  // ---- softmax ----
  void softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols, double scale, SoftmaxMask mask,
                       const int64_t* lengths, int64_t q_len) override;
  void softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                        double scale) override;
  void log_softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols) override;
  void log_softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols) override;
  // ---- layer norm ----
  void layernorm_forward(DType dt, void* y, void* mean, void* rstd, const void* x, const void* w, const void* b,
                         int64_t rows, int64_t cols, double eps) override;
  void layernorm_backward(DType dt, void* dx, void* dw, void* db, const void* dy, const void* x, const void* mean,
                          const void* rstd, const void* w, int64_t rows, int64_t cols) override;
  // ---- RMS norm ----
  bool has_rms_norm() const override { return true; }
  void rmsnorm_forward(DType dt, void* y, void* rstd, const void* x, const void* w, int64_t rows, int64_t cols,
                       double eps) override;
  void rmsnorm_backward(DType dt, void* dx, void* dw, const void* dy, const void* x, const void* rstd, const void* w,
                        int64_t rows, int64_t cols) override;
  // ---- dropout ----
  void dropout(DType dt, void* out, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset) override;
  // ---- cross entropy ----
  void cross_entropy_forward(DType dt, void* loss, const void* logits, const int64_t* targets, int64_t rows,
                             int64_t classes, int64_t ignore_index) override;
  void cross_entropy_backward(DType dt, void* dlogits, const void* dloss, int64_t dloss_stride, double scale,
                              const void* logits, const int64_t* targets, int64_t rows, int64_t classes,
                              int64_t ignore_index) override;
  // ---- optimizers ----
  void sgd_step(DType dt, void* param, const void* grad, void* buf, int64_t n, double lr, double momentum,
                double dampening, double wd, bool nesterov, bool first_step) override;
  void adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n, double lr,
                 double beta1, double beta2, double eps, double wd, int64_t step, bool decoupled) override;

  // Defined in cpu_attention.cpp.
  bool has_fused_attention(int64_t, int64_t) const override { return true; }
  bool has_grouped_attention() const override { return true; }
  void attention_forward(DType dt, const AttnResult& out, void* lse, const AttnOperand& q, const AttnOperand& k,
                         const AttnOperand& v, const AttnParams& a) override;
  void attention_backward(DType dt, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                          const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
                          const AttnOperand& out, const void* lse, const AttnParams& a) override;
};

}  // namespace headlab::cpu
