// Single-threaded float GEMMs through libxsmm's JIT-generated kernels, over operands in place or copied
// a block at a time beside an L2-sized tile of C, where OpenBLAS packs all of op(B) for every call. See
// xsmm_gemm.cpp for which calls qualify.
#pragma once
#include <cstdint>
#include <functional>

namespace headlab::cpu {

// Whether the callers (blas_gemm, the linear layer) take libxsmm's kernels at all: on a CPU with AVX-512
// (SKX and later) they beat OpenBLAS's; on one with AVX2 only they lost at every shape measured (xsmm_gemm.cpp).
// The kernels below serve whoever calls them either way (their tests do).
bool xsmm_pays();

// C (M, N) = op(A) @ op(B) + beta * C (row-major, leading dims) on the calling thread, when libxsmm
// serves the call; false (C untouched) when it does not, and the caller runs BLAS.
bool xsmm_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// out (M, N) = x (M, K) @ w^T + bias on the calling thread, for w (N, K) and out contiguous, x's rows ldx
// apart: the bias goes into a few rows of out at a time just before the kernel adds their product, so both
// touch lines in L1, where a broadcast of the bias over all of out first made a pass through memory; then
// after_rows(first, count), if given, on those rows while they are there (an activation). False (out
// untouched) where libxsmm does not serve it; xsmm_linear_serves says so from the sizes alone.
bool xsmm_linear_serves(int64_t M, int64_t N, int64_t K);
bool xsmm_linear(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, const float* bias,
                 float* out, const std::function<void(int64_t first, int64_t count)>& after_rows = {});

}  // namespace headlab::cpu
