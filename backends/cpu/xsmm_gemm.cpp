// libxsmm is column-major: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// libxsmm's first operand is our B and its second our A. It transposes its second operand
// (LIBXSMM_GEMM_FLAG_TRANS_B) but not its first: a transposed B is copied untransposed first.
//
// Which calls qualify (measured with bench/bench_matmul's one_thread cases): alpha 1, beta 0 or 1, not
// both operands transposed, M >= kMinRows (fewer rows: OpenBLAS's GEMV and small-matrix paths, and B's
// copy would not pay for itself), and op(B) at most kMaxBElems floats (it is read once per column block
// of C^T and must stay in L2: bigger products, GPT-2's among them, keep OpenBLAS's cache blocking), or
// slices of K of at least kMinKSlice whose op(B) is (B not transposed), where C is small enough to stay in
// L2 between them.
// A transposed A is read in slices of K too (its kernels ran at 80 GFLOP/s over 1024 rows of K, 120-135 over
// 256 at a time; untransposed, as in the attention kernel's P V, slicing a long K was 10-15% slower).
#include "backends/cpu/xsmm_gemm.h"

#include <libxsmm.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/aligned_scratch.h"

namespace headlab::cpu {
namespace {

constexpr int64_t kMinRows = 64;
constexpr int64_t kMaxBElems = 128 * 1024;  // 512 KiB of float, half of a Zen 4 core's L2
constexpr int64_t kMinKSlice = 256;
constexpr int64_t kMaxTransposedASlice = 256;
constexpr int64_t kLinearRows = 16;  // rows of out a bias broadcast goes into just before their product

void init_once() {
  static const bool initialised = [] {
    libxsmm_init();
    return true;
  }();
  (void)initialised;
}

// B^T for a row-major B (N, K): (K, N) row-major, in this thread's scratch.
const float* transposed(const float* B, int64_t N, int64_t K, int64_t ldb) {
  thread_local AlignedScratch<float> bt;
  float* const t = bt.get(static_cast<size_t>(K * N));
  // B, (N, K) row-major, is (K, N) column-major: libxsmm_otrans writes its (N, K) column-major transpose,
  // which is B^T (K, N) row-major (0.1-0.35 ns an element; a blocked loop took 0.3-0.6).
  libxsmm_otrans(t, B, sizeof(float), K, N, ldb, N);
  return t;
}

}  // namespace

bool xsmm_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // C accumulates over slices of K where C, read again for every slice, stays in L2: slices whose op(B) fits
  // where all of it does not (B untransposed: a transposed one would be copied whole first), and for a
  // transposed A at most kMaxTransposedASlice (a weight's gradient over many rows).
  const bool c_fits = M * N <= kMaxBElems;
  int64_t k_slice = K * N <= kMaxBElems ? K : c_fits && !tb ? kMaxBElems / N / 16 * 16 : 0;
  if (ta && c_fits) k_slice = std::min(k_slice, kMaxTransposedASlice);
  if (alpha != 1.0f || (beta != 0.0f && beta != 1.0f) || (ta && tb) || M < kMinRows || K < 1 ||
      k_slice < std::min(K, kMinKSlice))
    return false;
  init_once();
  if (tb) {
    B = transposed(B, N, K, ldb);
    ldb = N;
  }
  const libxsmm_blasint m = N, n = M, xlda = ldb, xldb = lda, xldc = ldc;
  const auto dispatch = [&](int64_t k, float b) {
    const libxsmm_blasint xk = k;
    const int flags = (ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0) | (b == 0.0f ? LIBXSMM_GEMM_FLAG_BETA_0 : 0);
    return libxsmm_smmdispatch(m, n, xk, &xlda, &xldb, &xldc, &alpha, &b, &flags, nullptr);
  };
  // Slices of K: the first takes the remainder and beta, the others k_slice each and beta 1.
  const int64_t slices = (K + k_slice - 1) / k_slice, k_first = K - (slices - 1) * k_slice;
  const libxsmm_smmfunction first = dispatch(k_first, beta), rest = slices > 1 ? dispatch(k_slice, 1.0f) : first;
  if (!first || !rest) return false;
  first(B, A, C);
  for (int64_t k0 = k_first; k0 < K; k0 += k_slice) rest(B + k0 * ldb, A + (ta ? k0 * lda : k0), C);
  return true;
}

bool xsmm_linear_serves(int64_t M, int64_t N, int64_t K) { return M >= kMinRows && K >= 1 && K * N <= kMaxBElems; }

bool xsmm_linear(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, const float* bias,
                 float* out, const std::function<void(int64_t first, int64_t count)>& after_rows) {
  if (!xsmm_linear_serves(M, N, K)) return false;
  init_once();
  const libxsmm_blasint m = N, xlda = N, xldb = ldx, xldc = N, k = K;
  const float one = 1.0f;
  const int flags = 0;  // beta 1: the product is added to the bias already in out
  const auto dispatch = [&](int64_t rows) {
    const libxsmm_blasint n = rows;
    return libxsmm_smmdispatch(m, n, k, &xlda, &xldb, &xldc, &one, &one, &flags, nullptr);
  };
  const int64_t tail = M % kLinearRows;
  const libxsmm_smmfunction block = dispatch(kLinearRows), last = tail ? dispatch(tail) : block;
  if (!block || !last) return false;
  const float* const wt = transposed(w, N, K, K);
  for (int64_t r0 = 0; r0 < M; r0 += kLinearRows) {
    const int64_t rows = std::min(kLinearRows, M - r0);
    float* const o = out + r0 * N;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(o + r * N, bias, static_cast<size_t>(N) * sizeof(float));
    (rows == kLinearRows ? block : last)(wt, x + r0 * ldx, o);
    if (after_rows) after_rows(r0, rows);
  }
  return true;
}

}  // namespace headlab::cpu
