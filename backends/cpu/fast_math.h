// Vectorisable float exp and tanh (Cephes polynomials, about 1 ulp): libm's scalar expf/tanhf
// calls dominated GELU, softmax and cross entropy. Doubles keep libm: they serve gradient checks.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace headlab::cpu {

inline float fast_exp(float x) {
  x = std::fmin(std::fmax(x, -87.3365447504f), 88.3762626647f);
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
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
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
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * std::fmin(ax, 9.0f)) + 1.0f);
  return ax < 0.625f ? small : std::copysign(big, x);
}

inline double fast_exp(double x) { return std::exp(x); }
inline double fast_tanh(double x) { return std::tanh(x); }

}  // namespace headlab::cpu
