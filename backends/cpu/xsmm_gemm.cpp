// libxsmm is column-major: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// libxsmm's first operand is our B and its second our A. It transposes its second operand
// (LIBXSMM_GEMM_FLAG_TRANS_B) but not its first: a transposed B is copied untransposed first.
//
// Which calls qualify (measured with bench/bench_matmul's one_thread cases): alpha 1, beta 0 or 1, not
// both operands transposed, M >= kMinRows (fewer rows: OpenBLAS's GEMV and small-matrix paths, and B's
// copy would not pay for itself), and op(B) at most kMaxBElems floats (it is read once per column block
// of C^T and must stay in L2), or slices of K of at least kMinKSlice whose op(B) is (B not transposed),
// where C is small enough to stay in L2 between them. Past both, at any number of rows: C in tiles of up to
// kTileRows rows and as many columns as stay in L2, each beside a block of op(B) at a time copied into
// aligned scratch, where OpenBLAS packs all of op(B) for every call (a whole GPT-2 weight for an exact
// sweep's 120-240 rows). One thread: 1.1-1.5x OpenBLAS's SkylakeX kernels at GPT-2's shapes from 120 to
// 1,024 rows, at 1024^3 and 2048^3; read in place instead, a B with rows 1,536 floats apart ran at half
// OpenBLAS's rate.
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
constexpr int64_t kTileRows = 1024;  // rows of a tile of C
static_assert(kMaxBElems / kTileRows >= 128 && kMaxBElems / kMinKSlice >= 128, "tiles at least 128 columns wide");
constexpr int64_t kLinearRows = 16;  // rows of out a bias broadcast goes into just before their product

void init_once() {
  static const bool initialised = [] {
    libxsmm_init();
    return true;
  }();
  (void)initialised;
}

}  // namespace

// libxsmm against OpenBLAS 0.3.21 (blas_gemm against cblas_sgemm): on an AVX-512 host, one thread, 1024^3 ran at
// 141 against 109 GFLOP/s and GPT-2's LM head half at 131 against 116; on an AVX2 host (2-vCPU AMD EPYC, OpenBLAS's
// Zen kernels; two threads, each on half of C) OpenBLAS ran 7-45% faster at every shape tried, from the toy's
// 2048 x 128 x 128 (129 against 120) through 1024^3 (144 against 99) to Gemma 3's tied head, 1024 x 262144 x 640
// (158 against 71-138: C's rows a power of two apart).
bool xsmm_pays() {
  static const bool pays = [] {
    init_once();
    return libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CORE;
  }();
  return pays;
}

