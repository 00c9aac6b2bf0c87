// The CUDA backend's fused scaled-dot-product attention (FlashAttention's algorithm, the contract of
// Backend::attention_forward / attention_backward): nothing of size Tq x Tk is ever stored.
//   forward:  a block per (b, h, tile of kRows queries), a thread per query row holding its q row and
//             output accumulator in registers; key/value tiles staged in shared memory; an online
//             softmax (running max, rescaled sum); writes the output and the row's log-sum-exp.
//   backward: delta_i = dO_i . O_i; then a block per key tile (a thread per key row: dK, dV) and a block
//             per query tile (a thread per query row: dQ), each recomputing P = exp(scale q.k - lse)
//             and the dropout mask from its Philox counters. Every gradient row has one writer: no atomics,
//             deterministic.
//   few query rows (decoding, Tq <= kSplitMaxRows, no dropout): the keys split across blocks, a warp per key,
//             and a second kernel merging the splits' partial softmaxes (attention_split_kernel).
// Scalar FMAs: float64 and float32 with dropout run these; float32 without dropout takes the tensor-core tiles
// of cuda_attention_mma.cu (3xTF32, float32's accuracy). Head sizes up to kMaxHead; larger ones take the
// composite path (has_fused_attention).
// B = batch, H = heads, Tq / Tk = queries / keys, D = q/k head size, Dv = v head size.
#include "backends/cuda/cuda_attention.cuh"
#include "backends/philox.h"

