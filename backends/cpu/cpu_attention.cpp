// The CPU backend's fused scaled-dot-product attention (FlashAttention-2's algorithm): for each
// (b, h) and tile of queries, an online softmax (running max and sum) over tiles of keys, skipping
// key tiles that no row of the tile may see; only the output and the per-row log-sum-exp are
// written. Backward recomputes the weights tile by tile from the log-sum-exp, and the dropout mask
// from its Philox counters, so nothing of size Tq x Tk outlives a tile.
// B = batch, H = heads, Tq / Tk = queries / keys, D = q/k head size, Dv = v head size.
#include <omp.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/aligned_scratch.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/simd.h"
#include "backends/philox.h"

namespace headlab::cpu {
namespace {

// Query rows x key columns per tile: a tile's scores are 32 KiB in float. bench/bench_attention.cpp
// at D = 32, one thread: 64 x 64, 64 x 128, 64 x 256 and 128 x 128 lie within the noise (64 x 128
// a few percent ahead at T = 64 and 256).
constexpr int64_t kBr = 64, kBc = 128;
// Tile products go to BLAS (one thread each): sgemm on tiles beat plain vectorised loops (i-k-j,
// B^T staged) 2-3x at D = 32, forward and backward alike.

// z[j] = keep_scale where weight element e0 + j survives dropout, else 0 (one Philox call per 4).
template <typename T>
inline void dropout_row(T* z, int64_t n, int64_t e0, double p, T keep_scale, uint64_t seed, uint64_t offset) {
  int64_t e = e0;
  const int64_t end = e0 + n;
  while (e < end) {
    const philox::U4 r = philox::philox4x32(offset + static_cast<uint64_t>(e) / 4, seed);
    for (int lane = static_cast<int>(e % 4); lane < 4 && e < end; ++lane, ++e)
      z[e - e0] = philox::to_unit(r.v[lane]) >= p ? keep_scale : T(0);
  }
}

// The keys row i of head bh may see: j < valid.
inline int64_t valid_keys(const AttnParams& a, int64_t bh, int64_t i) {
  switch (a.mask) {
    case SoftmaxMask::causal:
      return std::min(i + 1, a.Tk);
    case SoftmaxMask::lengths:
      return std::clamp<int64_t>(a.lengths[bh * a.Tq + i], 0, a.Tk);
    default:
      return a.Tk;
  }
}

// Head bh = b * H + h of an operand (const T*) or a result (T*).
template <typename T, typename Ptr>
inline auto head_ptr(const AttnView<Ptr>& o, int64_t bh, int64_t H) {
  using Elem = std::conditional_t<std::is_const_v<Ptr>, const T, T>;
  return static_cast<Elem*>(o.p) + (bh / H) * o.sb + (bh % H) * o.sh;
}

// Key/value head of query head bh = b * H + h under grouped-query attention: b * H + h / group of an
// operand whose head stride is per key/value head.
template <typename T>
inline const T* kv_head_ptr(const AttnOperand& o, int64_t bh, const AttnParams& a) {
  return static_cast<const T*>(o.p) + (bh / a.H) * o.sb + ((bh % a.H) / a.group) * o.sh;
}

// Zeroes `rows` rows of `cols` elements, `ld` apart.
template <typename T>
inline void zero_rows(T* p, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::fill(p + r * ld, p + r * ld + cols, T(0));
}

// X^T (d, n) of the last operand X (n, d) a thread asked for, kept while it is asked for again: a product
// with a transposed operand copies it first (libxsmm) or packs it (OpenBLAS) every time, so with several
// query tiles per head the keys' transpose is made once per head, not once per tile. Off (of() answers
// nullptr) with one query tile, where every key tile is read once anyway.
template <typename T>
class Transposed {
 public:
  explicit Transposed(bool on) : on_(on) {}
  const T* of(const T* X, int64_t n, int64_t d, int64_t ld) {
    if (!on_) return nullptr;
    if (X != from_) {
      xt_ = buf_.get(static_cast<size_t>(n * d));
      blas_transpose<T>(n, d, X, ld, xt_, n);
      from_ = X;
    }
    return xt_;
  }

