// Reductions over one or more dims (sum, mean, amax, var, argmax) and sum_to, which undoes broadcasting.
#include <algorithm>

#include "ops/internal.h"

namespace headlab {

namespace {

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  Shape out_shape;            // without keepdim
  Shape keep_shape;           // with keepdim
  int64_t count = 1;          // elements reduced into each output
};

ReducePlan plan_reduce(const char* op, const Tensor& x, const Shape& dims) {
  ReducePlan p;
  const int64_t rank = x.dim();
  p.reduced.assign(static_cast<size_t>(rank), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = detail::wrap_dim(op, d, rank);
    if (rank == 0) continue;
    HL_CHECK(!p.reduced[w], op, ": dimension ", d, " appears more than once in the list of dims");
    p.reduced[w] = true;
  }
  for (int64_t d = 0; d < rank; ++d) {
    if (p.reduced[d]) {
      p.count *= x.size(d);
      p.keep_shape.push_back(1);
    } else {
      p.out_shape.push_back(x.size(d));
      p.keep_shape.push_back(x.size(d));
    }
  }
  return p;
}

// Collapses (size, stride) pairs: drops size-1 dims and merges neighbours that are contiguous.
void collapse(std::vector<int64_t>& sizes, std::vector<int64_t>& strides) {
  std::vector<int64_t> s2, st2;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 1) continue;
    if (!s2.empty() && st2.back() == strides[i] * sizes[i]) {
      s2.back() *= sizes[i];
      st2.back() = strides[i];
    } else {
      s2.push_back(sizes[i]);
      st2.push_back(strides[i]);
    }
  }
  sizes = std::move(s2);
  strides = std::move(st2);
}

const char* reduction_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "amax";
    case ReduceOp::min:
      return "amin";
    case ReduceOp::argmax:
      return "argmax";
  }
  return "reduction";
}

// Runs the backend reduction of x over the planned dims into a new contiguous tensor.
Tensor reduce_raw(ReduceOp op, const Tensor& x, const ReducePlan& p, DType out_dtype) {
  const OpScope scope(reduction_name(op));
  Tensor out = Tensor::empty(p.out_shape, out_dtype, x.device());
  if (out.numel() == 0) return out;
  std::vector<int64_t> osz, ost, isz, ist;
  for (int64_t d = 0; d < x.dim(); ++d) {
    (p.reduced[d] ? isz : osz).push_back(x.size(d));
    (p.reduced[d] ? ist : ost).push_back(x.stride(d));
  }
  collapse(osz, ost);
  collapse(isz, ist);
  if (isz.empty()) {
    isz.push_back(1);
    ist.push_back(0);
  }
  if (osz.empty()) {
    osz.push_back(1);
    ost.push_back(0);
  }
  backend_of(x).reduce(op, x.dtype(), out.raw_data(), x.raw_data(), static_cast<int>(osz.size()), osz.data(),
                       ost.data(), static_cast<int>(isz.size()), isz.data(), ist.data());
  return out;
}

}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  detail::check_defined("sum", x);
  HL_CHECK(x.dtype() != DType::b8, "sum: cannot sum a bool tensor; convert it with to(int64) or to(float32)");
  ReducePlan p = plan_reduce("sum", x, dims);
  Tensor out = reduce_raw(ReduceOp::sum, x, p, x.dtype());
  if (p.count == 0 && out.numel()) out = zeros(out.shape(), x.dtype(), x.device());
  if (keepdim) out = out.as_strided_raw(p.keep_shape, contiguous_strides(p.keep_shape), 0);
  record("sum", out, {x}, {}, [keep = std::move(p.keep_shape)](const Tensor& dout, Saved, Grads& g) {
    g.acc(0, expand(reshape(dout, keep), g.shape(0)));
  });
  return out;
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  detail::check_floating("mean", x);
  const ReducePlan p = plan_reduce("mean", x, dims);
  HL_CHECK(p.count > 0, "mean: cannot take the mean over an empty dimension of shape ", shape_str(x.shape()));
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(p.count));
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  detail::check_defined("amax", x);
  const ReducePlan p = plan_reduce("amax", x, dims);
  HL_CHECK(p.count > 0, "amax: cannot reduce over an empty dimension of shape ", shape_str(x.shape()));
  Tensor out = reduce_raw(ReduceOp::max, x, p, x.dtype());
  const Tensor kept = out.as_strided_raw(p.keep_shape, contiguous_strides(p.keep_shape), 0);
  if (keepdim) out = kept.detach();  // its own handle: the node saving `kept` must not own its output
  record("amax", out, {x}, {x, kept}, [](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &x = s[0], &kept = s[1];  // kept: the maxima, with size 1 on the reduced dims
    // The gradient goes to the maximal elements, shared evenly between ties.
    const Tensor hit = to_dtype(eq(x, kept), x.dtype());
    const Tensor count = sum_to(hit, kept.shape());  // sums over exactly the reduced dims
    g.acc(0, div(mul(hit, reshape(dout, kept.shape())), count));
  });
  return out;
}

Tensor var(const Tensor& x, const Shape& dims, bool keepdim, int64_t correction) {
  detail::check_floating("var", x);
  const ReducePlan p = plan_reduce("var", x, dims);
  HL_CHECK(p.count - correction > 0, "var: ", p.count, " elements with correction ", correction,
           " leave no degrees of freedom");
  const Tensor centered = sub(x, mean(x, dims, true));
  return mul(sum(mul(centered, centered), dims, keepdim), 1.0 / static_cast<double>(p.count - correction));
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  detail::check_defined("argmax", x);
  const ReducePlan p = plan_reduce("argmax", x, {dim});
  HL_CHECK(p.count > 0, "argmax: cannot reduce over an empty dimension of shape ", shape_str(x.shape()));
  Tensor out = reduce_raw(ReduceOp::argmax, x, p, DType::i64);
  if (keepdim) out = out.as_strided_raw(p.keep_shape, contiguous_strides(p.keep_shape), 0);
  return out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  HL_CHECK(lead >= 0, "sum_to: cannot reduce shape ", shape_str(x.shape()), " to ", shape_str(shape));
  Shape dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead)
      dims.push_back(d);
    else if (shape[d - lead] == 1 && x.size(d) != 1)
      dims.push_back(d);
    else
      HL_CHECK(shape[d - lead] == x.size(d), "sum_to: cannot reduce shape ", shape_str(x.shape()), " to ",
               shape_str(shape));
  }
  if (dims.empty()) return reshape(x, shape);
  return reshape(sum(x, dims, false), shape);
}

}  // namespace headlab