namespace {

// libxsmm's kernel for a column-major C (m, n) = A (m, k) op(B) (k, n) + beta C, through a per-thread cache of
// the last kCachedKernels asked for: libxsmm's registry costs ~200 ns a lookup, and the attention kernel's
// tiles (the toy step's: 64 x 64 x 32, ~2 us each) ask for the same few kernels thousands of times a step
// (bench_matmul, one thread: 1.9-2.1 us a tile product against 2.0-2.3 through the registry).
constexpr int kCachedKernels = 16;
libxsmm_smmfunction kernel(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                           libxsmm_blasint ldb, libxsmm_blasint ldc, float beta, int flags) {
  struct Entry {
    libxsmm_blasint m, n, k, lda, ldb, ldc;
    float beta;
    int flags;
    libxsmm_smmfunction f;
  };
  thread_local Entry cache[kCachedKernels] = {};
  thread_local int next = 0;
  for (const Entry& e : cache)
    if (e.f && e.m == m && e.n == n && e.k == k && e.lda == lda && e.ldb == ldb && e.ldc == ldc && e.beta == beta &&
        e.flags == flags)
      return e.f;
  const float alpha = 1.0f;
  const libxsmm_smmfunction f = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
  if (f) {
    cache[next] = {m, n, k, lda, ldb, ldc, beta, flags, f};
    next = (next + 1) % kCachedKernels;
  }
  return f;
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
  if (alpha != 1.0f || (beta != 0.0f && beta != 1.0f) || (ta && tb) || M < kMinRows || K < 1) return false;
  // Rows and columns of C a pass covers (a tile), and slices of K within it. All of C where op(B) fits L2, or
  // where C does and slices of B untransposed do (C, read again for every slice, stays in L2). Else tiles of
  // at most kTileRows rows and as many columns as stay in L2, each beside one block of op(B) at a time.
  const int64_t k_min = std::min(K, kMinKSlice);
  int64_t m_tile = M, n_tile = N;
  int64_t k_slice = K * N <= kMaxBElems ? K : M * N <= kMaxBElems && !tb ? kMaxBElems / N / 16 * 16 : 0;
  const bool tiles = k_slice < k_min;
  if (tiles) {
    m_tile = std::min(M, kTileRows);
    n_tile = std::min(N, std::min(kMaxBElems / m_tile, kMaxBElems / k_min) / 16 * 16);
    k_slice = K * n_tile <= kMaxBElems ? K : kMaxBElems / n_tile / 16 * 16;
  }
  if (ta && m_tile * n_tile <= kMaxBElems) k_slice = std::min(k_slice, kMaxTransposedASlice);
  if (k_slice < k_min) return false;
  init_once();
  // A transposed B: all of it copied untransposed up front where it fits. In tiles, op(B) is copied a block at
  // a time into aligned scratch (ld n_tile), where the kernel reads it from L2 (read in place, a B with rows
  // 1,536 floats apart ran at half the rate).
  if (tb && !tiles) {
    B = transposed(B, N, K, ldb);
    ldb = N;
  }
  const libxsmm_blasint xlda = tiles ? n_tile : ldb, xldb = lda, xldc = ldc;
  const auto dispatch = [&](int64_t cols, int64_t rows, int64_t k, float b) {
    const int flags = (ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0) | (b == 0.0f ? LIBXSMM_GEMM_FLAG_BETA_0 : 0);
    return kernel(cols, rows, k, xlda, xldb, xldc, b, flags);
  };
  // Per tile, slices of K: the first takes the remainder and beta, the others k_slice each and beta 1. Every
  // kernel is built before C is written: [last row tile][last column tile], narrower where M or N leaves less.
  const int64_t slices = (K + k_slice - 1) / k_slice, k_first = K - (slices - 1) * k_slice;
  struct Kernels {
    libxsmm_smmfunction first = nullptr, rest = nullptr;
  };
  Kernels kern[2][2];
  const int64_t m_tail = M % m_tile, n_tail = N % n_tile;
  for (const int last_rows : {0, 1})
    for (const int last_cols : {0, 1}) {
      Kernels& k = kern[last_rows][last_cols];
      if ((last_rows && !m_tail) || (last_cols && !n_tail)) {  // no narrower tile there: the kernel before
        k = kern[last_rows && m_tail][last_cols && n_tail];
        continue;
      }
      const int64_t rows = last_rows ? m_tail : m_tile, cols = last_cols ? n_tail : n_tile;
      k.first = dispatch(cols, rows, k_first, beta);
      k.rest = slices > 1 ? dispatch(cols, rows, k_slice, 1.0f) : k.first;
      if (!k.first || !k.rest) return false;
    }
  thread_local AlignedScratch<float> block_scratch;
  float* const block = tiles ? block_scratch.get(static_cast<size_t>(k_slice * n_tile)) : nullptr;
  // op(B)'s rows k0..k0+k, columns j0..j0+cols, as the kernel reads them (lda xlda)
  const auto b_block = [&](int64_t k0, int64_t k, int64_t j0, int64_t cols) -> const float* {
    if (!tiles) return B + k0 * ldb + j0;
    if (tb)  // rows j0.. of B (N, K), k columns from k0, are (k, cols) column-major: their transpose is the block
      libxsmm_otrans(block, B + j0 * ldb + k0, sizeof(float), k, cols, ldb, n_tile);
    else
      for (int64_t r = 0; r < k; ++r)
        std::memcpy(block + r * n_tile, B + (k0 + r) * ldb + j0, static_cast<size_t>(cols) * sizeof(float));
    return block;
  };
  for (int64_t i0 = 0; i0 < M; i0 += m_tile) {
    const float* const a = A + (ta ? i0 : i0 * lda);
    float* const c = C + i0 * ldc;
    for (int64_t j0 = 0; j0 < N; j0 += n_tile) {
      const int64_t cols = std::min(n_tile, N - j0);
      const Kernels& k = kern[M - i0 < m_tile][cols < n_tile];
      k.first(b_block(0, k_first, j0, cols), a, c + j0);
      for (int64_t k0 = k_first; k0 < K; k0 += k_slice)
        k.rest(b_block(k0, k_slice, j0, cols), a + (ta ? k0 * lda : k0), c + j0);
    }
  }
  return true;
}

bool xsmm_linear_serves(int64_t M, int64_t N, int64_t K) { return M >= kMinRows && K >= 1 && K * N <= kMaxBElems; }

bool xsmm_linear(int64_t M, int64_t N, int64_t K, const float* x, int64_t ldx, const float* w, const float* bias,
                 float* out, const std::function<void(int64_t first, int64_t count)>& after_rows) {
  if (!xsmm_linear_serves(M, N, K)) return false;
  init_once();
  // beta 1: the product is added to the bias already in out
  const auto dispatch = [&](int64_t rows) { return kernel(N, rows, K, N, ldx, N, 1.0f, 0); };
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