 private:
  bool on_;
  AlignedScratch<T> buf_;
  T* xt_ = nullptr;
  const T* from_ = nullptr;
};

// C (rows, cols) = A (rows, d) @ X[j0 : j0 + cols]^T for X (n, d), from Xt = X^T (d, n) where there is one.
template <typename T>
inline void times_rows_transposed(int64_t rows, int64_t cols, int64_t d, const T* A, int64_t lda, const T* X,
                                  int64_t ldx, const T* Xt, int64_t n, int64_t j0, T* C, int64_t ldc) {
  if (Xt)
    blas_gemm<T>(false, false, rows, cols, d, T(1), A, lda, Xt + j0, n, T(0), C, ldc);
  else
    blas_gemm<T>(false, true, rows, cols, d, T(1), A, lda, X + j0 * ldx, ldx, T(0), C, ldc);
}

HEADLAB_SIMD_BEGIN
#ifdef __AVX512F__
// r[i] = the sum of v[i]'s 16 lanes, for 16 vectors: neighbours interleaved and added, then pairs of them, then the
// 128-bit quarters (a transposing reduction: about 3 instructions a vector, where a horizontal sum takes 8).
inline __m512 lane_sums16(const __m512* v) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // each 128-bit quarter of u[i]: its part of vectors 4i .. 4i + 3
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const auto quarters = [](__m512 a, __m512 b) {  // a's and b's quarters added in pairs: (a0+a1, a2+a3, b0+b1, b2+b3)
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  };
  return quarters(quarters(u[0], u[1]), quarters(u[2], u[3]));
}
#endif

// s[j] = scale * (q . K[j]) for n keys `ld` apart, D elements each. With AVX-512 (float, D a multiple of 16) 16 keys
// at a time, their lane-wise products summed by one transposing reduction: a horizontal sum per key had cost about
// as much as its dot product.
template <typename T>
inline void key_scores(const T* q, const T* K, int64_t ld, int64_t n, int64_t D, T scale, T* s) {
  int64_t j = 0;
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    if (D % 16 == 0)
      for (; j + 16 <= n; j += 16) {
        __m512 p[16];
        for (int r = 0; r < 16; ++r) {
          const float* kr = K + (j + r) * ld;
          __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(kr));
          for (int64_t c = 16; c < D; c += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(kr + c), acc);
          p[r] = acc;
        }
        _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_set1_ps(scale), lane_sums16(p)));
      }
  }
#endif
  for (; j < n; ++j) {
    const T* kj = K + j * ld;
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < D; ++c) dot += q[c] * kj[c];
    s[j] = scale * dot;
  }
}

// o (Dv) += sum_j p[j] V[j] over n value rows `ld` apart. With AVX-512 (float, Dv a multiple of 64) 64 columns of o
// stay in registers over all the rows, where the row-by-row loop loaded and stored them for every row.
template <typename T>
inline void add_weighted_rows(const T* p, const T* V, int64_t ld, int64_t n, int64_t Dv, T* o) {
#ifdef __AVX512F__
  if constexpr (std::is_same_v<T, float>) {
    if (Dv % 64 == 0) {
      for (int64_t c = 0; c < Dv; c += 64) {
        __m512 acc[4];
        for (int i = 0; i < 4; ++i) acc[i] = _mm512_loadu_ps(o + c + 16 * i);
        for (int64_t j = 0; j < n; ++j) {
          const __m512 pj = _mm512_set1_ps(p[j]);
          const float* vj = V + j * ld + c;
          for (int i = 0; i < 4; ++i) acc[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16 * i), acc[i]);
        }
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(o + c + 16 * i, acc[i]);
      }
      return;
    }
  }
#endif
  for (int64_t j = 0; j < n; ++j) {
    const T pj = p[j];
    const T* vj = V + j * ld;
#pragma omp simd
    for (int64_t c = 0; c < Dv; ++c) o[c] += pj * vj[c];
  }
}

HEADLAB_SIMD_END