namespace headlab {
namespace cuda {

constexpr int kMaxFusedAttentionHead = 256;

namespace {

constexpr int kRows = 64;  // query (or key) rows per block, one per thread

// Rows per shared-memory tile: two tiles of DM columns (K and V, or Q and dO) in 44 KiB, leaving room
// under the 48 KiB of static shared memory for the per-row values beside them.
template <typename T, int DM>
constexpr int key_tile() {
  const int fit = 44 * 1024 / (2 * DM * static_cast<int>(sizeof(T)));
  return fit < 64 ? fit : 64;
}

// Zeroes a block's shared tiles once: columns past the head size stay zero, so full-width dots are exact.
template <typename T>
__device__ __forceinline__ void zero_tiles(T* x, T* y, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) x[e] = y[e] = T(0);
  __syncthreads();
}

// rows x cols of src (row stride ld) into dst (row stride DM).
template <typename T, int DM>
__device__ __forceinline__ void stage(T* dst, const T* src, int64_t ld, int rows, int64_t cols) {
  for (int64_t e = threadIdx.x; e < rows * cols; e += blockDim.x)
    dst[(e / cols) * DM + e % cols] = src[(e / cols) * ld + e % cols];
}

// Loads row `r` (cols < DM used) into registers, zero past cols or when the row is absent.
template <typename T, int DM>
__device__ __forceinline__ void load_row(T (&dst)[DM], const T* src, bool present, int64_t cols) {
#pragma unroll
  for (int c = 0; c < DM; ++c) dst[c] = present && c < cols ? src[c] : T(0);
}

template <typename T, int DM>
__device__ __forceinline__ T dot(const T (&x)[DM], const T* y) {
  T s = 0;
#pragma unroll
  for (int c = 0; c < DM; ++c) s += x[c] * y[c];  // y is zero past the head size (staged tiles, registers)
  return s;
}

// The dropout factor of weight element e: keep_scale or 0.
template <typename T>
__device__ __forceinline__ T keep(const AttnParams& a, T keep_scale, int64_t e) {
  return philox::uniform(a.seed, a.offset, e) >= a.dropout_p ? keep_scale : T(0);
}

// The largest of the block's values (every thread calls it, with its own).
__device__ __forceinline__ int64_t block_max(int64_t x) {
  __shared__ unsigned long long m;
  if (threadIdx.x == 0) m = 0;
  __syncthreads();
  atomicMax(&m, static_cast<unsigned long long>(x));  // x >= 0
  __syncthreads();
  return static_cast<int64_t>(m);
}

// Keys j0 .. j0 + n and their values into the shared tiles (after every thread is done with the last
// ones); returns how many of them a row with `valid` keys sees.
template <typename T, int DM>
__device__ __forceinline__ int stage_keys(T* Ks, T* Vs, const T* K, const T* V, int64_t k_st, int64_t v_st, int64_t j0,
                                          int n, int64_t valid, const AttnParams& a) {
  __syncthreads();
  stage<T, DM>(Ks, K + j0 * k_st, k_st, n, a.D);
  stage<T, DM>(Vs, V + j0 * v_st, v_st, n, a.Dv);
  __syncthreads();
  return static_cast<int>(valid - j0 < n ? (valid - j0 > 0 ? valid - j0 : 0) : n);
}

// The query row of this thread: its head, index, valid key count and the block's furthest valid key
// (key tiles past every row's last valid key are skipped).
struct QueryRow {
  int64_t bh, i, valid, kmax;
  bool present;
};
__device__ __forceinline__ QueryRow query_row(const AttnParams& a, int64_t n_tiles) {
  QueryRow r;
  r.bh = blockIdx.x / n_tiles;
  r.i = (blockIdx.x % n_tiles) * kRows + threadIdx.x;
  r.present = r.i < a.Tq;
  r.valid = r.present ? valid_keys(a, r.bh, r.i) : 0;
  r.kmax = block_max(r.valid);
  return r;
}

template <typename T, int DM>
__global__ void __launch_bounds__(kRows) attention_forward_kernel(AttnResult out, T* lse, AttnOperand q, AttnOperand k,
                                                                  AttnOperand v, AttnParams a, int64_t n_tiles) {
  constexpr int BK = key_tile<T, DM>();
  __shared__ T Ks[BK * DM], Vs[BK * DM];
  zero_tiles(Ks, Vs, BK * DM);
  const QueryRow r = query_row(a, n_tiles);
  const int64_t bh = r.bh, i = r.i, valid = r.valid, kmax = r.kmax;
  const bool row = r.present;
  const T* Q = head_ptr<T>(q, bh, a.H);
  const T* K = head_ptr<T>(k, bh, a.H);
  const T* V = head_ptr<T>(v, bh, a.H);
  const T scale = static_cast<T>(a.scale), keep_scale = philox::dropout_scale<T>(a.dropout_p);
  const bool drop = a.dropout_p > 0;
  T qr[DM], o[DM];
  load_row(qr, Q + i * q.st, row, a.D);
#pragma unroll
  for (int c = 0; c < DM; ++c) o[c] = 0;
  T m = neg_inf<T>();
  Acc<T> l = 0;  // the softmax's denominator counts dropped weights too
  for (int64_t j0 = 0; j0 < kmax; j0 += BK) {
    const int n = static_cast<int>(kmax - j0 < BK ? kmax - j0 : BK);
    const int nj = stage_keys<T, DM>(Ks, Vs, K, V, k.st, v.st, j0, n, valid, a);
    for (int jj = 0; jj < nj; ++jj) {
      const T s = scale * dot(qr, Ks + jj * DM);
      if (s > m) {  // a new running max: rescale what was summed so far
        const T alpha = smath::exp(m - s);
        l *= alpha;
#pragma unroll
        for (int c = 0; c < DM; ++c) o[c] *= alpha;
        m = s;
      }
      T p = smath::exp(s - m);
      l += p;
      if (drop) p *= keep(a, keep_scale, (bh * a.Tq + i) * a.Tk + j0 + jj);
#pragma unroll
      for (int c = 0; c < DM; ++c) o[c] += p * Vs[jj * DM + c];
    }
  }
  if (!row) return;
  T* O = head_ptr<T>(out, bh, a.H) + i * out.st;
  const T inv = valid > 0 ? static_cast<T>(1.0 / static_cast<double>(l)) : T(0);
#pragma unroll
  for (int c = 0; c < DM; ++c)
    if (c < a.Dv) O[c] = o[c] * inv;
  lse[bh * a.Tq + i] = valid > 0 ? static_cast<T>(m + log(static_cast<double>(l))) : static_cast<T>(INFINITY);
}

// delta[bh * Tq + i] = dO_i . O_i, the rowsum(dP o P) of the softmax backward.
template <typename T>
__global__ void attention_delta_kernel(T* delta, AttnOperand dout, AttnOperand out, AttnParams a) {
  const int64_t rows = a.B * a.H * a.Tq;
  for (int64_t r = global_thread(); r < rows; r += grid_threads()) {
    const int64_t bh = r / a.Tq, i = r % a.Tq;
    const T* dO = head_ptr<T>(dout, bh, a.H) + i * dout.st;
    const T* O = head_ptr<T>(out, bh, a.H) + i * out.st;
    Acc<T> d = 0;
    for (int64_t c = 0; c < a.Dv; ++c) d += dO[c] * O[c];
    delta[r] = static_cast<T>(d);
  }
}

// A thread per key row j: dV_j = sum_i P_ij Z_ij dO_i, dK_j = scale sum_i dS_ij q_i with
// dS_ij = P_ij ((dO_i . v_j) Z_ij - delta_i), over the queries that may see key j.
template <typename T, int DM>
__global__ void __launch_bounds__(kRows)
    attention_dkdv_kernel(AttnResult dk, AttnResult dv, AttnOperand dout, AttnOperand q, AttnOperand k, AttnOperand v,
                          const T* lse, const T* delta, AttnParams a, int64_t n_tiles) {
  constexpr int BQ = key_tile<T, DM>();
  __shared__ T Qs[BQ * DM], dOs[BQ * DM], Ls[BQ], Ds[BQ];
  __shared__ int64_t Vld[BQ];
  zero_tiles(Qs, dOs, BQ * DM);
  const int64_t bh = blockIdx.x / n_tiles, j0 = (blockIdx.x % n_tiles) * kRows, j = j0 + threadIdx.x;
  const bool row = j < a.Tk;
  const T* Q = head_ptr<T>(q, bh, a.H);
  const T* dO = head_ptr<T>(dout, bh, a.H);
  const T scale = static_cast<T>(a.scale), keep_scale = philox::dropout_scale<T>(a.dropout_p);
  const bool drop = a.dropout_p > 0;
  T kr[DM], vr[DM], dkr[DM], dvr[DM];
  load_row(kr, head_ptr<T>(k, bh, a.H) + j * k.st, row, a.D);
  load_row(vr, head_ptr<T>(v, bh, a.H) + j * v.st, row, a.Dv);
#pragma unroll
  for (int c = 0; c < DM; ++c) dkr[c] = dvr[c] = 0;
  // Causally, query i sees key j only when i >= j: the queries before this key tile see none of it.
  const int64_t first = a.mask == SoftmaxMask::causal ? j0 : 0;
  for (int64_t i0 = first; i0 < a.Tq; i0 += BQ) {
    const int n = static_cast<int>(a.Tq - i0 < BQ ? a.Tq - i0 : BQ);
    __syncthreads();
    stage<T, DM>(Qs, Q + i0 * q.st, q.st, n, a.D);
    stage<T, DM>(dOs, dO + i0 * dout.st, dout.st, n, a.Dv);
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
      Ls[r] = lse[bh * a.Tq + i0 + r];
      Ds[r] = delta[bh * a.Tq + i0 + r];
      Vld[r] = valid_keys(a, bh, i0 + r);
    }
    __syncthreads();
    if (!row) continue;
    for (int ii = 0; ii < n; ++ii) {
      if (j >= Vld[ii]) continue;
      const T p = smath::exp(scale * dot(kr, Qs + ii * DM) - Ls[ii]);
      const T z = drop ? keep(a, keep_scale, (bh * a.Tq + i0 + ii) * a.Tk + j) : T(1);
      const T ds = p * (dot(vr, dOs + ii * DM) * z - Ds[ii]);
      const T pz = p * z, sds = scale * ds;
#pragma unroll
      for (int c = 0; c < DM; ++c) {
        dvr[c] += pz * dOs[ii * DM + c];
        dkr[c] += sds * Qs[ii * DM + c];
      }
    }
  }
  if (!row) return;
  T* dK = head_ptr<T>(dk, bh, a.H) + j * dk.st;
  T* dV = head_ptr<T>(dv, bh, a.H) + j * dv.st;
#pragma unroll
  for (int c = 0; c < DM; ++c) {
    if (c < a.D) dK[c] = dkr[c];
    if (c < a.Dv) dV[c] = dvr[c];
  }
}

// A thread per query row i: dQ_i = scale sum_j dS_ij k_j over the keys row i sees.
template <typename T, int DM>
__global__ void __launch_bounds__(kRows)
    attention_dq_kernel(AttnResult dq, AttnOperand dout, AttnOperand q, AttnOperand k, AttnOperand v, const T* lse,
                        const T* delta, AttnParams a, int64_t n_tiles) {
  constexpr int BK = key_tile<T, DM>();
  __shared__ T Ks[BK * DM], Vs[BK * DM];
  zero_tiles(Ks, Vs, BK * DM);
  const QueryRow r = query_row(a, n_tiles);
  const int64_t bh = r.bh, i = r.i, valid = r.valid, kmax = r.kmax;
  const bool row = r.present;
  const T* K = head_ptr<T>(k, bh, a.H);
  const T* V = head_ptr<T>(v, bh, a.H);
  const T scale = static_cast<T>(a.scale), keep_scale = philox::dropout_scale<T>(a.dropout_p);
  const bool drop = a.dropout_p > 0;
  T qr[DM], dor[DM], dqr[DM];
  load_row(qr, head_ptr<T>(q, bh, a.H) + i * q.st, row, a.D);
  load_row(dor, head_ptr<T>(dout, bh, a.H) + i * dout.st, row, a.Dv);
#pragma unroll
  for (int c = 0; c < DM; ++c) dqr[c] = 0;
  const T li = row ? lse[bh * a.Tq + i] : T(0), di = row ? delta[bh * a.Tq + i] : T(0);
  for (int64_t j0 = 0; j0 < kmax; j0 += BK) {
    const int n = static_cast<int>(kmax - j0 < BK ? kmax - j0 : BK);
    const int nj = stage_keys<T, DM>(Ks, Vs, K, V, k.st, v.st, j0, n, valid, a);
    for (int jj = 0; jj < nj; ++jj) {
      const T p = smath::exp(scale * dot(qr, Ks + jj * DM) - li);
      const T z = drop ? keep(a, keep_scale, (bh * a.Tq + i) * a.Tk + j0 + jj) : T(1);
      const T sds = scale * p * (dot(dor, Vs + jj * DM) * z - di);
#pragma unroll
      for (int c = 0; c < DM; ++c) dqr[c] += sds * Ks[jj * DM + c];
    }
  }
  if (!row) return;
  T* dQ = head_ptr<T>(dq, bh, a.H) + i * dq.st;
#pragma unroll
  for (int c = 0; c < DM; ++c)
    if (c < a.D) dQ[c] = dqr[c];
}

// ---- few query rows over many keys (decoding): the keys split across blocks ----
// A block takes one query row and one split of its keys; its warps take the split's keys in turn, each lane
// holding DM / 32 of the columns (lane + 32 c: the warp reads a key row coalesced) and a dot being a warp sum.
// Every warp keeps an online softmax (running max m, sum l, unnormalised output o); the block merges its warps
// into one partial (m, l, o) per split, and attention_combine_kernel merges a row's splits. So a single query
// reads its keys with the whole GPU, where the row kernel gives it one thread.
constexpr int kSplitWarps = 8;
constexpr int64_t kMinKeysPerSplit = 64;
constexpr int64_t kSplitMaxRows = 16;  // query rows up to which attention_forward splits the keys (no dropout)

template <typename T, int DM>
__global__ void __launch_bounds__(kSplitWarps * 32)
    attention_split_kernel(T* part_o, T* part_ml, AttnOperand q, AttnOperand k, AttnOperand v, AttnParams a, int splits,
                           int64_t split_len) {
  constexpr int PL = DM / 32;
  const int64_t row = blockIdx.x / splits, bh = row / a.Tq, i = row % a.Tq;  // row = bh * Tq + i
  const int split = static_cast<int>(blockIdx.x % splits), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t valid = valid_keys(a, bh, i), j_begin = split * split_len;
  const int64_t j_end = valid < j_begin + split_len ? valid : j_begin + split_len;
  const T* Q = head_ptr<T>(q, bh, a.H) + i * q.st;
  const T* K = head_ptr<T>(k, bh, a.H);
  const T* V = head_ptr<T>(v, bh, a.H);
  const T scale = static_cast<T>(a.scale);
  T qr[PL], o[PL];
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    const int col = lane + 32 * c;
    qr[c] = col < a.D ? Q[col] : T(0);
    o[c] = 0;
  }
  T m = neg_inf<T>(), l = 0;
  for (int64_t j = j_begin + warp; j < j_end; j += kSplitWarps) {
    const T* Kj = K + j * k.st;
    T s = 0;
#pragma unroll
    for (int c = 0; c < PL; ++c)
      if (lane + 32 * c < a.D) s += qr[c] * Kj[lane + 32 * c];
    s = scale * warp_sum(s);
    const T m_new = s > m ? s : m;
    const T alpha = smath::exp(m - m_new), p = smath::exp(s - m_new);  // alpha = 0 at the first key
    l = l * alpha + p;
    const T* Vj = V + j * v.st;
#pragma unroll
    for (int c = 0; c < PL; ++c) o[c] = o[c] * alpha + (lane + 32 * c < a.Dv ? p * Vj[lane + 32 * c] : T(0));
    m = m_new;
  }
  __shared__ T sm_m[kSplitWarps], sm_l[kSplitWarps], sm_o[kSplitWarps][DM];
  if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
#pragma unroll
  for (int c = 0; c < PL; ++c) sm_o[warp][lane + 32 * c] = o[c];
  __syncthreads();
  if (warp != 0) return;
  T M = neg_inf<T>();
  for (int w = 0; w < kSplitWarps; ++w) M = sm_m[w] > M ? sm_m[w] : M;
  T L = 0, acc[PL] = {};
  for (int w = 0; w < kSplitWarps; ++w) {
    if (sm_l[w] == T(0)) continue;  // a warp that saw no key
    const T f = smath::exp(sm_m[w] - M);
    L += f * sm_l[w];
#pragma unroll
    for (int c = 0; c < PL; ++c) acc[c] += f * sm_o[w][lane + 32 * c];
  }
  const int64_t part = row * splits + split;
#pragma unroll
  for (int c = 0; c < PL; ++c) part_o[part * DM + lane + 32 * c] = acc[c];
  if (lane == 0) part_ml[2 * part] = M, part_ml[2 * part + 1] = L;
}

