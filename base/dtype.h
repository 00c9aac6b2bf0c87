// Element types and devices: the vocabulary that autograd (autograd/tensor.h) and the kernels
// (backends/) share. No Tensor and no tape here, so the backends can include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace headlab {

// bf16 is a storage type: the weights of linear layers for inference (nn::to_bfloat16_weights), converted to and
// from f32/f64 by Tensor::to; other ops refuse it by name.
enum class DType : uint8_t { f32, f64, i64, b8, bf16 };

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
  }
  return "?";
}

constexpr size_t dtype_size(DType d) {  // bytes per element; bool is one byte 0/1
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
  }
  return 0;
}

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
