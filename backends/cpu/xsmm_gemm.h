// Single-threaded float GEMMs through libxsmm's JIT-generated kernels, which read their operands
// in place where OpenBLAS first packs them. See xsmm_gemm.cpp for which calls qualify.
#pragma once
#include <cstdint>

namespace headlab::cpu {

// C (M, N) = op(A) @ op(B) + beta * C (row-major, leading dims) on the calling thread, when libxsmm
// serves the call; false (C untouched) when it does not, and the caller runs BLAS.
bool xsmm_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace headlab::cpu