// Threads for a call: serial below the grain (gradchecks, toy models), else all of them.
inline int attention_threads(const AttnParams& a) {
  const double work = static_cast<double>(a.B * a.H) * a.Tq * a.Tk * (a.D + a.Dv);
  return work > 4.0 * kParallelGrain ? omp_get_max_threads() : 1;
}

// Decoding with a cache (Tq = 1, no dropout): each key/value head's `group` query heads over a chunk of its keys and
// values, each row read from memory once for the whole group (grouped-query attention's saving, and the stream a
// memory-bound step needs; the group's other queries find the chunk in cache), the keys cut into chunks across the
// threads (split-K, as flash decoding: a GPT-2 token has 12 heads for 2 threads, a SmolLM one 3 key/value heads), each
// chunk's max, sum and unnormalised output per query merged after. The tiles' path spent two BLAS GEMV calls (and a
// rescale of o) per 128 keys: ~2,300 calls a GPT-2 token, 1.5 ms of its ~20.
template <typename T>
void decode_forward(const AttnResult& out, T* lse, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
                    const AttnParams& a) {
  constexpr int64_t kMinChunk = 128;  // keys: shorter chunks cost more in merging than they save in balance
  const int64_t G = a.group, Hkv = a.H / G, D = a.D, Dv = a.Dv, Tk = a.Tk, kv_heads = a.B * Hkv;
  const int threads = attention_threads(a);
  const int64_t chunks =
      std::clamp<int64_t>((8 * threads + kv_heads - 1) / kv_heads, 1, std::max<int64_t>(Tk / kMinChunk, 1));
  const int64_t chunk = (Tk + chunks - 1) / chunks, items = kv_heads * chunks;
  // Per item and query of its group: the chunk's max score, its sum of exp(score - max), and sum_j e_j v_j.
  std::vector<T> part_m(static_cast<size_t>(items * G)), part_o(static_cast<size_t>(items * G * Dv));
  std::vector<Acc<T>> part_l(static_cast<size_t>(items * G));
  const T scale = static_cast<T>(a.scale);
  std::atomic<int64_t> next{0};
  parallel_team(items > 1 ? threads : 1, [&](int, int) {
    AlignedScratch<T> scores;
    T* const s = scores.get(static_cast<size_t>(G * std::max<int64_t>(chunk, 1)));  // (G, chunk)
    std::vector<int64_t> len(static_cast<size_t>(G));
    for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const int64_t kvh = it / chunks, j0 = (it % chunks) * chunk, j1 = std::min(Tk, j0 + chunk);
      const int64_t bh0 = (kvh / Hkv) * a.H + (kvh % Hkv) * G;  // the group's first query head
      const T* K = kv_head_ptr<T>(k, bh0, a) + j0 * k.st;
      const T* V = kv_head_ptr<T>(v, bh0, a) + j0 * v.st;
      for (int64_t g = 0; g < G; ++g) len[g] = std::clamp<int64_t>(valid_keys(a, bh0 + g, 0) - j0, 0, j1 - j0);
      for (int64_t g = 0; g < G; ++g)  // the chunk's keys from memory once, for the group's other queries from cache
        key_scores<T>(head_ptr<T>(q, bh0 + g, a.H), K, k.st, len[g], D, scale, s + g * chunk);
      T* const o = part_o.data() + it * G * Dv;
      std::fill(o, o + G * Dv, T(0));
      for (int64_t g = 0; g < G; ++g) {
        T* const sg = s + g * chunk;
        const int64_t n = len[g];
        const T mx = n ? lane_max<T>(n, [=](int64_t j) { return sg[j]; }) : -std::numeric_limits<T>::infinity();
        part_m[it * G + g] = mx;
        part_l[it * G + g] = n ? lane_sum<T>(n,
                                             [=](int64_t j) {
                                               const T e = fast_exp(sg[j] - mx);
                                               sg[j] = e;
                                               return e;
                                             })
                               : Acc<T>(0);
      }
      for (int64_t g = 0; g < G; ++g)  // the weighted sum, the values as the keys
        add_weighted_rows<T>(s + g * chunk, V, v.st, len[g], Dv, o + g * Dv);
    }
  });
  // Merge each query's chunks: o = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c, M the largest m_c.
  for (int64_t kvh = 0; kvh < kv_heads; ++kvh)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t bh = (kvh / Hkv) * a.H + (kvh % Hkv) * G + g;
      T* const orow = head_ptr<T>(out, bh, a.H);
      T M = -std::numeric_limits<T>::infinity();
      for (int64_t c = 0; c < chunks; ++c) M = std::max(M, part_m[(kvh * chunks + c) * G + g]);
      std::fill(orow, orow + Dv, T(0));
      if (M == -std::numeric_limits<T>::infinity()) {  // no key to attend to: zero output, no weight anywhere
        lse[bh] = std::numeric_limits<T>::infinity();
        continue;
      }
      Acc<T> L = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t i = (kvh * chunks + c) * G + g;
        if (part_l[i] == Acc<T>(0)) continue;
        const T w = std::exp(part_m[i] - M);
        L += w * part_l[i];
        const T* oc = part_o.data() + i * Dv;
        for (int64_t d = 0; d < Dv; ++d) orow[d] += w * oc[d];
      }
      const T inv = static_cast<T>(1.0 / static_cast<double>(L));
      for (int64_t d = 0; d < Dv; ++d) orow[d] *= inv;
      lse[bh] = static_cast<T>(M + std::log(static_cast<double>(L)));
    }
}

