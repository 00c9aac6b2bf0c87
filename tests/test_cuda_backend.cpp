// Parity of the CUDA backend with the CPU backend through the raw Backend interface: every entry
// point on random inputs, contiguous, strided, broadcast and scalar loops, both float dtypes (1e-5
// relative for float32, 1e-12 for float64, exact for integers and bool), plus the caching allocator;
// then every case of the op registry (tests/op_cases.h) in float64, where the kernels' float64 paths
// meet the ops' strides and masks. Every test skips when no GPU is visible (or CUDA is not built).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/backend.h"
#include "tests/core_test_util.h"
#include "tests/op_cases.h"
#ifdef HEADLAB_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

using namespace headlab;
using headlab::testing::error_of;

namespace {

const Device kCuda0{Device::cuda, 0};

std::string cuda_skip_reason() {
  if (!cuda_built()) return "headlab was built without CUDA (HEADLAB_CUDA=OFF)";
  try {
    backend_for(kCuda0);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "cuda_available() is false";
}

#define REQUIRE_CUDA() \
  if (!headlab::cuda_available()) GTEST_SKIP() << "no CUDA device visible: " << cuda_skip_reason()

Backend& gpu() { return backend_for(kCuda0); }
Backend& cpu() { return cpu_backend(); }

template <typename T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::i64;
  else
    return DType::b8;
}
template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>)
    return "float32";
  else if constexpr (std::is_same_v<T, double>)
    return "float64";
  else if constexpr (std::is_same_v<T, int64_t>)
    return "int64";
  else
    return "bool";
}

// The tolerances of the brief: 1e-5 relative for float32, 1e-12 for float64; a small absolute
// floor for results near zero (cancellation), scaled up by tests whose sums are long.
template <typename T>
double rtol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}
template <typename T>
double atol() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-13;
}

// ---- device buffers ----
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t nbytes) : p_(gpu().alloc(nbytes)), n_(nbytes) {}
  template <typename T>
  explicit DeviceBuf(const std::vector<T>& v) : DeviceBuf(v.size() * sizeof(T)) {
    gpu().copy_from_host(p_, v.data(), n_);
  }
  ~DeviceBuf() { gpu().free(p_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> v(n_ / sizeof(T));
    gpu().copy_to_host(v.data(), p_, v.size() * sizeof(T));
    return v;
  }

 private:
  void* p_;
  size_t n_;
};

// ---- random inputs ----
template <typename T>
std::vector<T> random_vec(size_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  if constexpr (std::is_floating_point_v<T>) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (auto& x : v) x = static_cast<T>(d(rng));
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    for (auto& x : v) x = static_cast<uint8_t>(rng() & 1);
  } else {
    std::uniform_int_distribution<int64_t> d(static_cast<int64_t>(lo), static_cast<int64_t>(hi) - 1);
    for (auto& x : v) x = d(rng);
  }
  return v;
}

// Values k / 2 for integer k in [lo, hi]: ties and exact zeros for comparisons, argmax and casts.
template <typename T>
std::vector<T> grid_vec(size_t n, int lo, int hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, uint8_t>)
      x = static_cast<uint8_t>(d(rng) & 1);
    else if constexpr (std::is_floating_point_v<T>)
      x = static_cast<T>(d(rng)) / T(2);
    else
      x = static_cast<T>(d(rng));
  }
  return v;
}

