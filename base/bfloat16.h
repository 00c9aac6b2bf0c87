// bfloat16 (DType::bf16): the top 16 bits of a float32 (sign, the same 8-bit exponent, 7 bits of mantissa),
// held as uint16_t. From float32 by rounding to the nearest, ties to even (as PyTorch's conversion and the
// hardware's), a NaN kept a NaN; back to float32 exactly.
#pragma once
#include <bit>
#include <cstdint>

namespace headlab {

constexpr uint16_t bf16_from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN: quiet, sign kept
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

constexpr float float_from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

}  // namespace headlab
