// One BLAS GEMM on the calling thread, with PyTorch's K == 0 meaning (a GEMV when C is one row). Inside one of our
// parallel regions OpenBLAS's OpenMP build runs serially, so callers there get exactly one thread's work.
#pragma once
#include <cblas.h>

#include <cstdint>
#include <type_traits>

#ifdef HEADLAB_HAS_XSMM
#include "backends/cpu/xsmm_gemm.h"
#include "base/bfloat16.h"
#endif

namespace headlab::cpu {

// y (N) = alpha * W (N, K) @ x (K) + beta * y, W's rows ldw apart: a row at a time, so W is read as one
// stream. Decoding is this read of every weight; OpenBLAS's sgemv walks four rows at once, and over GPT-2
// small's 494 MB of weights (2 threads, Zen 4) reached 26-28 GB/s where one stream reaches 32-33. For short
// rows (the attention's q . k over the cache, K 64) the fold of the lanes costs more than it saves: OpenBLAS's.
// W is float32, or bfloat16 (uint16_t) widened as it is read (half the bytes: linear_bf16).
template <typename TW>
inline void gemv_by_rows(int64_t N, int64_t K, float alpha, const TW* W, int64_t ldw, const float* x, float beta,
                         float* y) {
  static_assert(std::is_same_v<TW, float> || std::is_same_v<TW, uint16_t>);
  const auto widen = [](TW v) {
    if constexpr (std::is_same_v<TW, float>)
      return v;
    else
      return float_from_bf16(v);
  };
  constexpr int64_t kLanes = 64;  // several vectors of independent sums: loads, not the adds' latency, bound it
  for (int64_t n = 0; n < N; ++n) {
    const TW* w = W + n * ldw;
    float acc[kLanes] = {};
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes)
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += widen(w[k + j]) * x[k + j];
    for (int64_t width = kLanes / 2; width > 0; width /= 2)  // the lanes folded in halves: vector adds
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) acc[j] += acc[j + width];
    float s = acc[0];
#pragma omp simd reduction(+ : s)
    for (int64_t i = k; i < K; ++i) s += widen(w[i]) * x[i];
    y[n] = beta == 0.0f ? alpha * s : alpha * s + beta * y[n];
  }
}

// C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major with leading dims.
template <typename T>
inline void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
                      int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // BLAS may leave C alone when K == 0; PyTorch: C = beta * C
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < N; ++c) C[r * ldc + c] = beta == T(0) ? T(0) : beta * C[r * ldc + c];
    return;
  }
  if (M == 1) {  // a row times a matrix (decoding's shape): GEMV reads B once, where GEMM would pack it first
    const int64_t inc_a = ta ? lda : 1;  // A is (1, K), or (K, 1) when transposed
    if constexpr (std::is_same_v<T, float>)
      if (tb && inc_a == 1 && K >= 256) return gemv_by_rows(N, K, alpha, B, ldb, A, beta, C);  // B (N, K): rows of K
    const auto TB = tb ? CblasNoTrans : CblasTrans;  // C^T = op(B)^T A^T; B is (N, K) when tb, else (K, N)
    const int64_t rows = tb ? N : K, cols = tb ? K : N;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemv(CblasRowMajor, TB, rows, cols, alpha, B, ldb, A, inc_a, beta, C, 1);
    else
      cblas_dgemv(CblasRowMajor, TB, rows, cols, alpha, B, ldb, A, inc_a, beta, C, 1);
    return;
  }
#ifdef HEADLAB_HAS_XSMM
  if constexpr (std::is_same_v<T, float>)  // libxsmm's unpacked kernels, where they serve and pay
    if (xsmm_pays() && xsmm_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
#endif
  const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    cblas_dgemm(CblasRowMajor, TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// B (cols, rows) = A^T for a row-major A (rows, cols): OpenBLAS's out-of-place transpose.
template <typename T>
inline void blas_transpose(int64_t rows, int64_t cols, const T* A, int64_t lda, T* B, int64_t ldb) {
  if (rows == 0 || cols == 0) return;
  if constexpr (std::is_same_v<T, float>)
    cblas_somatcopy(CblasRowMajor, CblasTrans, rows, cols, 1.0f, A, lda, B, ldb);
  else
    cblas_domatcopy(CblasRowMajor, CblasTrans, rows, cols, 1.0, A, lda, B, ldb);
}

}  // namespace headlab::cpu
