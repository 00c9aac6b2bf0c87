// Tensor basics: factories and seeded random draws, views that share storage (and the ones that
// must copy), contiguous(), item/to_vector, PyTorch-style printing and dtype conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "backends/backend.h"
#include "backends/philox.h"
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::testing;

// ---- factories ----

TEST(Factories, ZerosOnesFull) {
  const Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_EQ(z.device(), kCPU);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(values(z), std::vector<double>(6, 0.0));

  const Tensor o = ones({4}, DType::i64);
  EXPECT_EQ(o.dtype(), DType::i64);
  EXPECT_EQ(o.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1}));

  const Tensor f = full({2, 2}, 2.5, DType::f64);
  EXPECT_EQ(f.dtype(), DType::f64);
  EXPECT_EQ(values(f), std::vector<double>(4, 2.5));

  const Tensor b = full({3}, 7.0, DType::b8);
  EXPECT_EQ(b.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 1}));

  const Tensor s = scalar_tensor(3.25);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_FLOAT_EQ(s.item<float>(), 3.25f);

  const Tensor e = zeros({0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_vector<float>().empty());

  const Tensor zl = zeros_like(f), ol = ones_like(f);
  EXPECT_EQ(zl.shape(), f.shape());
  EXPECT_EQ(zl.dtype(), DType::f64);
  EXPECT_EQ(values(ol), std::vector<double>(4, 1.0));
}

TEST(Factories, Arange) {
  const Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), DType::i64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));

  const Tensor f = arange(0, 1, 0.25, DType::f32);
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(values(f), (std::vector<double>{0, 0.25, 0.5, 0.75}));  // end excluded

  const Tensor d = arange(5, 0, -2, DType::f64);
  EXPECT_EQ(values(d), (std::vector<double>{5, 3, 1}));

  EXPECT_EQ(arange(2, 2, 1).numel(), 0);
  EXPECT_EQ(arange(0, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 6, 9}));
}

