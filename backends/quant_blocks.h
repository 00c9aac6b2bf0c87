// ggml's Q8_0 and Q4_K blocks (ggml-common.h's layouts), the two block types headlab keeps in memory (DType::q8_0,
// DType::q4_k; a linear layer reads them as they are): a row of weights cut into blocks, each block its own scale.
//   Q8_0  (34 bytes, 32 weights)    d (float16), int8 q[32]:                      w = q * d
//   Q4_K  (144 bytes, 256 weights)  d, dmin (float16), 12 bytes of 8 packed 6-bit (scale, min) pairs, 128 bytes of
//                                   nibbles; 8 sub-blocks of 32:                  w = d * scale * nibble - dmin * min
// The widening is ggml-quants.c's dequantize_row_* value for value (the GGUF reader uses it too). The quantizers
// write ggml's formats: Q8_0 as ggml's reference does (d = max |w| / 127, q rounded); Q4_K by each sub-block's
// minimum and range (ggml searches each sub-block's scale further, which this does not: a little more error).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/float16.h"

namespace headlab::quant {

inline constexpr int64_t kQ8_0Weights = 32, kQ8_0Bytes = 34;
inline constexpr int64_t kQ4_KWeights = 256, kQ4_KBytes = 144;

// A block's 16-bit field (any alignment), and as the float16 it is (a scale).
inline uint16_t u16_at(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float half_at(const std::byte* p) { return float_from_f16(u16_at(p)); }

// Q4_K's (and Q5_K's) 6-bit scale and min of sub-block j (0..7) from their 12 packed bytes: j < 4 in the low six
// bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 with the two high bits of bytes j - 4 and j.
inline void scale_min_k4(int j, const uint8_t* packed, float& scale, float& min) {
  if (j < 4) {
    scale = static_cast<float>(packed[j] & 63), min = static_cast<float>(packed[j + 4] & 63);
  } else {
    scale = static_cast<float>((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4));
    min = static_cast<float>((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

// `blocks` whole blocks at src widened to float32 at dst (blocks * weights floats).
void dequantize_q8_0(const std::byte* src, float* dst, int64_t blocks);
void dequantize_q4_k(const std::byte* src, float* dst, int64_t blocks);

// blocks * weights floats at src written as `blocks` blocks at dst. Finite inputs only (a NaN or infinity gives an
// unspecified block).
void quantize_q8_0(const float* src, std::byte* dst, int64_t blocks);
void quantize_q4_k(const float* src, std::byte* dst, int64_t blocks);

}  // namespace headlab::quant