template <typename T>
std::vector<char> to_bytes(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <typename T>
std::vector<T> from_bytes(const std::vector<char>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// ---- comparison ----
template <typename T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, double rt, double at,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      const double g = got[i], w = want[i];
      if (std::isnan(g) || std::isnan(w))
        ok = std::isnan(g) && std::isnan(w);
      else if (std::isinf(g) || std::isinf(w))
        ok = g == w;
      else
        ok = std::abs(g - w) <= at + rt * std::abs(w);
    } else {
      ok = got[i] == want[i];
    }
    if (!ok && ++bad <= 5) {
      std::ostringstream os;
      os << std::setprecision(17) << what << ": element " << i << ": cuda " << +got[i] << " vs cpu " << +want[i];
      ADD_FAILURE() << os.str();
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

template <typename T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, double scale = 1) {
  expect_close(got, want, rtol<T>(), atol<T>() * scale, what);
}

// ---- loops: one geometry, run on both backends ----
struct LoopSpec {
  std::string name;
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides;  // per operand, one per dim
};

// Elements an operand's buffer needs to hold its strided extent.
int64_t extent(const LoopSpec& s, int k) {
  int64_t e = 1;
  for (size_t d = 0; d < s.sizes.size(); ++d) e += (s.sizes[d] - 1) * s.strides[k][d];
  return e;
}

Loop make_loop(const LoopSpec& s, const std::vector<void*>& ptrs) {
  Loop l;
  l.ndim = static_cast<int>(s.sizes.size());
  l.nops = static_cast<int>(ptrs.size());
  for (int d = 0; d < l.ndim; ++d) l.sizes[d] = s.sizes[d];
  for (int k = 0; k < l.nops; ++k) {
    l.ptr[k] = ptrs[k];
    for (int d = 0; d < l.ndim; ++d) l.strides[k][d] = s.strides[k][d];
  }
  return l;
}

// Geometries for `nops` operands (operand 0 is the output and is never broadcast): contiguous,
// broadcast 1-D, transposed input (general path), 3-D broadcast, scalar, collapsible dims with a
// size-1 dim, transposed output, and one long enough for several grid-stride rounds.
std::vector<LoopSpec> geometries(int nops, bool with_large = false) {
  std::vector<LoopSpec> g;
  auto add = [&](std::string name, std::vector<int64_t> sizes, std::vector<std::vector<int64_t>> per_op) {
    per_op.resize(static_cast<size_t>(nops), per_op.back());
    g.push_back({std::move(name), std::move(sizes), std::move(per_op)});
  };
  add("contiguous", {1000}, {{1}});
  add("broadcast1d", {777}, {{1}, {0}, {1}, {0}});
  add("transposed_input", {37, 53}, {{53, 1}, {1, 37}, {53, 1}, {1, 37}});
  add("broadcast3d", {4, 5, 6}, {{30, 6, 1}, {6, 0, 1}, {0, 6, 1}, {30, 6, 1}});
  add("scalar", {}, {{}});
  add("collapsible", {2, 3, 1, 4}, {{12, 4, 4, 1}});
  add("transposed_output", {20, 30}, {{1, 20}, {30, 1}, {30, 1}, {1, 20}});
  add("strided", {300}, {{2}, {3}, {1}, {5}});
  if (with_large) add("large", {3'000'001}, {{1}});
  return g;
}

// Runs call(backend, loop) on the CPU (host buffers) and on the GPU (device buffers) from the same
// initial bytes of every operand; returns operand 0 (the output) of each: {cuda, cpu}.
std::pair<std::vector<char>, std::vector<char>> run_both(const LoopSpec& s, const std::vector<std::vector<char>>& init,
                                                         const std::function<void(Backend&, const Loop&)>& call) {
  std::vector<std::vector<char>> host = init;
  std::vector<void*> hp;
  for (auto& h : host) hp.push_back(h.data());
  call(cpu(), make_loop(s, hp));
  std::vector<std::unique_ptr<DeviceBuf>> dev;
  std::vector<void*> dp;
  for (auto& b : init) {
    dev.push_back(std::make_unique<DeviceBuf>(b));
    dp.push_back(dev.back()->get());
  }
  call(gpu(), make_loop(s, dp));
  return {dev[0]->to_host<char>(), host[0]};
}

// ================================================================================================
// memory
// ================================================================================================

TEST(CudaBackend, CopyRoundTrip) {
  REQUIRE_CUDA();
  const auto bytes = random_vec<int64_t>(1 << 17, -1000000, 1000000, 1);
  DeviceBuf d(bytes);
  EXPECT_EQ(d.to_host<int64_t>(), bytes);
  // Partial copies at an offset into the device block.
  std::vector<int64_t> part(100, 7);
  gpu().copy_from_host(d.as<int64_t>() + 500, part.data(), part.size() * sizeof(int64_t));
  std::vector<int64_t> back(102);
  gpu().copy_to_host(back.data(), d.as<int64_t>() + 499, back.size() * sizeof(int64_t));
  EXPECT_EQ(back[0], bytes[499]);
  EXPECT_EQ(back[101], bytes[600]);
  for (int i = 1; i <= 100; ++i) EXPECT_EQ(back[i], 7);
  gpu().synchronize();
  EXPECT_STREQ(gpu().name(), "cuda");
}

TEST(CudaBackend, AllocatorBytesInUseReturnsToBaseline) {
  REQUIRE_CUDA();
  Backend& be = gpu();
  be.synchronize();
  const size_t base = be.bytes_in_use();
  void* a = be.alloc(1000);
  void* b = be.alloc(3u << 20);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_GE(be.bytes_in_use(), base + 1000 + (3u << 20));
  EXPECT_GE(be.peak_bytes(), be.bytes_in_use());
  be.free(a);
  be.free(b);
  EXPECT_EQ(be.bytes_in_use(), base);
  void* z = be.alloc(0);  // like the CPU backend: a real, unique block
  EXPECT_NE(z, nullptr);
  be.free(z);
  be.free(nullptr);
  EXPECT_EQ(be.bytes_in_use(), base);
}

TEST(CudaBackend, AllocatorReusesFreedBlocks) {
  REQUIRE_CUDA();
  Backend& be = gpu();
  for (size_t n : {size_t{4096}, size_t{100}, size_t{5} << 20}) {
    void* p = be.alloc(n);
    be.free(p);
    void* q = be.alloc(n);
    EXPECT_EQ(p, q) << "a freed block of " << n << " bytes was not reused";
    be.free(q);
  }
}

TEST(CudaBackend, AllocatorPeakAndReset) {
  REQUIRE_CUDA();
  Backend& be = gpu();
  be.reset_peak();
  const size_t base = be.bytes_in_use();
  EXPECT_EQ(be.peak_bytes(), base);
  void* p = be.alloc(10u << 20);
  const size_t high = be.bytes_in_use();
  be.free(p);
  EXPECT_EQ(be.peak_bytes(), high);
  EXPECT_GE(high, base + (10u << 20));
  be.reset_peak();
  EXPECT_EQ(be.peak_bytes(), base);
}

TEST(CudaBackend, AllocatorOutOfMemoryIsAClearError) {
  REQUIRE_CUDA();
  Backend& be = gpu();
  const size_t base = be.bytes_in_use();
  const std::string msg = error_of([&] { be.alloc(size_t{1} << 52); });  // 4 PiB
  EXPECT_NE(msg.find("cuda:0 alloc: out of memory allocating"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(size_t{1} << 52)), std::string::npos) << msg;
  EXPECT_EQ(be.bytes_in_use(), base);
  // The backend still works afterwards.
  DeviceBuf d(std::vector<float>{1, 2, 3});
  EXPECT_EQ(d.to_host<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(CudaBackend, AllocatorRejectsForeignPointers) {
  REQUIRE_CUDA();
  int x = 0;
  EXPECT_NE(error_of([&] { gpu().free(&x); }).find("cuda free"), std::string::npos);
}

// A block freed while work on it is still queued is immediately reused: stream order keeps the
// new owner's writes after the old owner's.
TEST(CudaBackend, AllocatorReuseIsStreamOrdered) {
  REQUIRE_CUDA();
  Backend& be = gpu();
  const int64_t n = 1 << 22;
  LoopSpec s{"contiguous", {n}, {{1}}};
  void* a = be.alloc(n * sizeof(float));
  be.fill(DType::f32, make_loop(s, {a}), 1.0);
  void* b = be.alloc(n * sizeof(float));
  be.fill(DType::f32, make_loop(s, {b}), 3.0);
  LoopSpec s2{"contiguous", {n}, {{1}, {1}}};
  be.copy(DType::f32, DType::f32, make_loop(s2, {b, a}));  // b <- a (queued)
  be.free(a);                                              // freed while the copy may be pending
  void* c = be.alloc(n * sizeof(float));
  EXPECT_EQ(c, a);
  be.fill(DType::f32, make_loop(s, {c}), 2.0);
  std::vector<float> hb(n), hc(n);
  be.copy_to_host(hb.data(), b, n * sizeof(float));
  be.copy_to_host(hc.data(), c, n * sizeof(float));
  EXPECT_EQ(std::count(hb.begin(), hb.end(), 1.0f), n);
  EXPECT_EQ(std::count(hc.begin(), hc.end(), 2.0f), n);
  be.free(b);
  be.free(c);
}

#ifdef HEADLAB_HAS_CUDA
TEST(CudaBackend, EmptyCacheAndInstances) {
  REQUIRE_CUDA();
  void* p = gpu().alloc(1 << 20);
  gpu().free(p);
  EXPECT_GT(cuda_cached_bytes(0), 0u);
  cuda_empty_cache(0);
  EXPECT_EQ(cuda_cached_bytes(0), 0u);
  EXPECT_EQ(&cuda_backend_instance(0), &gpu());
  EXPECT_NE(error_of([] { cuda_backend_instance(999); }).find("cuda: device cuda:999 does not exist"),
            std::string::npos);
  EXPECT_TRUE(cuda_device_visible());
}
#endif

// ================================================================================================
// fill, arange, copy, unary, binary, where
// ================================================================================================

template <typename T>
void check_fill(double value) {
  for (const auto& s : geometries(1)) {
    const auto init = to_bytes(random_vec<T>(extent(s, 0), -5, 5, 3));
    auto [got, want] = run_both(s, {init}, [&](Backend& be, const Loop& l) { be.fill(dtype_of<T>(), l, value); });
    expect_close(from_bytes<T>(got), from_bytes<T>(want), 0, 0, std::string("fill ") + type_name<T>() + " " + s.name);
  }
}

TEST(CudaBackend, Fill) {
  REQUIRE_CUDA();
  for (double v : {2.5, -3.0, 0.0}) {
    check_fill<float>(v);
    check_fill<double>(v);
    check_fill<int64_t>(v);
    check_fill<uint8_t>(v);
  }
}

template <typename T>
void check_arange(int64_t n, double start, double step) {
  std::vector<T> want(static_cast<size_t>(n));
  cpu().arange(dtype_of<T>(), want.data(), n, start, step);
  DeviceBuf d(n * sizeof(T));
  gpu().arange(dtype_of<T>(), d.get(), n, start, step);
  expect_close(d.to_host<T>(), want, 0, 0, std::string("arange ") + type_name<T>());
}

TEST(CudaBackend, Arange) {
  REQUIRE_CUDA();
  check_arange<float>(1001, -3, 0.25);
  check_arange<double>(1001, 2, -0.1);
  check_arange<int64_t>(100000, -7, 3);
  check_arange<uint8_t>(2, 0, 1);
}

template <typename TD, typename TS>
void check_copy() {
  for (const auto& s : geometries(2)) {
    const auto out = to_bytes(random_vec<TD>(extent(s, 0), -5, 5, 4));
    const auto in = to_bytes(grid_vec<TS>(extent(s, 1), -7, 7, 5));  // exact zeros and halves
    auto [got, want] =
        run_both(s, {out, in}, [&](Backend& be, const Loop& l) { be.copy(dtype_of<TD>(), dtype_of<TS>(), l); });
    expect_close(from_bytes<TD>(got), from_bytes<TD>(want), 0, 0,
                 std::string("copy ") + type_name<TS>() + " -> " + type_name<TD>() + " " + s.name);
  }
}

template <typename TD>
void check_copy_from_all() {
  check_copy<TD, float>();
  check_copy<TD, double>();
  check_copy<TD, int64_t>();
  check_copy<TD, uint8_t>();
}

TEST(CudaBackend, CopyCastsBetweenAllDtypes) {
  REQUIRE_CUDA();
  check_copy_from_all<float>();
  check_copy_from_all<double>();
  check_copy_from_all<int64_t>();
  check_copy_from_all<uint8_t>();
}

const UnaryOp kAllUnary[] = {UnaryOp::neg,       UnaryOp::exp,  UnaryOp::log,     UnaryOp::sqrt, UnaryOp::rsqrt,
                             UnaryOp::abs,       UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::relu, UnaryOp::gelu,
                             UnaryOp::gelu_tanh, UnaryOp::pow,  UnaryOp::affine,  UnaryOp::sign, UnaryOp::gt_zero};

bool needs_positive(UnaryOp op) {
  return op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::pow;
}

template <typename T>
void check_unary(UnaryOp op, double alpha, double beta) {
  const double lo = needs_positive(op) ? 0.1 : -4, hi = 4;
  for (const auto& s : geometries(2, /*with_large=*/op == UnaryOp::exp)) {
    const auto out = to_bytes(random_vec<T>(extent(s, 0), -1, 1, 6));
    auto x = random_vec<T>(extent(s, 1), lo, hi, 7);
    if (!needs_positive(op)) x[0] = T(0);  // sign, relu, gt_zero at 0
    auto [got, want] = run_both(s, {out, to_bytes(x)},
                                [&](Backend& be, const Loop& l) { be.unary(op, dtype_of<T>(), l, alpha, beta); });
    expect_close(from_bytes<T>(got), from_bytes<T>(want),
                 std::string("unary op ") + std::to_string(static_cast<int>(op)) + " " + type_name<T>() + " " + s.name);
  }
}

TEST(CudaBackend, UnaryAllOps) {
  REQUIRE_CUDA();
  for (UnaryOp op : kAllUnary) {
    const double alpha = op == UnaryOp::pow ? 2.5 : 1.5, beta = -0.25;
    check_unary<float>(op, alpha, beta);
    check_unary<double>(op, alpha, beta);
  }
  check_unary<float>(UnaryOp::pow, 3.0, 0);
  check_unary<double>(UnaryOp::pow, -0.5, 0);
}

TEST(CudaBackend, UnaryRejectsIntegers) {
  REQUIRE_CUDA();
  DeviceBuf a(64), b(64);
  LoopSpec s{"c", {8}, {{1}, {1}}};
  EXPECT_EQ(error_of([&] {
              gpu().unary(UnaryOp::exp, DType::i64, make_loop(s, {a.get(), b.get()}), 0, 0);
            }),
            "cuda unary: expected a floating dtype, got int64");
}

// x and y (= op(x)) given, or only the one the derivative needs (the other null).
template <typename T>
void check_unary_backward(UnaryOp op, double alpha, bool drop_unneeded) {
  const int64_t n = 2000;
  const double lo = needs_positive(op) ? 0.1 : -4;
  auto x = random_vec<T>(n, lo, 4, 8);
  x[0] = T(0.5);
  std::vector<T> y(n);
  LoopSpec s{"c", {n}, {{1}, {1}}};
  cpu().unary(op, dtype_of<T>(), make_loop(s, {y.data(), x.data()}), alpha, 0);
  const auto dout = random_vec<T>(n, -2, 2, 9);
  const bool uses_y = op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::tanh ||
                      op == UnaryOp::sigmoid;
  const bool pass_x = !drop_unneeded || !uses_y, pass_y = !drop_unneeded || uses_y;
  std::vector<T> want(n);
  cpu().unary_backward(op, dtype_of<T>(), want.data(), dout.data(), pass_x ? x.data() : nullptr,
                       pass_y ? y.data() : nullptr, n, alpha);
  DeviceBuf dx(x), dy(y), ddout(dout), ddin(n * sizeof(T));
  gpu().unary_backward(op, dtype_of<T>(), ddin.get(), ddout.get(), pass_x ? dx.get() : nullptr,
                       pass_y ? dy.get() : nullptr, n, alpha);
  // Absolute floor x10: gelu_tanh's 1 - tanh(u)^2 cancels near |x| = 4, where an ulp of tanh is
  // ~1e-3 of the result in float32.
  expect_close(ddin.to_host<T>(), want,
               std::string("unary_backward op ") + std::to_string(static_cast<int>(op)) + " " + type_name<T>() +
                   (drop_unneeded ? " (one of x, y null)" : ""),
               10);
}

TEST(CudaBackend, UnaryBackwardAllOps) {
  REQUIRE_CUDA();
  for (UnaryOp op : kAllUnary) {
    const double alpha = op == UnaryOp::pow ? 2.5 : 1.5;
    for (bool drop : {false, true}) {
      check_unary_backward<float>(op, alpha, drop);
      check_unary_backward<double>(op, alpha, drop);
    }
  }
}

const BinaryOp kAllBinary[] = {BinaryOp::add,     BinaryOp::sub, BinaryOp::mul,        BinaryOp::div, BinaryOp::maximum,
                               BinaryOp::minimum, BinaryOp::eq,  BinaryOp::ne,         BinaryOp::lt,  BinaryOp::le,
                               BinaryOp::gt,      BinaryOp::ge,  BinaryOp::logical_and};

template <typename T>
void check_binary(BinaryOp op) {
  using TO = std::conditional_t<std::is_same_v<T, uint8_t>, uint8_t, T>;
  for (const auto& s : geometries(3)) {
    auto a = grid_vec<T>(extent(s, 1), -6, 6, 10);
    auto b = grid_vec<T>(extent(s, 2), -6, 6, 11);
    if constexpr (std::is_floating_point_v<T>) {  // NaN and inf: maximum/minimum propagate NaN
      a[a.size() / 2] = std::numeric_limits<T>::quiet_NaN();
      b[0] = std::numeric_limits<T>::quiet_NaN();
      if (b.size() > 3) b[3] = std::numeric_limits<T>::infinity();
    } else if (op == BinaryOp::div) {  // integer division by zero traps on the CPU
      for (auto& v : b)
        if (v == T(0)) v = T(1);
    }
    const bool cmp = is_comparison(op);
    const auto out =
        cmp ? to_bytes(random_vec<uint8_t>(extent(s, 0), 0, 2, 12)) : to_bytes(random_vec<TO>(extent(s, 0), -1, 1, 12));
    auto [got, want] = run_both(s, {out, to_bytes(a), to_bytes(b)},
                                [&](Backend& be, const Loop& l) { be.binary(op, dtype_of<T>(), l); });
    const std::string what =
        std::string("binary op ") + std::to_string(static_cast<int>(op)) + " " + type_name<T>() + " " + s.name;
    if (cmp)
      expect_close(from_bytes<uint8_t>(got), from_bytes<uint8_t>(want), 0, 0, what);
    else
      expect_close(from_bytes<T>(got), from_bytes<T>(want), what);
  }
}

TEST(CudaBackend, BinaryAllOpsAllDtypes) {
  REQUIRE_CUDA();
  for (BinaryOp op : kAllBinary) {
    check_binary<float>(op);
    check_binary<double>(op);
    check_binary<int64_t>(op);
    if (op != BinaryOp::div && op != BinaryOp::sub) check_binary<uint8_t>(op);
  }
}

template <typename T>
void check_where() {
  for (const auto& s : geometries(4)) {
    const auto out = to_bytes(random_vec<T>(extent(s, 0), -1, 1, 13));
    const auto cond = to_bytes(random_vec<uint8_t>(extent(s, 1), 0, 2, 14));
    const auto a = to_bytes(random_vec<T>(extent(s, 2), -9, 9, 15));
    const auto b = to_bytes(random_vec<T>(extent(s, 3), -9, 9, 16));
    auto [got, want] = run_both(s, {out, cond, a, b}, [&](Backend& be, const Loop& l) { be.where(dtype_of<T>(), l); });
    expect_close(from_bytes<T>(got), from_bytes<T>(want), 0, 0, std::string("where ") + type_name<T>() + " " + s.name);
  }
}

TEST(CudaBackend, Where) {
  REQUIRE_CUDA();
  check_where<float>();
  check_where<double>();
  check_where<int64_t>();
  check_where<uint8_t>();
}

// ================================================================================================
// reductions and checks
// ================================================================================================

struct ReduceCase {
  std::string name;
  std::vector<int64_t> osz, ost, isz, ist;
};

std::vector<ReduceCase> reduce_cases() {
  return {
      {"rows (last dim)", {50}, {300}, {300}, {1}},        {"columns (first dim)", {300}, {1}, {50}, {300}},
      {"everything", {}, {}, {7, 11, 13}, {143, 13, 1}},   {"two strided inner dims", {40}, {9}, {6, 9}, {360, 1}},
      {"one long row (split)", {}, {}, {1 << 20}, {1}},    {"few long columns (split)", {3}, {1}, {200000}, {3}},
      {"many short rows", {100000}, {3}, {3}, {1}},        {"short inner, 3-D outer", {4, 6, 5}, {60, 10, 1}, {2}, {5}},
      {"empty outer dims (one output)", {}, {}, {1}, {1}},
  };
}

int64_t reduce_extent(const ReduceCase& c) {
  int64_t e = 1;
  for (size_t d = 0; d < c.osz.size(); ++d) e += (c.osz[d] - 1) * c.ost[d];
  for (size_t d = 0; d < c.isz.size(); ++d) e += (c.isz[d] - 1) * c.ist[d];
  return e;
}

template <typename T>
void check_reduce(ReduceOp op, bool with_nan) {
  for (const auto& c : reduce_cases()) {
    auto in = grid_vec<T>(reduce_extent(c), -8, 8, 17);  // many ties for max / argmax
    if constexpr (std::is_floating_point_v<T>) {
      if (with_nan)
        for (size_t i = 5; i < in.size(); i += 97) in[i] = std::numeric_limits<T>::quiet_NaN();
    }
    int64_t n_out = 1;
    for (int64_t s : c.osz) n_out *= s;
    const int no = static_cast<int>(c.osz.size()), ni = static_cast<int>(c.isz.size());
    const std::string what = std::string("reduce op ") + std::to_string(static_cast<int>(op)) + " " + type_name<T>() +
                             " " + c.name + (with_nan ? " with NaN" : "");
    DeviceBuf din(in);
    if (op == ReduceOp::argmax) {
      std::vector<int64_t> want(n_out);
      cpu().reduce(op, dtype_of<T>(), want.data(), in.data(), no, c.osz.data(), c.ost.data(), ni, c.isz.data(),
                   c.ist.data());
      DeviceBuf dout(n_out * sizeof(int64_t));
      gpu().reduce(op, dtype_of<T>(), dout.get(), din.get(), no, c.osz.data(), c.ost.data(), ni, c.isz.data(),
                   c.ist.data());
      expect_close(dout.to_host<int64_t>(), want, 0, 0, what);
    } else {
      std::vector<T> want(n_out);
      cpu().reduce(op, dtype_of<T>(), want.data(), in.data(), no, c.osz.data(), c.ost.data(), ni, c.isz.data(),
                   c.ist.data());
      DeviceBuf dout(n_out * sizeof(T));
      gpu().reduce(op, dtype_of<T>(), dout.get(), din.get(), no, c.osz.data(), c.ost.data(), ni, c.isz.data(),
                   c.ist.data());
      // Halves summed in double (float32 too) are exact on both sides, whatever the order.
      expect_close(dout.to_host<T>(), want, 0, 0, what);
    }
  }
}

TEST(CudaBackend, ReduceAllOps) {
  REQUIRE_CUDA();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::argmax}) {
    check_reduce<float>(op, false);
    check_reduce<double>(op, false);
    check_reduce<int64_t>(op, false);
    check_reduce<float>(op, true);
    check_reduce<double>(op, true);
  }
}

TEST(CudaBackend, ReduceSumOfRandomFloats) {
  REQUIRE_CUDA();
  const int64_t rows = 64, cols = 5000;
  const auto in = random_vec<float>(rows * cols, -1, 1, 18);
  const int64_t osz[] = {rows}, ost[] = {cols}, isz[] = {cols}, ist[] = {1};
  std::vector<float> want(rows);
  cpu().reduce(ReduceOp::sum, DType::f32, want.data(), in.data(), 1, osz, ost, 1, isz, ist);
  DeviceBuf din(in), dout(rows * sizeof(float));
  gpu().reduce(ReduceOp::sum, DType::f32, dout.get(), din.get(), 1, osz, ost, 1, isz, ist);
  expect_close(dout.to_host<float>(), want, "reduce sum float32 random");
}

TEST(CudaBackend, ReduceRejectsBool) {
  REQUIRE_CUDA();
  DeviceBuf a(16), b(16);
  const int64_t sz[] = {4}, st[] = {1};
  EXPECT_NE(error_of([&] {
              gpu().reduce(ReduceOp::sum, DType::b8, b.get(), a.get(), 0, sz, st, 1, sz, st);
            }).find("bool tensors cannot be reduced"),
            std::string::npos);
}

template <typename T>
void check_all_finite() {
  auto v = random_vec<T>(100001, -1e3, 1e3, 19);
  DeviceBuf d(v);
  EXPECT_TRUE(gpu().all_finite(dtype_of<T>(), d.get(), static_cast<int64_t>(v.size())));
  EXPECT_TRUE(gpu().all_finite(dtype_of<T>(), d.get(), 0));
  for (T bad :
       {std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(), std::numeric_limits<T>::quiet_NaN()}) {
    v[77777] = bad;
    DeviceBuf e(v);
    EXPECT_FALSE(gpu().all_finite(dtype_of<T>(), e.get(), static_cast<int64_t>(v.size())));
    EXPECT_TRUE(gpu().all_finite(dtype_of<T>(), e.get(), 77777));  // the bad element is outside
    EXPECT_EQ(cpu().all_finite(dtype_of<T>(), v.data(), static_cast<int64_t>(v.size())), false);
  }
}

TEST(CudaBackend, AllFinite) {
  REQUIRE_CUDA();
  check_all_finite<float>();
  check_all_finite<double>();
}

TEST(CudaBackend, IndicesInRange) {
  REQUIRE_CUDA();
  const auto idx = random_vec<int64_t>(50000, 0, 10, 20);
  DeviceBuf d(idx);
  const int64_t n = static_cast<int64_t>(idx.size());
  for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 10}, {0, 9}, {1, 10}, {-5, 100}, {3, 3}}) {
    EXPECT_EQ(gpu().indices_in_range(d.as<int64_t>(), n, lo, hi), cpu().indices_in_range(idx.data(), n, lo, hi))
        << "[" << lo << ", " << hi << ")";
  }
  EXPECT_TRUE(gpu().indices_in_range(d.as<int64_t>(), n, 0, 10));
  EXPECT_FALSE(gpu().indices_in_range(d.as<int64_t>(), n, 0, 9));
}

