// Matrix-vector products over rows of ggml's blocks (backends/quant_blocks.h), each weight widened as it is read:
// decoding reads a Q8_0 weight in 34 bytes per 32 (a quarter of float32's), a Q4_K weight in 144 per 256. The
// input stays float32 (ggml rounds it to 8 bits too; headlab does not, so activations keep their precision).
// With AVX-512 each block is widened in registers (sign- or zero-extended bytes to 16 floats at a time) into
// independent sums; elsewhere the same loops in 32 lanes the compiler vectorizes.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/simd.h"
#include "backends/quant_blocks.h"

HEADLAB_SIMD_BEGIN

namespace headlab::cpu {

[[gnu::always_inline]] inline float block_half(const std::byte* p) {
#ifdef __F16C__
  return _cvtsh_ss(quant::u16_at(p));
#else
  return quant::half_at(p);
#endif
}

#ifdef __AVX512F__
// acc += (16 bytes at q zero-extended) * scale + shift, times x[0..16).
[[gnu::always_inline]] inline __m512 fma_bytes(__m128i q, __m512 scale, __m512 shift, const float* x, __m512 acc) {
  const __m512 w = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), scale, shift);
  return _mm512_fmadd_ps(w, _mm512_loadu_ps(x), acc);
}
#else
[[gnu::always_inline]] inline float fold_lanes(float* acc) {  // 32 lanes folded in halves: vector adds
  for (int width = 16; width > 0; width /= 2)
#pragma omp simd
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}
#endif

// sum_k w[k] x[k] over one row of `blocks` Q8_0 blocks: w = d * q. With AVX-512 the scales come first, 16 at a
// time (one gather, one conversion), so that the block loop broadcasts each from memory: a load where widening one
// half at a time took shuffle-port work a block; each block's 32 products summed before its one scale multiplies
// them (d * (q . x): a rounding apart from (d * q) . x). On a 2-core AVX-512 Xeon this read 118 MB of blocks from
// memory at 12.6 GB/s where widening each block's scale and weights first read at 10.0.
inline float dot_q8_0(const std::byte* b, const float* x, int64_t blocks) {
#ifdef __AVX512F__
  constexpr int64_t kChunk = 64;  // blocks whose scales sit in d at a time
  alignas(64) float d[kChunk];
  const __m512i offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(quant::kQ8_0Bytes)));
  const __m512 zero = _mm512_setzero_ps();
  __m512 acc[2] = {zero, zero};
  for (int64_t i0 = 0; i0 < blocks; i0 += kChunk, x += kChunk * quant::kQ8_0Weights) {
    const int64_t n = std::min(kChunk, blocks - i0);
    const std::byte* c = b + i0 * quant::kQ8_0Bytes;
    for (int64_t i = 0; i < n; i += 16) {  // the low 16 bits of 32 read at each block: its scale
      const auto live = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
      const __m512i raw =
          _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, offsets, c + i * quant::kQ8_0Bytes, 1);
      _mm512_store_ps(d + i, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw)));
    }
    for (int64_t i = 0; i < n; ++i, c += quant::kQ8_0Bytes) {
      const float* xb = x + i * quant::kQ8_0Weights;
      const __m512 w0 =
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 2))));
      const __m512 w1 =
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 18))));
      const __m512 qx = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(xb)));
      acc[i & 1] = _mm512_fmadd_ps(qx, _mm512_set1_ps(d[i]), acc[i & 1]);  // alternate sums: independent chains
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
#else
  float acc[32] = {};
  for (int64_t i = 0; i < blocks; ++i, b += quant::kQ8_0Bytes, x += quant::kQ8_0Weights) {
    const float d = block_half(b);
    const auto* q = reinterpret_cast<const int8_t*>(b + 2);
#pragma omp simd
    for (int j = 0; j < 32; ++j) acc[j] += d * static_cast<float>(q[j]) * x[j];
  }
  return fold_lanes(acc);
#endif
}

// The same over Q4_K blocks: w = d * scale * nibble - dmin * min; sub-blocks j and j + 1 share 32 bytes of nibbles
// (j's the low ones, j + 1's the high).
inline float dot_q4_k(const std::byte* b, const float* x, int64_t blocks) {
#ifdef __AVX512F__
  const __m512 zero = _mm512_setzero_ps();
  __m512 acc[4] = {zero, zero, zero, zero};
  const __m256i low_bits = _mm256_set1_epi8(0x0F);
#else
  float acc[32] = {};
#endif
  for (int64_t i = 0; i < blocks; ++i, b += quant::kQ4_KBytes) {
    const float d = block_half(b), dmin = block_half(b + 2);
    const auto* packed = reinterpret_cast<const uint8_t*>(b + 4);
    const auto* q = reinterpret_cast<const uint8_t*>(b + 16);
    for (int j = 0; j < 8; j += 2, q += 32, x += 64) {
      float s1, m1, s2, m2;
      quant::scale_min_k4(j, packed, s1, m1);
      quant::scale_min_k4(j + 1, packed, s2, m2);
#ifdef __AVX512F__
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i lo = _mm256_and_si256(bytes, low_bits),
                    hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low_bits);
      const __m512 d1 = _mm512_set1_ps(d * s1), min1 = _mm512_set1_ps(-dmin * m1);
      const __m512 d2 = _mm512_set1_ps(d * s2), min2 = _mm512_set1_ps(-dmin * m2);
      acc[0] = fma_bytes(_mm256_castsi256_si128(lo), d1, min1, x, acc[0]);
      acc[1] = fma_bytes(_mm256_extracti128_si256(lo, 1), d1, min1, x + 16, acc[1]);
      acc[2] = fma_bytes(_mm256_castsi256_si128(hi), d2, min2, x + 32, acc[2]);
      acc[3] = fma_bytes(_mm256_extracti128_si256(hi, 1), d2, min2, x + 48, acc[3]);
#else
      const float d1 = d * s1, min1 = dmin * m1, d2 = d * s2, min2 = dmin * m2;
#pragma omp simd
      for (int l = 0; l < 32; ++l)
        acc[l] += (d1 * static_cast<float>(q[l] & 0xF) - min1) * x[l] +
                  (d2 * static_cast<float>(q[l] >> 4) - min2) * x[l + 32];
#endif
    }
  }
#ifdef __AVX512F__
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
#else
  return fold_lanes(acc);
#endif
}

// y (N) = W (N, K) @ x (K) (+ y where accumulate); W's rows of K / weights blocks of `bytes`, contiguous.
template <float (*row_dot)(const std::byte*, const float*, int64_t)>
inline void gemv_blocks(int64_t N, int64_t K, int64_t weights, int64_t bytes, const std::byte* W, const float* x,
                        bool accumulate, float* y) {
  const int64_t blocks = K / weights;
  for (int64_t n = 0; n < N; ++n) {
    const float s = row_dot(W + n * blocks * bytes, x, blocks);
    y[n] = accumulate ? y[n] + s : s;
  }
}

inline void gemv_q8_0(int64_t N, int64_t K, const std::byte* W, const float* x, bool accumulate, float* y) {
  gemv_blocks<dot_q8_0>(N, K, quant::kQ8_0Weights, quant::kQ8_0Bytes, W, x, accumulate, y);
}
inline void gemv_q4_k(int64_t N, int64_t K, const std::byte* W, const float* x, bool accumulate, float* y) {
  gemv_blocks<dot_q4_k>(N, K, quant::kQ4_KWeights, quant::kQ4_KBytes, W, x, accumulate, y);
}

}  // namespace headlab::cpu

HEADLAB_SIMD_END
