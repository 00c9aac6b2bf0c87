// Forward values of every op in ops/ops.h against hand-derived numbers or a naive reference
// computed here in plain loops: elementwise with broadcasting, reductions, matmul in every rank
// combination and layout, shape ops, indexing, the softmax family, dropout, layer_norm and losses.
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/blas.h"
#include "backends/cpu/block_cache.h"
#include "backends/cpu/fast_math.h"
#include "backends/scalar_math.h"
#ifdef HEADLAB_HAS_XSMM
#include "backends/cpu/xsmm_gemm.h"
#endif
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

// x[i, j, k] = 12 i + 4 j + k, float64, shape (2, 3, 4)
Tensor grid64() { return arange(0, 24, 1, DType::f64).view({2, 3, 4}); }

// Naive batched matmul with broadcast batch dims: a (..., M, K), b (..., K, N), both >= 2-D.
std::vector<double> ref_matmul(const Tensor& a, const Tensor& b, Shape* out_shape = nullptr) {
  const Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  const size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb, 1);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t da = i + ba.size() >= nb ? ba[i + ba.size() - nb] : 1;
    const int64_t db = i + bb.size() >= nb ? bb[i + bb.size() - nb] : 1;
    batch[i] = std::max(da, db);
  }
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  so.insert(so.end(), {M, N});
  const std::vector<double> av = a.expand(sa).to_vector<double>(), bv = b.expand(sb).to_vector<double>();
  const int64_t B = shape_numel(batch);
  std::vector<double> out(static_cast<size_t>(B * M * N), 0.0);
  for (int64_t q = 0; q < B; ++q)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += av[q * M * K + i * K + k] * bv[q * K * N + k * N + j];
        out[q * M * N + i * N + j] = s;
      }
  if (out_shape) *out_shape = so;
  return out;
}

// Naive softmax / log_softmax of a contiguous tensor along dim d.
std::vector<double> ref_softmax(const Tensor& x, int64_t d, bool log_form = false) {
  const std::vector<double> v = x.contiguous().to_vector<double>();
  int64_t outer = 1, inner = 1;
  const int64_t n = x.size(d);
  for (int64_t k = 0; k < d; ++k) outer *= x.size(k);
  for (int64_t k = d + 1; k < x.dim(); ++k) inner *= x.size(k);
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t in = 0; in < inner; ++in) {
      double m = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, v[(o * n + j) * inner + in]);
      for (int64_t j = 0; j < n; ++j) s += std::exp(v[(o * n + j) * inner + in] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double z = v[(o * n + j) * inner + in] - m;
        out[(o * n + j) * inner + in] = log_form ? z - std::log(s) : std::exp(z) / s;
      }
    }
  return out;
}

// Softmax of the first `valid` entries of a row (scaled), zeros after.
std::vector<double> ref_row_softmax(const std::vector<double>& row, int64_t valid, double scale = 1.0) {
  std::vector<double> out(row.size(), 0.0);
  if (valid == 0) return out;
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < valid; ++j) m = std::max(m, scale * row[j]);
  for (int64_t j = 0; j < valid; ++j) s += std::exp(scale * row[j] - m);
  for (int64_t j = 0; j < valid; ++j) out[j] = std::exp(scale * row[j] - m) / s;
  return out;
}

}  // namespace

// ---- elementwise ----

TEST(Elementwise, BinaryWithBroadcasting) {
  const Tensor a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = f32({10, 20, 30}, {3});
  EXPECT_TRUE(all_close(add(a, b), {11, 22, 33, 14, 25, 36}));
  EXPECT_TRUE(all_close(sub(a, b), {-9, -18, -27, -6, -15, -24}));
  EXPECT_TRUE(all_close(mul(a, b), {10, 40, 90, 40, 100, 180}));
  EXPECT_TRUE(all_close(div(b, a), {10, 10, 10, 2.5, 4, 5}));
  EXPECT_EQ((a + b).shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(a - b, {-9, -18, -27, -6, -15, -24}));
  EXPECT_TRUE(all_close(a * b, {10, 40, 90, 40, 100, 180}));
  EXPECT_TRUE(all_close(b / a, {10, 10, 10, 2.5, 4, 5}));
  // (3, 1) x (1, 4): an outer product.
  const Tensor col = f32({1, 2, 3}, {3, 1}), row = f32({1, 10, 100, 1000}, {1, 4});
  const Tensor outer = mul(col, row);
  EXPECT_EQ(outer.shape(), (Shape{3, 4}));
  EXPECT_TRUE(all_close(outer, {1, 10, 100, 1000, 2, 20, 200, 2000, 3, 30, 300, 3000}));
  // (3, 1, 4) + (2, 4) -> (3, 2, 4)
  const Tensor p = arange(0, 12, 1, DType::f64).view({3, 1, 4}), q = mul(arange(0, 8, 1, DType::f64).view({2, 4}), 100);
  const Tensor pq = add(p, q);
  EXPECT_EQ(pq.shape(), (Shape{3, 2, 4}));
  std::vector<double> expect;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k) expect.push_back(4 * i + k + 100 * (4 * j + k));
  EXPECT_TRUE(all_close(pq, expect));
  // 0-d operands broadcast against anything.
  EXPECT_TRUE(all_close(mul(a, scalar_tensor(2)), {2, 4, 6, 8, 10, 12}));
  // Non-contiguous operands give the same as contiguous ones.
  const Tensor at = f32({1, 4, 2, 5, 3, 6}, {3, 2}).transpose(0, 1);
  EXPECT_TRUE(all_close(add(at, b), add(a, b)));
  // int64 arithmetic stays exact.
  EXPECT_EQ(add(i64({1, 2}), i64({40, 50})).to_vector<int64_t>(), (std::vector<int64_t>{41, 52}));
  EXPECT_EQ(add(i64({1, 2}), i64({3})).dtype(), DType::i64);
}

TEST(Elementwise, Scalars) {
  const Tensor a = f32({1, 2, 4});
  EXPECT_TRUE(all_close(a + 1, {2, 3, 5}));
  EXPECT_TRUE(all_close(a - 1, {0, 1, 3}));
  EXPECT_TRUE(all_close(a * 3, {3, 6, 12}));
  EXPECT_TRUE(all_close(a / 2, {0.5, 1, 2}));
  EXPECT_TRUE(all_close(1 + a, {2, 3, 5}));
  EXPECT_TRUE(all_close(10 - a, {9, 8, 6}));
  EXPECT_TRUE(all_close(2 * a, {2, 4, 8}));
  EXPECT_TRUE(all_close(8 / a, {8, 4, 2}));
  EXPECT_TRUE(all_close(-a, {-1, -2, -4}));
  EXPECT_TRUE(all_close(neg(a), {-1, -2, -4}));
  EXPECT_TRUE(all_close(add(a, 0.5), {1.5, 2.5, 4.5}));
  EXPECT_TRUE(all_close(mul(a, -2.0), {-2, -4, -8}));
  EXPECT_TRUE(all_close(affine(a, 3, -1), {2, 5, 11}));
}