// A warp per query row: out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s, lse = M + log(that sum).
template <typename T, int DM>
__global__ void attention_combine_kernel(AttnResult out, T* lse, const T* part_o, const T* part_ml, AttnParams a,
                                         int splits) {
  constexpr int PL = DM / 32;
  const int64_t rows = a.B * a.H * a.Tq;
  const int lane = threadIdx.x & 31;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5); row < rows;
       row += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const T* ml = part_ml + 2 * row * splits;
    T M = neg_inf<T>();
    for (int s = 0; s < splits; ++s)
      if (ml[2 * s + 1] != T(0)) M = ml[2 * s] > M ? ml[2 * s] : M;
    T L = 0, acc[PL] = {};
    for (int s = 0; s < splits; ++s) {
      if (ml[2 * s + 1] == T(0)) continue;  // a split past the row's valid keys
      const T f = smath::exp(ml[2 * s] - M);
      L += f * ml[2 * s + 1];
#pragma unroll
      for (int c = 0; c < PL; ++c) acc[c] += f * part_o[(row * splits + s) * DM + lane + 32 * c];
    }
    const int64_t bh = row / a.Tq, i = row % a.Tq;
    T* O = head_ptr<T>(out, bh, a.H) + i * out.st;
    const T inv = L > T(0) ? static_cast<T>(1.0 / static_cast<double>(L)) : T(0);
