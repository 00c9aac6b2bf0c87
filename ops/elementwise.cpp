// Elementwise ops with broadcasting: arithmetic, math functions, comparisons, where/masked_fill.
// Broadcast operands reach the kernel with stride 0; their gradients are summed back by Grads::acc.
#include "ops/internal.h"

namespace headlab {

using detail::broadcast_shapes;
using detail::make_loop;

namespace {

Tensor binary_raw(const char* op, BinaryOp bop, const Tensor& a, const Tensor& b) {
  const OpScope scope(op);
  detail::check_defined(op, a, "first operand");
  detail::check_defined(op, b, "second operand");
  check_same_device(op, a, b);
  detail::check_same_dtype(op, a, b);
  const Shape shape = broadcast_shapes(op, a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, is_comparison(bop) ? DType::b8 : a.dtype(), a.device());
  if (out.numel()) backend_of(a).binary(bop, a.dtype(), make_loop(shape, {&out, &a, &b}));
  return out;
}

// Which value the derivative of a unary op is computed from.
bool derivative_needs_x(UnaryOp op) {
  return op == UnaryOp::log || op == UnaryOp::abs || op == UnaryOp::relu || op == UnaryOp::gelu ||
         op == UnaryOp::gelu_tanh || op == UnaryOp::pow;
}

Tensor unary(const char* op, UnaryOp uop, const Tensor& x, double alpha = 0, double beta = 0) {
  const OpScope scope(op);
  detail::check_floating(op, x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel()) backend_of(x).unary(uop, x.dtype(), make_loop(x.shape(), {&out, &x}), alpha, beta);
  detail::record_unary(op, uop, out, x, alpha);
  return out;
}

Tensor mask_as(const Tensor& m, DType dt) { return to_dtype(m, dt); }

}  // namespace

void detail::record_unary(const char* op, UnaryOp uop, Tensor& out, const Tensor& x, double alpha) {
  if (uop == UnaryOp::affine || uop == UnaryOp::neg) {  // linear: no saved values
    const double slope = uop == UnaryOp::neg ? -1.0 : alpha;
    record(op, out, {x}, {}, [slope](const Tensor& dout, Saved, Grads& g) { g.acc(0, affine(dout, slope, 0.0)); });
    return;
  }
  const bool uses_x = derivative_needs_x(uop);
  // saved: x, or the output y when the derivative is computed from it (exp, tanh, sigmoid, ...)
  record(op, out, {x}, {uses_x ? x : out}, [uop, alpha, uses_x](const Tensor& dout, Saved s, Grads& g) {
    if (!g.needs(0)) return;
    const Tensor dy = contiguous(dout);
    const Tensor v = contiguous(s[0]);
    Tensor dx = Tensor::empty(v.shape(), v.dtype(), v.device());
    backend_of(v).unary_backward(uop, v.dtype(), dx.raw_data(), dy.raw_data(), uses_x ? v.raw_data() : nullptr,
                                 uses_x ? nullptr : v.raw_data(), v.numel(), alpha);
    g.acc(0, dx);
  });
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("add", BinaryOp::add, a, b);
  record("add", out, {a, b}, {}, [](const Tensor& dout, Saved, Grads& g) {
    g.acc(0, dout);
    g.acc(1, dout);
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("sub", BinaryOp::sub, a, b);
  record("sub", out, {a, b}, {}, [](const Tensor& dout, Saved, Grads& g) {
    g.acc(0, dout);
    if (g.needs(1)) g.acc(1, neg(dout));
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("mul", BinaryOp::mul, a, b);
  record("mul", out, {a, b}, {a, b}, [](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &a = s[0], &b = s[1];
    if (g.needs(0)) g.acc(0, mul(dout, b));  // d(a*b)/da = b
    if (g.needs(1)) g.acc(1, mul(dout, a));
  });
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("div", BinaryOp::div, a, b);
  record("div", out, {a, b}, {a, b}, [](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &a = s[0], &b = s[1];
    if (g.needs(0)) g.acc(0, div(dout, b));
    if (g.needs(1)) g.acc(1, neg(div(mul(dout, a), mul(b, b))));  // -dout * a / b^2
  });
  return out;
}

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = binary_raw("maximum", BinaryOp::maximum, a, b);
  record("maximum", out, {a, b}, {a, b}, [](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &a = s[0], &b = s[1];
    // Ties split the gradient evenly, as PyTorch does.
    const Tensor tie = affine(mask_as(eq(a, b), a.dtype()), 0.5, 0.0);
    if (g.needs(0)) g.acc(0, mul(dout, add(mask_as(gt(a, b), a.dtype()), tie)));
    if (g.needs(1)) g.acc(1, mul(dout, add(mask_as(lt(a, b), a.dtype()), tie)));
  });
  return out;
}

Tensor affine(const Tensor& a, double scale, double shift) { return unary("affine", UnaryOp::affine, a, scale, shift); }
Tensor add(const Tensor& a, double s) { return affine(a, 1.0, s); }
Tensor mul(const Tensor& a, double s) { return affine(a, s, 0.0); }
Tensor neg(const Tensor& a) { return unary("neg", UnaryOp::neg, a); }
Tensor exp(const Tensor& a) { return unary("exp", UnaryOp::exp, a); }
Tensor log(const Tensor& a) { return unary("log", UnaryOp::log, a); }
Tensor sqrt(const Tensor& a) { return unary("sqrt", UnaryOp::sqrt, a); }
Tensor rsqrt(const Tensor& a) { return unary("rsqrt", UnaryOp::rsqrt, a); }
Tensor pow(const Tensor& a, double e) { return unary("pow", UnaryOp::pow, a, e); }
Tensor abs(const Tensor& a) { return unary("abs", UnaryOp::abs, a); }
Tensor tanh(const Tensor& a) { return unary("tanh", UnaryOp::tanh, a); }
Tensor sigmoid(const Tensor& a) { return unary("sigmoid", UnaryOp::sigmoid, a); }
Tensor relu(const Tensor& a) { return unary("relu", UnaryOp::relu, a); }
Tensor gelu(const Tensor& a, bool tanh_approximation) {
  return tanh_approximation ? unary("gelu", UnaryOp::gelu_tanh, a) : unary("gelu", UnaryOp::gelu, a);
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary_raw("eq", BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_raw("ne", BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_raw("lt", BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_raw("le", BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_raw("gt", BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_raw("ge", BinaryOp::ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  HL_CHECK(a.dtype() == DType::b8 && b.dtype() == DType::b8, "logical_and: expected bool tensors, got ",
           dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  return binary_raw("logical_and", BinaryOp::logical_and, a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const OpScope scope("where");
  detail::check_defined("where", cond, "condition");
  HL_CHECK(cond.dtype() == DType::b8, "where: condition must be bool, got ", dtype_name(cond.dtype()));
  check_same_device("where", cond, a);
  check_same_device("where", a, b);
  detail::check_same_dtype("where", a, b);
  const Shape shape = broadcast_shapes("where", broadcast_shapes("where", cond.shape(), a.shape()), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel()) backend_of(a).where(a.dtype(), make_loop(shape, {&out, &cond, &a, &b}));
  record("where", out, {a, b}, {cond}, [](const Tensor& dout, Saved s, Grads& g) {
    const Tensor& cond = s[0];
    const Tensor zero = zeros({}, dout.dtype(), dout.device());
    if (g.needs(0)) g.acc(0, where(cond, dout, zero));
    if (g.needs(1)) g.acc(1, where(cond, zero, dout));
  });
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  const OpScope scope("masked_fill");
  detail::check_defined("masked_fill", x);
  detail::check_defined("masked_fill", mask, "mask");
  HL_CHECK(mask.dtype() == DType::b8, "masked_fill: mask must be bool, got ", dtype_name(mask.dtype()));
  check_same_device("masked_fill", x, mask);
  const Shape shape = broadcast_shapes("masked_fill", x.shape(), mask.shape());
  const Tensor fill = full({}, value, x.dtype(), x.device());
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  if (out.numel()) backend_of(x).where(x.dtype(), make_loop(shape, {&out, &mask, &fill, &x}));
  record("masked_fill", out, {x}, {mask}, [](const Tensor& dout, Saved s, Grads& g) {
    g.acc(0, masked_fill(dout, s[0], 0.0));  // filled positions do not depend on x
  });
  return out;
}

namespace {

// x = x op b in place, b broadcast to x's shape. The gradient flows to x's old value only, so b may not
// need one. b may be x itself; a b that partly overlaps x would read what the loop wrote, which is refused
// where both are dense (as PyTorch does: interleaved views of one block, such as two halves of its rows,
// pass).
Tensor& binary_inplace(const char* op, BinaryOp bop, Tensor& x, const Tensor& b) {
  const OpScope scope(op);
  detail::check_defined(op, x);
  detail::check_defined(op, b, "operand");
  detail::check_floating(op, x);
  check_same_device(op, x, b);
  detail::check_same_dtype(op, x, b);
  HL_CHECK(broadcast_shapes(op, x.shape(), b.shape()) == x.shape(), op, ": operand of shape ", shape_str(b.shape()),
           " does not broadcast to the tensor's shape ", shape_str(x.shape()));
  HL_CHECK(!(grad_enabled() && b.requires_grad()), op,
           ": the operand requires grad, which an in-place op here does not carry; use the out-of-place form");
  const TensorImpl &xi = *x.impl(), &bi = *b.impl();
  const bool partial = xi.storage == bi.storage && x.is_contiguous() && b.is_contiguous() && xi.offset != bi.offset &&
                       xi.offset < bi.offset + b.numel() && bi.offset < xi.offset + x.numel();
  HL_CHECK(!partial, op, ": the operand shares memory with the tensor it changes (another view of it)");
  check_inplace(op, x);
  if (x.numel()) backend_of(x).binary(bop, x.dtype(), make_loop(x.shape(), {&x, &x, &b}));
  x.bump_version();
  record_inplace(op, x, {}, [](const Tensor& dout, Saved) { return dout; });
  return x;
}

}  // namespace

Tensor& add_(Tensor& x, const Tensor& b) { return binary_inplace("add_", BinaryOp::add, x, b); }
Tensor& sub_(Tensor& x, const Tensor& b) { return binary_inplace("sub_", BinaryOp::sub, x, b); }

Tensor& masked_fill_(Tensor& x, const Tensor& mask, double value) {
  detail::check_defined("masked_fill_", x);
  detail::check_defined("masked_fill_", mask, "mask");
  HL_CHECK(mask.dtype() == DType::b8, "masked_fill_: mask must be bool, got ", dtype_name(mask.dtype()));
  check_same_device("masked_fill_", x, mask);
  HL_CHECK(broadcast_shapes("masked_fill_", x.shape(), mask.shape()) == x.shape(), "masked_fill_: mask of shape ",
           shape_str(mask.shape()), " does not broadcast to the tensor's shape ", shape_str(x.shape()));
  check_inplace("masked_fill_", x);
  const Tensor fill = full({}, value, x.dtype(), x.device());
  if (x.numel()) backend_of(x).where(x.dtype(), make_loop(x.shape(), {&x, &mask, &fill, &x}));
  x.bump_version();
  record_inplace("masked_fill_", x, {mask}, [](const Tensor& dout, Saved s) { return masked_fill(dout, s[0], 0.0); });
  return x;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double s) { return affine(a, 1.0, s); }
Tensor operator-(const Tensor& a, double s) { return affine(a, 1.0, -s); }
Tensor operator*(const Tensor& a, double s) { return affine(a, s, 0.0); }
Tensor operator/(const Tensor& a, double s) { return affine(a, 1.0 / s, 0.0); }
Tensor operator+(double s, const Tensor& a) { return affine(a, 1.0, s); }
Tensor operator-(double s, const Tensor& a) { return affine(a, -1.0, s); }
Tensor operator*(double s, const Tensor& a) { return affine(a, s, 0.0); }
Tensor operator/(double s, const Tensor& a) { return mul(pow(a, -1.0), s); }

}  // namespace headlab