// linear_rows (a few rows through a linear layer, bias fused) against a float64 reference on the host: every row
// count it takes, column counts that split a column across 1 to 8 warps, K not a multiple of 32, a row stride
// past K, with and without a bias; more rows than it takes are declined.
template <typename T>
void check_linear_rows() {
  for (const int64_t rows : {1, 2, 3, 4})
    for (const auto& [N, K] : {std::pair<int64_t, int64_t>{1, 1}, {7, 33}, {768, 768}, {3072, 768}, {768, 3072},
                              {1000, 70}})
      for (const bool with_bias : {true, false}) {
        const int64_t ldx = K + 5;
        const auto x = random_vec<T>(static_cast<size_t>(rows * ldx), -1, 1, 31);
        const auto w = random_vec<T>(static_cast<size_t>(N * K), -1, 1, 32);
        const auto b = random_vec<T>(static_cast<size_t>(N), -1, 1, 33);
        DeviceBuf dx(x), dw(w), db(b), dout(static_cast<size_t>(rows * N) * sizeof(T));
        ASSERT_TRUE(gpu().linear_rows(dtype_of<T>(), dout.get(), dx.get(), ldx, dw.get(), with_bias ? db.get() : nullptr,
                                      rows, N, K));
        const auto got = dout.to_host<T>();
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t n = 0; n < N; ++n) {
            double want = with_bias ? double(b[size_t(n)]) : 0.0, mag = std::abs(want);
            for (int64_t k = 0; k < K; ++k) {
              want += double(x[size_t(r * ldx + k)]) * double(w[size_t(n * K + k)]);
              mag += std::abs(double(x[size_t(r * ldx + k)]) * double(w[size_t(n * K + k)]));
            }
            ASSERT_NEAR(double(got[size_t(r * N + n)]), want, rtol<T>() * mag + atol<T>())
                << type_name<T>() << " rows " << rows << " N " << N << " K " << K << " at " << r << ", " << n;
          }
      }
  DeviceBuf d(size_t{4096});
  EXPECT_FALSE(gpu().linear_rows(dtype_of<T>(), d.get(), d.get(), 8, d.get(), nullptr, 5, 8, 8));
}

