// Scalar maths shared by the CPU and CUDA backends (HL_HOST_DEVICE, like backends/philox.h): the
// unary ops and their derivatives, the binary ops, the optimizer updates and the softmax masks,
// written once so the two backends agree term by term (same constants, same evaluation order).
// exp and tanh of the hot ops (exp, tanh, sigmoid, GELU-tanh) come from a policy `M`: the CPU passes
// its polynomial float versions (backends/cpu/fast_math.h), CUDA the maths library's (LibmExpTanh).
// Everything else, erf-GELU and its derivative's exp included, is the maths library's on both.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backends/backend.h"
#include "backends/host_device.h"
#include "base/error.h"

namespace headlab::smath {

// Accumulator type: float sums accumulate in double, so float32 results track PyTorch's to ~1e-7.
template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, T>;

// ---- the maths library, one overload per precision (no float -> double promotion by accident) ----
HL_HOST_DEVICE float exp(float x) { return ::expf(x); }
HL_HOST_DEVICE double exp(double x) { return ::exp(x); }
HL_HOST_DEVICE float log(float x) { return ::logf(x); }
HL_HOST_DEVICE double log(double x) { return ::log(x); }
HL_HOST_DEVICE float sqrt(float x) { return ::sqrtf(x); }
HL_HOST_DEVICE double sqrt(double x) { return ::sqrt(x); }
HL_HOST_DEVICE float tanh(float x) { return ::tanhf(x); }
HL_HOST_DEVICE double tanh(double x) { return ::tanh(x); }
HL_HOST_DEVICE float erf(float x) { return ::erff(x); }
HL_HOST_DEVICE double erf(double x) { return ::erf(x); }
HL_HOST_DEVICE float pow(float x, float a) { return ::powf(x, a); }
HL_HOST_DEVICE double pow(double x, double a) { return ::pow(x, a); }
HL_HOST_DEVICE float abs(float x) { return ::fabsf(x); }
HL_HOST_DEVICE double abs(double x) { return ::fabs(x); }

// exp and tanh as the maths library computes them. exp_in_range: exp for x in [kExpLo, kExpHi], which the
// caller has clamped x to (a policy may skip the handling of NaN, overflow and underflow there).
constexpr double kExpLo = -87.0, kExpHi = 88.0;
struct LibmExpTanh {
  template <typename T>
  static HL_HOST_DEVICE T exp(T x) {
    return smath::exp(x);
  }
  template <typename T>
  static HL_HOST_DEVICE T exp_in_range(T x) {
    return smath::exp(x);
  }
  template <typename T>
  static HL_HOST_DEVICE T tanh(T x) {
    return smath::tanh(x);
  }
};

// ---- GELU: exact (erf) and with the tanh approximation, the hot activation of every GPT block ----
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kGeluCubic = 0.044715;

template <typename T>
HL_HOST_DEVICE T gelu(T x) {
  return T(0.5) * x * (T(1) + erf(x * T(kInvSqrt2)));
}
template <typename T>
HL_HOST_DEVICE T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + erf(x * T(kInvSqrt2)));
  return cdf + x * T(kInvSqrt2Pi) * exp(T(-0.5) * x * x);
}
// GELU-tanh 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x s with s = sigmoid(2u) =
// 1 / (1 + e), e = exp(-2u): one exp and one division where tanh costs both and more, and no cancellation
// in 1 + tanh u for negative x (there it kept few correct digits). Past |x| = 10 GELU is x or 0 and its
// derivative 1 or 0 to float precision (PyTorch's form gives 0 from about x = -5.5), and x^2 may overflow:
// those are set outright, and -2u is clamped to exp's range. As PyTorch's form: GELU(-inf) is NaN
// (inf * 0), its derivative at +-inf NaN.
constexpr double kGeluSaturates = 10.0;
template <class M, typename T>
HL_HOST_DEVICE T gelu_tanh_exp(T x) {  // e = exp(-2u)
  const T v = T(-2 * kSqrt2OverPi) * x * (T(1) + T(kGeluCubic) * x * x);
  return M::exp_in_range(v < T(kExpHi) ? (v > T(kExpLo) ? v : T(kExpLo)) : T(kExpHi));  // NaN -> kExpHi
}
template <class M, typename T>
HL_HOST_DEVICE T gelu_tanh(T x) {
  const T y = x / (T(1) + gelu_tanh_exp<M>(x));
  return x < T(-kGeluSaturates) ? x * T(0) : y;  // x * 0: -0, or NaN at -inf
}
// d/dx x s(u) = s + x s'(u) u' with s' = 2 s (1 - s) = 2 s (e s): no 1 - s to cancel.
template <class M, typename T>
HL_HOST_DEVICE T gelu_tanh_grad(T x) {
  const T e = gelu_tanh_exp<M>(x), s = T(1) / (T(1) + e);
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * x * x);
  const T g = s + T(2) * x * du * (e * s) * s;
  // x - x: 0 where x is finite, NaN at +-inf
  return x > T(kGeluSaturates) ? (x - x) + T(1) : x < T(-kGeluSaturates) ? x - x : g;
}

