// Element types and devices: the vocabulary that autograd (autograd/tensor.h) and the kernels
// (backends/) share. No Tensor and no tape here, so the backends can include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace headlab {

// bf16 is a storage type: the weights of linear layers for inference (nn::to_bfloat16_weights), converted to and
// from f32/f64 by Tensor::to; other ops refuse it by name.
// q8_0 and q4_k are block types, ggml's Q8_0 and Q4_K (backends/quant_blocks.h): one element is one block of 32 or
// 256 weights, so a (out, in) weight is held as (out, in / 32) or (out, in / 256) elements. Linear layers' weights for
// inference (nn::to_quantized_weights); quantize() and dequantize() make and widen them, other ops refuse them.
enum class DType : uint8_t { f32, f64, i64, b8, bf16, q8_0, q4_k };

constexpr const char* dtype_name(DType d) {  // "float32", "float64", "int64", "bool", "bfloat16"
  switch (d) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::i64:
      return "int64";
    case DType::b8:
      return "bool";
    case DType::bf16:
      return "bfloat16";
    case DType::q8_0:
      return "q8_0";
    case DType::q4_k:
      return "q4_k";
  }
  return "?";
}

constexpr size_t dtype_size(DType d) {  // bytes per element (a block type's: per block); bool is one byte 0/1
  switch (d) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i64:
      return 8;
    case DType::b8:
      return 1;
    case DType::bf16:
      return 2;
    case DType::q8_0:
      return 34;  // float16 scale, 32 int8
    case DType::q4_k:
      return 144;  // float16 scale and min, 12 bytes of sub-block scales and mins, 256 nibbles
  }
  return 0;
}

constexpr int64_t dtype_block(DType d) {  // weights per element: 32 (q8_0), 256 (q4_k), else 1
  return d == DType::q8_0 ? 32 : d == DType::q4_k ? 256 : 1;
}
constexpr bool is_block_quantized(DType d) { return dtype_block(d) > 1; }

constexpr bool is_floating(DType d) { return d == DType::f32 || d == DType::f64; }

struct Device {
  enum Kind : uint8_t { cpu, cuda };
  Kind kind = cpu;
  int index = 0;
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:0"
  std::string str() const;
  bool is_cuda() const { return kind == cuda; }
  friend bool operator==(const Device& a, const Device& b) { return a.kind == b.kind && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};
inline const Device kCPU{};

}  // namespace headlab