TEST(CudaBackend, LinearRows) {
  REQUIRE_CUDA();
  check_linear_rows<float>();
  check_linear_rows<double>();
}

// check_indices queues its check and reports a failure at the next wait for the device, whichever call waits.
TEST(CudaBackend, CheckIndicesReportsAtTheNextWait) {
  REQUIRE_CUDA();
  auto idx = random_vec<int64_t>(50000, 0, 10, 21);
  DeviceBuf good(idx);
  idx[777] = 12;
  DeviceBuf bad(idx);
  const int64_t n = static_cast<int64_t>(idx.size());
  const std::string expected = "embedding: index 12 is out of range for size 10";
  gpu().check_indices("embedding", good.as<int64_t>(), n, 10);
  gpu().synchronize();  // nothing to report
  gpu().check_indices("embedding", bad.as<int64_t>(), n, 10);  // queued: no wait, no throw
  EXPECT_NE(error_of([&] { gpu().synchronize(); }).find(expected), std::string::npos);
  gpu().synchronize();  // reported once, then cleared
  gpu().check_indices("index_select", bad.as<int64_t>(), n, 10);
  std::vector<int64_t> back(4);
  EXPECT_NE(error_of([&] { gpu().copy_to_host(back.data(), good.as<int64_t>(), 4 * sizeof(int64_t)); })
                .find("index_select: index 12 is out of range for size 10"),
            std::string::npos);
  // More checks than the backend keeps slots for: it waits to free them, and the one failure among them
  // is reported (by the check that waits, or by the next synchronize).
  const std::string failed = error_of([&] {
    for (int i = 0; i < 10000; ++i) gpu().check_indices("embedding", (i == 5 ? bad : good).as<int64_t>(), n, 10);
    gpu().synchronize();
  });
  EXPECT_NE(failed.find(expected), std::string::npos) << failed;
  for (int i = 0; i < 10000; ++i) gpu().check_indices("embedding", good.as<int64_t>(), n, 10);
  gpu().synchronize();
  // A negative index too.
  idx[777] = -3;
  DeviceBuf negative(idx);
  gpu().check_indices("embedding", negative.as<int64_t>(), n, 10);
  EXPECT_NE(error_of([&] { gpu().synchronize(); }).find("embedding: index -3 is out of range for size 10"),
            std::string::npos);
}

