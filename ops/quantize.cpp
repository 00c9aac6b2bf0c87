// Weights to and from ggml's blocks (backends/quant_blocks.h): the storage of nn::to_quantized_weights, made once
// on the host, row by row.
#include "backends/quant_blocks.h"
#include "ops/internal.h"

namespace headlab {

Tensor quantize(const Tensor& w, DType block) {
  const OpScope scope("quantize");
  detail::check_defined("quantize", w);
  HL_CHECK(block == DType::q8_0 || block == DType::q4_k, "quantize: the blocks are q8_0 or q4_k, not ",
           dtype_name(block));
  detail::check_floating("quantize", w);
  HL_CHECK(w.dim() == 2, "quantize: expected a 2-D weight (out_features, in_features), got shape ",
           shape_str(w.shape()));
  const int64_t per = dtype_block(block), rows = w.size(0), cols = w.size(1);
  HL_CHECK(cols % per == 0, "quantize: ", dtype_name(block), " takes rows of whole blocks of ", per,
           " weights; in_features is ", cols);
  HL_CHECK(w.device() == kCPU, "quantize: weights are quantized on the CPU (got one on ", w.device().str(), ")");
  const Tensor src = contiguous(to_dtype(w.detach(), DType::f32));
  HL_CHECK(backend_of(src).all_finite(DType::f32, src.raw_data(), src.numel()),
           "quantize: the weight holds a NaN or an infinity, which blocks cannot hold");
  Tensor out = Tensor::empty({rows, cols / per}, block, kCPU);
  const float* x = src.data<float>();
  auto* q = static_cast<std::byte*>(out.raw_data());
  if (block == DType::q8_0)
    quant::quantize_q8_0(x, q, rows * cols / per);
  else
    quant::quantize_q4_k(x, q, rows * cols / per);
  return out;
}

Tensor dequantize(const Tensor& q) {
  const OpScope scope("dequantize");
  detail::check_defined("dequantize", q);
  HL_CHECK(is_block_quantized(q.dtype()), "dequantize: expected q8_0 or q4_k blocks, got ", dtype_name(q.dtype()));
  HL_CHECK(q.dim() == 2, "dequantize: expected (out_features, blocks), got shape ", shape_str(q.shape()));
  const Tensor c = contiguous(q.to(kCPU));
  const int64_t per = dtype_block(q.dtype());
  Tensor out = Tensor::empty({q.size(0), q.size(1) * per}, DType::f32, kCPU);
  const auto* src = static_cast<const std::byte*>(c.raw_data());
  if (q.dtype() == DType::q8_0)
    quant::dequantize_q8_0(src, out.data<float>(), c.numel());
  else
    quant::dequantize_q4_k(src, out.data<float>(), c.numel());
  return q.device() == kCPU ? out : out.to(q.device());
}

}  // namespace headlab
