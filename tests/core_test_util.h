// Helpers shared by the core suites (test_tensor, test_ops, test_gradcheck, test_autograd,
// test_errors): building small tensors from literals, comparing values, and catching the message
// of a headlab::Error.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace headlab::testing {

// Built with AddressSanitizer (gcc's define, clang's feature): it reserves terabytes of address space,
// so address-space limits and resident-memory checks do not apply.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// float32 / float64 / int64 tensors from literals: f32({1, 2, 3, 4}, {2, 2}).
inline Tensor f32(const std::vector<float>& v, const Shape& shape = {}) { return tensor(v, shape); }
inline Tensor f64(const std::vector<double>& v, const Shape& shape = {}) { return tensor(v, shape); }
inline Tensor i64(const std::vector<int64_t>& v, const Shape& shape = {}) { return tensor(v, shape); }

// A float64 tensor of `shape` with distinct, well-spread values (deterministic, no RNG involved).
inline Tensor seq64(const Shape& shape, double scale = 0.37, double shift = -1.1) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = shift + scale * static_cast<double>((i * 7) % 11) + 0.013 * i;
  return tensor(v, shape);
}

inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Element-wise |actual - expected| <= atol + rtol * |expected|, with the first mismatch reported.
inline ::testing::AssertionResult all_close(const Tensor& actual, const std::vector<double>& expected,
                                            double atol = 1e-5, double rtol = 1e-5) {
  const std::vector<double> a = actual.to_vector<double>();
  if (a.size() != expected.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " != expected " << expected.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == expected[i] || (std::isnan(a[i]) && std::isnan(expected[i]))) continue;  // incl. infinities
    if (!(std::abs(a[i] - expected[i]) <= atol + rtol * std::abs(expected[i])))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " != expected " << expected[i];
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol = 1e-5,
                                            double rtol = 1e-5) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << " != expected "
                                         << shape_str(expected.shape());
  return all_close(actual, expected.to_vector<double>(), atol, rtol);
}

// The message of the headlab::Error thrown by f, or a marker saying what happened instead.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a headlab::Error> ") + e.what();
  }
  return "<no error>";
}

}  // namespace headlab::testing

// EXPECT_ERROR(stmt, "substring"): stmt throws headlab::Error whose message contains the substring.
#define EXPECT_ERROR(stmt, needle)                                                \
  do {                                                                            \
    const std::string hl_msg_ = ::headlab::testing::error_of([&] { stmt; });      \
    EXPECT_NE(hl_msg_.find(needle), std::string::npos) << "message: " << hl_msg_; \
  } while (0)