// ================================================================================================
// GEMM
// ================================================================================================

template <typename T>
void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch, double alpha, double beta,
                bool shared_b) {
  // Row-major storage with padded leading dimensions and padded batch strides.
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 2;
  const int64_t sa = a_rows * lda + 5, sb = shared_b ? 0 : b_rows * ldb + 7, sc = M * ldc + 4;
  const auto A = random_vec<T>(std::max<int64_t>(sa * batch, 1), -1, 1, 21);
  const auto B = random_vec<T>(std::max<int64_t>(shared_b ? b_rows * ldb : sb * batch, 1), -1, 1, 22);
  auto C0 = random_vec<T>(sc * batch, -1, 1, 23);
  if (beta == 0)  // beta == 0 must ignore C, NaNs included
    for (size_t i = 0; i < C0.size(); i += 3) C0[i] = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> want = C0;
  cpu().gemm(dtype_of<T>(), ta, tb, M, N, K, alpha, A.data(), lda, sa, B.data(), ldb, sb, beta, want.data(), ldc, sc,
             batch);
  DeviceBuf dA(A), dB(B), dC(C0);
  gpu().gemm(dtype_of<T>(), ta, tb, M, N, K, alpha, dA.get(), lda, sa, dB.get(), ldb, sb, beta, dC.get(), ldc, sc,
             batch);
  // Products summed over K in a different order (cuBLAS vs OpenBLAS): absolute floor ~ K * eps.
  std::ostringstream what;
  what << "gemm " << type_name<T>() << " ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K
       << " batch=" << batch << " alpha=" << alpha << " beta=" << beta << (shared_b ? " shared B" : "");
  expect_close(dC.to_host<T>(), want, rtol<T>(), atol<T>() * std::max<double>(1, K / 4.0), what.str());
}

