// Sparse codes: the ops of sparse autoencoders (nn/sae.h). A row of k (value, index) pairs stands for a row of E
// features of which only those k are not zero; sparse_matmul and sparse_outer multiply by the matrix the pairs stand
// for without building it, and are each other's gradients. topk_matmul is a TopK encoder whose backward stays sparse;
// jumprelu and threshold_step carry JumpReLU's straight-through estimate of the threshold's gradient.
#include "ops/internal.h"

#include <cmath>

namespace headlab {

namespace {

// Checks (values, indices) as a (R, k) pair list naming rows of an E-row table.
void check_pairs(const char* op, const Tensor& values, const Tensor& indices, int64_t E) {
  detail::check_defined(op, values, "values");
  detail::check_floating(op, values);
  detail::check_index_tensor(op, indices, "indices");
  check_same_device(op, values, indices);
  HL_CHECK(values.dim() == 2 && indices.shape() == values.shape(), op,
           ": values and indices must be (rows, k) of one shape, got ", shape_str(values.shape()), " and ",
           shape_str(indices.shape()));
  detail::check_indices(op, indices, E);
}

// a (R, N), indices (R, k), table (E, N) -> (R, k): a[r] . table[indices[r, j]] (not recorded).
Tensor sparse_dot(const Tensor& a, const Tensor& indices, const Tensor& table) {
  const Tensor ac = contiguous(a.detach()), ic = contiguous(indices), tc = contiguous(table.detach());
  Tensor out = Tensor::empty({ic.size(0), ic.size(1)}, ac.dtype(), ac.device());
  if (out.numel())
    backend_of(ac).sparse_rows_dot(ac.dtype(), out.raw_data(), ac.raw_data(), ic.data<int64_t>(), tc.raw_data(),
                                   ic.size(0), ic.size(1), ac.size(1));
  return out;
}

Tensor zero_like_scalar(const Tensor& t) { return scalar_tensor(0.0, t.dtype(), t.device()); }

}  // namespace

// x: (..., N) -> values, indices: (..., k)
TopK topk(const Tensor& x, int64_t k) {
  const OpScope scope("topk");
  detail::check_defined("topk", x);
  detail::check_floating("topk", x);
  HL_CHECK(x.dim() >= 1, "topk: expected a tensor with at least 1 dim, got a scalar");
  const int64_t N = x.size(-1);
  HL_CHECK(k >= 1 && k <= N, "topk: k must be in [1, ", N, "] (the last dim's size), got ", k);
  const int64_t R = N ? x.numel() / N : 0;
  const Tensor xc = contiguous(x.detach());
  Shape shape = x.shape();
  shape.back() = k;
  Tensor values = Tensor::empty(shape, x.dtype(), x.device());
  Tensor indices = Tensor::empty(shape, DType::i64, x.device());
  if (R) backend_of(x).topk_rows(x.dtype(), values.raw_data(), indices.data<int64_t>(), xc.raw_data(), R, N, k);
  // saved: the indices (backward puts dvalues back in their places)
  record("topk", values, {x}, {indices}, [R, N, k](const Tensor& dout, Saved s, Grads& g) {
    g.acc(0, reshape(sparse_to_dense(reshape(dout, {R, k}), reshape(s[0], {R, k}), N), g.shape(0)));
  });
  return {values, indices};
}

// values, indices: (R, k) -> (R, E)
Tensor sparse_to_dense(const Tensor& values, const Tensor& indices, int64_t E) {
  const OpScope scope("sparse_to_dense");
  HL_CHECK(E >= 0, "sparse_to_dense: the number of entries must be >= 0, got ", E);
  check_pairs("sparse_to_dense", values, indices, E);
  const int64_t R = values.size(0), k = values.size(1);
  // the places flattened: row r's index i at r E + i
  const Tensor flat =
      contiguous(add(indices, unsqueeze(arange(0, double(R * E), double(E ? E : 1), DType::i64, values.device()), 1)));
  Tensor out = zeros({R, E}, values.dtype(), values.device());
  const Tensor vc = contiguous(values.detach());
  if (vc.numel())
    backend_of(out).index_add(out.dtype(), out.raw_data(), vc.raw_data(), flat.data<int64_t>(), 1, R * E, 1, R * k);
  record("sparse_to_dense", out, {values}, {flat}, [R, k](const Tensor& dout, Saved s, Grads& g) {
    g.acc(0, reshape(index_select(reshape(contiguous(dout), {-1}), 0, reshape(s[0], {-1})), {R, k}));
  });
  return out;
}

// values, indices: (R, k), table: (E, N) -> (R, N)
Tensor sparse_matmul(const Tensor& values, const Tensor& indices, const Tensor& table) {
  const OpScope scope("sparse_matmul");
  detail::check_defined("sparse_matmul", table, "table");
  HL_CHECK(table.dim() == 2, "sparse_matmul: table must be 2-D (entries, N), got shape ", shape_str(table.shape()));
  check_pairs("sparse_matmul", values, indices, table.size(0));
  detail::check_same_dtype("sparse_matmul", values, table);
  check_same_device("sparse_matmul", values, table);
  const int64_t R = values.size(0), k = values.size(1), N = table.size(1);
  const Tensor vc = contiguous(values.detach()), ic = contiguous(indices), tc = contiguous(table.detach());
  Tensor out = Tensor::empty({R, N}, values.dtype(), values.device());
  if (out.numel())
    backend_of(values).sparse_rows_gather(values.dtype(), out.raw_data(), vc.raw_data(), ic.data<int64_t>(),
                                          tc.raw_data(), R, k, N);
  record("sparse_matmul", out, {values, table}, {values, ic, table}, [](const Tensor& dout, Saved s, Grads& g) {
    if (g.needs(0)) g.acc(0, sparse_dot(dout, s[1], s[2]));                   // dvalues[r, j] = dout[r] . table[i]
    if (g.needs(1)) g.acc(1, sparse_outer(s[0], s[1], dout, g.shape(1)[0]));  // dtable[i] += values[r, j] dout[r]
  });
  return out;
}

// values, indices: (R, k), src: (R, N) -> (E, N)
Tensor sparse_outer(const Tensor& values, const Tensor& indices, const Tensor& src, int64_t E) {
  const OpScope scope("sparse_outer");
  HL_CHECK(E >= 0, "sparse_outer: the number of entries must be >= 0, got ", E);
  detail::check_defined("sparse_outer", src, "src");
  check_pairs("sparse_outer", values, indices, E);
  HL_CHECK(src.dim() == 2 && src.size(0) == values.size(0), "sparse_outer: src must be (rows, N) with the ",
           values.size(0), " rows of values, got shape ", shape_str(src.shape()));
  detail::check_same_dtype("sparse_outer", values, src);
  check_same_device("sparse_outer", values, src);
  const int64_t R = values.size(0), k = values.size(1), N = src.size(1);
  const Tensor vc = contiguous(values.detach()), ic = contiguous(indices), sc = contiguous(src.detach());
  Tensor out = Tensor::empty({E, N}, values.dtype(), values.device());
  if (out.numel())
    backend_of(values).sparse_rows_scatter(values.dtype(), out.raw_data(), vc.raw_data(), ic.data<int64_t>(),
                                           sc.raw_data(), R, k, N, E);
  record("sparse_outer", out, {values, src}, {values, ic, src}, [](const Tensor& dout, Saved s, Grads& g) {
    if (g.needs(0)) g.acc(0, sparse_dot(s[2], s[1], dout));     // dvalues[r, j] = src[r] . dout[i]
    if (g.needs(1)) g.acc(1, sparse_matmul(s[0], s[1], dout));  // dsrc[r] = sum_j values[r, j] dout[i]
  });
  return out;
}

// x: (R, I), w: (I, E), bias: (E) -> values, indices: (R, k)
TopK topk_matmul(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t k) {
  const OpScope scope("topk_matmul");
  detail::check_defined("topk_matmul", x);
  detail::check_defined("topk_matmul", w, "weight");
  HL_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(0), "topk_matmul: x (rows, I) and weight (I, E) ",
           "cannot be multiplied, got shapes ", shape_str(x.shape()), " and ", shape_str(w.shape()));
  const int64_t R = x.size(0), E = w.size(1);
  HL_CHECK(!bias.defined() || bias.shape() == Shape{E}, "topk_matmul: bias must have shape [", E, "], got ",
           shape_str(bias.shape()));
  TopK top = topk(linear(x.detach(), w.detach().mT(), bias.defined() ? bias.detach() : Tensor()), k);
  Tensor values = relu(top.values);
  const Tensor indices = top.indices;
  record("topk_matmul", values, {x, w, bias}, {x, w, values, indices}, [R, E](const Tensor& dout, Saved s, Grads& g) {
    // ReLU's gate, then each kept pair's gradient to its column of w and entry of bias, and to x through them
    const Tensor dv = where(gt(s[2], zero_like_scalar(s[2])), dout, zero_like_scalar(dout));
    if (g.needs(0)) g.acc(0, sparse_matmul(dv, s[3], contiguous(s[1].mT())));  // (R, I)
    if (g.needs(1)) g.acc(1, sparse_outer(dv, s[3], s[0], E).mT());            // (I, E)
    if (g.needs(2)) g.acc(2, reshape(sparse_outer(dv, s[3], ones({R, 1}, dv.dtype(), dv.device()), E), {E}));
  });
  return {values, indices};
}