#pragma unroll
    for (int c = 0; c < PL; ++c)
      if (lane + 32 * c < a.Dv) O[lane + 32 * c] = acc[c] * inv;
    if (lane == 0) lse[row] = L > T(0) ? static_cast<T>(M + log(static_cast<double>(L))) : static_cast<T>(INFINITY);
  }
}

}  // namespace
}  // namespace cuda

bool CudaBackend::has_fused_attention(int64_t D, int64_t Dv) const {
  return D <= cuda::kMaxFusedAttentionHead && Dv <= cuda::kMaxFusedAttentionHead;
}

// Measured on an H100 (float32, forward + backward, headlab compare and bench/sdpa_step): the kernel's
// thread per row does Tk x D multiply-adds from registers, so it wins while that is small and the
// composite path's launches dominate (T 64, D 32: 5x; T 128, D 16 or 32: 2.2-2.4x; T 256, D 32: 1.26x),
// ties at T 128, D 64, and loses beyond (T 256, D 64: 0.69x; T 128, D 128: 0.33x; T 1024, D 64: 0.32x).
// A few query rows (decoding) take the split kernel, which reads the keys with the whole GPU: GPT-2 small's
// decoding after 960 tokens spent 25 us a layer in the composite path's three launches. Float32 without
// dropout takes the tensor-core tiles (cuda_attention_mma.cu), measured on an H200 (B 8, H 12, causal; ms,
// tiles against composite; scripts/gpu-check.sh sweep_attention): the forward alone wins everywhere (D 128:
// T 64 0.03 / 0.22, T 1024 0.83 / 1.56, T 2048 3.19 / 6.44); forward + backward wins at head sizes up to 64
// (D 32: T 64 0.06 / 0.53, T 2048 2.94 / 8.70; D 64: T 64 0.08 / 0.58, T 1024 1.63 / 3.57, T 2048 5.60 / 11.18)
// but past 64 only while short (D 128: T 64 0.13 / 0.57, T 256 0.74 / 0.69, T 1024 6.9 / 4.7: the 128-wide
// backward tiles hold one block an SM and spill registers).
bool CudaBackend::fused_attention_is_faster(DType dt, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool dropout,
                                            bool backward) const {
  if (Tq <= cuda::kSplitMaxRows) return true;
  AttnParams a;
  a.D = D, a.Dv = Dv, a.dropout_p = dropout ? 0.5 : 0.0;
  const int64_t width = D > Dv ? D : Dv;
  if (cuda::mma_attention_serves(*this, dt, a) && (!backward || width <= 64 || Tk <= 128)) return true;
  return Tk * width <= 8192;
}

