// Shape ops. Views (view, transpose, permute, unsqueeze, squeeze, expand, narrow, slice, select)
// only change shape/strides/offset over the same storage; copies happen in contiguous, clone,
// cat and device/dtype moves. Each records the backward that maps the gradient back.
#include <numeric>
#include <optional>

#include "ops/internal.h"

namespace headlab {

using detail::wrap_dim;

namespace {

Tensor make_view(const char* op, const Tensor& x, const Shape& shape, const Shape& strides, int64_t offset) {
  Tensor out = x.as_strided_raw(shape, strides, offset);
  record(op, out, {x}, {}, [](const Tensor& dout, Saved, Grads& g) { g.acc(0, reshape(dout, g.shape(0))); });
  return out;
}

Shape infer_shape(const char* op, const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      HL_CHECK(infer < 0, op, ": only one dimension can be -1, got ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      HL_CHECK(out[i] >= 0, op, ": invalid size ", out[i], " in shape ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    HL_CHECK(known > 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for input of size ",
             numel);
    out[infer] = numel / known;
  }
  HL_CHECK(shape_numel(out) == numel, op, ": shape ", shape_str(shape), " is invalid for input of size ", numel);
  return out;
}

// Strides for viewing (old_shape, old_strides) as new_shape without copying, if possible
// (the chunk-matching rule PyTorch uses).
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& new_shape) {
  if (shape_numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  Shape ns(new_shape.size());
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = old_strides.back(), tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        ns[view_d] = view_numel * chunk_base;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return ns;
}

}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  detail::check_defined("view", x);
  const Shape s = infer_shape("view", shape, x.numel());
  auto st = view_strides(x.shape(), x.strides(), s);
  HL_CHECK(st.has_value(), "view: a tensor of shape ", shape_str(x.shape()), " with strides ", shape_str(x.strides()),
           " cannot be viewed as ", shape_str(s), " without a copy; use reshape()");
  return make_view("view", x, s, *st, x.offset());
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  detail::check_defined("reshape", x);
  const Shape s = infer_shape("reshape", shape, x.numel());
  if (view_strides(x.shape(), x.strides(), s)) return view(x, s);
  return view(contiguous(x), s);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  detail::check_defined("flatten", x);
  if (x.dim() == 0) return reshape(x, {1});
  const int64_t s = wrap_dim("flatten", start_dim, x.dim()), e = wrap_dim("flatten", end_dim, x.dim());
  HL_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d) n *= x.size(d);
  shape.push_back(n);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const Shape& dims) {
  detail::check_defined("permute", x);
  HL_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: expected ", x.dim(), " dims for shape ",
           shape_str(x.shape()), ", got ", shape_str(dims));
  Shape shape(dims.size()), strides(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim("permute", dims[i], x.dim());
    HL_CHECK(!seen[d], "permute: dimension ", dims[i], " repeats in ", shape_str(dims));
    seen[d] = true;
    shape[i] = x.size(d);
    strides[i] = x.stride(d);
    inverse[d] = static_cast<int64_t>(i);
  }
  Tensor out = x.as_strided_raw(shape, strides, x.offset());
  record("permute", out, {x}, {},
         [inverse = std::move(inverse)](const Tensor& dout, Saved, Grads& g) { g.acc(0, permute(dout, inverse)); });
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  detail::check_defined("transpose", x);
  if (x.dim() < 2) {
    wrap_dim("transpose", d0, x.dim());
    wrap_dim("transpose", d1, x.dim());
    return x;
  }
  Shape dims(static_cast<size_t>(x.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim("transpose", d0, x.dim())], dims[wrap_dim("transpose", d1, x.dim())]);
  return permute(x, dims);
}

Tensor unsqueeze(const Tensor& x, int64_t d) {
  detail::check_defined("unsqueeze", x);
  const int64_t w = wrap_dim("unsqueeze", d, x.dim() + 1);
  Shape shape = x.shape(), strides = x.strides();
  const int64_t st = w < x.dim() ? x.stride(w) * x.size(w) : 1;
  shape.insert(shape.begin() + w, 1);
  strides.insert(strides.begin() + w, st);
  return make_view("unsqueeze", x, shape, strides, x.offset());
}

