// One BLAS GEMM on the calling thread, with PyTorch's K == 0 meaning (a GEMV when C is one row). Inside one of our
// parallel regions OpenBLAS's OpenMP build runs serially, so callers there get exactly one thread's work.
#pragma once
#include <cblas.h>

#include <cstdint>
#include <type_traits>

#ifdef HEADLAB_HAS_XSMM
#include "backends/cpu/xsmm_gemm.h"
#endif

namespace headlab::cpu {

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
    const int64_t inc_a = ta ? lda : 1;              // A is (1, K), or (K, 1) when transposed
    const auto TB = tb ? CblasNoTrans : CblasTrans;  // C^T = op(B)^T A^T; B is (N, K) when tb, else (K, N)
    const int64_t rows = tb ? N : K, cols = tb ? K : N;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemv(CblasRowMajor, TB, rows, cols, alpha, B, ldb, A, inc_a, beta, C, 1);
    else
      cblas_dgemv(CblasRowMajor, TB, rows, cols, alpha, B, ldb, A, inc_a, beta, C, 1);
    return;
  }
#ifdef HEADLAB_HAS_XSMM
  if constexpr (std::is_same_v<T, float>)  // small products: libxsmm's unpacked kernels, where it serves
    if (xsmm_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
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