// ---- unary ops: out = op(x); pow uses alpha as the exponent; affine is alpha * x + beta ----
template <UnaryOp kOp, class M = LibmExpTanh, typename T>
HL_HOST_DEVICE T unary_op(T x, T alpha, T beta) {
  if constexpr (kOp == UnaryOp::neg)
    return -x;
  else if constexpr (kOp == UnaryOp::exp)
    return M::exp(x);
  else if constexpr (kOp == UnaryOp::log)
    return log(x);
  else if constexpr (kOp == UnaryOp::sqrt)
    return sqrt(x);
  else if constexpr (kOp == UnaryOp::rsqrt)
    return T(1) / sqrt(x);
  else if constexpr (kOp == UnaryOp::abs)
    return abs(x);
  else if constexpr (kOp == UnaryOp::tanh)
    return M::tanh(x);
  else if constexpr (kOp == UnaryOp::sigmoid)
    return T(1) / (T(1) + M::exp(-x));
  else if constexpr (kOp == UnaryOp::relu)
    return x > T(0) ? x : T(0);
  else if constexpr (kOp == UnaryOp::gelu)
    return gelu(x);
  else if constexpr (kOp == UnaryOp::gelu_tanh)
    return gelu_tanh<M>(x);
  else if constexpr (kOp == UnaryOp::pow)
    return pow(x, alpha);
  else if constexpr (kOp == UnaryOp::affine)
    return alpha * x + beta;
  else if constexpr (kOp == UnaryOp::sign)
    return T((x > T(0)) - (x < T(0)));
  else {
    static_assert(kOp == UnaryOp::gt_zero);
    return x > T(0) ? T(1) : T(0);
  }
}

// What d op(x) / dx is computed from: x, y = op(x) (cheaper for exp, sqrt, tanh, ...), or nothing.
enum class GradFrom : uint8_t { none, x, y };
HL_HOST_DEVICE constexpr GradFrom unary_grad_from(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt:
    case UnaryOp::tanh:
    case UnaryOp::sigmoid:
      return GradFrom::y;
    case UnaryOp::log:
    case UnaryOp::abs:
    case UnaryOp::relu:
    case UnaryOp::gelu:
    case UnaryOp::gelu_tanh:
    case UnaryOp::pow:
      return GradFrom::x;
    default:
      return GradFrom::none;  // neg, affine: constant; sign, gt_zero: piecewise constant
  }
}

// d op(x) / dx from x or y, whichever unary_grad_from(kOp) names (the other is ignored).
template <UnaryOp kOp, class M = LibmExpTanh, typename T>
HL_HOST_DEVICE T unary_derivative(T x, T y, T alpha) {
  if constexpr (kOp == UnaryOp::neg)
    return T(-1);
  else if constexpr (kOp == UnaryOp::exp)
    return y;
  else if constexpr (kOp == UnaryOp::log)
    return T(1) / x;
  else if constexpr (kOp == UnaryOp::sqrt)
    return T(0.5) / y;
  else if constexpr (kOp == UnaryOp::rsqrt)
    return T(-0.5) * y * y * y;
  else if constexpr (kOp == UnaryOp::abs)
    return T((x > T(0)) - (x < T(0)));
  else if constexpr (kOp == UnaryOp::tanh)
    return T(1) - y * y;
  else if constexpr (kOp == UnaryOp::sigmoid)
    return y * (T(1) - y);
  else if constexpr (kOp == UnaryOp::relu)
    return x > T(0) ? T(1) : T(0);
  else if constexpr (kOp == UnaryOp::gelu)
    return gelu_grad(x);
  else if constexpr (kOp == UnaryOp::gelu_tanh)
    return gelu_tanh_grad<M>(x);
  else if constexpr (kOp == UnaryOp::pow)
    return alpha * pow(x, alpha - T(1));
  else if constexpr (kOp == UnaryOp::affine)
    return alpha;
  else
    return T(0);  // sign, gt_zero
}

