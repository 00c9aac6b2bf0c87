// libxsmm is column-major: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// libxsmm's first operand is our B and its second our A. It transposes its second operand
// (LIBXSMM_GEMM_FLAG_TRANS_B) but not its first: a transposed B is copied untransposed first.
//
// Which calls qualify (measured with bench/bench_matmul's one_thread cases): alpha 1, beta 0 or 1, not
// both operands transposed, M >= kMinRows (fewer rows: OpenBLAS's GEMV and small-matrix paths, and B's
// copy would not pay for itself), and op(B) at most kMaxBElems floats (it is read once per column block
// of C^T and must stay in L2: bigger products, GPT-2's among them, keep OpenBLAS's cache blocking).
#include "backends/cpu/xsmm_gemm.h"

#include <libxsmm.h>

#include <vector>

namespace headlab::cpu {
namespace {

constexpr int64_t kMinRows = 64;
constexpr int64_t kMaxBElems = 128 * 1024;  // 512 KiB of float, half of a Zen 4 core's L2

}  // namespace

bool xsmm_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (alpha != 1.0f || (beta != 0.0f && beta != 1.0f) || (ta && tb) || M < kMinRows || K * N > kMaxBElems || K < 1)
    return false;
  static const bool initialised = [] {
    libxsmm_init();
    return true;
  }();
  (void)initialised;
  thread_local std::vector<float> bt;  // op(B) = B^T, stored (K, N)
  if (tb) {
    bt.resize(static_cast<size_t>(K * N));
    // B, (N, K) row-major, is (K, N) column-major: libxsmm_otrans writes its (N, K) column-major transpose,
    // which is op(B) = (K, N) row-major (0.1-0.35 ns an element; a blocked loop took 0.3-0.6).
    libxsmm_otrans(bt.data(), B, sizeof(float), K, N, ldb, N);
    B = bt.data();
    ldb = N;
  }
  const libxsmm_blasint m = N, n = M, k = K, xlda = ldb, xldb = lda, xldc = ldc;
  const int flags = (ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0) | (beta == 0.0f ? LIBXSMM_GEMM_FLAG_BETA_0 : 0);
  const libxsmm_smmfunction kernel = libxsmm_smmdispatch(m, n, k, &xlda, &xldb, &xldc, &alpha, &beta, &flags, nullptr);
  if (!kernel) return false;
  kernel(B, A, C);
  return true;
}

}  // namespace headlab::cpu
