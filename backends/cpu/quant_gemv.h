// Matrix-vector products over rows of ggml's blocks (backends/quant_blocks.h), each weight widened as it is read:
// decoding reads a Q8_0 weight in 34 bytes per 32 (a quarter of float32's), a Q4_K weight in 144 per 256. The
// input stays float32 (ggml quantizes it to 8 bits too; headlab does not, so activations keep their precision).
// Sums run in 32 independent lanes and fold at the end, as gemv_by_rows does.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/quant_blocks.h"
#ifdef __F16C__
#include <immintrin.h>
#endif

namespace headlab::cpu {

[[gnu::always_inline]] inline float block_half(const std::byte* p) {
#ifdef __F16C__
  return _cvtsh_ss(quant::u16_at(p));
#else
  return quant::half_at(p);
#endif
}

[[gnu::always_inline]] inline float fold_lanes(float* acc) {  // 32 lanes folded in halves: vector adds
  for (int width = 16; width > 0; width /= 2)
#pragma omp simd
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

// y (N) = W (N, K) @ x (K) (+ y where accumulate); W's rows of K / weights blocks of `bytes`, contiguous, each block
// added into the 32 lanes by add_block(block, its x, lanes).
template <typename AddBlock>
inline void gemv_blocks(int64_t N, int64_t K, int64_t weights, int64_t bytes, const std::byte* W, const float* x,
                        bool accumulate, float* y, AddBlock&& add_block) {
  const int64_t blocks = K / weights;
  for (int64_t n = 0; n < N; ++n) {
    const std::byte* b = W + n * blocks * bytes;
    float acc[32] = {};
    for (int64_t i = 0; i < blocks; ++i, b += bytes) add_block(b, x + i * weights, acc);
    const float s = fold_lanes(acc);
    y[n] = accumulate ? y[n] + s : s;
  }
}

// Q8_0: w = d * q.
inline void gemv_q8_0(int64_t N, int64_t K, const std::byte* W, const float* x, bool accumulate, float* y) {
  gemv_blocks(N, K, quant::kQ8_0Weights, quant::kQ8_0Bytes, W, x, accumulate, y,
              [](const std::byte* b, const float* xb, float* acc) {
                const float d = block_half(b);
                const auto* q = reinterpret_cast<const int8_t*>(b + 2);
#pragma omp simd
                for (int j = 0; j < 32; ++j) acc[j] += d * static_cast<float>(q[j]) * xb[j];
              });
}

// Q4_K: w = d * scale * nibble - dmin * min; sub-blocks j and j + 1 share 32 bytes of nibbles.
inline void gemv_q4_k(int64_t N, int64_t K, const std::byte* W, const float* x, bool accumulate, float* y) {
  gemv_blocks(N, K, quant::kQ4_KWeights, quant::kQ4_KBytes, W, x, accumulate, y,
              [](const std::byte* b, const float* xb, float* acc) {
                const float d = block_half(b), dmin = block_half(b + 2);
                const auto* packed = reinterpret_cast<const uint8_t*>(b + 4);
                const auto* q = reinterpret_cast<const uint8_t*>(b + 16);
                for (int j = 0; j < 8; j += 2, q += 32, xb += 64) {
                  float s1, m1, s2, m2;
                  quant::scale_min_k4(j, packed, s1, m1);
                  quant::scale_min_k4(j + 1, packed, s2, m2);
                  const float d1 = d * s1, min1 = dmin * m1, d2 = d * s2, min2 = dmin * m2;
#pragma omp simd
                  for (int l = 0; l < 32; ++l)
                    acc[l] += (d1 * static_cast<float>(q[l] & 0xF) - min1) * xb[l] +
                              (d2 * static_cast<float>(q[l] >> 4) - min2) * xb[l + 32];
                }
              });
}

}  // namespace headlab::cpu