Tensor squeeze(const Tensor& x, int64_t d) {
  detail::check_defined("squeeze", x);
  if (x.dim() == 0) return x;
  const int64_t w = wrap_dim("squeeze", d, x.dim());
  if (x.size(w) != 1) return x;
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + w);
  strides.erase(strides.begin() + w);
  return make_view("squeeze", x, shape, strides, x.offset());
}

Tensor squeeze(const Tensor& x) {
  detail::check_defined("squeeze", x);
  Shape shape, strides;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.size(d) != 1) {
      shape.push_back(x.size(d));
      strides.push_back(x.stride(d));
    }
  return make_view("squeeze", x, shape, strides, x.offset());
}

Tensor expand(const Tensor& x, const Shape& shape_in) {
  detail::check_defined("expand", x);
  HL_CHECK(shape_in.size() >= static_cast<size_t>(x.dim()), "expand: cannot expand shape ", shape_str(x.shape()),
           " to fewer dims ", shape_str(shape_in));
  Shape shape = shape_in, strides(shape.size(), 0);
  const size_t lead = shape.size() - static_cast<size_t>(x.dim());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      HL_CHECK(shape[i] >= 0, "expand: -1 is not allowed for a new leading dim in ", shape_str(shape_in));
      continue;
    }
    const int64_t xs = x.size(static_cast<int64_t>(i - lead));
    if (shape[i] == -1) shape[i] = xs;
    HL_CHECK(xs == shape[i] || xs == 1, "expand: the size ", xs, " at dim ", i - lead, " must match the expanded size ",
             shape[i], " or be 1 (shape ", shape_str(x.shape()), " to ", shape_str(shape_in), ")");
    strides[i] = xs == shape[i] ? x.stride(static_cast<int64_t>(i - lead)) : 0;
  }
  if (shape == x.shape()) return x;
  Tensor out = x.as_strided_raw(shape, strides, x.offset());
  record("expand", out, {x}, {}, [](const Tensor& dout, Saved, Grads& g) { g.acc(0, dout); });  // acc sums back
  return out;
}

Tensor slice(const Tensor& x, int64_t d, int64_t start, int64_t end, int64_t step) {
  detail::check_defined("slice", x);
  const int64_t w = wrap_dim("slice", d, x.dim());
  HL_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = x.size(w);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = x.shape(), strides = x.strides();
  shape[w] = (end - start + step - 1) / step;
  strides[w] *= step;
  Tensor out = x.as_strided_raw(shape, strides, x.offset() + start * x.stride(w));
  record("slice", out, {x}, {}, [w, start, end, step](const Tensor& dout, Saved, Grads& g) {
    Tensor dx = zeros(g.shape(0), dout.dtype(), dout.device());
    detail::copy_into(slice(dx, w, start, end, step), dout);
    g.acc(0, dx);
  });
  return out;
}

Tensor narrow(const Tensor& x, int64_t d, int64_t start, int64_t length) {
  detail::check_defined("narrow", x);
  const int64_t w = wrap_dim("narrow", d, x.dim());
  HL_CHECK(start >= 0 && length >= 0 && start + length <= x.size(w), "narrow: range [", start, ", ", start + length,
           ") is out of bounds for dim ", d, " of size ", x.size(w));
  return slice(x, w, start, start + length, 1);
}

Tensor select(const Tensor& x, int64_t d, int64_t index) {
  detail::check_defined("select", x);
  const int64_t w = wrap_dim("select", d, x.dim());
  const int64_t n = x.size(w);
  HL_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n);
  return squeeze(narrow(x, w, index < 0 ? index + n : index, 1), w);
}