void CudaBackend::attention_forward(DType dt, const AttnResult& out, void* lse, const AttnOperand& q,
                                    const AttnOperand& k, const AttnOperand& v, const AttnParams& a) {
  using namespace cuda;
  HL_CHECK(has_fused_attention(a.D, a.Dv), "cuda attention_forward: head sizes ", a.D, " and ", a.Dv,
           " exceed the kernel's ", kMaxFusedAttentionHead);
  activate();
  const int64_t rows = a.B * a.H * a.Tq;
  if (a.Tq <= kSplitMaxRows && a.dropout_p == 0 && a.Tk > 0) {
    // Enough splits to give every SM two blocks, each of at least kMinKeysPerSplit keys.
    const int64_t splits = std::max<int64_t>(
        1, std::min<int64_t>(ceil_div(2 * int64_t{sm_count()}, rows), ceil_div(a.Tk, kMinKeysPerSplit)));
    const int64_t split_len = ceil_div(a.Tk, splits);
    HLC_DISPATCH_FLOAT(dt, T, "attention_forward (split keys)", {
      with_head_width<kMaxFusedAttentionHead>(a.D, a.Dv, [&](auto dm) {
        constexpr int DM = decltype(dm)::value;
        const TempBuffer part_o(*this, static_cast<size_t>(rows * splits * DM) * sizeof(T));
        const TempBuffer part_ml(*this, static_cast<size_t>(rows * splits * 2) * sizeof(T));
        attention_split_kernel<T, DM><<<rows * splits, kSplitWarps * 32, 0, stream_>>>(
            part_o.as<T>(), part_ml.as<T>(), q, k, v, a, static_cast<int>(splits), split_len);
        HL_CUDA_LAUNCH_CHECK("attention_forward (split keys)");
        const int grid = static_cast<int>(std::min<int64_t>(ceil_div(rows, 4), max_blocks()));
        attention_combine_kernel<T, DM><<<grid, 128, 0, stream_>>>(out, static_cast<T*>(lse), part_o.as<T>(),
                                                                   part_ml.as<T>(), a, static_cast<int>(splits));
      });
    });
    HL_CUDA_LAUNCH_CHECK("attention_forward (combine splits)");
    return;
  }
  if (mma_attention_serves(*this, dt, a)) {
    mma_attention_forward(*this, out, static_cast<float*>(lse), q, k, v, a);
    return;
  }
  const int64_t n_tiles = ceil_div(a.Tq, int64_t{kRows});
  HLC_DISPATCH_FLOAT(dt, T, "attention_forward", {
    with_head_width<kMaxFusedAttentionHead>(a.D, a.Dv, [&](auto dm) {
      attention_forward_kernel<T, decltype(dm)::value>
          <<<a.B * a.H * n_tiles, kRows, 0, stream_>>>(out, static_cast<T*>(lse), q, k, v, a, n_tiles);
    });
  });
  HL_CUDA_LAUNCH_CHECK("attention_forward");
}

