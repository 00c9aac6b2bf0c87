// Fused attention for float32 on the tensor cores (FlashAttention-2's tiling; the contract of
// Backend::attention_forward / attention_backward, cuda_attention.cuh says where it serves).
//   forward: a block per (b, h, 64 query rows), a warp per 16 of them; key/value tiles of 64 rows staged in
//            shared memory; S = Q K^T and O += P V as m16n8k8 MMAs; an online softmax over the accumulators;
//            writes O and each row's log-sum-exp.
//   backward: a block per (b, h, 64 keys) for dK and dV over every query tile that sees them, recomputing P
//            from the log-sum-exp (FlashAttention-2's five products: S, dV, dP, dK, dQ); each block adds its
//            share of dQ to the output with atomics, as PyTorch's memory-efficient kernel does by default.
//            Deterministic (set_deterministic_attention): dQ from a second kernel over query tiles, every
//            gradient row with one writer, at the cost of computing S and dP twice (seven products).
// Precision: each float operand is split into a TF32 high part and a TF32 remainder, and a product is the
// three MMAs hi*hi + hi*lo + lo*hi (CUTLASS's "fast F32", what PyTorch's float32 memory-efficient attention
// runs): about float32's accuracy at a third of the tensor cores' TF32 rate, so TF32 off still holds.
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32), lane = 4 g + t: A (16 x 8, row-major) a0 (g, t), a1 (g + 8,
// t), a2 (g, t + 4), a3 (g + 8, t + 4); B (8 x 8) b0 (k t, n g), b1 (k t + 4, n g); C (16 x 8) c0 (g, 2t),
// c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
#include "backends/cuda/cuda_attention.cuh"

namespace headlab {
namespace cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRows = 16 * kWarps;  // rows of a block's own tile (queries or keys), 16 a warp
constexpr int kStep = 64;           // rows of the other side staged per step (keys or queries)
constexpr int kThreadsMma = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ int64_t lmin(int64_t x, int64_t y) { return x < y ? x : y; }

// A staged tile's row pitch in floats: DM + 4 puts the 8 rows x 4 columns of an A or row-read B fragment,
// and the 4 row pairs x 8 columns of a column-read B fragment, in 32 different banks.
template <int DM>
constexpr int pitch() {
  return DM + 4;
}

// ---- 3xTF32 fragments ----
__device__ __forceinline__ uint32_t to_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return __float_as_uint(x);  // never reached there (mma_tf32)
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#endif
}

template <int N>
struct Frag {
  uint32_t hi[N], lo[N];
};
using FragA = Frag<4>;
using FragB = Frag<2>;

template <int N>
__device__ __forceinline__ Frag<N> split(const float (&x)[N]) {
  Frag<N> f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    f.hi[i] = to_tf32(x[i]);
    f.lo[i] = to_tf32(x[i] - __uint_as_float(f.hi[i]));
  }
  return f;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // built for an older GPU too: mma_attention_serves keeps such a device off this path
#else
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// d += a b, the small cross terms first.
__device__ __forceinline__ void mma3(float (&d)[4], const FragA& a, const FragB& b) {
  mma_tf32(d, a.lo, b.hi);
  mma_tf32(d, a.hi, b.lo);
  mma_tf32(d, a.hi, b.hi);
}

struct Lane {
  int g, t;
};
__device__ __forceinline__ Lane lane_of() {
  const int lane = static_cast<int>(threadIdx.x & 31);
  return {lane >> 2, lane & 3};
}

// A = X[r0 .. r0 + 16, k0 .. k0 + 8] of a staged tile.
template <int DM>
__device__ __forceinline__ FragA a_rows(const float* X, int r0, int k0, Lane l) {
  constexpr int P = pitch<DM>();
  const float* x = X + (r0 + l.g) * P + k0 + l.t;
  const float v[4] = {x[0], x[8 * P], x[4], x[8 * P + 4]};
  return split(v);
}

// B = X[n0 .. n0 + 8, k0 .. k0 + 8]^T of a staged tile (B[k][n] = X[n0 + n][k0 + k]): S = Q K^T's K.
template <int DM>
__device__ __forceinline__ FragB b_rows(const float* X, int n0, int k0, Lane l) {
  constexpr int P = pitch<DM>();
  const float* x = X + (n0 + l.g) * P + k0 + l.t;
  const float v[2] = {x[0], x[4]};
  return split(v);
}

// B = X[k0 .. k0 + 8, n0 .. n0 + 8] with its k rows in the order of a_from_acc's columns: logical k = t is
// row 2t, k = t + 4 is row 2t + 1 (O += P V's V).
template <int DM>
__device__ __forceinline__ FragB b_cols(const float* X, int k0, int n0, Lane l) {
  constexpr int P = pitch<DM>();
  const float* x = X + (k0 + 2 * l.t) * P + n0 + l.g;
  const float v[2] = {x[0], x[P]};
  return split(v);
}

// An accumulator tile (16 x 8, C layout) as the A operand of the next product, its 8 columns taken in the
// order b_cols reads the rows: no data moves between lanes.
__device__ __forceinline__ FragA a_from_acc(const float (&c)[4]) {
  const float v[4] = {c[0], c[2], c[1], c[3]};
  return split(v);
}

// A = X^T (A[m][k] = X[k0 + k][r0 + m]) of a staged tile of pitch PITCH, its k rows in b_cols's order: dQ's dS
// from the dS^T tile the dK/dV kernel leaves in shared memory.
template <int PITCH>
__device__ __forceinline__ FragA a_cols(const float* X, int r0, int k0, Lane l) {
  const float* x = X + (k0 + 2 * l.t) * PITCH + r0 + l.g;
  const float v[4] = {x[0], x[8], x[PITCH], x[PITCH + 8]};
  return split(v);
}

// rows x cols of src (row stride ld) into a tile of kStep rows, zero elsewhere (rows past n, columns past cols):
// the zero columns make full-width products exact, the zero rows harmless.
template <int DM>
__device__ __forceinline__ void stage(float* dst, const float* src, int64_t ld, int n, int64_t cols) {
  if (cols == DM && (ld & 3) == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {  // whole rows, 16-byte aligned
    constexpr int kVecs = DM / 4;
    for (int e = static_cast<int>(threadIdx.x); e < kStep * kVecs; e += kThreadsMma) {
      const int r = e / kVecs, c = 4 * (e % kVecs);
      *reinterpret_cast<float4*>(dst + r * pitch<DM>() + c) =
          r < n ? *reinterpret_cast<const float4*>(src + r * ld + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    return;
  }
  for (int e = static_cast<int>(threadIdx.x); e < kStep * DM; e += kThreadsMma) {
    const int r = e / DM, c = e % DM;
    dst[r * pitch<DM>() + c] = r < n && c < cols ? src[r * ld + c] : 0.f;
  }
}

// acc (16 rows x 8 n-tiles of 8 columns, C layout) = X_rows A-side [r0, r0 + 16) times Y^T (Y rows n, the
// 64 staged rows): S = Q K^T, dP = dO V^T and their transposes.
template <int DM>
__device__ __forceinline__ void product_rows(float (&acc)[kStep / 8][4], const float* X, int r0, const float* Y,
                                             Lane l) {
#pragma unroll
  for (int n = 0; n < kStep / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int k0 = 0; k0 < DM; k0 += 8) {
    const FragA a = a_rows<DM>(X, r0, k0, l);
#pragma unroll
    for (int n = 0; n < kStep / 8; ++n) mma3(acc[n], a, b_rows<DM>(Y, 8 * n, k0, l));
  }
}

// out (16 x DM) += W (16 x kStep, accumulators) Y (kStep staged rows x DM): O += P V, dV += P^T dO, ...
template <int DM>
__device__ __forceinline__ void accumulate(float (&out)[DM / 8][4], const float (&w)[kStep / 8][4], const float* Y,
                                           Lane l) {
#pragma unroll
  for (int k = 0; k < kStep / 8; ++k) {
    const FragA a = a_from_acc(w[k]);
#pragma unroll
    for (int n = 0; n < DM / 8; ++n) mma3(out[n], a, b_cols<DM>(Y, 8 * k, 8 * n, l));
  }
}

// Row r (0: the lane's row g, 1: g + 8) of an accumulator tile (16 x DM) times `factor` into dst[0, cols).
template <int DM>
__device__ __forceinline__ void store_row(float* dst, const float (&acc)[DM / 8][4], int r, int64_t cols, float factor,
                                          Lane l) {
#pragma unroll
  for (int nt = 0; nt < DM / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * nt + 2 * l.t + e;
      if (col < cols) dst[col] = factor * acc[nt][2 * r + e];
    }
}

// The smallest and largest valid key counts of the block's present rows (every thread passes its own two).
struct KeyRange {
  int64_t lo, hi;
};
__device__ __forceinline__ KeyRange block_key_range(const int64_t (&valid)[2], const bool (&present)[2]) {
  __shared__ unsigned long long lo, hi;
  if (threadIdx.x == 0) lo = ~0ull, hi = 0;
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (present[r]) {
      atomicMin(&lo, static_cast<unsigned long long>(valid[r]));
      atomicMax(&hi, static_cast<unsigned long long>(valid[r]));
    }
  __syncthreads();
  return {static_cast<int64_t>(lo == ~0ull ? 0 : lo), static_cast<int64_t>(hi)};
}

// The keys the block's query tile needs, [0, hi): a causal tile stops at its last row.
struct QueryTile {
  int64_t bh, i0;
  int64_t row[2], valid[2];
  bool present[2];
  KeyRange keys;
};
__device__ __forceinline__ QueryTile query_tile(const AttnParams& a, int64_t n_tiles, Lane l) {
  QueryTile q;
  const int64_t BH = a.B * a.H;
  // Causal tiles with the most keys first, so that the light ones fill in at the end.
  q.bh = blockIdx.x % BH;
  q.i0 = (n_tiles - 1 - blockIdx.x / BH) * kRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    q.row[r] = q.i0 + 16 * (threadIdx.x >> 5) + l.g + 8 * r;
    q.present[r] = q.row[r] < a.Tq;
    q.valid[r] = q.present[r] ? valid_keys(a, q.bh, q.row[r]) : 0;
  }
  q.keys = block_key_range(q.valid, q.present);
  return q;
}

// Up to head size 64, four blocks an SM (shared memory allows four; so must the registers, at most 128).
template <int DM>
__global__ void __launch_bounds__(kThreadsMma, DM <= 64 ? 4 : 1)
    mma_attention_forward_kernel(AttnResult out, float* lse, AttnOperand q, AttnOperand k, AttnOperand v, AttnParams a,
                                 int64_t n_tiles) {
  extern __shared__ __align__(16) float smem[];  // float4 staging
  constexpr int P = pitch<DM>();
  float *Qs = smem, *Ks = Qs + kRows * P, *Vs = Ks + kStep * P;
  const Lane l = lane_of();
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const QueryTile qt = query_tile(a, n_tiles, l);
  const float* K = head_ptr<float>(k, qt.bh, a.H);
  const float* V = head_ptr<float>(v, qt.bh, a.H);
  stage<DM>(Qs, head_ptr<float>(q, qt.bh, a.H) + qt.i0 * q.st, q.st, static_cast<int>(lmin(a.Tq - qt.i0, kRows)), a.D);
  const float c = static_cast<float>(a.scale) * kLog2e;  // scores in log2 units: exp2 is one instruction
  float o[DM / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.f, 0.f};
  for (int64_t j0 = 0; j0 < qt.keys.hi; j0 += kStep) {
    const int n = static_cast<int>(lmin(a.Tk - j0, kStep));
    __syncthreads();  // every warp is done with the last tiles (and Qs is staged, the first time)
    stage<DM>(Ks, K + j0 * k.st, k.st, n, a.D);
    stage<DM>(Vs, V + j0 * v.st, v.st, n, a.Dv);
    __syncthreads();
    float s[kStep / 8][4];
    product_rows<DM>(s, Qs, 16 * warp, Ks, l);
    const bool mask = j0 + kStep > qt.keys.lo;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kStep / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * r + e];
          x = !mask || j0 + 8 * nt + 2 * l.t + e < qt.valid[r] ? x * c : -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      // A row that has seen no valid key yet keeps m = -inf and p = 0.
      const float base = m_new == -INFINITY ? 0.f : m_new, alpha = exp2f(m[r] - base);
      lsum[r] *= alpha;
#pragma unroll
      for (int nt = 0; nt < DM / 8; ++nt) o[nt][2 * r] *= alpha, o[nt][2 * r + 1] *= alpha;
#pragma unroll
      for (int nt = 0; nt < kStep / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * r + e];
          x = exp2f(x - base);
          lsum[r] += x;
        }
      m[r] = m_new;
    }
    accumulate<DM>(o, s, Vs, l);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = lsum[r] + __shfl_xor_sync(0xffffffffu, lsum[r], 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    if (!qt.present[r]) continue;
    store_row<DM>(head_ptr<float>(out, qt.bh, a.H) + qt.row[r] * out.st, o, r, a.Dv, total > 0.f ? 1.f / total : 0.f,
                  l);
    if (l.t == 0)
      lse[qt.bh * a.Tq + qt.row[r]] =
          total > 0.f ? static_cast<float>(m[r] / kLog2e + log(static_cast<double>(total))) : INFINITY;
  }
}

// The backward kernels' blocks an SM up to head size 64: three (their ~70 KB of shared memory allows three;
// registers capped at 168, a few spilled, against 2 blocks at 255: 1.69 against 2.02 ms forward + backward at
// B 8 H 12 T 1024 D 64 on an H200). Wider heads keep every register (one or two blocks by shared memory).
template <int DM>
constexpr int kBackwardBlocks = DM <= 64 ? 3 : 1;

// dK and dV of 64 keys (a warp per 16) over every query tile that sees them:
//   S^T = K Q^T, P^T = exp(scale S^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
//   dK += scale dS^T Q, and with kDq dQ += scale dS K: the block's dS^T goes through shared memory (in dO's
//   tile, read by then) and each warp adds 16 queries' share over the block's 64 keys to dq (zeroed before).
constexpr int kDsPitch = kStep + 4;  // dS^T's tile: 64 keys x 64 queries, a_cols reading without conflicts

template <int DM>
constexpr int do_pitch() {  // dO's tile also holds dS^T
  return pitch<DM>() > kDsPitch ? pitch<DM>() : kDsPitch;
}

template <int DM, bool kDq>
__global__ void __launch_bounds__(kThreadsMma, kBackwardBlocks<DM>)
    mma_attention_dkdv_kernel(AttnResult dk, AttnResult dv, AttnResult dq, AttnOperand dout, AttnOperand q,
                              AttnOperand k, AttnOperand v, const float* lse, const float* delta, AttnParams a) {
  extern __shared__ __align__(16) float smem[];  // float4 staging
  constexpr int P = pitch<DM>();
  float *Ks = smem, *Vs = Ks + kRows * P, *Qs = Vs + kRows * P, *dOs = Qs + kStep * P;
  float *Ls = dOs + kStep * do_pitch<DM>(), *Ds = Ls + kStep;
  int64_t* Vld = reinterpret_cast<int64_t*>(Ds + kStep);
  const Lane l = lane_of();
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t BH = a.B * a.H, bh = blockIdx.x % BH, j0 = (blockIdx.x / BH) * kRows;  // the heaviest tiles first
  const int nk = static_cast<int>(lmin(a.Tk - j0, kRows));
  stage<DM>(Ks, head_ptr<float>(k, bh, a.H) + j0 * k.st, k.st, nk, a.D);
  stage<DM>(Vs, head_ptr<float>(v, bh, a.H) + j0 * v.st, v.st, nk, a.Dv);
  const float* Q = head_ptr<const float>(q, bh, a.H);
  const float* dO = head_ptr<const float>(dout, bh, a.H);
  const float c = static_cast<float>(a.scale) * kLog2e, scale = static_cast<float>(a.scale);
  float dkacc[DM / 8][4] = {}, dvacc[DM / 8][4] = {};
  // The keys of this thread's accumulator rows.
  const int64_t key[2] = {j0 + 16 * warp + l.g, j0 + 16 * warp + l.g + 8};
  // Causally, query i sees key j only when i >= j: the queries before this tile see none of it.
  for (int64_t i0 = a.mask == SoftmaxMask::causal ? j0 : 0; i0 < a.Tq; i0 += kStep) {
    const int n = static_cast<int>(lmin(a.Tq - i0, kStep));
    __syncthreads();
    stage<DM>(Qs, Q + i0 * q.st, q.st, n, a.D);
    stage<DM>(dOs, dO + i0 * dout.st, dout.st, n, a.Dv);
    for (int r = static_cast<int>(threadIdx.x); r < kStep; r += kThreadsMma) {
      const bool row = r < n;
      Ls[r] = row ? lse[bh * a.Tq + i0 + r] * kLog2e : INFINITY;
      Ds[r] = row ? delta[bh * a.Tq + i0 + r] : 0.f;
      Vld[r] = row ? valid_keys(a, bh, i0 + r) : 0;
    }
    __syncthreads();
    float s[kStep / 8][4], dp[kStep / 8][4];
    product_rows<DM>(s, Ks, 16 * warp, Qs, l);  // S^T: keys x queries
#pragma unroll
    for (int nt = 0; nt < kStep / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * nt + 2 * l.t + (e & 1);  // the query
        s[nt][e] = key[e >> 1] < Vld[col] ? exp2f(s[nt][e] * c - Ls[col]) : 0.f;
      }
    accumulate<DM>(dvacc, s, dOs, l);
    product_rows<DM>(dp, Vs, 16 * warp, dOs, l);  // dP^T
#pragma unroll
    for (int nt = 0; nt < kStep / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[nt][e] = s[nt][e] * (dp[nt][e] - Ds[8 * nt + 2 * l.t + (e & 1)]);
    accumulate<DM>(dkacc, dp, Qs, l);
    if constexpr (kDq) {
      float* dSs = dOs;
      __syncthreads();  // every warp is done with dO
#pragma unroll
      for (int nt = 0; nt < kStep / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dSs[(16 * warp + l.g + 8 * (e >> 1)) * kDsPitch + 8 * nt + 2 * l.t + (e & 1)] = dp[nt][e];
      __syncthreads();
      // This warp's 16 queries over the block's 64 keys, 64 columns at a time (registers).
      const bool pairs = (dq.st & 1) == 0 && (reinterpret_cast<uintptr_t>(dq.p) & 7) == 0 && (dq.sb & 1) == 0 &&
                         (dq.sh & 1) == 0;
      constexpr int NC = DM < 64 ? DM : 64;
#pragma unroll
      for (int c0 = 0; c0 < DM; c0 += NC) {
        float acc[NC / 8][4] = {};
#pragma unroll
        for (int k0 = 0; k0 < kStep; k0 += 8) {
          const FragA ds = a_cols<kDsPitch>(dSs, 16 * warp, k0, l);
#pragma unroll
          for (int nt = 0; nt < NC / 8; ++nt) mma3(acc[nt], ds, b_cols<DM>(Ks, k0, c0 + 8 * nt, l));
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t i = i0 + 16 * warp + l.g + 8 * r;
          if (i >= a.Tq) continue;
          float* dQ = head_ptr<float>(dq, bh, a.H) + i * dq.st;
#pragma unroll
          for (int nt = 0; nt < NC / 8; ++nt) {
            const int col = c0 + 8 * nt + 2 * l.t;  // and col + 1
            const float x0 = scale * acc[nt][2 * r], x1 = scale * acc[nt][2 * r + 1];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (pairs && col + 1 < a.D) {  // one 8-byte atomic for the pair (compute capability 9)
              atomicAdd(reinterpret_cast<float2*>(dQ + col), make_float2(x0, x1));
              continue;
            }
#endif
            if (col < a.D) atomicAdd(dQ + col, x0);
            if (col + 1 < a.D) atomicAdd(dQ + col + 1, x1);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= a.Tk) continue;
    store_row<DM>(head_ptr<float>(dk, bh, a.H) + key[r] * dk.st, dkacc, r, a.D, scale, l);
    store_row<DM>(head_ptr<float>(dv, bh, a.H) + key[r] * dv.st, dvacc, r, a.Dv, 1.f, l);
  }
}

// delta[bh * Tq + i] = dO_i . O_i, a warp per row reading both rows coalesced (heads over y, rows over x, so
// that no thread divides 64-bit indices per row); with zero_dq, row i of dq is zeroed for the dK/dV kernel's
// atomics.
constexpr int kDeltaRows = 8;  // warps (rows) a block
__global__ void mma_attention_delta_kernel(float* delta, AttnResult dq, bool zero_dq, AttnOperand dout, AttnOperand out,
                                           AttnParams a) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t bh = blockIdx.y; bh < a.B * a.H; bh += gridDim.y) {
    const float* dO = head_ptr<const float>(dout, bh, a.H);
    const float* O = head_ptr<const float>(out, bh, a.H);
    float* dQ = head_ptr<float>(dq, bh, a.H);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDeltaRows + (threadIdx.x >> 5); i < a.Tq;
         i += static_cast<int64_t>(gridDim.x) * kDeltaRows) {
      float d = 0.f;
      for (int64_t c = lane; c < a.Dv; c += 32) d += dO[i * dout.st + c] * O[i * out.st + c];
      d = warp_sum(d);
      if (lane == 0) delta[bh * a.Tq + i] = d;
      if (zero_dq)
        for (int64_t c = lane; c < a.D; c += 32) dQ[i * dq.st + c] = 0.f;
    }
  }
}

// dQ of 64 queries (a warp per 16) over the keys they see:
//   S = Q K^T, P = exp(scale S - lse), dP = dO V^T, dS = P (dP - delta), dQ += scale dS K.
template <int DM>
__global__ void __launch_bounds__(kThreadsMma, kBackwardBlocks<DM>)
    mma_attention_dq_kernel(AttnResult dq, AttnOperand dout, AttnOperand q, AttnOperand k, AttnOperand v,
                            const float* lse, const float* delta, AttnParams a, int64_t n_tiles) {
  extern __shared__ __align__(16) float smem[];  // float4 staging
  constexpr int P = pitch<DM>();
  float *Qs = smem, *dOs = Qs + kRows * P, *Ks = dOs + kRows * P, *Vs = Ks + kStep * P;
  const Lane l = lane_of();
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const QueryTile qt = query_tile(a, n_tiles, l);
  const int nq = static_cast<int>(lmin(a.Tq - qt.i0, kRows));
  stage<DM>(Qs, head_ptr<const float>(q, qt.bh, a.H) + qt.i0 * q.st, q.st, nq, a.D);
  stage<DM>(dOs, head_ptr<const float>(dout, qt.bh, a.H) + qt.i0 * dout.st, dout.st, nq, a.Dv);
  const float* K = head_ptr<const float>(k, qt.bh, a.H);
  const float* V = head_ptr<const float>(v, qt.bh, a.H);
  const float c = static_cast<float>(a.scale) * kLog2e;
  float L[2], Dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    L[r] = qt.present[r] ? lse[qt.bh * a.Tq + qt.row[r]] * kLog2e : INFINITY;
    Dl[r] = qt.present[r] ? delta[qt.bh * a.Tq + qt.row[r]] : 0.f;
  }
  float dqacc[DM / 8][4] = {};
  for (int64_t j0 = 0; j0 < qt.keys.hi; j0 += kStep) {
    const int n = static_cast<int>(lmin(a.Tk - j0, kStep));
    __syncthreads();
    stage<DM>(Ks, K + j0 * k.st, k.st, n, a.D);
    stage<DM>(Vs, V + j0 * v.st, v.st, n, a.Dv);
    __syncthreads();
    float s[kStep / 8][4], dp[kStep / 8][4];
    product_rows<DM>(s, Qs, 16 * warp, Ks, l);
    product_rows<DM>(dp, dOs, 16 * warp, Vs, l);
#pragma unroll
    for (int nt = 0; nt < kStep / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t j = j0 + 8 * nt + 2 * l.t + (e & 1);
        const float p = j < qt.valid[r] ? exp2f(s[nt][e] * c - L[r]) : 0.f;
        dp[nt][e] = p * (dp[nt][e] - Dl[r]);
      }
    accumulate<DM>(dqacc, dp, Ks, l);
  }
  const float scale = static_cast<float>(a.scale);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (qt.present[r]) store_row<DM>(head_ptr<float>(dq, qt.bh, a.H) + qt.row[r] * dq.st, dqacc, r, a.D, scale, l);
  }
}

// Launches kernel with `bytes` of dynamic shared memory (past the default 48 KiB: opted in once per kernel).
template <typename... KArgs, typename... Args>
void launch_mma(CudaBackend& be, const char* what, void (*kernel)(KArgs...), int64_t blocks, size_t bytes,
                Args... args) {
  HL_CUDA_CHECK(what,
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  // All of L1 that can be shared memory: the blocks an SM are counted on it (else the driver may pick a carveout
  // that holds fewer).
  HL_CUDA_CHECK(what, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  kernel<<<static_cast<unsigned>(blocks), kThreadsMma, bytes, be.stream()>>>(static_cast<KArgs>(args)...);
  HL_CUDA_LAUNCH_CHECK(what);
}

}  // namespace

bool mma_attention_serves(const CudaBackend& be, DType dt, const AttnParams& a) {
  return be.compute_major() >= 8 && dt == DType::f32 && a.dropout_p == 0 && a.D <= kMmaMaxHead && a.Dv <= kMmaMaxHead &&
         a.group == 1;
}

void mma_attention_forward(CudaBackend& be, const AttnResult& out, float* lse, const AttnOperand& q,
                           const AttnOperand& k, const AttnOperand& v, const AttnParams& a) {
  const int64_t n_tiles = ceil_div(a.Tq, int64_t{kRows});
  with_head_width<kMmaMaxHead>(a.D, a.Dv, [&](auto dm) {
    constexpr int DM = decltype(dm)::value;
    const size_t bytes = sizeof(float) * (kRows + 2 * kStep) * pitch<DM>();
    launch_mma(be, "attention_forward (tensor cores)", mma_attention_forward_kernel<DM>, a.B * a.H * n_tiles, bytes,
               out, lse, q, k, v, a, n_tiles);
  });
}

void mma_attention_backward(CudaBackend& be, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                            const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
                            const AttnOperand& out, const float* lse, const AttnParams& a) {
  const int64_t rows = a.B * a.H * a.Tq;
  const bool atomic_dq = !a.deterministic;
  const TempBuffer delta(be, static_cast<size_t>(rows) * sizeof(float));
  const dim3 delta_grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(a.Tq, int64_t{kDeltaRows}), 65535)),
                        static_cast<unsigned>(std::min<int64_t>(a.B * a.H, 65535)));
  mma_attention_delta_kernel<<<delta_grid, 32 * kDeltaRows, 0, be.stream()>>>(delta.as<float>(), dq, atomic_dq, dout,
                                                                               out, a);
  HL_CUDA_LAUNCH_CHECK("attention_backward (delta; tensor cores)");
  with_head_width<kMmaMaxHead>(a.D, a.Dv, [&](auto dm) {
    constexpr int DM = decltype(dm)::value;
    const size_t dkdv_bytes = sizeof(float) * ((2 * kRows + kStep) * pitch<DM>() + kStep * do_pitch<DM>()) +
                              kStep * (2 * sizeof(float) + sizeof(int64_t));
    const int64_t key_blocks = a.B * a.H * ceil_div(a.Tk, int64_t{kRows});
    if (atomic_dq) {
      launch_mma(be, "attention_backward (dk, dv, dq; tensor cores)", mma_attention_dkdv_kernel<DM, true>, key_blocks,
                 dkdv_bytes, dk, dv, dq, dout, q, k, v, lse, delta.as<float>(), a);
      return;
    }
    launch_mma(be, "attention_backward (dk, dv; tensor cores)", mma_attention_dkdv_kernel<DM, false>, key_blocks,
               dkdv_bytes, dk, dv, dq, dout, q, k, v, lse, delta.as<float>(), a);
    const int64_t n_tiles = ceil_div(a.Tq, int64_t{kRows});
    launch_mma(be, "attention_backward (dq; tensor cores)", mma_attention_dq_kernel<DM>, a.B * a.H * n_tiles,
               sizeof(float) * (2 * kRows + 2 * kStep) * pitch<DM>(), dq, dout, q, k, v, lse, delta.as<float>(), a,
               n_tiles);
  });
}

}  // namespace cuda
}  // namespace headlab