template <typename T>
void check_gemm_all() {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm<T>(ta, tb, 33, 47, 65, 3, 0.75, 0.5, false);
      check_gemm<T>(ta, tb, 1, 47, 65, 2, 1.0, 0.0, false);
      check_gemm<T>(ta, tb, 33, 1, 1, 1, -1.0, 1.0, false);
    }
  check_gemm<T>(false, true, 64, 32, 16, 4, 1.0, 0.0, true);
  check_gemm<T>(false, false, 5, 6, 0, 2, 1.0, 0.5, false);  // K == 0: C = beta * C
  check_gemm<T>(true, false, 5, 6, 0, 2, 1.0, 0.0, false);   // K == 0, beta == 0: C = 0
  check_gemm<T>(false, false, 300, 200, 500, 1, 1.0, 0.0, false);
}

TEST(CudaBackend, GemmFloat32) {
  REQUIRE_CUDA();
  check_gemm_all<float>();
}

TEST(CudaBackend, GemmFloat64) {
  REQUIRE_CUDA();
  check_gemm_all<double>();
}

TEST(CudaBackend, GemmRejectsIntegers) {
  REQUIRE_CUDA();
  DeviceBuf a(64);
  EXPECT_EQ(error_of([&] {
              gpu().gemm(DType::i64, false, false, 2, 2, 2, 1, a.get(), 2, 0, a.get(), 2, 0, 0, a.get(), 2, 0, 1);
            }),
            "cuda gemm: expected a floating dtype, got int64");
}

#ifdef HEADLAB_HAS_CUDA
TEST(CudaBackend, GemmTf32Toggle) {
  REQUIRE_CUDA();
  ASSERT_FALSE(cuda_allow_tf32());
  cuda_set_allow_tf32(true);
  // TF32 keeps 10 mantissa bits: about 1e-3 relative per product.
  const int64_t M = 128, N = 128, K = 256;
  const auto A = random_vec<float>(M * K, -1, 1, 24), B = random_vec<float>(K * N, -1, 1, 25);
  std::vector<float> want(M * N);
  cpu().gemm(DType::f32, false, false, M, N, K, 1, A.data(), K, 0, B.data(), N, 0, 0, want.data(), N, 0, 1);
  DeviceBuf dA(A), dB(B), dC(M * N * sizeof(float));
  gpu().gemm(DType::f32, false, false, M, N, K, 1, dA.get(), K, 0, dB.get(), N, 0, 0, dC.get(), N, 0, 1);
  expect_close(dC.to_host<float>(), want, 1e-2, 5e-2, "gemm with TF32");
  cuda_set_allow_tf32(false);
  gpu().gemm(DType::f32, false, false, M, N, K, 1, dA.get(), K, 0, dB.get(), N, 0, 0, dC.get(), N, 0, 1);
  expect_close(dC.to_host<float>(), want, 1e-5, 1e-6 * K / 4, "gemm after TF32 is turned off");
}
#endif

// ================================================================================================
// softmax, log-softmax, cross-entropy
// ================================================================================================

const std::pair<int64_t, int64_t> kRowShapes[] = {{64, 7}, {50, 1000}, {33, 1025}, {9, 3000}, {1, 1}};

template <typename T>
void check_softmax(int64_t rows, int64_t cols, SoftmaxMask mask) {
  const double scale = 0.7;
  const auto x = random_vec<T>(rows * cols, -6, 6, 26);
  auto lengths = random_vec<int64_t>(rows, -1, cols + 3, 27);
  if (rows > 2) lengths[1] = 0;  // a fully masked row: zeros, never NaN
  const int64_t q_len = 8;
  std::vector<T> want(rows * cols);
  cpu().softmax_forward(dtype_of<T>(), want.data(), x.data(), rows, cols, scale, mask, lengths.data(), q_len);
  DeviceBuf dx(x), dl(lengths), dy(rows * cols * sizeof(T));
  gpu().softmax_forward(dtype_of<T>(), dy.get(), dx.get(), rows, cols, scale, mask, dl.as<int64_t>(), q_len);
  std::ostringstream what;
  what << "softmax_forward " << type_name<T>() << " " << rows << "x" << cols << " mask " << static_cast<int>(mask);
  const auto got = dy.to_host<T>();
  expect_close(got, want, what.str());
  for (T v : got) ASSERT_FALSE(std::isnan(v)) << what.str();

  // backward from the CPU's y, so both sides see the same input
  const auto dout = random_vec<T>(rows * cols, -1, 1, 28);
  std::vector<T> want_dx(rows * cols);
  cpu().softmax_backward(dtype_of<T>(), want_dx.data(), dout.data(), want.data(), rows, cols, scale);
  DeviceBuf d_dout(dout), d_y(want), d_dx(rows * cols * sizeof(T));
  gpu().softmax_backward(dtype_of<T>(), d_dx.get(), d_dout.get(), d_y.get(), rows, cols, scale);
  expect_close(d_dx.to_host<T>(), want_dx, "softmax_backward" + what.str().substr(15));
}

TEST(CudaBackend, Softmax) {
  REQUIRE_CUDA();
  for (auto [rows, cols] : kRowShapes)
    for (SoftmaxMask mask : {SoftmaxMask::none, SoftmaxMask::lengths, SoftmaxMask::causal}) {
      check_softmax<float>(rows, cols, mask);
      check_softmax<double>(rows, cols, mask);
    }
}

template <typename T>
void check_log_softmax(int64_t rows, int64_t cols) {
  const auto x = random_vec<T>(rows * cols, -6, 6, 29);
  std::vector<T> want(rows * cols);
  cpu().log_softmax_forward(dtype_of<T>(), want.data(), x.data(), rows, cols);
  DeviceBuf dx(x), dy(rows * cols * sizeof(T));
  gpu().log_softmax_forward(dtype_of<T>(), dy.get(), dx.get(), rows, cols);
  const std::string shape = std::string(" ") + type_name<T>() + " " + std::to_string(rows) + "x" + std::to_string(cols);
  expect_close(dy.to_host<T>(), want, "log_softmax_forward" + shape);

  const auto dout = random_vec<T>(rows * cols, -1, 1, 30);
  std::vector<T> want_dx(rows * cols);
  cpu().log_softmax_backward(dtype_of<T>(), want_dx.data(), dout.data(), want.data(), rows, cols);
  DeviceBuf d_dout(dout), d_y(want), d_dx(rows * cols * sizeof(T));
  gpu().log_softmax_backward(dtype_of<T>(), d_dx.get(), d_dout.get(), d_y.get(), rows, cols);
  expect_close(d_dx.to_host<T>(), want_dx, "log_softmax_backward" + shape, 10);
}

TEST(CudaBackend, LogSoftmax) {
  REQUIRE_CUDA();
  for (auto [rows, cols] : kRowShapes) {
    check_log_softmax<float>(rows, cols);
    check_log_softmax<double>(rows, cols);
  }
}