namespace {

// x (..., N), threshold (N): checked for jumprelu and threshold_step.
void check_threshold(const char* op, const Tensor& x, const Tensor& threshold, double bandwidth) {
  detail::check_defined(op, x);
  detail::check_defined(op, threshold, "threshold");
  detail::check_floating(op, x);
  detail::check_same_dtype(op, x, threshold);
  check_same_device(op, x, threshold);
  HL_CHECK(x.dim() >= 1 && threshold.shape() == Shape{x.size(-1)}, op, ": threshold must have shape [",
           x.dim() ? x.size(-1) : 0, "] (x's last dim), got ", shape_str(threshold.shape()));
  HL_CHECK(bandwidth > 0 && std::isfinite(bandwidth), op, ": bandwidth must be > 0, got ", bandwidth);
}

// The straight-through estimate's window: dout where |x - threshold| < bandwidth / 2, else 0.
Tensor in_window(const Tensor& dout, const Tensor& x, const Tensor& threshold, double bandwidth) {
  return where(lt(abs(sub(x, threshold)), scalar_tensor(bandwidth / 2, x.dtype(), x.device())), dout,
               zero_like_scalar(dout));
}

}  // namespace

Tensor jumprelu(const Tensor& x, const Tensor& threshold, double bandwidth) {
  const OpScope scope("jumprelu");
  check_threshold("jumprelu", x, threshold, bandwidth);
  Tensor out = where(gt(x.detach(), threshold.detach()), x.detach(), zero_like_scalar(x));
  record("jumprelu", out, {x, threshold}, {x, threshold}, [bandwidth](const Tensor& dout, Saved s, Grads& g) {
    if (g.needs(0)) g.acc(0, where(gt(s[0], s[1]), dout, zero_like_scalar(dout)));
    if (g.needs(1)) g.acc(1, mul(in_window(dout, s[0], s[1], bandwidth), mul(s[1], -1.0 / bandwidth)));
  });
  return out;
}

Tensor threshold_step(const Tensor& x, const Tensor& threshold, double bandwidth) {
  const OpScope scope("threshold_step");
  check_threshold("threshold_step", x, threshold, bandwidth);
  Tensor out = to_dtype(gt(x.detach(), threshold.detach()), x.dtype());
  record("threshold_step", out, {x, threshold}, {x, threshold}, [bandwidth](const Tensor& dout, Saved s, Grads& g) {
    if (g.needs(1)) g.acc(1, mul(in_window(dout, s[0], s[1], bandwidth), -1.0 / bandwidth));
  });
  return out;
}

}  // namespace headlab