Tensor contiguous(const Tensor& x) {
  const OpScope scope("contiguous");
  detail::check_defined("contiguous", x);
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor clone(const Tensor& x) {
  const OpScope scope("clone");
  detail::check_defined("clone", x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  detail::copy_into(out, x.detach());
  record("clone", out, {x}, {}, [](const Tensor& dout, Saved, Grads& g) { g.acc(0, dout); });
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  const OpScope scope("to_dtype");
  detail::check_defined("to", x);
  if (x.dtype() == dtype) return x;
  HL_CHECK(!is_block_quantized(x.dtype()) && !is_block_quantized(dtype), "to: ", dtype_name(x.dtype()), " to ",
           dtype_name(dtype), ": blocks are made by quantize() and widened by dequantize(), not converted");
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  detail::copy_into(out, x.detach());
  if (is_floating(x.dtype()) && is_floating(dtype))
    record("to_dtype", out, {x}, {}, [](const Tensor& dout, Saved, Grads& g) { g.acc(0, to_dtype(dout, g.dtype(0))); });
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  const OpScope scope("to_device");
  detail::check_defined("to", x);
  if (x.device() == device) return x;
  Backend& dst_be = backend_for(device);  // throws a clear error when the device is unavailable
  const Tensor src = contiguous(x.detach());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), device);
  const size_t bytes = static_cast<size_t>(x.numel()) * dtype_size(x.dtype());
  if (bytes) {
    if (device.is_cuda() && !src.device().is_cuda()) {
      dst_be.copy_from_host(out.raw_data(), src.raw_data(), bytes);
    } else if (!device.is_cuda()) {
      backend_of(src).copy_to_host(out.raw_data(), src.raw_data(), bytes);
    } else {  // between two GPUs: through the host (simple and rare)
      const Tensor host = to_device(src, kCPU);
      dst_be.copy_from_host(out.raw_data(), host.raw_data(), bytes);
    }
  }
  record("to_device", out, {x}, {},
         [](const Tensor& dout, Saved, Grads& g) { g.acc(0, to_device(dout, g.device(0))); });
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t d) {
  const OpScope scope("cat");
  HL_CHECK(!xs.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = xs[0];
  detail::check_defined("cat", first);
  const int64_t w = wrap_dim("cat", d, first.dim());
  Shape shape = first.shape();
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::check_defined("cat", xs[i]);
    HL_CHECK(xs[i].dim() == first.dim(), "cat: tensor ", i, " has shape ", shape_str(xs[i].shape()), ", expected rank ",
             first.dim(), " like tensor 0 ", shape_str(first.shape()));
    check_same_device("cat", first, xs[i]);
    detail::check_same_dtype("cat", first, xs[i]);
    for (int64_t k = 0; k < first.dim(); ++k)
      HL_CHECK(k == w || xs[i].size(k) == first.size(k), "cat: tensor ", i, " has shape ", shape_str(xs[i].shape()),
               ", which differs from tensor 0 ", shape_str(first.shape()), " outside dim ", w);
    total += xs[i].size(w);
  }
  shape[w] = total;
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t off = 0;
  for (const Tensor& x : xs) {
    if (x.numel()) detail::copy_into(out.detach().narrow(w, off, x.size(w)), x.detach());
    off += x.size(w);
  }
  record("cat", out, xs, {}, [w](const Tensor& dout, Saved, Grads& g) {
    int64_t at = 0;  // input i's slice of dout starts where the sizes of the inputs before it end
    for (size_t i = 0; i < g.num_inputs(); ++i) {
      const int64_t n = g.shape(i)[w];
      if (g.needs(i)) g.acc(i, narrow(dout, w, at, n));
      at += n;
    }
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t d) {
  const OpScope scope("stack");
  HL_CHECK(!xs.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 1; i < xs.size(); ++i)
    HL_CHECK(xs[i].shape() == xs[0].shape(), "stack: tensor ", i, " has shape ", shape_str(xs[i].shape()),
             ", expected ", shape_str(xs[0].shape()), " like tensor 0");
  const int64_t w = wrap_dim("stack", d, xs[0].dim() + 1);
  std::vector<Tensor> us;
  for (const Tensor& x : xs) us.push_back(unsqueeze(x, w));
  return cat(us, w);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t d) {
  detail::check_defined("split", x);
  const int64_t w = wrap_dim("split", d, x.dim());
  int64_t total = 0;
  for (int64_t s : sizes) {
    HL_CHECK(s >= 0, "split: sizes must be >= 0, got ", s);
    total += s;
  }
  HL_CHECK(total == x.size(w), "split: sizes add up to ", total, " but dim ", d, " has size ", x.size(w));
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, w, off, s));
    off += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t d) {
  detail::check_defined("split", x);
  HL_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  const int64_t n = x.size(wrap_dim("split", d, x.dim()));
  std::vector<int64_t> sizes;
  for (int64_t off = 0; off < n; off += split_size) sizes.push_back(std::min(split_size, n - off));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t d) {
  detail::check_defined("chunk", x);
  HL_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  const int64_t n = x.size(wrap_dim("chunk", d, x.dim()));
  return split(x, std::max<int64_t>((n + chunks - 1) / chunks, 1), d);
}

}  // namespace headlab