template <typename T>
void check_cross_entropy(int64_t rows, int64_t classes) {
  const int64_t ignore = -100;
  const auto logits = random_vec<T>(rows * classes, -5, 5, 31);
  auto targets = random_vec<int64_t>(rows, 0, classes, 32);
  for (int64_t r = 0; r < rows; r += 5) targets[r] = ignore;
  const std::string shape =
      std::string(" ") + type_name<T>() + " " + std::to_string(rows) + "x" + std::to_string(classes);
  std::vector<T> want(rows);
  cpu().cross_entropy_forward(dtype_of<T>(), want.data(), logits.data(), targets.data(), rows, classes, ignore);
  DeviceBuf d_logits(logits), d_targets(targets), d_loss(rows * sizeof(T));
  gpu().cross_entropy_forward(dtype_of<T>(), d_loss.get(), d_logits.get(), d_targets.as<int64_t>(), rows, classes,
                              ignore);
  expect_close(d_loss.to_host<T>(), want, "cross_entropy_forward" + shape);

  for (int64_t stride : {int64_t{1}, int64_t{0}}) {  // per-row dloss (reduction none) or one scalar (mean)
    const auto dloss = random_vec<T>(rows, 0.5, 2, 33);
    const double scale = stride ? 1.0 : 1.0 / rows;
    std::vector<T> want_d(rows * classes);
    cpu().cross_entropy_backward(dtype_of<T>(), want_d.data(), dloss.data(), stride, scale, logits.data(),
                                 targets.data(), rows, classes, ignore);
    DeviceBuf d_dloss(dloss), d_d(rows * classes * sizeof(T));
    gpu().cross_entropy_backward(dtype_of<T>(), d_d.get(), d_dloss.get(), stride, scale, d_logits.get(),
                                 d_targets.as<int64_t>(), rows, classes, ignore);
    expect_close(d_d.to_host<T>(), want_d, "cross_entropy_backward dloss_stride " + std::to_string(stride) + shape);
  }
}

TEST(CudaBackend, CrossEntropy) {
  REQUIRE_CUDA();
  for (auto [rows, classes] : {std::pair<int64_t, int64_t>{40, 10}, {6, 5000}, {3, 1}, {257, 65}}) {
    check_cross_entropy<float>(rows, classes);
    check_cross_entropy<double>(rows, classes);
  }
}

// ================================================================================================
// layer norm
// ================================================================================================

template <typename T>
void check_layernorm(int64_t rows, int64_t cols, bool affine) {
  const double eps = 1e-5;
  const auto x = random_vec<T>(rows * cols, 1, 4, 34);  // a mean far from 0 exercises the variance
  const auto w = random_vec<T>(cols, 0.5, 1.5, 35), b = random_vec<T>(cols, -1, 1, 36);
  std::vector<T> y(rows * cols), mean(rows), rstd(rows);
  cpu().layernorm_forward(dtype_of<T>(), y.data(), mean.data(), rstd.data(), x.data(), affine ? w.data() : nullptr,
                          affine ? b.data() : nullptr, rows, cols, eps);
  DeviceBuf dx(x), dw(w), db(b), dy(rows * cols * sizeof(T)), dmean(rows * sizeof(T)), drstd(rows * sizeof(T));
  gpu().layernorm_forward(dtype_of<T>(), dy.get(), dmean.get(), drstd.get(), dx.get(), affine ? dw.get() : nullptr,
                          affine ? db.get() : nullptr, rows, cols, eps);
  const std::string what = std::string(" ") + type_name<T>() + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                           (affine ? " affine" : "");
  expect_close(dy.to_host<T>(), y, "layernorm_forward y" + what, 10);
  expect_close(dmean.to_host<T>(), mean, "layernorm_forward mean" + what);
  expect_close(drstd.to_host<T>(), rstd, "layernorm_forward rstd" + what);

  // backward from the CPU's mean and rstd
  const auto dout = random_vec<T>(rows * cols, -1, 1, 37);
  for (bool want_wb : {true, false}) {
    std::vector<T> gx(rows * cols), gw(cols, T(-7)), gb(cols, T(-7));
    cpu().layernorm_backward(dtype_of<T>(), gx.data(), want_wb ? gw.data() : nullptr, want_wb ? gb.data() : nullptr,
                             dout.data(), x.data(), mean.data(), rstd.data(), affine ? w.data() : nullptr, rows, cols);
    DeviceBuf d_dout(dout), d_mean(mean), d_rstd(rstd), d_gx(rows * cols * sizeof(T));
    DeviceBuf d_gw(std::vector<T>(cols, T(-7))), d_gb(std::vector<T>(cols, T(-7)));
    gpu().layernorm_backward(dtype_of<T>(), d_gx.get(), want_wb ? d_gw.get() : nullptr, want_wb ? d_gb.get() : nullptr,
                             d_dout.get(), dx.get(), d_mean.get(), d_rstd.get(), affine ? dw.get() : nullptr, rows,
                             cols);
    expect_close(d_gx.to_host<T>(), gx, "layernorm_backward dx" + what, 10);
    // Column sums over `rows` rows: the absolute floor grows with the row count.
    expect_close(d_gw.to_host<T>(), gw, "layernorm_backward dw" + what, static_cast<double>(rows));
    expect_close(d_gb.to_host<T>(), gb, "layernorm_backward db" + what, static_cast<double>(rows));
  }
}

TEST(CudaBackend, LayerNorm) {
  REQUIRE_CUDA();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{100, 64}, {7, 2000}, {1, 1}, {3000, 33}, {2, 1024}})
    for (bool affine : {true, false}) {
      check_layernorm<float>(rows, cols, affine);
      check_layernorm<double>(rows, cols, affine);
    }
}

// ================================================================================================
// randomness
// ================================================================================================

template <typename T>
void check_random(int64_t n, uint64_t seed, uint64_t offset) {
  std::vector<T> want(n);
  DeviceBuf d(n * sizeof(T));
  cpu().random_uniform(dtype_of<T>(), want.data(), n, seed, offset, -2, 3);
  gpu().random_uniform(dtype_of<T>(), d.get(), n, seed, offset, -2, 3);
  const std::string what = std::string(" ") + type_name<T>() + " n=" + std::to_string(n);
  // lo + (hi - lo) * u in double may be fused on the GPU: at most an ulp of double apart.
  expect_close(d.to_host<T>(), want, std::is_same_v<T, float> ? 1e-7 : 1e-15, 0, "random_uniform" + what);
  for (T v : want) ASSERT_TRUE(v >= T(-2) && v < T(3));
  cpu().random_normal(dtype_of<T>(), want.data(), n, seed, offset, 0.5, 2);
  gpu().random_normal(dtype_of<T>(), d.get(), n, seed, offset, 0.5, 2);
  // log / cos / sin of the device's libm may differ from glibc's in the last bit.
  expect_close(d.to_host<T>(), want, std::is_same_v<T, float> ? 1e-6 : 1e-12, std::is_same_v<T, float> ? 1e-6 : 1e-12,
               "random_normal" + what);
}

TEST(CudaBackend, RandomMatchesCpu) {
  REQUIRE_CUDA();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}}) {
    check_random<float>(n, 1234, 0);
    check_random<double>(n, 99, 12345);
  }
  for (auto [lo, hi] : {std::pair<int64_t, int64_t>{-5, 17}, {0, 50257}, {3, 4}}) {
    const int64_t n = 10007;
    std::vector<int64_t> want(n);
    DeviceBuf d(n * sizeof(int64_t));
    cpu().random_int(want.data(), n, 42, 3, lo, hi);
    gpu().random_int(d.get(), n, 42, 3, lo, hi);
    expect_close(d.to_host<int64_t>(), want, 0, 0, "random_int");
    for (int64_t v : want) ASSERT_TRUE(v >= lo && v < hi);
  }
}

