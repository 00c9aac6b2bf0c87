// Indexing ops: index_select, embedding (gather forward, scatter-add backward), repeat_interleave,
// and triu/tril. Indices are range-checked (on CUDA without waiting: Backend::check_indices).
#include "ops/internal.h"

#include <cstring>

namespace headlab {

using detail::check_indices;

// x: (..., n, ...) along dim d; index: (k,) int64 -> (..., k, ...)
Tensor index_select(const Tensor& x, int64_t d, const Tensor& index) {
  const OpScope scope("index_select");
  detail::check_defined("index_select", x);
  detail::check_index_tensor("index_select", index);
  check_same_device("index_select", x, index);
  HL_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got shape ", shape_str(index.shape()));
  const int64_t w = detail::wrap_dim("index_select", d, x.dim());
  const int64_t dim_size = x.dim() ? x.size(w) : 1;
  const Tensor idx = contiguous(reshape(index, {-1}));
  check_indices("index_select", idx, dim_size);
  const Tensor xc = contiguous(x.detach());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < w; ++k) outer *= x.size(k);
  for (int64_t k = w + 1; k < x.dim(); ++k) inner *= x.size(k);
  Shape shape = x.shape();
  if (!shape.empty()) shape[w] = idx.numel();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (out.numel())
    backend_of(x).index_select(x.dtype(), out.raw_data(), xc.raw_data(), idx.data<int64_t>(), outer, dim_size, inner,
                               idx.numel());
  // saved: the indices (backward scatters by them; x's values are not read)
  record("index_select", out, {x}, {idx}, [outer, dim_size, inner](const Tensor& dout, Saved s, Grads& g) {
    const Tensor& idx = s[0];
    Tensor dx = zeros(g.shape(0), dout.dtype(), dout.device());
    const Tensor dc = contiguous(dout);
    if (dc.numel())
      backend_of(dx).index_add(dx.dtype(), dx.raw_data(), dc.raw_data(), idx.data<int64_t>(), outer, dim_size, inner,
                               idx.numel());
    g.acc(0, dx);
  });
  return out;
}

// weight: (V, C), indices: any shape of int64 -> indices.shape + (C)
namespace {
// The rows of a table of blocks (a tied head's, nn::to_quantized_weights) at the indices, widened: (n, dim).
Tensor embedding_rows_of_blocks(const Tensor& weight, const Tensor& flat) {
  HL_CHECK(weight.device() == kCPU, "embedding: ", dtype_name(weight.dtype()), " tables are read on the CPU (got one on ",
           weight.device().str(), ")");
  const Tensor table = contiguous(weight);
  const std::vector<int64_t> rows = flat.to_vector<int64_t>();
  Tensor picked = Tensor::empty({static_cast<int64_t>(rows.size()), weight.size(1)}, weight.dtype(), kCPU);
  const auto row_bytes = static_cast<size_t>(weight.size(1)) * dtype_size(weight.dtype());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(picked.raw_data()) + i * row_bytes,
                static_cast<const char*>(table.raw_data()) + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  return dequantize(picked);
}
}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const OpScope scope("embedding");
  if (!weight.defined() || !is_block_quantized(weight.dtype())) detail::check_floating("embedding", weight);
  detail::check_index_tensor("embedding", indices, "indices");
  HL_CHECK(weight.dim() == 2, "embedding: weight must be 2-D (num_embeddings, embedding_dim), got shape ",
           shape_str(weight.shape()));
  check_same_device("embedding", weight, indices);
  Shape shape = indices.shape();
  shape.push_back(weight.size(1) * dtype_block(weight.dtype()));
  const Tensor flat = reshape(indices, {-1});
  check_indices("embedding", flat, weight.size(0));
  if (is_block_quantized(weight.dtype())) return reshape(embedding_rows_of_blocks(weight, flat), shape);
  return reshape(index_select(weight, 0, flat), shape);
}

Tensor repeat_interleave(const Tensor& x, int64_t repeats, int64_t d) {
  detail::check_defined("repeat_interleave", x);
  HL_CHECK(repeats >= 0, "repeat_interleave: repeats must be >= 0, got ", repeats);
  const int64_t w = detail::wrap_dim("repeat_interleave", d, x.dim());
  const int64_t n = x.dim() ? x.size(w) : 1;
  std::vector<int64_t> idx;
  idx.reserve(static_cast<size_t>(n * repeats));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < repeats; ++r) idx.push_back(i);
  const Tensor xin = x.dim() ? x : reshape(x, {1});
  return index_select(xin, w, tensor(idx, {static_cast<int64_t>(idx.size())}, x.device()));
}

namespace {
// Mask of the positions (row, col) of the last two dims with col - row compared to `diagonal`.
Tensor band_mask(const char* op, const Tensor& x, int64_t diagonal, bool upper) {
  detail::check_defined(op, x);
  HL_CHECK(x.dim() >= 2, op, ": expected a tensor with at least 2 dims, got shape ", shape_str(x.shape()));
  const int64_t R = x.size(-2), C = x.size(-1);
  std::vector<bool> drop(static_cast<size_t>(R * C));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) drop[r * C + c] = upper ? (c - r < diagonal) : (c - r > diagonal);
  return tensor_bool(drop, {R, C}, x.device());
}
}  // namespace

Tensor triu(const Tensor& x, int64_t diagonal) { return masked_fill(x, band_mask("triu", x, diagonal, true), 0.0); }
Tensor tril(const Tensor& x, int64_t diagonal) { return masked_fill(x, band_mask("tril", x, diagonal, false), 0.0); }

}  // namespace headlab
