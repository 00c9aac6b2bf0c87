// Shared op helpers: broadcasting, dimension checks and Loop construction with dim collapsing.
#include "ops/internal.h"

namespace headlab {

Backend& backend_of(const Tensor& t) { return backend_for(t.device()); }

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  HL_CHECK(a.device() == b.device(), op, ": expected all tensors on the same device, got ", a.device().str(), " and ",
           b.device().str());
}

namespace detail {

int64_t wrap_dim(const char* op, int64_t d, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  HL_CHECK(d >= -r && d < r, op, ": dimension ", d, " is out of range for a ", rank, "-D tensor (expected in [", -r,
           ", ", r - 1, "])");
  return d < 0 ? d + r : d;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    HL_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast (", da, " vs ", db, " at dim ", i, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Tensor& t, const Shape& out) {
  const size_t n = out.size(), k = t.shape().size();
  Shape st(n, 0);
  for (size_t i = 0; i < k; ++i) {
    const size_t j = n - k + i;
    st[j] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return st;
}

Loop make_loop(const Shape& shape, const std::vector<const Tensor*>& operands) {
  Loop l;
  l.nops = static_cast<int>(operands.size());
  std::vector<Shape> strides;
  for (const Tensor* t : operands) strides.push_back(broadcast_strides(*t, shape));
  // Keep non-trivial dims, merging dim d into the previous kept dim when all operands allow it.
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> st(operands.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !sizes.empty();
    for (size_t k = 0; k < operands.size() && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
    if (merge) {
      sizes.back() *= shape[d];
      for (size_t k = 0; k < operands.size(); ++k) st[k].back() = strides[k][d];
    } else {
      sizes.push_back(shape[d]);
      for (size_t k = 0; k < operands.size(); ++k) st[k].push_back(strides[k][d]);
    }
  }
  HL_CHECK(static_cast<int>(sizes.size()) <= kMaxDims, "elementwise: too many dimensions (", sizes.size(), ")");
  l.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < l.ndim; ++d) l.sizes[d] = sizes[d];
  for (size_t k = 0; k < operands.size(); ++k) {
    l.ptr[k] = operands[k]->raw_data();
    for (int d = 0; d < l.ndim; ++d) l.strides[k][d] = st[k][d];
  }
  if (l.ndim == 0 && shape_numel(shape) == 1) {  // a single element: one dim of size 1
    l.ndim = 1;
    l.sizes[0] = 1;
  }
  return l;
}

void check_defined(const char* op, const Tensor& t, const char* name) {
  HL_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
}

void check_floating(const char* op, const Tensor& t) {
  check_defined(op, t);
  HL_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", dtype_name(t.dtype()));
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  HL_CHECK(a.dtype() == b.dtype(), op, ": expected tensors of the same dtype, got ", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()), "; convert one with to(dtype)");
}

void check_index_tensor(const char* op, const Tensor& idx, const char* name) {
  check_defined(op, idx, name);
  HL_CHECK(idx.dtype() == DType::i64, op, ": ", name, " must be int64, got ", dtype_name(idx.dtype()));
}

void check_indices(const char* op, const Tensor& idx, int64_t size) {
  if (idx.numel() == 0) return;
  const Tensor c = contiguous(idx);
  backend_of(c).check_indices(op, c.data<int64_t>(), c.numel(), size);
}

void copy_into(const Tensor& dst, const Tensor& src) {
  HL_CHECK(dst.shape() == src.shape(), "copy: shapes ", shape_str(dst.shape()), " and ", shape_str(src.shape()),
           " differ");
  if (dst.numel() == 0) return;
  Tensor s = src;
  if (s.device() != dst.device()) s = to_device(src, dst.device());
  const Loop l = make_loop(dst.shape(), {&dst, &s});
  backend_of(dst).copy(dst.dtype(), s.dtype(), l);
}

}  // namespace detail
}  // namespace headlab