// dout[i] * op'(x[i]), reading only the operand the derivative needs (the other may be null).
template <UnaryOp kOp, class M = LibmExpTanh, typename T>
HL_HOST_DEVICE T unary_backward_at(const T* dout, const T* x, const T* y, int64_t i, T alpha) {
  constexpr GradFrom from = unary_grad_from(kOp);
  return dout[i] *
         unary_derivative<kOp, M>(from == GradFrom::x ? x[i] : T(0), from == GradFrom::y ? y[i] : T(0), alpha);
}

// Host check of unary_backward's contract: the operand the derivative is computed from is given.
inline void check_grad_operand(UnaryOp op, const void* x, const void* y, const char* who) {
  const GradFrom from = unary_grad_from(op);
  HL_CHECK((from != GradFrom::x || x) && (from != GradFrom::y || y), who, ": the derivative of unary op ",
           static_cast<int>(op), " is computed from ", from == GradFrom::x ? "x" : "y = op(x)", ", which is null");
}

// ---- binary ops: arithmetic keeps the operands' type (bool narrows back to one byte), comparisons
// and logical_and give 0/1; maximum/minimum propagate NaN, as in PyTorch ----
template <BinaryOp kOp, typename T>
HL_HOST_DEVICE auto binary_op(T a, T b) {
  if constexpr (kOp == BinaryOp::add)
    return static_cast<T>(a + b);
  else if constexpr (kOp == BinaryOp::sub)
    return static_cast<T>(a - b);
  else if constexpr (kOp == BinaryOp::mul)
    return static_cast<T>(a * b);
  else if constexpr (kOp == BinaryOp::div)
    return static_cast<T>(a / b);
  else if constexpr (kOp == BinaryOp::maximum)
    return (a != a || a > b) ? a : b;
  else if constexpr (kOp == BinaryOp::minimum)
    return (a != a || a < b) ? a : b;
  else if constexpr (kOp == BinaryOp::eq)
    return static_cast<uint8_t>(a == b);
  else if constexpr (kOp == BinaryOp::ne)
    return static_cast<uint8_t>(a != b);
  else if constexpr (kOp == BinaryOp::lt)
    return static_cast<uint8_t>(a < b);
  else if constexpr (kOp == BinaryOp::le)
    return static_cast<uint8_t>(a <= b);
  else if constexpr (kOp == BinaryOp::gt)
    return static_cast<uint8_t>(a > b);
  else if constexpr (kOp == BinaryOp::ge)
    return static_cast<uint8_t>(a >= b);
  else {
    static_assert(kOp == BinaryOp::logical_and);
    return static_cast<uint8_t>((a != T(0)) && (b != T(0)));
  }
}

// ---- softmax rows ----
// Valid columns of softmax row r: lengths -> the first lengths[r] (clamped to [0, cols]);
// causal -> the first r % q_len + 1.
HL_HOST_DEVICE int64_t softmax_valid_cols(SoftmaxMask mask, const int64_t* lengths, int64_t q_len, int64_t r,
                                          int64_t cols) {
  switch (mask) {
    case SoftmaxMask::lengths: {
      const int64_t len = lengths[r];
      return len < 0 ? 0 : (len > cols ? cols : len);
    }
    case SoftmaxMask::causal: {
      const int64_t keep = r % q_len + 1;
      return keep < cols ? keep : cols;
    }
    default:
      return cols;
  }
}

// A row's max and sum of exp(x - max), as each backend's row log-sum-exp helper returns them.
template <typename T>
struct RowLse {
  T max;
  Acc<T> sum;
  HL_HOST_DEVICE double log_sum() const { return log(static_cast<double>(sum)); }
  HL_HOST_DEVICE T lse() const { return max + static_cast<T>(log_sum()); }  // log(sum(exp(x)))
};