template <typename T>
void check_dropout(double p) {
  const int64_t n = 5001;
  const auto x = random_vec<T>(n, -3, 3, 38);
  std::vector<T> want(n);
  cpu().dropout(dtype_of<T>(), want.data(), x.data(), n, p, 7, 11);
  DeviceBuf dx(x), dy(n * sizeof(T));
  gpu().dropout(dtype_of<T>(), dy.get(), dx.get(), n, p, 7, 11);
  // The mask comes from exact 24-bit uniforms and the kept values from one multiply: bit-identical.
  expect_close(dy.to_host<T>(), want, 0, 0, std::string("dropout ") + type_name<T>() + " p=" + std::to_string(p));
}

TEST(CudaBackend, DropoutMatchesCpu) {
  REQUIRE_CUDA();
  for (double p : {0.0, 0.1, 0.5, 1.0}) {
    check_dropout<float>(p);
    check_dropout<double>(p);
  }
}

// ================================================================================================
// gather / scatter
// ================================================================================================

template <typename T>
void check_index_select(int64_t outer, int64_t in_dim, int64_t inner, int64_t n_idx) {
  const auto in = random_vec<T>(outer * in_dim * inner, -9, 9, 39);
  const auto idx = random_vec<int64_t>(n_idx, 0, in_dim, 40);  // repeats
  std::vector<T> want(outer * n_idx * inner);
  cpu().index_select(dtype_of<T>(), want.data(), in.data(), idx.data(), outer, in_dim, inner, n_idx);
  DeviceBuf din(in), didx(idx), dout(std::max<size_t>(want.size(), 1) * sizeof(T));
  gpu().index_select(dtype_of<T>(), dout.get(), din.get(), didx.as<int64_t>(), outer, in_dim, inner, n_idx);
  auto got = dout.to_host<T>();
  got.resize(want.size());
  expect_close(got, want, 0, 0, std::string("index_select ") + type_name<T>());
}

template <typename T>
void check_index_add(int64_t outer, int64_t dst_dim, int64_t inner, int64_t n_idx) {
  const auto src = random_vec<T>(outer * n_idx * inner, -1, 1, 41);
  const auto idx = random_vec<int64_t>(n_idx, 0, dst_dim, 42);
  const auto dst0 = random_vec<T>(outer * dst_dim * inner, -1, 1, 43);
  std::vector<T> want = dst0;
  cpu().index_add(dtype_of<T>(), want.data(), src.data(), idx.data(), outer, dst_dim, inner, n_idx);
  DeviceBuf dsrc(src), didx(idx), ddst(dst0);
  gpu().index_add(dtype_of<T>(), ddst.get(), dsrc.get(), didx.as<int64_t>(), outer, dst_dim, inner, n_idx);
  // Atomic adds in any order: the floor grows with the number of repeats.
  expect_close(ddst.to_host<T>(), want, std::string("index_add ") + type_name<T>(),
               static_cast<double>(n_idx) / static_cast<double>(dst_dim) * 4);
}

TEST(CudaBackend, IndexSelect) {
  REQUIRE_CUDA();
  check_index_select<float>(3, 10, 5, 7);
  check_index_select<double>(1, 50257, 64, 300);
  check_index_select<int64_t>(4, 9, 1, 20);
  check_index_select<uint8_t>(2, 6, 3, 11);
  check_index_select<float>(5, 4, 3, 0);
}

TEST(CudaBackend, IndexAdd) {
  REQUIRE_CUDA();
  check_index_add<float>(2, 10, 16, 500);
  check_index_add<double>(2, 10, 16, 500);
  check_index_add<float>(1, 1000, 64, 4096);
  check_index_add<double>(3, 7, 1, 100);
}

// ================================================================================================
// optimizers
// ================================================================================================

template <typename T>
void check_sgd(double momentum, double dampening, double wd, bool nesterov, bool first_step) {
  const int64_t n = 10007;
  const auto p0 = random_vec<T>(n, -1, 1, 44), g = random_vec<T>(n, -1, 1, 45), b0 = random_vec<T>(n, -1, 1, 46);
  std::vector<T> p = p0, b = b0;
  cpu().sgd_step(dtype_of<T>(), p.data(), g.data(), b.data(), n, 0.1, momentum, dampening, wd, nesterov, first_step);
  DeviceBuf dp(p0), dg(g), db(b0);
  gpu().sgd_step(dtype_of<T>(), dp.get(), dg.get(), db.get(), n, 0.1, momentum, dampening, wd, nesterov, first_step);
  std::ostringstream what;
  what << "sgd_step " << type_name<T>() << " momentum=" << momentum << " dampening=" << dampening << " wd=" << wd
       << " nesterov=" << nesterov << " first=" << first_step;
  expect_close(dp.to_host<T>(), p, what.str() + " param");
  expect_close(db.to_host<T>(), b, what.str() + " momentum buffer");
}

template <typename T>
void check_adam(double wd, int64_t step, bool decoupled) {
  const int64_t n = 10007;
  const auto p0 = random_vec<T>(n, -1, 1, 47), g = random_vec<T>(n, -1, 1, 48);
  const auto m0 = random_vec<T>(n, -0.1, 0.1, 49), v0 = random_vec<T>(n, 0, 0.01, 50);
  std::vector<T> p = p0, m = m0, v = v0;
  cpu().adam_step(dtype_of<T>(), p.data(), g.data(), m.data(), v.data(), n, 1e-3, 0.9, 0.999, 1e-8, wd, step,
                  decoupled);
  DeviceBuf dp(p0), dg(g), dm(m0), dv(v0);
  gpu().adam_step(dtype_of<T>(), dp.get(), dg.get(), dm.get(), dv.get(), n, 1e-3, 0.9, 0.999, 1e-8, wd, step,
                  decoupled);
  std::ostringstream what;
  what << "adam_step " << type_name<T>() << " wd=" << wd << " step=" << step << " decoupled=" << decoupled;
  expect_close(dp.to_host<T>(), p, what.str() + " param");
  expect_close(dm.to_host<T>(), m, what.str() + " exp_avg");
  expect_close(dv.to_host<T>(), v, what.str() + " exp_avg_sq");
}

TEST(CudaBackend, SgdStep) {
  REQUIRE_CUDA();
  for (bool first : {true, false}) {
    check_sgd<float>(0, 0, 0, false, first);
    check_sgd<double>(0, 0, 0.01, false, first);
    check_sgd<float>(0.9, 0.1, 0.01, false, first);
    check_sgd<double>(0.9, 0, 0, true, first);
    check_sgd<float>(0.9, 0, 1e-4, true, first);
  }
}

TEST(CudaBackend, AdamStep) {
  REQUIRE_CUDA();
  for (bool decoupled : {false, true})
    for (int64_t step : {int64_t{1}, int64_t{10}, int64_t{1000}}) {
      check_adam<float>(0.01, step, decoupled);
      check_adam<double>(0.01, step, decoupled);
      check_adam<float>(0, step, decoupled);
    }
}

}  // namespace

// ================================================================================================
// ops in float64: the op registry's cases, forward and backward
// ================================================================================================

class CudaBackendOp : public ::testing::TestWithParam<headlab::testing::OpCase> {};

// Sums and attention run in another order (and attention as its composite form on the GPU): a
// thousand ulps of float64 leave room for that and none for a wrong index or mask.
TEST_P(CudaBackendOp, Float64) {
  REQUIRE_CUDA();
  headlab::testing::check_case_against_cpu(GetParam(), kCuda0, DType::f64, 1e-10, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaBackendOp, ::testing::ValuesIn(headlab::testing::cuda_op_cases()),
                         headlab::testing::op_case_name);
