// ggml's tensor types as GGUF files store them (ggml-common.h's block layouts, ggml-quants.c's dequantize_row_*):
// each type's name and block (elements and bytes), and the blocks widened to float32. Q8_0 and Q4_K, the types
// headlab also keeps in memory, are backends/quant_blocks.h's.
//
// The blocks headlab reads (d, dmin: float16; a K-quant's super-block holds 256 elements):
//   F32, F16, BF16   one element a block
//   Q8_0  (34 bytes, 32 elements)   d, int8 q[32]:                   x = q * d
//   Q4_0  (18 bytes, 32 elements)   d, 16 bytes of nibbles:          x = (nibble - 8) * d, byte j's low nibble is
//                                                                   element j, its high nibble element j + 16
//   Q4_K  (144 bytes, 256)          d, dmin, 12 bytes of 8 packed 6-bit (scale, min) pairs, 128 bytes of nibbles:
//                                   8 sub-blocks of 32, x = d * scale * nibble - dmin * min
//   Q5_K  (176 bytes, 256)          as Q4_K, plus qh[32]: the fifth bit of each quant
//   Q6_K  (210 bytes, 256)          ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d:
//                                   16 sub-blocks of 16, x = d * scale * (q - 32)
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace headlab::io {

// ggml's type numbers (enum ggml_type) of the types headlab reads.
enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30 };

struct GgmlBlock {
  int64_t elements = 0;  // 0: a type headlab does not read
  int64_t bytes = 0;
};

// ggml's name of any type number it has used ("Q4_K", "IQ2_XXS"), or "type N".
std::string ggml_type_name(uint32_t type);
// The block of a type headlab reads; {0, 0} for any other.
GgmlBlock ggml_block(uint32_t type);

// `blocks` whole blocks of `type` (one headlab reads) at src, widened to float32 at dst (blocks * elements floats).
void dequantize(uint32_t type, const std::byte* src, float* dst, int64_t blocks);

// One function per block type, for a caller that knows its type (Q8_0's and Q4_K's: backends/quant_blocks.h).
void dequantize_q4_0(const std::byte* src, float* dst, int64_t blocks);
void dequantize_q5_k(const std::byte* src, float* dst, int64_t blocks);
void dequantize_q6_k(const std::byte* src, float* dst, int64_t blocks);

}  // namespace headlab::io
