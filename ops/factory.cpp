// Tensor factories: constant fills, ranges, host data, and seeded random draws.
#include <cmath>
#include <cstring>

#include "ops/internal.h"

namespace headlab {

using detail::make_loop;

namespace {
thread_local Generator* t_thread_generator = nullptr;  // a ThreadGenerator's, on its thread
}

Generator& default_generator() {
  if (t_thread_generator) return *t_thread_generator;
  static Generator gen(0);
  return gen;
}

ThreadGenerator::ThreadGenerator(const Generator& start) : own_(start), previous_(t_thread_generator) {
  t_thread_generator = &own_;
}
ThreadGenerator::~ThreadGenerator() { t_thread_generator = previous_; }

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  const OpScope scope("full");
  Tensor t = Tensor::empty(shape, dtype, device);
  if (t.numel() > 0) backend_of(t).fill(dtype, make_loop(shape, {&t}), value);
  return t;
}
Tensor zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor scalar_tensor(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  HL_CHECK(step != 0, "arange: step must be non-zero");
  HL_CHECK((end - start) / step >= 0 || start == end, "arange: the range [", start, ", ", end, ") with step ", step,
           " is empty in the wrong direction");
  const int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = Tensor::empty({std::max<int64_t>(n, 0)}, dtype, device);
  if (n > 0) backend_of(t).arange(dtype, t.raw_data(), n, start, step);
  return t;
}
Tensor arange(int64_t end, DType dtype, Device device) { return arange(0, static_cast<double>(end), 1, dtype, device); }

Tensor eye(int64_t n, DType dtype, Device device) {
  HL_CHECK(n >= 0, "eye: n must be >= 0, got ", n);
  Tensor t = zeros({n, n}, dtype, device);
  if (n > 0) {
    const Tensor diag = t.as_strided_raw({n}, {n + 1}, 0);
    backend_of(t).fill(dtype, make_loop({n}, {&diag}), 1.0);
  }
  return t;
}

namespace {
template <typename T>
Tensor from_host(const T* values, size_t count, Shape shape, DType dtype, Device device) {
  if (shape.empty() && count != 1) shape = {static_cast<int64_t>(count)};
  HL_CHECK(shape_numel(shape) == static_cast<int64_t>(count), "tensor: ", count, " values cannot fill shape ",
           shape_str(shape), " (", shape_numel(shape), " elements)");
  Tensor t = Tensor::empty(shape, dtype, device);
  if (count) backend_of(t).copy_from_host(t.raw_data(), values, count * sizeof(T));
  return t;
}
}  // namespace

Tensor tensor(const std::vector<float>& v, const Shape& shape, Device device) {
  return from_host(v.data(), v.size(), shape, DType::f32, device);
}
Tensor tensor(const std::vector<double>& v, const Shape& shape, Device device) {
  return from_host(v.data(), v.size(), shape, DType::f64, device);
}
Tensor tensor(const std::vector<int64_t>& v, const Shape& shape, Device device) {
  return from_host(v.data(), v.size(), shape, DType::i64, device);
}
Tensor tensor_bool(const std::vector<bool>& v, const Shape& shape, Device device) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  return from_host(bytes.data(), bytes.size(), shape, DType::b8, device);
}

Tensor uniform(const Shape& shape, double lo, double hi, Generator& gen, DType dtype, Device device) {
  const OpScope scope("uniform");
  HL_CHECK(is_floating(dtype), "uniform: dtype must be floating, got ", dtype_name(dtype));
  Tensor t = Tensor::empty(shape, dtype, device);
  const uint64_t offset = gen.reserve(t.numel());
  if (t.numel()) backend_of(t).random_uniform(dtype, t.raw_data(), t.numel(), gen.seed(), offset, lo, hi);
  return t;
}
Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return uniform(shape, 0.0, 1.0, gen, dtype, device);
}
Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  const OpScope scope("randn");
  HL_CHECK(is_floating(dtype), "randn: dtype must be floating, got ", dtype_name(dtype));
  Tensor t = Tensor::empty(shape, dtype, device);
  const uint64_t offset = gen.reserve(t.numel());
  if (t.numel()) backend_of(t).random_normal(dtype, t.raw_data(), t.numel(), gen.seed(), offset, 0.0, 1.0);
  return t;
}
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, Device device) {
  const OpScope scope("randint");
  HL_CHECK(high > low, "randint: expected low < high, got [", low, ", ", high, ")");
  HL_CHECK(high - low <= (int64_t{1} << 32), "randint: range [", low, ", ", high, ") is wider than 2^32");
  Tensor t = Tensor::empty(shape, DType::i64, device);
  const uint64_t offset = gen.reserve(t.numel());
  if (t.numel()) backend_of(t).random_int(t.raw_data(), t.numel(), gen.seed(), offset, low, high);
  return t;
}

}  // namespace headlab
