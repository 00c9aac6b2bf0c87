// ggml's Q8_0 and Q4_K blocks: widened as ggml-quants.c widens them, and written (see quant_blocks.h).
#include "backends/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// Each widened value is one rounding of each product and difference, as the block formula writes it: no fused
// multiply-add (-march=native would contract d * q - m), so the floats equal ggml's computed step by step.
#pragma GCC optimize("fp-contract=off")

namespace headlab::quant {

namespace {
void put_half(std::byte* p, float f) {
  const uint16_t v = f16_from_float(f);
  std::memcpy(p, &v, 2);
}
const uint8_t* bytes_at(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }
uint8_t* bytes_at(std::byte* p) { return reinterpret_cast<uint8_t*>(p); }
}  // namespace

void dequantize_q8_0(const std::byte* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ8_0Bytes, dst += kQ8_0Weights) {
    const float d = half_at(src);
    for (int i = 0; i < 32; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(bytes_at(src + 2)[i])) * d;
  }
}

// Each 64 weights read 32 bytes of nibbles: sub-block j's in the low nibbles, sub-block j + 1's in the high.
void dequantize_q4_k(const std::byte* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ4_KBytes) {
    const float d = half_at(src), dmin = half_at(src + 2);
    const uint8_t* scales = bytes_at(src + 4);
    const uint8_t* q = bytes_at(src + 16);
    for (int j = 0; j < 8; j += 2, q += 32) {
      float s1, m1, s2, m2;
      scale_min_k4(j, scales, s1, m1);
      scale_min_k4(j + 1, scales, s2, m2);
      const float d1 = d * s1, min1 = dmin * m1, d2 = d * s2, min2 = dmin * m2;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0xF) - min1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - min2;
    }
  }
}

// ggml's quantize_row_q8_0_ref: d = max |w| / 127, q = round(w / d) (a zero block: d = 0, q = 0).
void quantize_q8_0(const float* src, std::byte* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ8_0Weights, dst += kQ8_0Bytes) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(dst, d);
    auto* q = reinterpret_cast<int8_t*>(dst + 2);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(std::lround(src[i] * id));
  }
}

// Each sub-block of 32 by its range: min = min(0, smallest weight), scale = (largest - min) / 15; the eight scales
// and mins then as 6-bit multiples of the block's d and dmin; each weight the nibble nearest under those.
void quantize_q4_k(const float* src, std::byte* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += kQ4_KWeights, dst += kQ4_KBytes) {
    float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
      const float* x = src + 32 * j;
      float lo = 0.0f, hi = x[0];
      for (int l = 0; l < 32; ++l) lo = std::min(lo, x[l]), hi = std::max(hi, x[l]);
      scale[j] = std::max(hi - lo, 0.0f) / 15.0f, min[j] = -lo;
      max_scale = std::max(max_scale, scale[j]), max_min = std::max(max_min, min[j]);
    }
    put_half(dst, max_scale / 63.0f);
    put_half(dst + 2, max_min / 63.0f);
    const float d = half_at(dst), dmin = half_at(dst + 2);  // as they are stored: the nibbles fit those
    uint8_t* packed = bytes_at(dst + 4);
    std::memset(packed, 0, 12);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(d > 0.0f ? std::clamp(std::lround(scale[j] / d), 0L, 63L) : 0);
      lm[j] = static_cast<uint8_t>(dmin > 0.0f ? std::clamp(std::lround(min[j] / dmin), 0L, 63L) : 0);
      if (j < 4) {
        packed[j] = ls[j], packed[j + 4] = lm[j];
      } else {
        packed[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
        packed[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
        packed[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
      }
    }
    uint8_t nibble[256];
    for (int j = 0; j < 8; ++j) {
      const float step = d * static_cast<float>(ls[j]), offset = dmin * static_cast<float>(lm[j]);
      for (int l = 0; l < 32; ++l) {
        const float x = src[32 * j + l] + offset;
        nibble[32 * j + l] = static_cast<uint8_t>(step > 0.0f ? std::clamp(std::lround(x / step), 0L, 15L) : 0);
      }
    }
    uint8_t* q = bytes_at(dst + 16);
    for (int j = 0; j < 8; j += 2, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(nibble[32 * j + l] | (nibble[32 * (j + 1) + l] << 4));
  }
}

}  // namespace headlab::quant
