// Vectorisable float exp and tanh (Cephes polynomials, about 1 ulp): libm's scalar expf/tanhf
// calls dominated GELU, softmax and cross entropy. Doubles keep libm: they serve gradient checks.
// FastExpTanh hands them to the formulas shared with CUDA (backends/scalar_math.h).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace headlab::cpu {

// always_inline: called out of line (GCC's inliner gives up deep inside the kernels' lambdas), they
// vectorise nothing and GELU runs at a third of its speed.
// exp(x) = 2^n y: returns y = exp(r), r = x - n ln 2, and n = round(x / ln 2), for finite |x| < 2^22 ln 2.
[[gnu::always_inline]] inline float exp_reduced(float x, float& n) {
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (round to nearest even), exact for |n| < 2^22.
  n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln 2 split in two so r stays exact
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r2 + r + 1.0f;
}

[[gnu::always_inline]] inline float fast_exp(float x) {
  // Plain comparisons and bit_cast instead of fmin/fmax/floor/memcpy: GCC calls fminf/fmaxf out of
  // line (NaN rules) and then vectorises nothing; this form becomes straight SIMD code.
  // NaN fails both tests and becomes the low end, so n stays finite (converting NaN to int is
  // undefined); the last line returns the NaN.
  const float xc = x > -87.3365447504f ? (x < 88.7228391117f ? x : 88.7228391117f) : -87.3365447504f;
  float n;
  const float y = exp_reduced(xc, n);
  // 2^n as two factors, so n = 128 (x near the top of float's range) does not overflow the exponent.
  const int32_t ni = static_cast<int32_t>(n), n_lo = ni >> 1, n_hi = ni - n_lo;
  const float result = y * std::bit_cast<float>((n_lo + 127) << 23) * std::bit_cast<float>((n_hi + 127) << 23);
  // As std::exp: NaN stays NaN, past the range the result is inf / 0.
  return x != x ? x : x > 88.7228391117f ? INFINITY : x < -103.972084f ? 0.0f : result;
}

// exp(x) for x in [-87, 88], which the caller clamps to: n in [-126, 127] is one normal power of two, and
// there is no NaN, overflow or underflow to handle (GELU's exp costs a third less).
[[gnu::always_inline]] inline float fast_exp_in_range(float x) {
  float n;
  const float y = exp_reduced(x, n);
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

[[gnu::always_inline]] inline float fast_tanh(float x) {
  const float ax = std::fabs(x);
  // Small |x|: odd polynomial; otherwise 1 - 2 / (exp(2|x|) + 1). Both computed, one kept (no branch).
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * ax) + 1.0f);  // fast_exp saturates: big -> 1 exactly
  return ax < 0.625f ? small : std::copysign(big, x);
}

inline double fast_exp(double x) { return std::exp(x); }
inline double fast_exp_in_range(double x) { return std::exp(x); }
inline double fast_tanh(double x) { return std::tanh(x); }

// The exp/tanh policy of the shared formulas (backends/scalar_math.h) on the CPU.
struct FastExpTanh {
  template <typename T>
  [[gnu::always_inline]] static T exp(T x) {
    return fast_exp(x);
  }
  template <typename T>
  [[gnu::always_inline]] static T exp_in_range(T x) {
    return fast_exp_in_range(x);
  }
  template <typename T>
  [[gnu::always_inline]] static T tanh(T x) {
    return fast_tanh(x);
  }
};

}  // namespace headlab::cpu