// ---- optimizer updates of element i (PyTorch's formulas) ----
template <typename T>
struct SgdParams {
  T lr, momentum, dampening, weight_decay;
  bool nesterov, first_step;
};
template <typename T>
HL_HOST_DEVICE void sgd_update(T* p, const T* g, T* buf, int64_t i, const SgdParams<T>& h) {
  T d = h.weight_decay != T(0) ? g[i] + h.weight_decay * p[i] : g[i];
  if (h.momentum != T(0)) {
    const T b = h.first_step ? d : h.momentum * buf[i] + (T(1) - h.dampening) * d;
    buf[i] = b;
    d = h.nesterov ? d + h.momentum * b : b;
  }
  p[i] -= h.lr * d;
}

// decoupled: AdamW (param *= 1 - lr * wd) else Adam (grad += wd * param).
template <typename T>
struct AdamParams {
  T step_size, bc2_sqrt, beta1, beta2, eps, decay, weight_decay;
  bool decoupled;
};
template <typename T>
AdamParams<T> adam_params(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                          bool decoupled) {
  const double bc1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(beta2, static_cast<double>(step));
  return {static_cast<T>(lr / bc1),     static_cast<T>(std::sqrt(bc2)),
          static_cast<T>(beta1),        static_cast<T>(beta2),
          static_cast<T>(eps),          static_cast<T>(1 - lr * weight_decay),
          static_cast<T>(weight_decay), decoupled};
}
template <typename T>
HL_HOST_DEVICE void adam_update(T* p, const T* g, T* m, T* v, int64_t i, const AdamParams<T>& h) {
  T gi = g[i], pi = p[i];
  if (h.decoupled)
    pi *= h.decay;
  else if (h.weight_decay != T(0))
    gi += h.weight_decay * pi;
  const T mi = h.beta1 * m[i] + (T(1) - h.beta1) * gi;
  const T vi = h.beta2 * v[i] + (T(1) - h.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] = pi - h.step_size * mi / (sqrt(vi) / h.bc2_sqrt + h.eps);
}

// ---- host side: a runtime op to a compile-time one, once per call (f gets an integral_constant) ----
template <typename F>
void dispatch_unary_op(UnaryOp op, const char* who, F&& f) {
  switch (op) {
#define HL_UNARY_CASE(name)                              \
  case UnaryOp::name:                                    \
    f(std::integral_constant<UnaryOp, UnaryOp::name>{}); \
    return;
    HL_UNARY_CASE(neg)
    HL_UNARY_CASE(exp) HL_UNARY_CASE(log) HL_UNARY_CASE(sqrt) HL_UNARY_CASE(rsqrt) HL_UNARY_CASE(abs)
        HL_UNARY_CASE(tanh) HL_UNARY_CASE(sigmoid) HL_UNARY_CASE(relu) HL_UNARY_CASE(gelu) HL_UNARY_CASE(gelu_tanh)
            HL_UNARY_CASE(pow) HL_UNARY_CASE(affine) HL_UNARY_CASE(sign) HL_UNARY_CASE(gt_zero)
#undef HL_UNARY_CASE
  }
  HL_FAIL(who, ": unknown unary op ", static_cast<int>(op));
}

template <typename F>
void dispatch_binary_op(BinaryOp op, const char* who, F&& f) {
  switch (op) {
#define HL_BINARY_CASE(name)                               \
  case BinaryOp::name:                                     \
    f(std::integral_constant<BinaryOp, BinaryOp::name>{}); \
    return;
    HL_BINARY_CASE(add)
    HL_BINARY_CASE(sub) HL_BINARY_CASE(mul) HL_BINARY_CASE(div) HL_BINARY_CASE(maximum) HL_BINARY_CASE(minimum)
        HL_BINARY_CASE(eq) HL_BINARY_CASE(ne) HL_BINARY_CASE(lt) HL_BINARY_CASE(le) HL_BINARY_CASE(gt)
            HL_BINARY_CASE(ge) HL_BINARY_CASE(logical_and)
#undef HL_BINARY_CASE
  }
  HL_FAIL(who, ": unknown binary op ", static_cast<int>(op));
}

}  // namespace headlab::smath