void CudaBackend::attention_backward(DType dt, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                                     const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k,
                                     const AttnOperand& v, const AttnOperand& out, const void* lse,
                                     const AttnParams& a) {
  using namespace cuda;
  HL_CHECK(has_fused_attention(a.D, a.Dv), "cuda attention_backward: head sizes ", a.D, " and ", a.Dv,
           " exceed the kernel's ", kMaxFusedAttentionHead);
  activate();
  if (mma_attention_serves(*this, dt, a)) {
    mma_attention_backward(*this, dq, dk, dv, dout, q, k, v, out, static_cast<const float*>(lse), a);
    return;
  }
  HLC_DISPATCH_FLOAT(dt, T, "attention_backward", {
    const TempBuffer delta(*this, static_cast<size_t>(a.B * a.H * a.Tq) * sizeof(T));
    attention_delta_kernel<T><<<grid_for(a.B * a.H * a.Tq), kThreads, 0, stream_>>>(delta.as<T>(), dout, out, a);
    HL_CUDA_LAUNCH_CHECK("attention_backward (delta)");
    const T* L = static_cast<const T*>(lse);
    with_head_width<kMaxFusedAttentionHead>(a.D, a.Dv, [&](auto dm) {
      constexpr int DM = decltype(dm)::value;
      const int64_t key_tiles = ceil_div(a.Tk, int64_t{kRows}), query_tiles = ceil_div(a.Tq, int64_t{kRows});
      attention_dkdv_kernel<T, DM>
          <<<a.B * a.H * key_tiles, kRows, 0, stream_>>>(dk, dv, dout, q, k, v, L, delta.as<T>(), a, key_tiles);
      HL_CUDA_LAUNCH_CHECK("attention_backward (dk, dv)");
      attention_dq_kernel<T, DM>
          <<<a.B * a.H * query_tiles, kRows, 0, stream_>>>(dq, dout, q, k, v, L, delta.as<T>(), a, query_tiles);
    });
  });
  HL_CUDA_LAUNCH_CHECK("attention_backward (dq)");
}

}  // namespace headlab
