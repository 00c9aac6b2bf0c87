// ggml's block types widened to float32 (see gguf_quants.h), element for element as ggml-quants.c computes them;
// Q8_0's and Q4_K's in backends/quant_blocks.cpp, where the linear layers read them.
#include "io/gguf_quants.h"

#include <array>
#include <cstring>

#include "backends/quant_blocks.h"
#include "base/bfloat16.h"
#include "base/error.h"
#include "base/float16.h"

// Each value is one rounding of each product and difference, as the block formula writes it: no fused
// multiply-add (-march=native would contract d * q - m), so the floats equal a reference computed step by step.
#pragma GCC optimize("fp-contract=off")

namespace headlab::io {

namespace {

using quant::half_at, quant::u16_at;
const uint8_t* bytes_at(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }

}  // namespace

std::string ggml_type_name(uint32_t type) {
  static const std::array<const char*, 40> kNames = {
      "F32",     "F16",     "Q4_0",     "Q4_1",     "Q4_2",       "Q4_3",       "Q5_0",      "Q5_1",
      "Q8_0",    "Q8_1",    "Q2_K",     "Q3_K",     "Q4_K",       "Q5_K",       "Q6_K",      "Q8_K",
      "IQ2_XXS", "IQ2_XS",  "IQ3_XXS",  "IQ1_S",    "IQ4_NL",     "IQ3_S",      "IQ2_S",     "IQ4_XS",
      "I8",      "I16",     "I32",      "I64",      "F64",        "IQ1_M",      "BF16",      "Q4_0_4_4",
      "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",  "TQ2_0",    "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  return type < kNames.size() ? kNames[type] : "type " + std::to_string(type);
}

GgmlBlock ggml_block(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: return {1, 4};
    case GgmlType::f16:
    case GgmlType::bf16: return {1, 2};
    case GgmlType::q8_0: return {32, 34};
    case GgmlType::q4_0: return {32, 18};
    case GgmlType::q4_k: return {256, 144};
    case GgmlType::q5_k: return {256, 176};
    case GgmlType::q6_k: return {256, 210};
  }
  return {};
}

void dequantize_q4_0(const std::byte* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const float d = half_at(src);
    const uint8_t* q = bytes_at(src + 2);
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>((q[j] & 0xF) - 8) * d;
      dst[j + 16] = static_cast<float>((q[j] >> 4) - 8) * d;
    }
  }
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]; as Q4_K, the fifth bit of element l of sub-block j at bit j of qh[l].
void dequantize_q5_k(const std::byte* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 176) {
    const float d = half_at(src), dmin = half_at(src + 2);
    const uint8_t* scales = bytes_at(src + 4);
    const uint8_t* qh = bytes_at(src + 16);
    const uint8_t* ql = bytes_at(src + 48);
    for (int j = 0; j < 8; j += 2, ql += 32) {
      float s1, m1, s2, m2;
      quant::scale_min_k4(j, scales, s1, m1);
      quant::scale_min_k4(j + 1, scales, s2, m2);
      const float d1 = d * s1, min1 = dmin * m1, d2 = d * s2, min2 = dmin * m2;
      const uint8_t u1 = static_cast<uint8_t>(1u << j), u2 = static_cast<uint8_t>(2u << j);
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - min1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - min2;
    }
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], d; each 128 elements read 64 bytes of ql, 32 of qh and 8 scales.
void dequantize_q6_k(const std::byte* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 210) {
    const float d = half_at(src + 208);
    const uint8_t* ql = bytes_at(src);
    const uint8_t* qh = bytes_at(src + 128);
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int n = 0; n < 256; n += 128, dst += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        dst[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        dst[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        dst[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void dequantize(uint32_t type, const std::byte* src, float* dst, int64_t blocks) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: std::memcpy(dst, src, static_cast<size_t>(blocks) * 4); return;
    case GgmlType::f16:
      for (int64_t i = 0; i < blocks; ++i) dst[i] = float_from_f16(u16_at(src + 2 * i));
      return;
    case GgmlType::bf16:
      for (int64_t i = 0; i < blocks; ++i) dst[i] = float_from_bf16(u16_at(src + 2 * i));
      return;
    case GgmlType::q8_0: return quant::dequantize_q8_0(src, dst, blocks);
    case GgmlType::q4_0: return dequantize_q4_0(src, dst, blocks);
    case GgmlType::q4_k: return quant::dequantize_q4_k(src, dst, blocks);
    case GgmlType::q5_k: return dequantize_q5_k(src, dst, blocks);
    case GgmlType::q6_k: return dequantize_q6_k(src, dst, blocks);
  }
  HL_FAIL("dequantize: ggml type ", ggml_type_name(type), " is not one headlab reads");
}

}  // namespace headlab::io