TEST(Factories, Eye) {
  const Tensor e = eye(3);
  EXPECT_EQ(e.shape(), (Shape{3, 3}));
  EXPECT_EQ(values(e), (std::vector<double>{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(eye(2, DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 1}));
  EXPECT_EQ(eye(0).numel(), 0);
}

TEST(Factories, FromValues) {
  const Tensor t = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(values(t), (std::vector<double>{1, 2, 3, 4, 5, 6}));

  const Tensor flat = f64({1.5, 2.5, 3.5});  // no shape: 1-D of the values' length
  EXPECT_EQ(flat.shape(), (Shape{3}));
  EXPECT_EQ(flat.dtype(), DType::f64);

  const Tensor one = f32({4.5f});  // one value and no shape: a 0-d scalar
  EXPECT_EQ(one.dim(), 0);
  EXPECT_FLOAT_EQ(one.item<float>(), 4.5f);

  const Tensor i = i64({-3, 0, 9}, {3, 1});
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_EQ(i.shape(), (Shape{3, 1}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{-3, 0, 9}));

  const Tensor b = tensor_bool({true, false, true}, {3});
  EXPECT_EQ(b.dtype(), DType::b8);
  EXPECT_EQ(b.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
}

// ---- random draws ----

TEST(Random, SameSeedSameNumbersAndCountersAdvance) {
  Generator g1(42), g2(42), g3(43);
  const std::vector<float> a = rand({1000}, g1).to_vector<float>();
  const std::vector<float> b = rand({1000}, g2).to_vector<float>();
  const std::vector<float> c = rand({1000}, g3).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(g1.offset(), 250u);  // 4 numbers per Philox counter
  // The next draw starts at fresh counters: different numbers, and equal to a draw at that state.
  const std::vector<float> a2 = rand({1000}, g1).to_vector<float>();
  EXPECT_NE(a, a2);
  Generator g4(0);
  g4.set_state(42, 250);
  EXPECT_EQ(rand({1000}, g4).to_vector<float>(), a2);
  // The global generator reseeds.
  manual_seed(7);
  const std::vector<double> r1 = values(randn({16}));
  manual_seed(7);
  EXPECT_EQ(values(randn({16})), r1);
  // An odd-sized draw still reserves whole counters.
  Generator g5(1);
  rand({5}, g5);
  EXPECT_EQ(g5.offset(), 2u);
}

TEST(Random, PhiloxKnownAnswer) {
  // Random123's known-answer test for Philox4x32-10: counter 0, key 0 ->
  // {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}; rand keeps the top 24 bits.
  const philox::U4 r = philox::philox4x32(0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  Generator g(0);
  const std::vector<double> u = values(rand({4}, g, DType::f64));
  const uint32_t kat[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(u[i], static_cast<double>(kat[i] >> 8) / 16777216.0) << i;
}

TEST(Random, RandUniformRange) {
  Generator g(123);
  const std::vector<double> v = values(rand({100000}, g));
  double mn = 1, mx = 0, sum = 0;
  for (double x : v) {
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    sum += x;
  }
  EXPECT_GE(mn, 0.0);
  EXPECT_LT(mx, 1.0);
  EXPECT_NEAR(sum / v.size(), 0.5, 0.01);
  EXPECT_LT(mn, 1e-3);  // the range is actually covered
  EXPECT_GT(mx, 1 - 1e-3);

  const std::vector<double> w = values(uniform({10000}, -2.0, 3.0, g, DType::f64));
  for (double x : w) {
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 3.0);
  }
}

TEST(Random, RandnMoments) {
  Generator g(5);
  const std::vector<double> v = values(randn({100000}, g));
  double sum = 0, sq = 0;
  int64_t within1 = 0;
  for (double x : v) {
    sum += x;
    sq += x * x;
    within1 += std::abs(x) < 1;
  }
  const double mean = sum / v.size(), stddev = std::sqrt(sq / v.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(stddev, 1.0, 0.02);
  EXPECT_NEAR(static_cast<double>(within1) / v.size(), 0.6827, 0.01);  // the shape is normal too
  EXPECT_EQ(randn({3}, g, DType::f64).dtype(), DType::f64);
}

TEST(Random, RandintBounds) {
  Generator g(9);
  const Tensor t = randint(3, 7, {20000}, g);
  EXPECT_EQ(t.dtype(), DType::i64);
  std::vector<int64_t> counts(4, 0);
  for (int64_t x : t.to_vector<int64_t>()) {
    ASSERT_GE(x, 3);
    ASSERT_LT(x, 7);
    ++counts[x - 3];
  }
  for (int64_t c : counts) EXPECT_NEAR(c, 5000, 300);  // every value, about equally often
  const Tensor neg = randint(-5, -4, {10}, g);
  EXPECT_EQ(neg.to_vector<int64_t>(), std::vector<int64_t>(10, -5));
}

// ---- views ----

namespace {
Tensor grid() { return arange(0, 24, 1, DType::f32).view({2, 3, 4}); }
}  // namespace

TEST(Views, ViewAndReshapeOfContiguousShareStorage) {
  const Tensor x = grid();
  const Tensor v = x.view({6, 4});
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_EQ(v.offset(), 0);
  const Tensor r = x.reshape({4, -1});
  EXPECT_TRUE(r.shares_storage(x));
  EXPECT_EQ(r.shape(), (Shape{4, 6}));
  EXPECT_EQ(r.strides(), (Shape{6, 1}));
  const Tensor fl = x.flatten(1);
  EXPECT_TRUE(fl.shares_storage(x));
  EXPECT_EQ(fl.shape(), (Shape{2, 12}));
  EXPECT_EQ(values(r), values(x));
}

TEST(Views, TransposePermuteShareStorage) {
  const Tensor x = grid();
  const Tensor t = x.transpose(0, 2);
  EXPECT_TRUE(t.shares_storage(x));
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  // t[i, j, k] = x[k, j, i] = 12k + 4j + i
  std::vector<double> expect;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) expect.push_back(12 * k + 4 * j + i);
  EXPECT_EQ(values(t), expect);

  const Tensor p = x.permute({2, 0, 1});
  EXPECT_TRUE(p.shares_storage(x));
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(x.mT().strides(), (Shape{12, 1, 4}));
}

TEST(Views, NarrowSliceSelect) {
  const Tensor x = grid();
  const Tensor n = x.narrow(1, 1, 2);
  EXPECT_TRUE(n.shares_storage(x));
  EXPECT_EQ(n.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(n.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(n.offset(), 4);
  EXPECT_EQ(values(n), (std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23}));

  const Tensor s = x.slice(2, 1, 4, 2);  // columns 1 and 3
  EXPECT_TRUE(s.shares_storage(x));
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.strides(), (Shape{12, 4, 2}));
  EXPECT_EQ(s.offset(), 1);
  EXPECT_EQ(values(s), (std::vector<double>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  const Tensor neg = x.slice(2, -3, -1);  // Python-style negative bounds: columns 1, 2
  EXPECT_EQ(neg.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(neg.offset(), 1);

  const Tensor sel = x.select(0, 1);
  EXPECT_TRUE(sel.shares_storage(x));
  EXPECT_EQ(sel.shape(), (Shape{3, 4}));
  EXPECT_EQ(sel.strides(), (Shape{4, 1}));
  EXPECT_EQ(sel.offset(), 12);
  const Tensor last = x.select(2, -1);
  EXPECT_EQ(last.shape(), (Shape{2, 3}));
  EXPECT_EQ(last.strides(), (Shape{12, 4}));
  EXPECT_EQ(last.offset(), 3);
  EXPECT_EQ(values(last), (std::vector<double>{3, 7, 11, 15, 19, 23}));
}

TEST(Views, UnsqueezeSqueezeExpand) {
  const Tensor x = grid();
  const Tensor u = x.unsqueeze(0);
  EXPECT_TRUE(u.shares_storage(x));
  EXPECT_EQ(u.shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(u.strides(), (Shape{24, 12, 4, 1}));
  const Tensor u2 = x.unsqueeze(-1);
  EXPECT_EQ(u2.shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(u.squeeze(0).shape(), x.shape());
  EXPECT_EQ(u2.squeeze().shape(), x.shape());
  EXPECT_EQ(x.squeeze(1).shape(), x.shape());  // not size 1: unchanged

  const Tensor c = f32({1, 2, 3}, {3, 1});
  const Tensor e = c.expand({3, 4});
  EXPECT_TRUE(e.shares_storage(c));
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_EQ(values(e), (std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  const Tensor e2 = f32({5, 6}).expand({2, 3, -1});
  EXPECT_EQ(e2.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(e2.strides(), (Shape{0, 0, 1}));
  EXPECT_EQ(values(e2.sum({0, 1})), (std::vector<double>{30, 36}));
}

TEST(Views, CopyNothing) {
  const Tensor x = grid();
  const size_t before = cpu_backend().bytes_in_use();
  {
    const std::vector<Tensor> views = {x.view({6, 4}),       x.reshape({4, 6}), x.transpose(0, 2),
                                       x.permute({1, 2, 0}), x.narrow(1, 0, 2), x.slice(2, 0, 4, 3),
                                       x.select(0, 1),       x.unsqueeze(1),    x.expand({5, 2, 3, 4}),
                                       x.flatten(),          x.contiguous(),    x.mT()};
    for (const Tensor& v : views) EXPECT_TRUE(v.shares_storage(x));
    EXPECT_EQ(cpu_backend().bytes_in_use(), before);
  }
  const Tensor copy = x.transpose(0, 1).reshape({-1});
  EXPECT_GT(cpu_backend().bytes_in_use(), before);  // the one that had to copy
}

TEST(Views, WritesThroughAViewReachTheBase) {
  Tensor x = zeros({3, 4});
  Tensor col = x.select(1, 2);
  col.fill_(5);
  EXPECT_EQ(values(x), (std::vector<double>{0, 0, 5, 0, 0, 0, 5, 0, 0, 0, 5, 0}));
  EXPECT_EQ(x.version(), col.version());  // one counter per storage
}

TEST(Views, ReshapeOfTransposedCopies) {
  const Tensor x = grid().select(0, 0);  // (3, 4): 0..11
  const Tensor t = x.transpose(0, 1);    // (4, 3)
  const Tensor r = t.reshape({12});
  EXPECT_FALSE(r.shares_storage(x));
  EXPECT_TRUE(r.is_contiguous());
  EXPECT_EQ(values(r), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  // Splitting a dim of the transposed tensor is still a view.
  const Tensor r2 = t.reshape({2, 2, 3});
  EXPECT_TRUE(r2.shares_storage(x));
  EXPECT_EQ(r2.strides(), (Shape{2, 1, 4}));
}

TEST(Views, ContiguousCopiesOnlyWhenNeeded) {
  const Tensor x = grid();
  const Tensor c = x.contiguous();
  EXPECT_TRUE(c.shares_storage(x));
  EXPECT_EQ(c.impl(), x.impl());
  const Tensor n = x.slice(2, 0, 4, 2).contiguous();
  EXPECT_FALSE(n.shares_storage(x));
  EXPECT_TRUE(n.is_contiguous());
  EXPECT_EQ(n.strides(), (Shape{6, 2, 1}));
  EXPECT_EQ(values(n), (std::vector<double>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22}));
  // Size-1 dims do not make a tensor non-contiguous, whatever their stride.
  const Tensor row = x.narrow(1, 1, 1);
  EXPECT_TRUE(row.select(0, 0).is_contiguous());
  const Tensor cl = x.clone();
  EXPECT_FALSE(cl.shares_storage(x));
  EXPECT_EQ(values(cl), values(x));
}

// ---- item / to_vector ----

TEST(Data, ItemAndToVector) {
  EXPECT_EQ(i64({42}, {1, 1}).item<int64_t>(), 42);
  EXPECT_DOUBLE_EQ(f64({0.125}).item<double>(), 0.125);
  EXPECT_TRUE(tensor_bool({true}).item<bool>());
  EXPECT_FLOAT_EQ(grid().select(0, 1).select(0, 2).select(0, 3).item<float>(), 23.f);
  // to_vector reads any layout in logical order and casts.
  const Tensor t = grid().select(0, 0).transpose(0, 1);
  EXPECT_EQ(t.to_vector<int>(), (std::vector<int>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(f32({1.5f, -2.5f}).to_vector<int64_t>(), (std::vector<int64_t>{1, -2}));
}

// ---- printing (PyTorch's format) ----

TEST(Printing, ExactStrings) {
  EXPECT_EQ(to_string(f32({1.5, -2.25, 3, 4}, {2, 2})),
            "tensor([[ 1.5000, -2.2500],\n"
            "        [ 3.0000,  4.0000]])");
  EXPECT_EQ(to_string(scalar_tensor(3.25)), "tensor(3.2500)");
  EXPECT_EQ(to_string(arange(3)), "tensor([0, 1, 2])");
  EXPECT_EQ(to_string(i64({1, 100, -7})), "tensor([  1, 100,  -7])");
  EXPECT_EQ(to_string(tensor_bool({true, false})), "tensor([ True, False])");
  EXPECT_EQ(to_string(f64({1.5, 2})), "tensor([1.5000, 2.0000], dtype=torch.float64)");
  EXPECT_EQ(to_string(f32({0.5f}, {1}).requires_grad_()), "tensor([0.5000], requires_grad=True)");
  EXPECT_EQ(to_string(Tensor()), "tensor(undefined)");
  EXPECT_EQ(to_string(zeros({0, 3})), "tensor([], size=(0, 3))");
  EXPECT_EQ(to_string(zeros({0})), "tensor([])");
  EXPECT_EQ(to_string(arange(0, 8, 1, DType::f32).view({2, 2, 2})),
            "tensor([[[0.0000, 1.0000],\n"
            "         [2.0000, 3.0000]],\n"
            "\n"
            "        [[4.0000, 5.0000],\n"
            "         [6.0000, 7.0000]]])");
}

TEST(Printing, GradFn) {
  Tensor a = f32({1.5, 2}, {1, 2}).requires_grad_();
  const Tensor b = f32({1, 0.25}, {2, 1});
  const Tensor y = matmul(a, b);  // 1.5 + 0.5
  EXPECT_EQ(y.grad_fn_name(), "MatmulBackward");
  EXPECT_EQ(to_string(y), "tensor([[2.0000]], grad_fn=<MatmulBackward>)");
  EXPECT_EQ(to_string(masked_fill(a, tensor_bool({true, false}), 0.0)),
            "tensor([[0.0000, 2.0000]], grad_fn=<MaskedFillBackward>)");
}

// ---- dtype conversions ----

TEST(DTypes, Conversions) {
  const Tensor x = f32({1.7f, -1.7f, 0.0f, 0.5f});
  const Tensor i = x.to(DType::i64);
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, -1, 0, 0}));  // truncation toward zero
  const Tensor b = x.to(DType::b8);
  EXPECT_EQ(b.to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 0, 1}));  // nonzero -> true
  const Tensor back = b.to(DType::f32);
  EXPECT_EQ(values(back), (std::vector<double>{1, 1, 0, 1}));
  const Tensor d = i64({3, -4}).to(DType::f64);
  EXPECT_EQ(d.dtype(), DType::f64);
  EXPECT_EQ(values(d), (std::vector<double>{3, -4}));
  const Tensor f = f64({0.1}).to(DType::f32);
  EXPECT_EQ(f.to_vector<float>()[0], 0.1f);         // rounded to the nearest float
  EXPECT_TRUE(x.to(DType::f32).shares_storage(x));  // same dtype: no copy
  // Non-contiguous source converts in logical order.
  EXPECT_EQ(grid().select(0, 0).transpose(0, 1).to(DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_STREQ(dtype_name(DType::f32), "float32");
  EXPECT_STREQ(dtype_name(DType::f64), "float64");
  EXPECT_STREQ(dtype_name(DType::i64), "int64");
  EXPECT_STREQ(dtype_name(DType::b8), "bool");
  EXPECT_EQ(dtype_size(DType::b8), 1u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
}

TEST(Devices, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), kCPU);
  EXPECT_EQ(Device::parse("cuda").str(), "cuda:0");
  EXPECT_EQ(Device::parse("cuda:3").index, 3);
  EXPECT_TRUE(Device::parse("cuda:1").is_cuda());
  EXPECT_EQ(kCPU.str(), "cpu");
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(shape_str({}), "[]");
}

// Debian 12's GCC 12.2 with AVX-512 on stored these constants as a broadcast of their first element
// ({1, 1, 1, 1}): a pruning test's head gates {1, 1, 0, 0} gated nothing. CMakeLists.txt probes for it and
// turns SLP vectorisation off where it happens; this holds the probe's cases against the flags the tests
// are built with.
TEST(Toolchain, ConstantVectorStoresKeepTheirZeros) {
  const std::vector<double> d{1, 1, 0, 0};
  const std::vector<int64_t> i{1, 1, 1, 0};
  const std::vector<double> eight{1, 1, 0, 0, 0, 0, 0, 0};
  const volatile double* vd = d.data();
  const volatile int64_t* vi = i.data();
  const volatile double* v8 = eight.data();
  EXPECT_EQ(vd[2], 0.0);
  EXPECT_EQ(vd[3], 0.0);
  EXPECT_EQ(vi[3], 0);
  EXPECT_EQ(v8[7], 0.0);
  EXPECT_EQ(tensor(std::vector<double>{1, 1, 0, 0}, {4}).to_vector<double>(), (std::vector<double>{1, 1, 0, 0}));
}