template <typename T>
void forward_impl(const AttnResult& out, T* lse, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
                  const AttnParams& a) {
  const int64_t BH = a.B * a.H, Tq = a.Tq, Tk = a.Tk, D = a.D, Dv = a.Dv;
  if (Tq == 1 && a.dropout_p == 0) return decode_forward<T>(out, lse, q, k, v, a);
  const int64_t n_qt = (Tq + kBr - 1) / kBr;
  const bool drop = a.dropout_p > 0;
  std::atomic<int64_t> next{0};  // the next (head, query tile) to take: a dynamic schedule
  parallel_team(attention_threads(a), [&](int, int) {
    // The scales are the thread's own locals: read through the lambda's references, a store to a score
    // row might alias them, and the row loops reloaded them every element (a gather, in the max).
    const T scale = static_cast<T>(a.scale), keep_scale = philox::dropout_scale<T>(a.dropout_p);
    AlignedScratch<T> s_tile;  // a GEMM's output and the next one's operand: from a 64-byte boundary
    T* const s = s_tile.get(kBr * kBc);
    std::vector<T> z(kBc), m(kBr);
    std::vector<Acc<T>> l(kBr);
    int64_t valid[kBr];
    Transposed<T> keys_t(n_qt > 1);
    for (int64_t w; (w = next.fetch_add(1, std::memory_order_relaxed)) < BH * n_qt;) {
      const int64_t bh = w / n_qt, i0 = (w % n_qt) * kBr, rows = std::min(kBr, Tq - i0);
      const T* Q = head_ptr<T>(q, bh, a.H) + i0 * q.st;
      const T* K = kv_head_ptr<T>(k, bh, a);
      const T* V = kv_head_ptr<T>(v, bh, a);
      const T* Kt = keys_t.of(K, Tk, D, k.st);
      T* O = head_ptr<T>(out, bh, a.H) + i0 * out.st;
      int64_t max_valid = 0;
      for (int64_t r = 0; r < rows; ++r) {
        valid[r] = valid_keys(a, bh, i0 + r);
        max_valid = std::max(max_valid, valid[r]);
        m[r] = -std::numeric_limits<T>::infinity();
        l[r] = 0;
      }
      zero_rows(O, rows, Dv, out.st);
      // Key tiles past every row's last valid key (beyond the causal diagonal) are never touched.
      for (int64_t j0 = 0; j0 < max_valid; j0 += kBc) {
        const int64_t cols = std::min(kBc, max_valid - j0);
        times_rows_transposed<T>(rows, cols, D, Q, q.st, K, k.st, Kt, Tk, j0, s, kBc);
        for (int64_t r = 0; r < rows; ++r) {
          T* sr = s + r * kBc;
          const int64_t n = std::clamp<int64_t>(valid[r] - j0, 0, cols);
          if (n == 0) {  // this row sees none of the tile: a zero row of P leaves O alone
            std::fill(sr, sr + cols, T(0));
            continue;
          }
          const T mx = lane_max<T>(n, [=](int64_t j) { return scale * sr[j]; });
          const T m_new = std::max(m[r], mx);
          const T alpha = fast_exp(m[r] - m_new);  // exp(-inf) = 0 on the row's first tile
          const Acc<T> sum = lane_sum<T>(n, [=](int64_t j) {
            const T e = fast_exp(scale * sr[j] - m_new);
            sr[j] = e;
            return e;
          });
          std::fill(sr + n, sr + cols, T(0));
          l[r] = l[r] * alpha + sum;  // the softmax's denominator counts dropped weights too
          m[r] = m_new;
          if (alpha != T(1)) {
            T* orow = O + r * out.st;
            for (int64_t c = 0; c < Dv; ++c) orow[c] *= alpha;
          }
          if (drop) {
            dropout_row(z.data(), n, ((bh * Tq + i0 + r) * Tk) + j0, a.dropout_p, keep_scale, a.seed, a.offset);
            for (int64_t j = 0; j < n; ++j) sr[j] *= z[j];
          }
        }
        blas_gemm<T>(false, false, rows, Dv, cols, T(1), s, kBc, V + j0 * v.st, v.st, T(1), O, out.st);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* orow = O + r * out.st;
        if (valid[r] == 0) {  // nothing to attend to: zero output (already), and no weight anywhere
          lse[bh * Tq + i0 + r] = std::numeric_limits<T>::infinity();
          continue;
        }
        const T inv = static_cast<T>(1.0 / static_cast<double>(l[r]));
        for (int64_t c = 0; c < Dv; ++c) orow[c] *= inv;
        lse[bh * Tq + i0 + r] = static_cast<T>(m[r] + std::log(static_cast<double>(l[r])));
      }
    }
  });
}

