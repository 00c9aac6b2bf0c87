// Vectorisable float exp and tanh (Cephes polynomials, about 1 ulp): libm's scalar expf/tanhf
// calls dominated GELU, softmax and cross entropy. Doubles keep libm: they serve gradient checks.
// FastExpTanh hands them to the formulas shared with CUDA (backends/scalar_math.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace headlab::cpu {

inline float fast_exp(float x) {
  const float in = x;
  x = std::fmin(std::fmax(x, -87.3365447504f), 88.7228391117f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;  // ln 2 split in two so r stays exact
  r = r + n * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r2 + r + 1.0f;
  // 2^n as two factors, so n = 128 (x near the top of float's range) does not overflow the exponent.
  const int32_t n_lo = static_cast<int32_t>(n) / 2, n_hi = static_cast<int32_t>(n) - n_lo;
  const int32_t bits_lo = (n_lo + 127) << 23, bits_hi = (n_hi + 127) << 23;
  float s_lo, s_hi;
  std::memcpy(&s_lo, &bits_lo, sizeof(s_lo));
  std::memcpy(&s_hi, &bits_hi, sizeof(s_hi));
  const float result = y * s_lo * s_hi;
  // As std::exp: NaN stays NaN, past the range the result is inf / 0.
  return in != in ? in : in > 88.7228391117f ? INFINITY : in < -103.972084f ? 0.0f : result;
}

inline float fast_tanh(float x) {
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
inline double fast_tanh(double x) { return std::tanh(x); }

// The exp/tanh policy of the shared formulas (backends/scalar_math.h) on the CPU.
struct FastExpTanh {
  template <typename T> static T exp(T x) { return fast_exp(x); }
  template <typename T> static T tanh(T x) { return fast_tanh(x); }
};

}  // namespace headlab::cpu