TEST(Elementwise, UnaryMath) {
  const std::vector<double> xs = {-2, -0.5, 0, 0.5, 1, 3};
  const std::vector<double> pos = {0.25, 0.5, 1, 2, 4, 9};
  const Tensor x = f64(xs), p = f64(pos);
  auto map = [](const std::vector<double>& v, double (*f)(double)) {
    std::vector<double> o;
    for (double e : v) o.push_back(f(e));
    return o;
  };
  EXPECT_TRUE(all_close(exp(x), map(xs, [](double v) { return std::exp(v); }), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(log(p), map(pos, [](double v) { return std::log(v); }), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(sqrt(p), {0.5, std::sqrt(0.5), 1, std::sqrt(2.0), 2, 3}, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(rsqrt(p), {2, 1 / std::sqrt(0.5), 1, 1 / std::sqrt(2.0), 0.5, 1.0 / 3}, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(pow(x, 3), {-8, -0.125, 0, 0.125, 1, 27}, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(pow(p, 0.5), {0.5, std::sqrt(0.5), 1, std::sqrt(2.0), 2, 3}, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(pow(p, -1), {4, 2, 1, 0.5, 0.25, 1.0 / 9}, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(abs(x), {2, 0.5, 0, 0.5, 1, 3}));
  EXPECT_TRUE(all_close(tanh(x), map(xs, [](double v) { return std::tanh(v); }), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(sigmoid(x), map(xs, [](double v) { return 1 / (1 + std::exp(-v)); }), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(relu(x), {0, 0, 0, 0.5, 1, 3}));
  EXPECT_TRUE(
      all_close(gelu(x), map(xs, [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(
      gelu(x, true),
      map(xs, [](double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }),
      1e-12, 1e-12));
  // Known values, in float32 (what models run in).
  EXPECT_NEAR(gelu(f32({1.f})).item<float>(), 0.8413447f, 1e-6);
  EXPECT_NEAR(gelu(f32({1.f}), true).item<float>(), 0.8411920f, 1e-6);
  EXPECT_NEAR(gelu(f32({-1.f})).item<float>(), -0.1586553f, 1e-6);
  EXPECT_NEAR(sigmoid(f32({2.f})).item<float>(), 0.8807971f, 1e-6);
  EXPECT_NEAR(tanh(f32({0.5f})).item<float>(), 0.4621172f, 1e-6);
  EXPECT_NEAR(exp(f32({1.f})).item<float>(), 2.7182817f, 1e-6);
  EXPECT_NEAR(log(f32({2.f})).item<float>(), 0.6931472f, 1e-6);
  EXPECT_EQ(exp(f32({1.f})).dtype(), DType::f32);
  // Unary ops read strided inputs in logical order.
  const Tensor t = f64({1, 3, 2, 4}, {2, 2}).transpose(0, 1);  // [[1, 2], [3, 4]]
  EXPECT_TRUE(all_close(pow(t, 2), {1, 4, 9, 16}));
}

TEST(Elementwise, MaximumAndComparisons) {
  const Tensor a = f32({1, 5, 3}), b = f32({2, 5, 1});
  EXPECT_TRUE(all_close(maximum(a, b), {2, 5, 3}));
  EXPECT_EQ(eq(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(ne(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(lt(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(le(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(gt(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(ge(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(gt(a, b).dtype(), DType::b8);
  // broadcasting comparison: (3, 1) vs (3)
  const Tensor c = gt(f32({1, 2, 3}, {3, 1}), f32({0, 2, 5}));
  EXPECT_EQ(c.shape(), (Shape{3, 3}));
  EXPECT_EQ(c.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 1, 0, 0, 1, 1, 0}));
  const Tensor m1 = tensor_bool({true, true, false, false}), m2 = tensor_bool({true, false, true, false});
  EXPECT_EQ(logical_and(m1, m2).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 0, 0}));
}

TEST(Elementwise, WhereAndMaskedFill) {
  const Tensor cond = tensor_bool({true, false}, {2, 1});
  const Tensor a = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor w = where(cond, a, scalar_tensor(-1));
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(w, {1, 2, 3, -1, -1, -1}));
  const Tensor w2 = where(tensor_bool({false, true, false}), a, f32({7, 8, 9}));
  EXPECT_TRUE(all_close(w2, {7, 2, 9, 7, 5, 9}));

  const Tensor mask = tensor_bool({false, true, true});
  const Tensor mf = masked_fill(a, mask, -INFINITY);
  EXPECT_TRUE(all_close(mf, {1, -INFINITY, -INFINITY, 4, -INFINITY, -INFINITY}));
  EXPECT_TRUE(all_close(a, {1, 2, 3, 4, 5, 6}));  // out of place
  EXPECT_TRUE(all_close(a.masked_fill(cond, 0), {0, 0, 0, 4, 5, 6}));

  Tensor b = a.clone();
  const uint64_t v0 = b.version();
  const Tensor& r = masked_fill_(b, mask, 9);
  EXPECT_EQ(&r, &b);
  EXPECT_TRUE(all_close(b, {1, 9, 9, 4, 9, 9}));
  EXPECT_EQ(b.version(), v0 + 1);
  b.masked_fill_(cond, 0.5);
  EXPECT_TRUE(all_close(b, {0.5, 0.5, 0.5, 4, 9, 9}));
  // In place through a strided view reaches the base tensor's memory.
  Tensor base = zeros({2, 4});
  Tensor view = base.slice(1, 0, 4, 2);  // columns 0 and 2
  view.masked_fill_(tensor_bool({false, true}), 3);
  EXPECT_TRUE(all_close(base, {0, 0, 3, 0, 0, 0, 3, 0}));
}

// ---- reductions ----

TEST(Reductions, SumMean) {
  const Tensor x = grid64();
  EXPECT_DOUBLE_EQ(x.sum().item<double>(), 276);
  EXPECT_EQ(x.sum().dim(), 0);
  const Tensor s0 = sum(x, {0});  // 12 + 8 j + 2 k
  EXPECT_EQ(s0.shape(), (Shape{3, 4}));
  std::vector<double> e0;
  for (int j = 0; j < 3; ++j)
    for (int k = 0; k < 4; ++k) e0.push_back(12 + 8 * j + 2 * k);
  EXPECT_TRUE(all_close(s0, e0));
  const Tensor s02 = sum(x, {0, 2}, true);  // 60 + 32 j
  EXPECT_EQ(s02.shape(), (Shape{1, 3, 1}));
  EXPECT_TRUE(all_close(s02, {60, 92, 124}));
  const Tensor sl = sum(x, {-1});  // 48 i + 16 j + 6
  EXPECT_EQ(sl.shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(sl, {6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(sum(x, {}, true).shape(), (Shape{1, 1, 1}));

  const Tensor m1 = mean(x, {1});  // 12 i + 4 + k
  EXPECT_EQ(m1.shape(), (Shape{2, 4}));
  EXPECT_TRUE(all_close(m1, {4, 5, 6, 7, 16, 17, 18, 19}));
  EXPECT_DOUBLE_EQ(x.mean().item<double>(), 11.5);
  EXPECT_EQ(x.mean({0, 1}, true).shape(), (Shape{1, 1, 4}));
  EXPECT_TRUE(all_close(x.mean({0, 1}), {10, 11, 12, 13}));
  // Strided input, int64 input, sums over an empty dim.
  EXPECT_TRUE(all_close(sum(x.transpose(0, 2), {2}), sum(x, {0}).transpose(0, 1)));
  EXPECT_EQ(sum(arange(5)).item<int64_t>(), 10);
  EXPECT_EQ(sum(arange(5)).dtype(), DType::i64);
  EXPECT_TRUE(all_close(sum(zeros({3, 0}), {1}), {0, 0, 0}));
  // float32 sums accumulate in double: 2^20 ones sum exactly.
  EXPECT_EQ(ones({1 << 20}).sum().item<float>(), static_cast<float>(1 << 20));
}

// Column sums of a wide matrix (the heads' outputs summed): blocks of columns past the first, a narrower
// last one, each thread's share; float32 accumulates in double down the rows, as a plain loop does.
TEST(Reductions, ColumnSumsOfAWideMatrixMatchAPlainLoop) {
  for (const int64_t cols : {int64_t{1}, int64_t{1023}, int64_t{1025}, int64_t{40'001}}) {
    const int64_t rows = 7;
    const Tensor x = randn({rows, cols});
    const std::vector<float> v = x.to_vector<float>();
    std::vector<float> expected(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      double s = 0;
      for (int64_t r = 0; r < rows; ++r) s += v[static_cast<size_t>(r * cols + c)];
      expected[static_cast<size_t>(c)] = static_cast<float>(s);
    }
    EXPECT_EQ(sum(x, {0}).to_vector<float>(), expected) << cols << " columns";
  }
}

TEST(Reductions, AmaxArgmaxVar) {
  const Tensor x = grid64();
  EXPECT_DOUBLE_EQ(amax(x).item<double>(), 23);
  EXPECT_DOUBLE_EQ(x.max().item<double>(), 23);
  EXPECT_TRUE(all_close(amax(x, {0, 2}), {15, 19, 23}));
  const Tensor k1 = amax(x, {1}, true);  // 12 i + 8 + k
  EXPECT_EQ(k1.shape(), (Shape{2, 1, 4}));
  EXPECT_TRUE(all_close(k1, {8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_TRUE(all_close(amax(f32({-3, -1, -2}, {3})), {-1}));

  const Tensor v = var(x, {2});  // four consecutive values: sum of squared deviations 5
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(v, std::vector<double>(6, 5.0 / 3), 1e-12));
  EXPECT_TRUE(all_close(var(x, {2}, true, 0), std::vector<double>(6, 1.25), 1e-12));
  EXPECT_EQ(var(x, {2}, true).shape(), (Shape{2, 3, 1}));
  // Over dims 0 and 2 each column holds {0, 1, 2, 3, 12, 13, 14, 15} + 4 j: squared deviations sum to 298.
  EXPECT_TRUE(all_close(x.var({0, 2}), std::vector<double>(3, 298.0 / 7), 1e-12));
  EXPECT_TRUE(all_close(x.var({0, 2}, false, 0), std::vector<double>(3, 37.25), 1e-12));
  EXPECT_NEAR(var(x).item<double>(), 50.0, 1e-12);  // 0..23: n (n^2 - 1) / 12 / (n - 1) = 24 * 575 / 12 / 23

  const Tensor a = f32({1, 5, 5, 2, 0, -1}, {2, 3});
  const Tensor am = argmax(a, 1);
  EXPECT_EQ(am.dtype(), DType::i64);
  EXPECT_EQ(am.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));  // a tie keeps the first
  EXPECT_EQ(argmax(a, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(a.argmax(-1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(argmax(x.transpose(1, 2), 2).to_vector<int64_t>(), std::vector<int64_t>(8, 2));
}

TEST(Reductions, SumTo) {
  const Tensor x = grid64();
  const Tensor s = sum_to(x, {3, 1});  // sum over i and k: 60 + 32 j
  EXPECT_EQ(s.shape(), (Shape{3, 1}));
  EXPECT_TRUE(all_close(s, {60, 92, 124}));
  EXPECT_TRUE(all_close(sum_to(x, {4}), {60, 66, 72, 78}));
  EXPECT_EQ(sum_to(x, x.shape()).impl(), x.impl());
}

// ---- matmul ----

TEST(Matmul, VectorAndMatrixRanks) {
  const Tensor v = f64({1, 2, 3}), w = f64({4, 5, 6});
  const Tensor dot = matmul(v, w);
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_DOUBLE_EQ(dot.item<double>(), 32);
  const Tensor m = f64({1, 2, 3, 4, 5, 6}, {2, 3});  // [[1, 2, 3], [4, 5, 6]]
  const Tensor mv = matmul(m, v);                    // (2, 3) @ (3) -> (2)
  EXPECT_EQ(mv.shape(), (Shape{2}));
  EXPECT_TRUE(all_close(mv, {14, 32}));
  const Tensor vm = matmul(f64({1, -1}), m);  // (2) @ (2, 3) -> (3)
  EXPECT_EQ(vm.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(vm, {-3, -3, -3}));
  const Tensor mm = matmul(m, m.transpose(0, 1));  // (2, 3) @ (3, 2)
  EXPECT_EQ(mm.shape(), (Shape{2, 2}));
  EXPECT_TRUE(all_close(mm, {14, 32, 32, 77}));
  // 1-D with batched operands: (3) @ (2, 3, 4) -> (2, 4); (2, 4, 3) @ (3) -> (2, 4)
  const Tensor b3 = seq64({2, 3, 4});
  Shape so;
  const std::vector<double> r1 = ref_matmul(v.unsqueeze(0), b3, &so);
  const Tensor vb = matmul(v, b3);
  EXPECT_EQ(vb.shape(), (Shape{2, 4}));
  EXPECT_TRUE(all_close(vb, r1, 1e-12));
  const Tensor bv = matmul(b3.transpose(1, 2), v);
  EXPECT_EQ(bv.shape(), (Shape{2, 4}));
  EXPECT_TRUE(all_close(bv, r1, 1e-12));
  // float32 against the same reference
  const Tensor a32 = seq64({5, 7}).to(DType::f32), b32 = seq64({7, 3}, 0.2, 0.4).to(DType::f32);
  EXPECT_TRUE(all_close(matmul(a32, b32), ref_matmul(a32, b32), 1e-5, 1e-5));
}

TEST(Matmul, BatchedAndBroadcast) {
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{4, 2, 3}, {4, 3, 5}},        // plain batch
      {{4, 2, 3}, {3, 5}},           // b shared by the batch (folded into one GEMM)
      {{2, 3}, {4, 3, 5}},           // a shared by the batch
      {{2, 1, 2, 3}, {1, 3, 3, 4}},  // 4-D, both batch dims broadcast
      {{2, 3, 2, 3}, {3, 3, 4}},     // 4-D with a 3-D operand
      {{1, 1, 3}, {5, 3, 2}},        // M = 1
      {{3, 4, 1}, {3, 1, 6}},        // K = 1: outer products
  };
  for (const Case& c : cases) {
    const Tensor a = seq64(c.a), b = seq64(c.b, 0.21, -0.7);
    Shape so;
    const std::vector<double> ref = ref_matmul(a, b, &so);
    const Tensor out = matmul(a, b);
    EXPECT_EQ(out.shape(), so) << shape_str(c.a) << " @ " << shape_str(c.b);
    EXPECT_TRUE(all_close(out, ref, 1e-12)) << shape_str(c.a) << " @ " << shape_str(c.b);
    const Tensor out32 = matmul(a.to(DType::f32), b.to(DType::f32));
    EXPECT_TRUE(all_close(out32, ref, 1e-4, 1e-5)) << shape_str(c.a) << " @ " << shape_str(c.b);
  }
}

TEST(Matmul, StridedOperandsMatchContiguous) {
  const Tensor a = seq64({3, 4, 5}), b = seq64({3, 5, 2}, 0.3, 0.2);
  const Tensor expect = matmul(a, b);
  // Transposed storage (BLAS transpose flags), sliced with a step, batch dim permuted.
  const Tensor at = a.transpose(1, 2).contiguous().transpose(1, 2);
  const Tensor bt = b.transpose(1, 2).contiguous().transpose(1, 2);
  ASSERT_FALSE(at.is_contiguous());
  EXPECT_TRUE(all_close(matmul(at, bt), expect, 1e-12));
  EXPECT_TRUE(all_close(matmul(at, b), expect, 1e-12));
  const Tensor a_wide = zeros({3, 8, 5}, DType::f64);
  a_wide.slice(1, 0, 8, 2).copy_(a);  // rows 0, 2, 4, 6: row stride 10
  const Tensor as = a_wide.slice(1, 0, 8, 2);
  EXPECT_TRUE(all_close(matmul(as, b), expect, 1e-12));
  const Tensor b_cols = zeros({3, 5, 6}, DType::f64);
  b_cols.slice(2, 1, 6, 3).copy_(b);  // column stride 3: needs a copy
  EXPECT_TRUE(all_close(matmul(a, b_cols.slice(2, 1, 6, 3)), expect, 1e-12));
  const Tensor ap = a.permute({1, 0, 2}).contiguous().permute({1, 0, 2});  // batch stride 5, row stride 15
  EXPECT_TRUE(all_close(matmul(ap, b), expect, 1e-12));
  // (B, H, T, D) heads viewed out of a (B, T, H*D) projection.
  const Tensor proj = seq64({2, 3, 4 * 2});
  const Tensor q = proj.view({2, 3, 4, 2}).transpose(1, 2);  // (B=2, H=4, T=3, D=2)
  const Tensor scores = matmul(q, q.mT());
  EXPECT_EQ(scores.shape(), (Shape{2, 4, 3, 3}));
  EXPECT_TRUE(all_close(scores, ref_matmul(q.contiguous(), q.mT().contiguous()), 1e-12));
  // An expanded (stride 0) operand.
  const Tensor row = seq64({1, 5}).expand({4, 5});
  EXPECT_TRUE(all_close(matmul(row, b.select(0, 0)), ref_matmul(row.contiguous(), b.select(0, 0)), 1e-12));
}

// One-row products go to GEMV (backends/cpu/blas.h): against the naive reference, with each operand
// stored transposed or not, batched, and wide enough (1 x 300 x 4096) to be split between threads.
TEST(Matmul, OneRowIsGemvAndMatchesTheReference) {
  const Tensor a = seq64({2, 1, 300}), b = seq64({2, 300, 4096}, 0.01, -0.3);
  const std::vector<double> expect = ref_matmul(a, b);
  const Tensor at = a.transpose(1, 2).contiguous().transpose(1, 2);  // (K, 1) storage: A transposed
  const Tensor bt = b.transpose(1, 2).contiguous().transpose(1, 2);  // (N, K) storage: B transposed
  for (const Tensor& x : {a, at})
    for (const Tensor& y : {b, bt}) EXPECT_TRUE(all_close(matmul(x, y), expect, 1e-9));
  // float32 and beta: linear's bias path through addmm-like accumulation.
  const Tensor w = seq64({64, 300}, 0.02, -0.5).to(DType::f32), bias = seq64({64}).to(DType::f32);
  const Tensor x = seq64({1, 300}).to(DType::f32);
  std::vector<double> want = ref_matmul(x, w.mT().contiguous());
  const std::vector<double> bv = bias.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i];
  EXPECT_TRUE(all_close(linear(x, w, bias), want, 1e-4));
}

// A row times the rows of B (decoding's shape: a row times a Linear's weight) against a double reference: short
// rows (OpenBLAS's sgemv) and from 256 on blas.h's gemv_by_rows, its 64 lanes with no tail, a tail of 1, 40
// and 63; rows ldb apart wider than K, alpha, and beta 0 (C's NaNs never read), 1 and 0.25.
TEST(Matmul, OneRowTimesRowsOfBMatchesTheReference) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (const int64_t K : {int64_t{1}, int64_t{65}, int64_t{257}, int64_t{319}, int64_t{768}, int64_t{1000}})
    for (const int64_t N : {int64_t{1}, int64_t{37}})
      for (const float alpha : {1.0f, -0.5f})
        for (const float beta : {0.0f, 1.0f, 0.25f}) {
          const int64_t ldb = K + 3;
          std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(N * ldb)), c(static_cast<size_t>(N));
          for (float& v : a) v = normal(rng);
          for (float& v : b) v = normal(rng);
          for (float& v : c) v = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : normal(rng);
          std::vector<double> want(static_cast<size_t>(N)), scale(static_cast<size_t>(N));
          for (int64_t n = 0; n < N; ++n) {
            double s = 0, m = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = double(a[static_cast<size_t>(k)]) * b[static_cast<size_t>(n * ldb + k)];
              s += p, m += std::abs(p);
            }
            const double from_c = beta == 0.0f ? 0.0 : beta * double(c[static_cast<size_t>(n)]);
            want[static_cast<size_t>(n)] = alpha * s + from_c;
            scale[static_cast<size_t>(n)] = std::abs(alpha) * m + std::abs(from_c) + 1;
          }
          cpu::blas_gemm<float>(false, true, 1, N, K, alpha, a.data(), K, b.data(), ldb, beta, c.data(), N);
          for (int64_t n = 0; n < N; ++n)
            EXPECT_NEAR(c[static_cast<size_t>(n)], want[static_cast<size_t>(n)], 1e-6 * scale[static_cast<size_t>(n)])
                << "K " << K << " N " << N << " alpha " << alpha << " beta " << beta << " row " << n;
        }
}

#ifdef HEADLAB_HAS_XSMM
// libxsmm's kernels (backends/cpu/xsmm_gemm.cpp), the fast path of one-thread float GEMMs, against a
// double reference: each operand stored transposed or not (both: refused), beta 0 (C's NaNs ignored) and 1,
// leading dims wider than the matrices, K from 1 to past a vector, K in slices (op(B) past L2, and a
// transposed A over many rows; the first slice a remainder), C in tiles (C and op(B) past L2: op(B) copied
// block by block, a last row and column of tiles narrower); and the calls it must refuse.
TEST(Matmul, LibxsmmKernelsMatchTheReference) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const float beta : {0.0f, 1.0f})
        for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{64, 17, 1},
                                                                         {100, 128, 33},
                                                                         {1024, 128, 128},
                                                                         {64, 512, 600},
                                                                         {128, 128, 1000},
                                                                         {120, 1100, 700},
                                                                         {1100, 200, 700}}) {
          const int64_t pad = 3, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
          std::vector<float> A((ta ? K : M) * lda), B((tb ? N : K) * ldb), C(M * ldc);
          for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
          for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
          for (size_t i = 0; i < C.size(); ++i) C[i] = beta == 0 ? std::numeric_limits<float>::quiet_NaN() : 0.5f;
          const std::vector<float> C0 = C;
          const bool served = cpu::xsmm_sgemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          const std::string what = "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                   " beta=" + std::to_string(beta) + " M=" + std::to_string(M) +
                                   " N=" + std::to_string(N) + " K=" + std::to_string(K);
          // Refused, C untouched: both transposed (libxsmm transposes one operand only).
          if (ta && tb) {
            EXPECT_FALSE(served) << what;
            EXPECT_EQ(std::memcmp(C.data(), C0.data(), C.size() * sizeof(float)), 0) << what;
            continue;
          }
          ASSERT_TRUE(served) << what;
          int64_t off = 0;  // elements off the reference by more than 1e-5 K (NaN included)
          for (int64_t r = 0; r < M; ++r)
            for (int64_t c = 0; c < N; ++c) {
              double want = beta == 0 ? 0.0 : 0.5;
              for (int64_t k = 0; k < K; ++k)
                want += static_cast<double>(ta ? A[k * lda + r] : A[r * lda + k]) *
                        static_cast<double>(tb ? B[c * ldb + k] : B[k * ldb + c]);
              off += !(std::abs(static_cast<double>(C[r * ldc + c]) - want) <= 1e-5 * static_cast<double>(K));
            }
          EXPECT_EQ(off, 0) << what;
          for (int64_t r = 0; r < M; ++r)  // the padding between rows of C is never written
            for (int64_t c = N; c < ldc; ++c) EXPECT_TRUE(std::isnan(C[r * ldc + c]) || C[r * ldc + c] == 0.5f) << what;
        }
  // What goes to OpenBLAS instead: alpha != 1, beta outside {0, 1}, too few rows.
  std::vector<float> A(64 * 64, 1.0f), B(64 * 64, 1.0f), C(64 * 64, 0.0f);
  EXPECT_FALSE(cpu::xsmm_sgemm(false, false, 64, 64, 64, 2.0f, A.data(), 64, B.data(), 64, 0.0f, C.data(), 64));
  EXPECT_FALSE(cpu::xsmm_sgemm(false, false, 64, 64, 64, 1.0f, A.data(), 64, B.data(), 64, 0.5f, C.data(), 64));
  EXPECT_FALSE(cpu::xsmm_sgemm(false, false, 63, 64, 64, 1.0f, A.data(), 64, B.data(), 64, 0.0f, C.data(), 64));
}

// The linear layer's libxsmm kernel (xsmm_linear: the bias broadcast a block of rows at a time) against a
// double reference, with x's rows wider apart than K and a last block of fewer rows; too few rows are
// refused with out untouched. Through the op: linear() with a bias on two threads' bands of rows (the CPU
// backend's linear_rows), x a column slice of a wider tensor, and the gradients unchanged by the path.
TEST(Matmul, LinearKernelWithItsBiasMatchesTheReference) {
  const int64_t M = 100, N = 40, K = 48, ldx = K + 3;
  std::vector<float> x(M * ldx), w(N * K), bias(N), out(M * N, std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(0.5 - 0.01 * static_cast<double>(i));
  ASSERT_TRUE(cpu::xsmm_linear(M, N, K, x.data(), ldx, w.data(), bias.data(), out.data()));
  int64_t off = 0;  // elements off the reference by more than 1e-5 K (NaN included)
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < N; ++c) {
      double want = bias[c];
      for (int64_t k = 0; k < K; ++k) want += static_cast<double>(x[r * ldx + k]) * static_cast<double>(w[c * K + k]);
      off += !(std::abs(static_cast<double>(out[r * N + c]) - want) <= 1e-5 * static_cast<double>(K));
    }
  EXPECT_EQ(off, 0);
  std::vector<float> untouched(63 * N, 7.0f);
  EXPECT_FALSE(cpu::xsmm_linear(63, N, K, x.data(), ldx, w.data(), bias.data(), untouched.data()));
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float v) { return v == 7.0f; }));

  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(2);
  const Tensor wide = seq64({2, 160, 130}, 0.01, -0.4).to(DType::f32);
  const Tensor xs = wide.slice(2, 1, 129).requires_grad_();  // rows 130 apart, K = 128
  const Tensor wt = seq64({96, 128}, 0.003, -0.2).to(DType::f32).requires_grad_();
  const Tensor bs = seq64({96}, 0.02, -1.0).to(DType::f32).requires_grad_();
  const Tensor y = linear(xs, wt, bs);
  std::vector<double> want =
      ref_matmul(xs.detach().reshape({320, 128}).to(DType::f64), wt.detach().mT().to(DType::f64));
  const std::vector<double> bv = bs.to_vector<double>();
  for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 96];
  EXPECT_TRUE(all_close(y.reshape({320, 96}), want, 1e-4));
  sum(mul(y, y)).backward();  // d/db = 2 sum_rows(y), d/dW = 2 y^T x
  const Tensor y64 = y.detach().to(DType::f64).reshape({320, 96});
  EXPECT_TRUE(all_close(bs.grad(), mul(sum(y64, {0}), 2.0).to_vector<double>(), 1e-3));
  EXPECT_TRUE(all_close(
      wt.grad(), ref_matmul(mul(y64, 2.0).mT().contiguous(), xs.detach().reshape({320, 128}).to(DType::f64)), 1e-2));
  omp_set_num_threads(threads_before);
}
#endif

// linear_gelu is linear then gelu, in value, autograd graph and gradients: on two threads' bands of rows in
// float32 (the CPU's one-pass kernel, where libxsmm is built), and in float64 (the two ops), both GELU forms.
TEST(Matmul, LinearGeluIsLinearThenGelu) {
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(2);
  for (const DType dt : {DType::f32, DType::f64})
    for (const bool tanh_form : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (tanh_form ? " tanh" : " exact"));
      const Tensor x0 = seq64({2, 160, 128}, 0.002, -1.5).to(dt), w0 = seq64({96, 128}, 0.003, -0.2).to(dt),
                   b0 = seq64({96}, 0.02, -1.0).to(dt), c = seq64({2, 160, 96}, 0.01, -0.5).to(dt);
      Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
      const auto [pre, post] = linear_gelu(x, w, b, tanh_form);
      EXPECT_EQ(pre.grad_fn_name(), "LinearBackward");
      EXPECT_EQ(post.grad_fn_name(), "GeluBackward");
      sum(mul(post, c)).backward();
      Tensor xr = x0.clone().requires_grad_(), wr = w0.clone().requires_grad_(), br = b0.clone().requires_grad_();
      const Tensor pre_r = linear(xr, wr, br), post_r = gelu(pre_r, tanh_form);
      sum(mul(post_r, c)).backward();
      EXPECT_TRUE(all_close(pre, pre_r, 0, 0));  // the same kernel
      EXPECT_TRUE(all_close(post, post_r, 1e-7, 1e-6));
      EXPECT_TRUE(all_close(x.grad(), xr.grad(), 1e-7, 1e-5));
      EXPECT_TRUE(all_close(w.grad(), wr.grad(), 1e-6, 1e-5));
      EXPECT_TRUE(all_close(b.grad(), br.grad(), 1e-6, 1e-5));
    }
  omp_set_num_threads(threads_before);
}

TEST(Matmul, ZeroSizeDims) {
  const Tensor k0 = matmul(zeros({2, 0}), zeros({0, 3}));  // empty sum: zeros
  EXPECT_EQ(k0.shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(k0, std::vector<double>(6, 0.0)));
  EXPECT_EQ(matmul(zeros({0, 3}), ones({3, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(matmul(ones({2, 3}), zeros({3, 0})).shape(), (Shape{2, 0}));
  EXPECT_EQ(matmul(ones({0, 2, 3}), ones({3, 4})).shape(), (Shape{0, 2, 4}));
  const Tensor bk0 = matmul(ones({2, 2, 0}), ones({2, 0, 3}));
  EXPECT_EQ(bk0.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(all_close(bk0, std::vector<double>(12, 0.0)));
  EXPECT_DOUBLE_EQ(matmul(zeros({0}), zeros({0})).item<double>(), 0.0);
}

TEST(Linear, WithAndWithoutBias) {
  const Tensor x = seq64({2, 3}), w = seq64({4, 3}, 0.3, -0.5), b = f64({1, 2, 3, 4});
  const std::vector<double> xw = ref_matmul(x, w.transpose(0, 1).contiguous());
  std::vector<double> xwb = xw;
  for (size_t i = 0; i < xwb.size(); ++i) xwb[i] += 1 + static_cast<double>(i % 4);
  EXPECT_TRUE(all_close(linear(x, w, b), xwb, 1e-12));
  EXPECT_TRUE(all_close(linear(x, w), xw, 1e-12));
  EXPECT_EQ(linear(x, w).shape(), (Shape{2, 4}));
  // A 3-D input, a transposed weight, a strided bias; float32.
  const Tensor x3 = seq64({2, 5, 3});
  const Tensor wt = w.transpose(0, 1).contiguous().transpose(0, 1);
  const Tensor bs = f64({1, 0, 2, 0, 3, 0, 4, 0}).slice(0, 0, 8, 2);
  const Tensor y3 = linear(x3, wt, bs);
  EXPECT_EQ(y3.shape(), (Shape{2, 5, 4}));
  std::vector<double> r3 = ref_matmul(x3, w.transpose(0, 1).contiguous());
  for (size_t i = 0; i < r3.size(); ++i) r3[i] += 1 + static_cast<double>(i % 4);
  EXPECT_TRUE(all_close(y3, r3, 1e-12));
  EXPECT_TRUE(all_close(linear(x3.to(DType::f32), w.to(DType::f32), b.to(DType::f32)), r3, 1e-5, 1e-5));
  // A 1-D input, and in_features = 0 (the output is the bias).
  EXPECT_TRUE(all_close(linear(x.select(0, 1), w, b), std::vector<double>(xwb.begin() + 4, xwb.end()), 1e-12));
  const Tensor y0 = linear(zeros({3, 0}, DType::f64), zeros({4, 0}, DType::f64), b);
  EXPECT_EQ(y0.shape(), (Shape{3, 4}));
  EXPECT_TRUE(all_close(y0, {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_TRUE(all_close(linear(zeros({3, 0}, DType::f64), zeros({4, 0}, DType::f64)), std::vector<double>(12, 0.0)));
}

// ---- shape ops ----

TEST(ShapeOps, CatStackSplitChunk) {
  const Tensor a = f32({1, 2, 3, 4}, {2, 2}), b = f32({5, 6}, {1, 2}), c = f32({7, 8, 9, 10, 11, 12}, {2, 3});
  const Tensor c0 = cat({a, b}, 0);
  EXPECT_EQ(c0.shape(), (Shape{3, 2}));
  EXPECT_TRUE(all_close(c0, {1, 2, 3, 4, 5, 6}));
  const Tensor c1 = cat({a, c}, -1);
  EXPECT_EQ(c1.shape(), (Shape{2, 5}));
  EXPECT_TRUE(all_close(c1, {1, 2, 7, 8, 9, 3, 4, 10, 11, 12}));
  EXPECT_TRUE(all_close(cat({a.transpose(0, 1), zeros({0, 2})}, 0), {1, 3, 2, 4}));

  const Tensor s0 = stack({a, a * 10}, 0);
  EXPECT_EQ(s0.shape(), (Shape{2, 2, 2}));
  EXPECT_TRUE(all_close(s0, {1, 2, 3, 4, 10, 20, 30, 40}));
  const Tensor s2 = stack({a, a * 10}, 2);
  EXPECT_EQ(s2.shape(), (Shape{2, 2, 2}));
  EXPECT_TRUE(all_close(s2, {1, 10, 2, 20, 3, 30, 4, 40}));
  EXPECT_EQ(stack({f32({1}, {1}), f32({2}, {1}), f32({3}, {1})}, -1).shape(), (Shape{1, 3}));

  const Tensor x = arange(0, 10, 1, DType::f32).view({2, 5});
  const std::vector<Tensor> sp = split(x, 2, 1);  // sizes 2, 2, 1
  ASSERT_EQ(sp.size(), 3u);
  EXPECT_TRUE(all_close(sp[0], {0, 1, 5, 6}));
  EXPECT_TRUE(all_close(sp[1], {2, 3, 7, 8}));
  EXPECT_TRUE(all_close(sp[2], {4, 9}));
  EXPECT_TRUE(sp[1].shares_storage(x));
  const std::vector<Tensor> sz = split(x, std::vector<int64_t>{1, 4}, 1);
  ASSERT_EQ(sz.size(), 2u);
  EXPECT_EQ(sz[1].shape(), (Shape{2, 4}));
  EXPECT_TRUE(all_close(sz[1], {1, 2, 3, 4, 6, 7, 8, 9}));
  const std::vector<Tensor> ch = chunk(x, 3, 1);  // ceil(5 / 3) = 2 per chunk
  ASSERT_EQ(ch.size(), 3u);
  EXPECT_EQ(ch[2].shape(), (Shape{2, 1}));
  const std::vector<Tensor> ch0 = chunk(x, 2, 0);
  ASSERT_EQ(ch0.size(), 2u);
  EXPECT_TRUE(all_close(ch0[1], {5, 6, 7, 8, 9}));
}

TEST(Indexing, IndexSelectEmbedding) {
  const Tensor x = arange(0, 12, 1, DType::f32).view({3, 4});
  const Tensor r = index_select(x, 0, i64({2, 0, 2}));
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_TRUE(all_close(r, {8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_FALSE(r.shares_storage(x));
  const Tensor c = index_select(x, -1, i64({3, 1}));
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_TRUE(all_close(c, {3, 1, 7, 5, 11, 9}));
  EXPECT_TRUE(all_close(index_select(x.transpose(0, 1), 0, i64({1})), {1, 5, 9}));
  EXPECT_EQ(index_select(x, 0, i64({}, {0})).shape(), (Shape{0, 4}));

  const Tensor w = arange(0, 15, 1, DType::f32).view({5, 3});
  const Tensor e = embedding(w, i64({4, 0, 2, 4}, {2, 2}));
  EXPECT_EQ(e.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(all_close(e, {12, 13, 14, 0, 1, 2, 6, 7, 8, 12, 13, 14}));
  EXPECT_EQ(embedding(w, i64({1}, {1})).shape(), (Shape{1, 3}));
  EXPECT_EQ(embedding(w, scalar_tensor(3, DType::i64)).shape(), (Shape{3}));
  EXPECT_TRUE(all_close(embedding(w, scalar_tensor(3, DType::i64)), {9, 10, 11}));
}

TEST(Indexing, TriuTrilRepeatInterleave) {
  const Tensor x = add(arange(0, 12, 1, DType::f32).view({3, 4}), 1.0);  // 1..12
  EXPECT_TRUE(all_close(triu(x), {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}));
  EXPECT_TRUE(all_close(triu(x, 1), {0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12}));
  EXPECT_TRUE(all_close(triu(x, -1), {1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12}));
  EXPECT_TRUE(all_close(tril(x), {1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}));
  EXPECT_TRUE(all_close(tril(x, 1), {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12}));
  EXPECT_TRUE(all_close(tril(x, -1), {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}));
  const Tensor batched = triu(ones({2, 2, 2}));  // applies to the last two dims of every batch
  EXPECT_TRUE(all_close(batched, {1, 1, 0, 1, 1, 1, 0, 1}));

  EXPECT_TRUE(all_close(repeat_interleave(f32({1, 2, 3}), 2, 0), {1, 1, 2, 2, 3, 3}));
  const Tensor m = f32({1, 2, 3, 4}, {2, 2});
  EXPECT_TRUE(all_close(repeat_interleave(m, 2, 0), {1, 2, 1, 2, 3, 4, 3, 4}));
  EXPECT_TRUE(all_close(repeat_interleave(m, 3, 1), {1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4}));
  EXPECT_EQ(repeat_interleave(i64({4, 7}), 2, 0).to_vector<int64_t>(), (std::vector<int64_t>{4, 4, 7, 7}));
}

// ---- the softmax family ----

TEST(Softmax, AlongEveryDim) {
  const Tensor x = seq64({2, 3, 4}, 0.9, -2.0);
  for (int64_t d = 0; d < 3; ++d) {
    EXPECT_TRUE(all_close(softmax(x, d), ref_softmax(x, d), 1e-12)) << "dim " << d;
    EXPECT_TRUE(all_close(log_softmax(x, d), ref_softmax(x, d, true), 1e-12)) << "dim " << d;
    EXPECT_TRUE(all_close(softmax(x, d - 3), ref_softmax(x, d), 1e-12)) << "dim " << d - 3;
  }
  // float32; large logits stay finite (max subtraction)
  const Tensor big = f32({1000, 1001, 1002});
  const double z = 1 + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_TRUE(all_close(softmax(big, 0), {std::exp(-2.0) / z, std::exp(-1.0) / z, 1 / z}, 1e-6));
  EXPECT_TRUE(all_close(log_softmax(big, 0), {-2 - std::log(z), -1 - std::log(z), -std::log(z)}, 1e-5));
  EXPECT_TRUE(all_close(x.softmax(1).sum({1}), std::vector<double>(8, 1.0), 1e-12));
  EXPECT_TRUE(all_close(softmax(x.transpose(0, 2), 0), ref_softmax(x.transpose(0, 2).contiguous(), 0), 1e-12));
}

TEST(Softmax, MaskedByValidLens) {
  const Tensor s = seq64({2, 2, 4});
  const std::vector<double> v = values(s);
  auto row = [&](int r) { return std::vector<double>(v.begin() + 4 * r, v.begin() + 4 * r + 4); };
  auto expect_rows = [&](const Tensor& out, const std::vector<int64_t>& lens, double scale) {
    std::vector<double> e;
    for (int r = 0; r < 4; ++r) {
      const std::vector<double> rr = ref_row_softmax(row(r), lens[r], scale);
      e.insert(e.end(), rr.begin(), rr.end());
    }
    return all_close(out, e, 1e-12);
  };
  // 1-D: one length per batch entry
  EXPECT_TRUE(expect_rows(masked_softmax(s, i64({2, 3})), {2, 2, 3, 3}, 1.0));
  // 2-D: one length per query row; a zero length gives an all-zero row
  EXPECT_TRUE(expect_rows(masked_softmax(s, i64({1, 4, 0, 2}, {2, 2})), {1, 4, 0, 2}, 1.0));
  const Tensor zero_row = masked_softmax(s, i64({1, 4, 0, 2}, {2, 2})).select(0, 1).select(0, 0);
  EXPECT_TRUE(all_close(zero_row, {0, 0, 0, 0}));
  // with a scale, and without lengths (a plain scaled softmax)
  EXPECT_TRUE(expect_rows(masked_softmax(s, i64({3, 1}), 0.5), {3, 3, 1, 1}, 0.5));
  EXPECT_TRUE(expect_rows(masked_softmax(s, Tensor(), 0.25), {4, 4, 4, 4}, 0.25));
  // 4-D (B, H, Q, K) scores with one length per (batch, head)
  const Tensor s4 = seq64({2, 2, 2, 3});
  const std::vector<double> v4 = values(s4);
  const std::vector<int64_t> lens4 = {3, 0, 1, 2};
  std::vector<double> e4;
  for (int r = 0; r < 8; ++r) {
    const std::vector<double> rr =
        ref_row_softmax(std::vector<double>(v4.begin() + 3 * r, v4.begin() + 3 * r + 3), lens4[r / 2]);
    e4.insert(e4.end(), rr.begin(), rr.end());
  }
  EXPECT_TRUE(all_close(masked_softmax(s4, i64(lens4)), e4, 1e-12));
  // float32
  EXPECT_TRUE(expect_rows(masked_softmax(s.to(DType::f32), i64({2, 3})), {2, 2, 3, 3}, 1.0));
}

TEST(Softmax, Causal) {
  const Tensor flat = causal_softmax(zeros({2, 3, 3}));
  EXPECT_TRUE(all_close(flat, {1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3,  //
                               1, 0, 0, 0.5, 0.5, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3}));
  const Tensor s = seq64({2, 4, 4});
  const std::vector<double> v = values(s);
  std::vector<double> e;
  for (int r = 0; r < 8; ++r) {
    const std::vector<double> rr =
        ref_row_softmax(std::vector<double>(v.begin() + 4 * r, v.begin() + 4 * r + 4), r % 4 + 1, 0.5);
    e.insert(e.end(), rr.begin(), rr.end());
  }
  EXPECT_TRUE(all_close(causal_softmax(s, 0.5), e, 1e-12));
  // Same as masking the upper triangle with -inf and taking a softmax.
  const Tensor mask = tensor_bool(
      {false, true, true, true, false, false, true, true, false, false, false, true, false, false, false, false},
      {4, 4});
  EXPECT_TRUE(all_close(causal_softmax(s), softmax(masked_fill(s, mask, -INFINITY), -1), 1e-12));
}

// ---- dropout ----

TEST(Dropout, EvalTrainAndReplay) {
  const Tensor x = ones({100000});
  EXPECT_EQ(dropout(x, 0.5, false).impl(), x.impl());  // eval: identity, no copy
  EXPECT_EQ(dropout(x, 0.0, true).impl(), x.impl());
  Generator g(11);
  const std::vector<float> y = dropout(x, 0.3, true, g).to_vector<float>();
  int64_t zeros_n = 0;
  for (float v : y) {
    if (v == 0.f)
      ++zeros_n;
    else
      ASSERT_FLOAT_EQ(v, 1.f / 0.7f);  // survivors scaled by 1 / (1 - p)
  }
  EXPECT_NEAR(static_cast<double>(zeros_n) / y.size(), 0.3, 0.01);
  // The same generator state gives the same mask; the next draw a different one.
  Generator g2(11);
  EXPECT_EQ(dropout(x, 0.3, true, g2).to_vector<float>(), y);
  EXPECT_NE(dropout(x, 0.3, true, g2).to_vector<float>(), y);
  // The mask is the generator's uniform stream: element i is kept iff u_i >= p.
  Generator gu(11);
  const std::vector<float> u = rand({100000}, gu).to_vector<float>();
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(y[i] == 0.f, u[i] < 0.3f) << i;
  // p = 1 drops everything; values are scaled, not replaced.
  EXPECT_TRUE(all_close(dropout(f32({1, 2, 3}), 1.0, true, g), {0, 0, 0}));
  Generator g3(2);
  const Tensor z = dropout(f64({2, 4, 6, 8}), 0.5, true, g3);
  for (double zv : values(z)) EXPECT_TRUE(zv == 0 || zv == 4 || zv == 8 || zv == 12 || zv == 16);
}

// ---- layer norm ----

TEST(LayerNorm, MatchesHandComputation) {
  const Tensor x = f64({1, 2, 3, 4, -1, 0, 0, 5}, {2, 4});
  const Tensor w = f64({1, 2, 0.5, -1}), b = f64({0, 0.1, 0.2, 0.3});
  // Row 0: mean 2.5, biased var 1.25. Row 1: mean 1, biased var (4 + 1 + 1 + 16) / 4 = 5.5.
  const double r0 = 1 / std::sqrt(1.25 + 1e-5), r1 = 1 / std::sqrt(5.5 + 1e-5);
  const std::vector<double> xhat = {-1.5 * r0, -0.5 * r0, 0.5 * r0, 1.5 * r0, -2 * r1, -1 * r1, -1 * r1, 4 * r1};
  EXPECT_TRUE(all_close(layer_norm(x, Tensor(), Tensor()), xhat, 1e-12));
  std::vector<double> affine_e;
  for (int i = 0; i < 8; ++i) affine_e.push_back(xhat[i] * values(w)[i % 4] + values(b)[i % 4]);
  EXPECT_TRUE(all_close(layer_norm(x, w, b), affine_e, 1e-12));
  // eps matters for a constant row: output 0, not NaN
  EXPECT_TRUE(all_close(layer_norm(full({1, 3}, 7.0), Tensor(), Tensor()), {0, 0, 0}));
  // 3-D, float32, strided input
  const Tensor x3 = seq64({2, 3, 5}).transpose(0, 1);
  const Tensor y3 =
      layer_norm(x3.to(DType::f32), w.to(DType::f32).narrow(0, 0, 1).expand({5}).contiguous(), Tensor(), 1e-5);
  const std::vector<double> xv = values(x3);
  std::vector<double> e3;
  for (int r = 0; r < 6; ++r) {
    double m = 0, var = 0;
    for (int j = 0; j < 5; ++j) m += xv[5 * r + j] / 5;
    for (int j = 0; j < 5; ++j) var += (xv[5 * r + j] - m) * (xv[5 * r + j] - m) / 5;
    for (int j = 0; j < 5; ++j) e3.push_back((xv[5 * r + j] - m) / std::sqrt(var + 1e-5));
  }
  EXPECT_TRUE(all_close(y3, e3, 1e-5, 1e-5));
}

// The fused kernels' backward in float32 (row sums in float lanes, column sums in float blocks of rows
// added into double) against the norm composed of elementary ops in float64 (other kernels): rows past
// the kernels' thread split and block of 16 rows, with and without affine weights, layer and RMS norm.
TEST(LayerNorm, Float32BackwardOverManyRowsMatchesComposedFloat64) {
  Generator gen(7);
  const int64_t rows = 403, cols = 96;  // 38,688 elements: split over threads, blocks and a remainder
  const Tensor x = randn({rows, cols}, gen, DType::f64) * 3.0 + 0.5, seed = randn({rows, cols}, gen, DType::f64);
  const Tensor w = randn({cols}, gen, DType::f64), b = randn({cols}, gen, DType::f64);
  const double eps = 1e-5;
  for (const bool rms : {false, true}) {
    for (const bool affine : {true, false}) {
      std::vector<std::vector<Tensor>> grads;  // fused float32, composed float64: dx, dw, db
      for (const bool fused : {true, false}) {
        const DType dt = fused ? DType::f32 : DType::f64;
        Tensor xd = x.to(dt).detach().requires_grad_(), wd = w.to(dt).detach().requires_grad_(),
               bd = b.to(dt).detach().requires_grad_();
        Tensor y;
        if (fused) {
          y = rms ? rms_norm(xd, affine ? wd : Tensor(), eps)
                  : layer_norm(xd, affine ? wd : Tensor(), affine ? bd : Tensor(), eps);
        } else {
          const Tensor centred = rms ? xd : sub(xd, mean(xd, {-1}, true));
          y = mul(centred, rsqrt(add(mean(mul(centred, centred), {-1}, true), eps)));
          if (affine) y = rms ? mul(y, wd) : add(mul(y, wd), bd);
        }
        sum(mul(y, seed.to(dt))).backward();
        grads.push_back({xd.grad(), affine ? wd.grad() : Tensor(), affine && !rms ? bd.grad() : Tensor()});
      }
      for (size_t i = 0; i < 3; ++i) {
        if (!grads[1][i].defined()) continue;
        const Tensor expected = grads[1][i];
        const double scale = abs(expected).max().item<double>();
        EXPECT_TRUE(all_close(grads[0][i].to(DType::f64), expected, 2e-5 * scale, 1e-5))
            << (rms ? "rms_norm" : "layer_norm") << (affine ? " affine" : "") << ", gradient " << i;
      }
    }
  }
}

// ---- losses ----

// The float kernels' log-sum-exp (exps summed in float lanes over chunks of 256, the chunks in double)
// against the same maths composed of elementary ops in float64, on rows wider than several chunks.
TEST(Losses, Float32LogSoftmaxAndCrossEntropyOverWideRowsMatchComposedFloat64) {
  Generator gen(3);
  const int64_t rows = 6, vocab = 1000;  // three chunks and a remainder a row
  const Tensor x = randn({rows, vocab}, gen, DType::f64) * 4.0;
  const Tensor composed = sub(x, log(sum(exp(x), {-1}, true)));  // no overflow at this scale
  EXPECT_TRUE(all_close(log_softmax(x.to(DType::f32), -1).to(DType::f64), composed, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(softmax(x.to(DType::f32), -1).to(DType::f64), exp(composed), 1e-7, 1e-5));
  const Tensor targets = randint(0, vocab, {rows}, gen);
  double expected = 0;
  for (int64_t r = 0; r < rows; ++r)
    expected -= composed.select(0, r).select(0, targets.select(0, r).item<int64_t>()).item<double>() / rows;
  EXPECT_NEAR(cross_entropy(x.to(DType::f32), targets).item<double>(), expected, 1e-5);
}

TEST(Losses, CrossEntropy) {
  const Tensor logits = f64({1, 2, 3, 4, 0, 0, 0, 0, -1, 0.5, 2, -3}, {3, 4});
  auto lse = [](std::vector<double> r) {
    double s = 0;
    for (double v : r) s += std::exp(v);
    return std::log(s);
  };
  const double l0 = lse({1, 2, 3, 4}) - 2;         // target 1
  const double l2 = lse({-1, 0.5, 2, -3}) - (-3);  // target 3
  const Tensor t = i64({1, -100, 3});
  EXPECT_NEAR(cross_entropy(logits, t).item<double>(), (l0 + l2) / 2, 1e-12);  // mean over non-ignored
  EXPECT_NEAR(cross_entropy(logits, t, -100, Reduction::sum).item<double>(), l0 + l2, 1e-12);
  const Tensor none = cross_entropy(logits, t, -100, Reduction::none);
  EXPECT_EQ(none.shape(), (Shape{3}));
  EXPECT_TRUE(all_close(none, {l0, 0, l2}, 1e-12));
  // A custom ignore_index; -100 is then an ordinary (invalid) class, so use class 0 as ignored.
  const double l1 = std::log(4.0) - 0;  // uniform row, target 2
  EXPECT_NEAR(cross_entropy(logits, i64({0, 2, 3}), 0).item<double>(), (l1 + l2) / 2, 1e-12);
  // (B, T, C) logits with (B, T) targets
  const Tensor l3 = logits.view({1, 3, 4});
  EXPECT_NEAR(cross_entropy(l3, t.view({1, 3})).item<double>(), (l0 + l2) / 2, 1e-12);
  // float32, and a uniform prediction costs log(C)
  EXPECT_NEAR(cross_entropy(zeros({5, 10}), i64({0, 1, 2, 3, 9})).item<float>(), std::log(10.0), 1e-6);
  // Every target ignored: NaN for the mean, as PyTorch gives.
  EXPECT_TRUE(std::isnan(cross_entropy(logits, i64({-100, -100, -100})).item<double>()));
}

TEST(Losses, Mse) {
  const Tensor in = f32({1, 2, 3}), tg = f32({1.5, 2, 1});
  EXPECT_NEAR(mse_loss(in, tg).item<float>(), 4.25 / 3, 1e-6);
  EXPECT_NEAR(mse_loss(in, tg, Reduction::sum).item<float>(), 4.25, 1e-6);
  EXPECT_TRUE(all_close(mse_loss(in, tg, Reduction::none), {0.25, 0, 4}));
}

// ---- the CPU backend's vectorisable exp and tanh against libm ---------------------------------------
// Every op that uses them is tested against a float64 reference; this pins the functions themselves,
// including the inputs no op test reaches: NaN (converted to an integer was undefined behaviour, found by
// clang's UBSan), infinities and both ends of float's range.
TEST(FastMath, ExpAndTanhMatchLibmEverywhere) {
  std::vector<float> xs = {0.0f,   -0.0f, 1e-30f,  -1e-30f, 0.5f,     -0.625f, 0.625f, 1.0f,  88.72f,
                           88.73f, 89.0f, -87.33f, -87.34f, -103.97f, -104.0f, 1e30f,  -1e30f};
  for (float x = -120.0f; x <= 100.0f; x += 0.0137f) xs.push_back(x);
  for (float x : xs) {
    const double e = std::exp(static_cast<double>(x)), t = std::tanh(static_cast<double>(x));
    const float fe = cpu::fast_exp(x), ft = cpu::fast_tanh(x);
    if (e > std::numeric_limits<float>::max())
      EXPECT_EQ(fe, INFINITY) << x;
    else if (e < std::numeric_limits<float>::min())
      EXPECT_LE(fe, std::numeric_limits<float>::min()) << x;  // 0 or subnormal
    else
      EXPECT_NEAR(fe / e, 1.0, 1e-6) << x;
    EXPECT_NEAR(ft, t, 2e-7 + 2e-7 * std::fabs(t)) << x;
  }
  const float inf = INFINITY, nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(cpu::fast_exp(inf), inf);
  EXPECT_EQ(cpu::fast_exp(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::fast_exp(nan)));
  EXPECT_EQ(cpu::fast_tanh(inf), 1.0f);
  EXPECT_EQ(cpu::fast_tanh(-inf), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::fast_tanh(nan)));
}

// exp on [-87, 88] without range handling, and the float GELU-tanh built on it (x sigmoid(2u)) with its
// derivative, against float64 over [-12, 12]: the value to 2e-6 of max(|y|, 1e-3) (the old 1 + tanh u form
// was off by up to 8e-5 of that for negative x, where it cancels), the derivative to 5e-7. At the edges, PyTorch's
// values: GELU(-inf) NaN, GELU(inf) inf, derivative NaN at both; past -10, 0; past 10, x and 1.
TEST(FastMath, ExpInRangeAndGeluTanhMatchFloat64) {
  for (float x = -87.0f; x <= 88.0f; x += 0.0137f)
    EXPECT_NEAR(cpu::fast_exp_in_range(x) / std::exp(static_cast<double>(x)), 1.0, 1e-6) << x;
  using Fast = cpu::FastExpTanh;
  const auto gelu64 = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  const auto grad64 = [](double x) {
    const double t = std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
  };
  for (float x = -12.0f; x <= 12.0f; x += 0.00731f) {
    const double y = gelu64(x);
    EXPECT_NEAR(smath::gelu_tanh<Fast>(x), y, 2e-6 * std::max(std::fabs(y), 1e-3)) << x;
    EXPECT_NEAR(smath::gelu_tanh_grad<Fast>(x), grad64(x), 5e-7) << x;
  }
  const float inf = INFINITY, nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(smath::gelu_tanh<Fast>(-inf)));
  EXPECT_EQ(smath::gelu_tanh<Fast>(inf), inf);
  EXPECT_TRUE(std::isnan(smath::gelu_tanh<Fast>(nan)));
  for (float x : {-inf, inf, nan}) EXPECT_TRUE(std::isnan(smath::gelu_tanh_grad<Fast>(x))) << x;
  for (float x : {-30.0f, -100.0f, -1e30f}) {
    EXPECT_LE(std::fabs(smath::gelu_tanh<Fast>(x)), 1e-30f) << x;
    EXPECT_LE(std::fabs(smath::gelu_tanh_grad<Fast>(x)), 1e-30f) << x;
  }
  EXPECT_EQ(smath::gelu_tanh<Fast>(1e30f), 1e30f);
  EXPECT_EQ(smath::gelu_tanh_grad<Fast>(1e30f), 1.0f);
}

// The CPU backend's cache of large blocks: exact size classes, a thread's own blocks first, clear()
// hands every block back.
TEST(BlockCache, SizeClassesOwnBlocksFirstAndClear) {
  using headlab::cpu::BlockCache;
  EXPECT_EQ(BlockCache::size_class(size_t(64) << 10), size_t(64) << 10);
  EXPECT_EQ(BlockCache::size_class((size_t(64) << 10) + 1), size_t(80) << 10);  // a quarter octave up
  BlockCache cache;
  const size_t bytes = size_t(128) << 10;
  int mine = 0, theirs = 0, other_size = 0;
  EXPECT_EQ(cache.take(bytes), nullptr);
  ASSERT_TRUE(cache.give(&mine, bytes));
  std::thread([&] { ASSERT_TRUE(cache.give(&theirs, bytes)); }).join();  // the newest block: another thread's
  EXPECT_EQ(cache.take(bytes), &mine) << "this thread's block before the newer one of another thread";
  EXPECT_EQ(cache.take(bytes), &theirs) << "another thread's block when this thread has none";
  EXPECT_EQ(cache.take(bytes), nullptr);
  ASSERT_TRUE(cache.give(&mine, bytes));
  ASSERT_TRUE(cache.give(&other_size, 2 * bytes));
  EXPECT_EQ(cache.take(3 * bytes), nullptr) << "no block of another size class";
  std::vector<void*> released;
  cache.clear([&](void* p) { released.push_back(p); });
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(cache.take(bytes), nullptr);
}
