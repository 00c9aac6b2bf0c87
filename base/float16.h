// IEEE float16 (binary16: sign, 5-bit exponent, 10 bits of mantissa), held as uint16_t: what safetensors' F16,
// GGUF's F16 and the scales of ggml's blocks (backends/quant_blocks.h) store. To float32 exactly; from float32
// rounded to the nearest, ties to even, past the largest half to infinity, a NaN kept a NaN.
#pragma once
#include <bit>
#include <cstdint>

namespace headlab {

constexpr float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf, NaN (payload kept)
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));  // rebias 15 -> 127
  const float v = static_cast<float>(mant) * 0x1p-24f;  // zero or subnormal: mant * 2^-24, exact in float32
  return sign ? -v : v;
}

constexpr uint16_t f16_from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN: quiet
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, mant = round(|f| * 2^24), ties to even
    const float scaled = std::bit_cast<float>(a) * 0x1p24f;  // exact: a power-of-two scaling
    auto m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);  // m == 0x400 is the smallest normal, as the bits say
  }
  const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);  // to 10 bits of mantissa, ties to even
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));  // rebias 127 -> 15
}

}  // namespace headlab