// FlashAttention-2's backward, one (b, h) per task so dQ / dK / dV of a head have one writer:
//   P = exp(scale S - lse), dV += (P o Z)^T dO, dP = (dO V^T) o Z,
//   dS = P o (dP - rowsum(dO o O)), dQ += scale dS K, dK += scale dS^T Q (scale dS formed in the row loop).
template <typename T>
void backward_impl(const AttnResult& dq, const AttnResult& dk, const AttnResult& dv, const AttnOperand& dout,
                   const AttnOperand& q, const AttnOperand& k, const AttnOperand& v, const AttnOperand& out,
                   const T* lse, const AttnParams& a) {
  const int64_t BH = a.B * a.H, Tq = a.Tq, Tk = a.Tk, D = a.D, Dv = a.Dv;
  const bool drop = a.dropout_p > 0;
  std::atomic<int64_t> next{0};  // the next (b, h) to take: a dynamic schedule
  parallel_team(attention_threads(a), [&](int, int) {
    const T scale = static_cast<T>(a.scale), keep_scale = philox::dropout_scale<T>(a.dropout_p);  // as forward's
    AlignedScratch<T> tiles;  // P, scale dS and the dropped P: GEMM operands, from 64-byte boundaries
    T* const p = tiles.get(3 * kBr * kBc);
    T* const dp = p + kBr * kBc;
    T* const pd = dp + kBr * kBc;
    std::vector<T> z(kBc), delta(Tq);
    int64_t valid[kBr];
    Transposed<T> keys_t(Tq > kBr), values_t(Tq > kBr);
    for (int64_t bh; (bh = next.fetch_add(1, std::memory_order_relaxed)) < BH;) {
      const T* Q = head_ptr<T>(q, bh, a.H);
      const T* K = kv_head_ptr<T>(k, bh, a);
      const T* V = kv_head_ptr<T>(v, bh, a);
      const T* Kt = keys_t.of(K, Tk, D, k.st);
      const T* Vt = values_t.of(V, Tk, Dv, v.st);
      const T* dO = head_ptr<T>(dout, bh, a.H);
      const T* O = head_ptr<T>(out, bh, a.H);
      const T* L = lse + bh * Tq;
      T* dQ = head_ptr<T>(dq, bh, a.H);
      T* dK = head_ptr<T>(dk, bh, a.H);
      T* dV = head_ptr<T>(dv, bh, a.H);
      zero_rows(dQ, Tq, D, dq.st);
      zero_rows(dK, Tk, D, dk.st);
      zero_rows(dV, Tk, Dv, dv.st);
      for (int64_t i = 0; i < Tq; ++i) {
        const T* dOi = dO + i * dout.st;
        const T* Oi = O + i * out.st;
        delta[i] = static_cast<T>(lane_sum<T>(Dv, [=](int64_t c) { return dOi[c] * Oi[c]; }));
      }
      for (int64_t i0 = 0; i0 < Tq; i0 += kBr) {
        const int64_t rows = std::min(kBr, Tq - i0);
        int64_t max_valid = 0;
        for (int64_t r = 0; r < rows; ++r) max_valid = std::max(max_valid, valid[r] = valid_keys(a, bh, i0 + r));
        const T* Qt = Q + i0 * q.st;
        const T* dOt = dO + i0 * dout.st;
        for (int64_t j0 = 0; j0 < max_valid; j0 += kBc) {
          const int64_t cols = std::min(kBc, max_valid - j0);
          times_rows_transposed<T>(rows, cols, D, Qt, q.st, K, k.st, Kt, Tk, j0, p, kBc);
          times_rows_transposed<T>(rows, cols, Dv, dOt, dout.st, V, v.st, Vt, Tk, j0, dp, kBc);
          for (int64_t r = 0; r < rows; ++r) {
            T* pr = p + r * kBc;
            T* dpr = dp + r * kBc;
            const int64_t n = std::clamp<int64_t>(valid[r] - j0, 0, cols);
            const T lr = L[i0 + r], dr = delta[i0 + r];
            for (int64_t j = 0; j < n; ++j) pr[j] = fast_exp(scale * pr[j] - lr);
            std::fill(pr + n, pr + cols, T(0));
            if (drop) {
              T* pdr = pd + r * kBc;
              dropout_row(z.data(), n, ((bh * Tq + i0 + r) * Tk) + j0, a.dropout_p, keep_scale, a.seed, a.offset);
              for (int64_t j = 0; j < n; ++j) {
                pdr[j] = pr[j] * z[j];
                dpr[j] = scale * pr[j] * (dpr[j] * z[j] - dr);
              }
              std::fill(pdr + n, pdr + cols, T(0));
            } else {
              for (int64_t j = 0; j < n; ++j) dpr[j] = scale * pr[j] * (dpr[j] - dr);
            }
            std::fill(dpr + n, dpr + cols, T(0));
          }
          const T* pdrop = drop ? pd : p;
          blas_gemm<T>(true, false, cols, Dv, rows, T(1), pdrop, kBc, dOt, dout.st, T(1), dV + j0 * dv.st, dv.st);
          // dp holds scale dS: alpha 1 lets libxsmm take the two products
          blas_gemm<T>(false, false, rows, D, cols, T(1), dp, kBc, K + j0 * k.st, k.st, T(1), dQ + i0 * dq.st, dq.st);
          blas_gemm<T>(true, false, cols, D, rows, T(1), dp, kBc, Qt, q.st, T(1), dK + j0 * dk.st, dk.st);
        }
      }
    }
  });
}

}  // namespace

void CpuBackend::attention_forward(DType dt, const AttnResult& out, void* lse, const AttnOperand& q,
                                   const AttnOperand& k, const AttnOperand& v, const AttnParams& a) {
  dispatch_float(dt, "attention_forward", [&](auto tag_T) {
    using T = decltype(tag_T);
    forward_impl<T>(out, static_cast<T*>(lse), q, k, v, a);
  });
}

void CpuBackend::attention_backward(DType dt, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                                    const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k,
                                    const AttnOperand& v, const AttnOperand& out, const void* lse,
                                    const AttnParams& a) {
  dispatch_float(dt, "attention_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    backward_impl<T>(dq, dk, dv, dout, q, k, v, out, static_cast<const T*>(lse), a);
  });
}

}  // namespace headlab::cpu
