// nn/: Module bookkeeping (state_dict names, modes, dtype moves, loading, PyTorch-style printing),
// the basic layers, and the attention family: the seeds' worked examples as the texts print them
// (d2l 10.3 / 10.5, the book's ch. 3), masking, head gates, bad input, wrapper <-> fused conversion,
// and float64 gradchecks of every module. PyTorch parity lives in test_nn_parity.cpp.
// B = batch, Q = queries, K = keys, T = tokens, H = heads, D = head size.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "nn/attention.h"
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::testing;
using nn::AdditiveAttention;
using nn::CausalAttention;
using nn::CausalMultiHeadAttention;
using nn::DotProductAttention;
using nn::MultiHeadAttention;
using nn::MultiHeadAttentionWrapper;

namespace {

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

// A float64 leaf with N(0, 1) * scale entries from its own generator.
Tensor rnd(const Shape& shape, uint64_t seed, double scale = 1.0, DType dt = DType::f64) {
  Generator g(seed);
  Tensor t = mul(randn(shape, g, DType::f64), scale).to(dt).detach();
  t.requires_grad_(true);
  return t;
}

Tensor leaf(const Tensor& t) {
  Tensor c = t.detach().clone();
  c.requires_grad_(true);
  return c;
}

std::vector<Tensor> with_params(std::vector<Tensor> inputs, const nn::Module& m) {
  for (const Tensor& p : m.parameters()) inputs.push_back(p);
  return inputs;
}

::testing::AssertionResult gradchecks(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                      const std::vector<Tensor>& inputs) {
  const GradcheckResult r = gradcheck(fn, inputs);
  if (r.ok) return ::testing::AssertionSuccess() << "max error " << r.max_abs_error;
  return ::testing::AssertionFailure() << r.message << " (max error " << r.max_abs_error << ")";
}

// |a - b| <= tol * max(1, |b|) everywhere.
::testing::AssertionResult close(const Tensor& a, const Tensor& b, double tol) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(a.shape()) << " != " << shape_str(b.shape());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i)
    if (!(std::abs(va[i] - vb[i]) <= tol * std::max(1.0, std::abs(vb[i]))))
      return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i];
  return ::testing::AssertionSuccess();
}

// The book's ch. 3 `inputs` ("Your journey starts with one step"), (6, 3), and it stacked twice.
Tensor book_inputs() {
  return tensor(std::vector<float>{0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f, 0.58f, 0.33f,
                                   0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f},
                {6, 3});
}
Tensor book_batch() { return stack({book_inputs(), book_inputs()}, 0); }  // (2, 6, 3)

void set(const Tensor& p, const std::vector<float>& v) {
  NoGradGuard ng;
  Tensor dst = p.detach();
  dst.copy_(tensor(v, p.shape()));
}

// d2l 10.3's toy data: keys ones(2, 10, 2), values arange(40) as (1, 10, 4) repeated twice, valid_lens [2, 6].
Tensor d2l_keys() { return ones({2, 10, 2}); }
Tensor d2l_values() { return arange(0, 40, 1, DType::f32).reshape({1, 10, 4}).expand({2, 10, 4}).contiguous(); }
Tensor d2l_valid_lens() { return tensor(std::vector<int64_t>{2, 6}, {2}); }

// A module with both an extra_repr and children, to pin down how PyTorch prints that case.
class Block : public nn::Module {
 public:
  Block() { fc = register_module("fc", std::make_shared<nn::Linear>(4, 2)); }
  std::string type_name() const override { return "Block"; }
  std::string extra_repr() const override { return "width=4"; }
  std::shared_ptr<nn::Linear> fc;
};

}  // namespace

// =====================================================================================================
// Module
// =====================================================================================================

TEST(Module, NamedParametersAreStateDictKeysInRegistrationOrder) {
  MultiHeadAttentionWrapper w(3, 2, 6, 0.0, 2, /*qkv_bias=*/true, /*out_proj=*/true);
  EXPECT_EQ(names_of(w),
            (std::vector<std::string>{"heads.0.W_query.weight", "heads.0.W_query.bias", "heads.0.W_key.weight",
                                      "heads.0.W_key.bias", "heads.0.W_value.weight", "heads.0.W_value.bias",
                                      "heads.1.W_query.weight", "heads.1.W_query.bias", "heads.1.W_key.weight",
                                      "heads.1.W_key.bias", "heads.1.W_value.weight", "heads.1.W_value.bias",
                                      "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(w.parameter("heads.1.W_key.weight").shape(), (Shape{2, 3}));
  EXPECT_EQ(w.parameter("out_proj.weight").shape(), (Shape{4, 4}));

  MultiHeadAttention d2l(100, 100, 100, 100, 5, 0.5);  // the DotProductAttention child has no parameters
  EXPECT_EQ(names_of(d2l), (std::vector<std::string>{"W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"}));
  CausalMultiHeadAttention fused(3, 2, 6, 0.0, 2);
  EXPECT_EQ(names_of(fused), (std::vector<std::string>{"W_query.weight", "W_key.weight", "W_value.weight",
                                                       "out_proj.weight", "out_proj.bias"}));
  AdditiveAttention add_att(2, 20, 8, 0.1);
  EXPECT_EQ(names_of(add_att), (std::vector<std::string>{"W_k.weight", "W_q.weight", "w_v.weight"}));
  nn::FeedForward ff(6);
  EXPECT_EQ(names_of(ff),
            (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"}));
  EXPECT_EQ(names_of(nn::LayerNorm(8)), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(names_of(nn::LayerNorm(8, 1e-5, nn::LayerNorm::Style::Book)), (std::vector<std::string>{"scale", "shift"}));
  EXPECT_TRUE(names_of(DotProductAttention(0.1)).empty());
}

TEST(Module, NumParameters) {
  EXPECT_EQ(MultiHeadAttention(100, 100, 100, 100, 5, 0.5).num_parameters(), 4 * 100 * 100);
  EXPECT_EQ(MultiHeadAttention(100, 100, 100, 100, 5, 0.5, true).num_parameters(), 4 * (100 * 100 + 100));
  EXPECT_EQ(MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2).num_parameters(), 2 * 3 * (2 * 3));         // 36
  EXPECT_EQ(CausalMultiHeadAttention(3, 2, 6, 0.0, 2).num_parameters(), 3 * (2 * 3) + 2 * 2 + 2);  // 24
  EXPECT_EQ(MultiHeadAttentionWrapper(4, 3, 8, 0.0, 2, true, true).num_parameters(), 2 * 3 * (12 + 3) + 36 + 6);
  EXPECT_EQ(AdditiveAttention(2, 20, 8, 0.1).num_parameters(), 16 + 160 + 8);
  EXPECT_EQ(nn::Embedding(7, 4).num_parameters(), 28);
  EXPECT_EQ(nn::FeedForward(6).num_parameters(), 6 * 24 + 24 + 24 * 6 + 6);
  EXPECT_EQ(DotProductAttention(0.5).num_parameters(), 0);
}

TEST(Module, ParametersShareStorageWithTheLayersHandles) {
  MultiHeadAttention m(3, 4, 5, 6, 2, 0.0, true);
  const auto params = m.parameters();
  ASSERT_EQ(params.size(), 8u);
  EXPECT_EQ(params[0].impl(), m.W_q->weight.impl());
  EXPECT_EQ(params[1].impl(), m.W_q->bias.impl());
  EXPECT_EQ(params[7].impl(), m.W_o->bias.impl());
  for (const Tensor& p : params) EXPECT_TRUE(p.requires_grad() && p.is_leaf());
  EXPECT_EQ(m.parameter("W_v.bias").impl(), m.W_v->bias.impl());
  EXPECT_ERROR(m.parameter("W_x.weight"), "MultiHeadAttention: no parameter named 'W_x.weight'");
}

TEST(Module, ZeroGradClearsEveryGradient) {
  MultiHeadAttentionWrapper w(3, 2, 6, 0.0, 2, false, true);
  w.forward(book_batch()).sum().backward();
  for (const auto& [name, p] : w.named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  w.zero_grad();
  for (const auto& [name, p] : w.named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
}

TEST(Module, TrainEvalReachEveryDescendant) {
  MultiHeadAttentionWrapper w(3, 2, 6, 0.5, 2);
  auto head = w.heads->at<CausalAttention>(1);
  EXPECT_TRUE(w.is_training() && head->dropout->is_training());  // PyTorch's default: training
  w.eval();
  EXPECT_FALSE(w.is_training());
  EXPECT_FALSE(w.heads->is_training());
  EXPECT_FALSE(head->is_training());
  EXPECT_FALSE(head->dropout->is_training());
  w.train();
  EXPECT_TRUE(head->dropout->is_training());
  w.train(false);
  EXPECT_FALSE(head->dropout->is_training());
}

TEST(Module, ToDtypeMovesEveryParameterInPlace) {
  MultiHeadAttention m(3, 4, 5, 6, 2, 0.0, true);
  const std::vector<double> before = m.W_k->weight.to_vector<double>();
  m.to(DType::f64);
  for (const auto& [name, p] : m.named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::f64) << name;
    EXPECT_TRUE(p.requires_grad() && p.is_leaf()) << name;
  }
  EXPECT_EQ(m.W_k->weight.dtype(), DType::f64);  // the handle held by the layer sees the move
  EXPECT_EQ(m.W_k->weight.to_vector<double>(), before);
  const Tensor q = rnd({2, 3, 4}, 1), k = rnd({2, 5, 3}, 2), v = rnd({2, 5, 5}, 3);
  EXPECT_EQ(m.forward(q, k, v).dtype(), DType::f64);
  EXPECT_EQ(m.device(), kCPU);
}

TEST(Module, LoadParametersChecksNamesAndShapes) {
  nn::Linear a(3, 2), b(3, 2);
  b.load_parameters(a.named_parameters());
  EXPECT_EQ(values(b.weight), values(a.weight));
  EXPECT_EQ(values(b.bias), values(a.bias));
  EXPECT_ERROR(b.load_parameters({{"weight", zeros({2, 3})}}), "Linear: parameter bias is missing");
  EXPECT_ERROR(b.load_parameters({{"weight", zeros({2, 3})}, {"bias", zeros({2})}, {"scale", zeros({2})}}),
               "Linear: parameter scale does not exist in the model");
  EXPECT_ERROR(b.load_parameters({{"weight", zeros({3, 2})}, {"bias", zeros({2})}}, "ckpt.h5"),
               "ckpt.h5: parameter weight has shape [3, 2], model expects [2, 3]");
  // float64 values into a float32 model are cast
  b.load_parameters({{"weight", full({2, 3}, 0.25, DType::f64)}, {"bias", zeros({2}, DType::f64)}});
  EXPECT_EQ(b.weight.dtype(), DType::f32);
  EXPECT_EQ(values(b.weight), std::vector<double>(6, 0.25));
}

TEST(Module, ModuleListAndSequential) {
  nn::ModuleList list;
  list.push_back(std::make_shared<nn::Linear>(2, 3));
  list.push_back(std::make_shared<nn::ReLU>());
  list.push_back(std::make_shared<nn::Linear>(3, 1, false));
  EXPECT_EQ(list.size(), 3u);
  EXPECT_EQ(names_of(list), (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  EXPECT_NE(list.at<nn::Linear>(2), nullptr);
  EXPECT_EQ(list.at<nn::Linear>(1), nullptr);  // a ReLU, not a Linear
  EXPECT_ERROR(list.at(3), "ModuleList: index 3 is out of range for 3 modules");

  nn::Sequential seq;
  auto l1 = seq.push_back(std::make_shared<nn::Linear>(2, 3));
  seq.push_back(std::make_shared<nn::ReLU>());
  auto l2 = seq.push_back(std::make_shared<nn::Linear>(3, 1, false));
  set(l1->weight, {1, -1, 0.5, 2, -3, 1});
  set(l1->bias, {0, 0.5, -1});
  set(l2->weight, {1, 2, 3});
  const Tensor x = f32({1, 2, -1, 0.5}, {2, 2});
  // h1 = relu(x W1^T + b1): row 0 [-1, 0, 0] -> [0, 0, 0]... computed by hand:
  // row 0: [1-2, 0.5+4+0.5, -3+2-1] = [-1, 5, -2] -> relu [0, 5, 0] -> 10
  // row 1: [-1-0.5, -0.5+1+0.5, 3+0.5-1] = [-1.5, 1, 2.5] -> relu [0, 1, 2.5] -> 2 + 7.5 = 9.5
  EXPECT_TRUE(all_close(seq(x), {10, 9.5}));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_ERROR(seq.at(5), "Sequential: index 5 is out of range for 3 modules");
  EXPECT_EQ(names_of(seq), (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
}

// ---- printing, as PyTorch's repr ----

TEST(ModuleRepr, D2lMultiHeadAttentionTreeAsTheTextPrintsIt) {
  MultiHeadAttention attention(100, 100, 100, 100, 5, 0.5);
  attention.eval();
  EXPECT_EQ(attention.repr(),
            "MultiHeadAttention(\n"
            "  (attention): DotProductAttention(\n"
            "    (dropout): Dropout(p=0.5, inplace=False)\n"
            "  )\n"
            "  (W_q): Linear(in_features=100, out_features=100, bias=False)\n"
            "  (W_k): Linear(in_features=100, out_features=100, bias=False)\n"
            "  (W_v): Linear(in_features=100, out_features=100, bias=False)\n"
            "  (W_o): Linear(in_features=100, out_features=100, bias=False)\n"
            ")");
}

TEST(ModuleRepr, WrapperAndFused) {
  // What torch 1.13 prints for the book's modules (dropout 0.0 prints as Python's float: "0.0").
  EXPECT_EQ(MultiHeadAttentionWrapper(3, 2, 6, 0.0, 2).repr(),
            "MultiHeadAttentionWrapper(\n"
            "  (heads): ModuleList(\n"
            "    (0): CausalAttention(\n"
            "      (W_query): Linear(in_features=3, out_features=2, bias=False)\n"
            "      (W_key): Linear(in_features=3, out_features=2, bias=False)\n"
            "      (W_value): Linear(in_features=3, out_features=2, bias=False)\n"
            "      (dropout): Dropout(p=0.0, inplace=False)\n"
            "    )\n"
            "    (1): CausalAttention(\n"
            "      (W_query): Linear(in_features=3, out_features=2, bias=False)\n"
            "      (W_key): Linear(in_features=3, out_features=2, bias=False)\n"
            "      (W_value): Linear(in_features=3, out_features=2, bias=False)\n"
            "      (dropout): Dropout(p=0.0, inplace=False)\n"
            "    )\n"
            "  )\n"
            ")");
  EXPECT_EQ(MultiHeadAttentionWrapper(4, 3, 8, 0.1, 2, true, true).repr(),
            "MultiHeadAttentionWrapper(\n"
            "  (heads): ModuleList(\n"
            "    (0): CausalAttention(\n"
            "      (W_query): Linear(in_features=4, out_features=3, bias=True)\n"
            "      (W_key): Linear(in_features=4, out_features=3, bias=True)\n"
            "      (W_value): Linear(in_features=4, out_features=3, bias=True)\n"
            "      (dropout): Dropout(p=0.1, inplace=False)\n"
            "    )\n"
            "    (1): CausalAttention(\n"
            "      (W_query): Linear(in_features=4, out_features=3, bias=True)\n"
            "      (W_key): Linear(in_features=4, out_features=3, bias=True)\n"
            "      (W_value): Linear(in_features=4, out_features=3, bias=True)\n"
            "      (dropout): Dropout(p=0.1, inplace=False)\n"
            "    )\n"
            "  )\n"
            "  (out_proj): Linear(in_features=6, out_features=6, bias=True)\n"
            ")");
  // The fused form prints under its C++ name, so that it never reads as d2l's MultiHeadAttention.
  EXPECT_EQ(CausalMultiHeadAttention(3, 2, 6, 0.0, 2).repr(),
            "CausalMultiHeadAttention(\n"
            "  (W_query): Linear(in_features=3, out_features=2, bias=False)\n"
            "  (W_key): Linear(in_features=3, out_features=2, bias=False)\n"
            "  (W_value): Linear(in_features=3, out_features=2, bias=False)\n"
            "  (out_proj): Linear(in_features=2, out_features=2, bias=True)\n"
            "  (dropout): Dropout(p=0.0, inplace=False)\n"
            ")");
  EXPECT_EQ(AdditiveAttention(2, 20, 8, 0.1).repr(),
            "AdditiveAttention(\n"
            "  (W_k): Linear(in_features=2, out_features=8, bias=False)\n"
            "  (W_q): Linear(in_features=20, out_features=8, bias=False)\n"
            "  (w_v): Linear(in_features=8, out_features=1, bias=False)\n"
            "  (dropout): Dropout(p=0.1, inplace=False)\n"
            ")");
}

TEST(ModuleRepr, LayersAndContainers) {
  EXPECT_EQ(nn::Linear(3, 2, false).repr(), "Linear(in_features=3, out_features=2, bias=False)");
  EXPECT_EQ(nn::Dropout(0.0).repr(), "Dropout(p=0.0, inplace=False)");
  EXPECT_EQ(nn::Dropout(1e-5).repr(), "Dropout(p=1e-05, inplace=False)");
  EXPECT_EQ(nn::Dropout(1).repr(), "Dropout(p=1.0, inplace=False)");
  EXPECT_EQ(nn::Embedding(7, 4).repr(), "Embedding(7, 4)");
  EXPECT_EQ(nn::LayerNorm(8).repr(), "LayerNorm((8,), eps=1e-05, elementwise_affine=True)");
  EXPECT_EQ(nn::LayerNorm(8, 1e-5, nn::LayerNorm::Style::Book).repr(), "LayerNorm()");  // the book's own class
  EXPECT_EQ(nn::GELU(true).repr(), "GELU(approximate='tanh')");
  EXPECT_EQ(nn::GELU(false).repr(), "GELU(approximate='none')");
  EXPECT_EQ(nn::ReLU().repr(), "ReLU()");
  nn::Sequential seq;
  seq.push_back(std::make_shared<nn::Linear>(2, 3));
  seq.push_back(std::make_shared<nn::ReLU>());
  EXPECT_EQ(seq.repr(), "Sequential(\n  (0): Linear(in_features=2, out_features=3, bias=True)\n  (1): ReLU()\n)");
  EXPECT_EQ(nn::ModuleList().repr(), "ModuleList()");
  EXPECT_EQ(Block().repr(), "Block(\n  width=4\n  (fc): Linear(in_features=4, out_features=2, bias=True)\n)");
}

TEST(ModuleRepr, PythonFloatRepr) {
  EXPECT_EQ(nn::py_float(0.0), "0.0");
  EXPECT_EQ(nn::py_float(-0.0), "-0.0");
  EXPECT_EQ(nn::py_float(0.5), "0.5");
  EXPECT_EQ(nn::py_float(0.1), "0.1");
  EXPECT_EQ(nn::py_float(2), "2.0");
  EXPECT_EQ(nn::py_float(123.25), "123.25");
  EXPECT_EQ(nn::py_float(0.0001), "0.0001");
  EXPECT_EQ(nn::py_float(1e-5), "1e-05");
  EXPECT_EQ(nn::py_float(2.5e-7), "2.5e-07");
  EXPECT_EQ(nn::py_float(1e15), "1000000000000000.0");
  EXPECT_EQ(nn::py_float(1e16), "1e+16");
  EXPECT_EQ(nn::py_float(-1.5e100), "-1.5e+100");
}

// =====================================================================================================
// Layers
// =====================================================================================================

TEST(Layers, LinearInitialisesLikePyTorch) {
  manual_seed(11);
  nn::Linear a(400, 300);
  const double bound = 1.0 / std::sqrt(400.0);
  for (const Tensor& t : {a.weight, a.bias}) {
    const auto v = values(t);
    double mn = 1, mx = -1, mean = 0, sq = 0;
    for (double x : v) {
      mn = std::min(mn, x);
      mx = std::max(mx, x);
      mean += x;
    }
    mean /= static_cast<double>(v.size());
    for (double x : v) sq += (x - mean) * (x - mean);
    EXPECT_GE(mn, -bound);
    EXPECT_LE(mx, bound);
    EXPECT_GT(mx, 0.95 * bound);  // uniform on the whole interval, not a narrower one
    EXPECT_LT(mn, -0.95 * bound);
    if (t.numel() > 1000) {
      EXPECT_NEAR(mean, 0, 0.002);
      EXPECT_NEAR(sq / static_cast<double>(v.size()), bound * bound / 3, 0.03 * bound * bound / 3);  // U(-b, b)
    }
  }
  manual_seed(11);
  nn::Linear b(400, 300);  // seeded: the same draw
  EXPECT_EQ(values(b.weight), values(a.weight));
  nn::Linear c(400, 300);
  EXPECT_NE(values(c.weight), values(a.weight));
}

TEST(Layers, LinearComputesXWtPlusB) {
  nn::Linear l(3, 2);
  set(l.weight, {1, 2, 3, -1, 0, 0.5});
  set(l.bias, {0.25, -1});
  const Tensor x = f32({1, 1, 1, 2, 0, -2}, {2, 3});
  EXPECT_TRUE(all_close(l(x), {6.25, -1.5, -3.75, -4}));
  EXPECT_TRUE(all_close(l(x.reshape({1, 2, 3})), {6.25, -1.5, -3.75, -4}));  // extra batch dims
  EXPECT_ERROR(l(zeros({2, 4})), "Linear: expected input with last dim 3, got shape [2, 4]");
  EXPECT_ERROR(nn::Linear(0, 2), "Linear: in_features and out_features must be positive, got 0 and 2");
}

TEST(Layers, EmbeddingGathersRowsAndIsNormal) {
  manual_seed(3);
  nn::Embedding e(1000, 64);
  const auto v = values(e.weight);
  double mean = 0, sq = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  EXPECT_NEAR(mean, 0, 0.02);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size())), 1, 0.02);
  nn::Embedding small(5, 2);
  set(small.weight, {0, 1, 10, 11, 20, 21, 30, 31, 40, 41});
  EXPECT_TRUE(all_close(small(i64({3, 0, 3, 4}, {2, 2})), {30, 31, 0, 1, 30, 31, 40, 41}));
}

TEST(Layers, LayerNormNormalisesWithBiasedVariance) {
  for (auto style : {nn::LayerNorm::Style::Torch, nn::LayerNorm::Style::Book}) {
    nn::LayerNorm ln(4, 1e-5, style);
    EXPECT_EQ(values(ln.weight), std::vector<double>(4, 1.0));
    EXPECT_EQ(values(ln.bias), std::vector<double>(4, 0.0));
    const Tensor x = f64({1, 2, 3, 4, -2, 0, 2, 8}, {2, 4});
    ln.to(DType::f64);
    const auto y = values(ln(x));
    for (int r = 0; r < 2; ++r) {
      double mean = 0, var = 0;
      for (int j = 0; j < 4; ++j) mean += y[r * 4 + j] / 4;
      for (int j = 0; j < 4; ++j) var += (y[r * 4 + j] - mean) * (y[r * 4 + j] - mean) / 4;
      EXPECT_NEAR(mean, 0, 1e-12);
      EXPECT_NEAR(var, 1, 1e-4);  // eps 1e-5 against variances 1.25 and 14
    }
    // row 0: mean 2.5, biased variance 1.25
    EXPECT_NEAR(y[0], -1.5 / std::sqrt(1.25 + 1e-5), 1e-12);
    set(ln.weight, {2, 2, 2, 2});
    set(ln.bias, {1, 1, 1, 1});
    EXPECT_NEAR(values(ln(x))[0], 1 + 2 * -1.5 / std::sqrt(1.25 + 1e-5), 1e-12);
    EXPECT_ERROR(ln(zeros({2, 5}, DType::f64)), "LayerNorm: expected input with last dim 4, got shape [2, 5]");
  }
}

TEST(Layers, GeluBothFormsAndRelu) {
  const std::vector<double> xs = {-3, -1, -0.25, 0, 0.5, 2};
  const Tensor x = f64(xs, {6});
  const auto exact = values(nn::GELU(false)(x)), approx = values(nn::GELU(true)(x));
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    EXPECT_NEAR(exact[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-14);
    EXPECT_NEAR(approx[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-14);
  }
  EXPECT_NEAR(exact[4], 0.34573123063700656, 1e-15);
  EXPECT_NEAR(approx[4], 0.34571400982514394, 1e-15);  // the tanh approximation differs in the 5th digit
  EXPECT_TRUE(all_close(nn::ReLU()(x), {0, 0, 0, 0, 0.5, 2}, 0, 0));
}

TEST(Layers, DropoutEvalIsIdentity) {
  nn::Dropout d(0.5);
  d.eval();
  const Tensor x = rnd({4, 5}, 1);
  EXPECT_EQ(values(d(x)), values(x));
  nn::Dropout none(0.0);  // p = 0 in training is the identity too
  EXPECT_EQ(values(none(x)), values(x));
  EXPECT_ERROR(nn::Dropout(1.5), "Dropout: p must be in [0, 1], got 1.5");
}

TEST(Layers, DropoutTrainZeroesAboutPAndScalesTheRest) {
  const double p = 0.3;
  nn::Dropout d(p);
  ASSERT_TRUE(d.is_training());
  manual_seed(2024);
  const Tensor x = ones({200000});
  const auto y = d(x).to_vector<float>();
  int64_t zeros_n = 0;
  for (float v : y) {
    if (v == 0)
      ++zeros_n;
    else
      EXPECT_EQ(v, static_cast<float>(1.0 / (1.0 - p)));
  }
  EXPECT_NEAR(static_cast<double>(zeros_n) / 200000.0, p, 0.005);

  // Same seed, same mask; another seed (or the next draw), another mask.
  manual_seed(7);
  const auto m1 = d(ones({1000})).to_vector<float>();
  const auto m1_next = d(ones({1000})).to_vector<float>();
  manual_seed(7);
  const auto m2 = d(ones({1000})).to_vector<float>();
  manual_seed(8);
  const auto m3 = d(ones({1000})).to_vector<float>();
  EXPECT_EQ(m1, m2);
  EXPECT_NE(m1, m3);
  EXPECT_NE(m1, m1_next);

  // Backward lets the gradient through exactly where the forward kept the value, scaled alike.
  manual_seed(9);
  const Tensor xr = rnd({1000}, 4, 1.0, DType::f32);
  const Tensor yr = d(xr);
  yr.backward(ones({1000}));
  const auto yv = values(yr), gv = values(xr.grad()), xv = values(xr);
  for (size_t i = 0; i < yv.size(); ++i) {
    if (yv[i] == 0 && xv[i] != 0)
      EXPECT_EQ(gv[i], 0);
    else
      EXPECT_FLOAT_EQ(static_cast<float>(gv[i]), static_cast<float>(1.0 / (1.0 - p)));
  }
}

// =====================================================================================================
// masked_softmax (d2l 10.3)
// =====================================================================================================

namespace {
// d2l's masked_softmax with its -1e6 fill, for rows with at least one valid entry.
std::vector<double> d2l_masked_softmax(const std::vector<double>& x, int64_t rows, int64_t K,
                                       const std::vector<int64_t>& row_lens) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < K; ++j) mx = std::max(mx, j < row_lens[r] ? x[r * K + j] : -1e6);
    for (int64_t j = 0; j < K; ++j) sum += std::exp((j < row_lens[r] ? x[r * K + j] : -1e6) - mx);
    for (int64_t j = 0; j < K; ++j) y[r * K + j] = std::exp((j < row_lens[r] ? x[r * K + j] : -1e6) - mx) / sum;
  }
  return y;
}

// Entries at or past each row's length are exactly 0, the others positive, rows sum to 1.
void expect_masked(const Tensor& y, const std::vector<int64_t>& row_lens, int64_t K) {
  const auto v = values(y);
  for (size_t r = 0; r < row_lens.size(); ++r) {
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) {
      const double w = v[r * K + j];
      if (j < row_lens[r])
        EXPECT_GT(w, 0) << "row " << r << " col " << j;
      else
        EXPECT_EQ(w, 0) << "row " << r << " col " << j;
      sum += w;
    }
    EXPECT_NEAR(sum, 1, 1e-6) << "row " << r;
  }
}
}  // namespace

TEST(MaskedSoftmax, D2lExamples) {
  manual_seed(0);
  const Tensor X = rand({2, 2, 4});
  // masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3])): lengths 2, 2 | 3, 3
  const Tensor y1 = masked_softmax(X, i64({2, 3}, {2}));
  EXPECT_EQ(y1.shape(), (Shape{2, 2, 4}));
  expect_masked(y1, {2, 2, 3, 3}, 4);
  EXPECT_TRUE(all_close(y1, d2l_masked_softmax(values(X), 4, 4, {2, 2, 3, 3}), 1e-7, 1e-6));
  // masked_softmax(torch.rand(2, 2, 4), torch.tensor([[1, 3], [2, 4]])): one length per row
  const Tensor y2 = masked_softmax(X, i64({1, 3, 2, 4}, {2, 2}));
  expect_masked(y2, {1, 3, 2, 4}, 4);
  EXPECT_EQ(values(y2)[0], 1.0);  // a single valid entry takes all the weight, as printed: [1, 0, 0, 0]
  EXPECT_TRUE(all_close(y2, d2l_masked_softmax(values(X), 4, 4, {1, 3, 2, 4}), 1e-7, 1e-6));
  // no valid_lens: a plain softmax over the last axis
  EXPECT_TRUE(all_close(masked_softmax(X, Tensor()), softmax(X, -1), 0, 0));
}

TEST(MaskedSoftmax, ZeroLengthRowsAreZeroWithZeroGradientNeverNaN) {
  const Tensor X = rnd({2, 3, 4}, 5, 2.0);
  const Tensor y = masked_softmax(X, i64({0, 2, 4, 1, 0, 3}, {2, 3}));
  expect_masked(y.narrow(0, 0, 1).narrow(1, 1, 2), {2, 4}, 4);
  const auto v = values(y);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(v[0 * 4 + j], 0);  // d2l's -1e6 trick would give 1/4 here
    EXPECT_EQ(v[4 * 4 + j], 0);
  }
  mul(y, rnd({2, 3, 4}, 6)).sum().backward();
  const auto g = values(X.grad());
  for (double d : g) EXPECT_TRUE(std::isfinite(d));
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(g[0 * 4 + j], 0);
    EXPECT_EQ(g[4 * 4 + j], 0);
  }
  // positions past a row's length get no gradient either
  EXPECT_EQ(g[1 * 4 + 2], 0);
  EXPECT_EQ(g[1 * 4 + 3], 0);
  EXPECT_NE(g[1 * 4 + 0], 0);
  // a 1-D zero: every row of that batch entry
  const Tensor y1 = masked_softmax(X, i64({0, 4}, {2}));
  for (int j = 0; j < 12; ++j) EXPECT_EQ(values(y1)[j], 0);
}

TEST(MaskedSoftmax, BadInput) {
  const Tensor X = rand({2, 2, 4});
  EXPECT_ERROR(masked_softmax(rand({4}), Tensor()), "masked_softmax: expected scores of shape (..., queries, keys)");
  EXPECT_ERROR(masked_softmax(X, i64({1, 2, 3}, {3})), "masked_softmax: valid_lens of shape [3]");
  EXPECT_ERROR(masked_softmax(X, i64({1, 5}, {2})),
               "masked_softmax: valid length 5 is out of range for 4 keys (expected 0..4)");
  EXPECT_ERROR(masked_softmax(X, i64({-1, 2}, {2})), "masked_softmax: valid length -1 is out of range");
}

// =====================================================================================================
// d2l 10.3: AdditiveAttention and DotProductAttention, the text's worked example
// =====================================================================================================

TEST(D2lScoring, AdditiveAttentionWorkedExample) {
  manual_seed(0);
  const Tensor queries = randn({2, 1, 20});  // torch.normal(0, 1, (2, 1, 20))
  AdditiveAttention attention(2, 20, 8, 0.1);
  attention.eval();
  const Tensor out = attention(queries, d2l_keys(), d2l_values(), d2l_valid_lens());
  EXPECT_EQ(out.shape(), (Shape{2, 1, 4}));
  // tensor([[[ 2.0000,  3.0000,  4.0000,  5.0000]], [[10.0000, 11.0000, 12.0000, 13.0000]]])
  EXPECT_TRUE(all_close(out, {2, 3, 4, 5, 10, 11, 12, 13}, 1e-5, 1e-6));
  // identical keys: uniform weights over the valid ones, exactly zero past them
  const Tensor w = attention.attention_weights;
  EXPECT_EQ(w.shape(), (Shape{2, 1, 10}));
  EXPECT_FALSE(w.requires_grad());
  std::vector<double> expect(20, 0.0);
  for (int j = 0; j < 2; ++j) expect[j] = 0.5;
  for (int j = 0; j < 6; ++j) expect[10 + j] = 1.0 / 6;
  EXPECT_TRUE(all_close(w, expect, 1e-7, 1e-6));
}

TEST(D2lScoring, DotProductAttentionWorkedExample) {
  manual_seed(1);
  const Tensor queries = randn({2, 1, 2});
  DotProductAttention attention(0.5);
  attention.eval();
  const Tensor out = attention(queries, d2l_keys(), d2l_values(), d2l_valid_lens());
  EXPECT_TRUE(all_close(out, {2, 3, 4, 5, 10, 11, 12, 13}, 1e-5, 1e-6));
  EXPECT_EQ(attention.attention_weights.shape(), (Shape{2, 1, 10}));

  // In training, dropout(0.5) acts on the weights (not on attention_weights, which d2l keeps undropped).
  attention.train();
  manual_seed(5);
  const Tensor trained = attention(queries, d2l_keys(), d2l_values(), d2l_valid_lens());
  EXPECT_FALSE(all_close(trained, out, 1e-3, 0));
  EXPECT_TRUE(all_close(attention.attention_weights.sum({-1}), {1, 1}, 1e-6, 0));
}

TEST(D2lScoring, DotProductScalesBySqrtD) {
  // scores = q k^T / sqrt(d): with q = (2, 0, 0, 0) and keys e0, 0 the weights are softmax([1, 0]).
  DotProductAttention attention(0.0);
  const Tensor q = f64({2, 0, 0, 0}, {1, 1, 4});
  const Tensor k = f64({1, 0, 0, 0, 0, 0, 0, 0}, {1, 2, 4});
  const Tensor v = f64({1, 0}, {1, 2, 1});
  const double e = std::exp(1.0);
  EXPECT_TRUE(all_close(attention(q, k, v), {e / (e + 1)}, 1e-14, 0));
}

// =====================================================================================================
// d2l 10.5: MultiHeadAttention
// =====================================================================================================

TEST(D2lMultiHead, WorkedExampleShape) {
  MultiHeadAttention attention(100, 100, 100, 100, 5, 0.5);
  attention.eval();
  const Tensor X = ones({2, 4, 100}), Y = ones({2, 6, 100});
  const Tensor out = attention(X, Y, Y, i64({3, 2}, {2}));
  EXPECT_EQ(out.shape(), (Shape{2, 4, 100}));  // torch.Size([2, 4, 100])
  // Per-head weights (B, H, Q, K): every head masks by its batch entry's valid length; identical keys
  // give uniform weights over the valid ones.
  const Tensor w = attention.attention_weights;
  ASSERT_EQ(w.shape(), (Shape{2, 5, 4, 6}));
  const auto wv = values(w);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 5; ++h)
      for (int q = 0; q < 4; ++q)
        for (int k = 0; k < 6; ++k) {
          const int len = b == 0 ? 3 : 2;
          EXPECT_NEAR(wv[((b * 5 + h) * 4 + q) * 6 + k], k < len ? 1.0 / len : 0.0, 1e-6);
        }
  EXPECT_EQ(attention.attention->attention_weights.shape(), (Shape{10, 4, 6}));  // d2l's (B*H, Q, K)
}

TEST(D2lMultiHead, CrossAttentionWithDifferentSizesMatchesPerHeadComputation) {
  // query 5, key 3, value 4 features; Q 3, K 5; 2 heads of 4 (num_hiddens 8); 2-D valid_lens with a zero.
  manual_seed(42);
  MultiHeadAttention m(3, 5, 4, 8, 2, 0.0, true);
  m.to(DType::f64);
  const Tensor q = rnd({2, 3, 5}, 1), k = rnd({2, 5, 3}, 2), v = rnd({2, 5, 4}, 3);
  const Tensor vl = i64({1, 5, 0, 3, 2, 4}, {2, 3});
  const Tensor out = m.forward(q, k, v, vl);
  ASSERT_EQ(out.shape(), (Shape{2, 3, 8}));
  ASSERT_EQ(m.attention_weights.shape(), (Shape{2, 2, 3, 5}));
  // Reference: head h uses features [4h, 4h + 4) of the projections, DotProductAttention, concatenation.
  std::vector<Tensor> heads;
  DotProductAttention dot(0.0);
  const Tensor pq = m.W_q->forward(q), pk = m.W_k->forward(k), pv = m.W_v->forward(v);
  for (int64_t h = 0; h < 2; ++h) {
    heads.push_back(dot(pq.narrow(2, 4 * h, 4), pk.narrow(2, 4 * h, 4), pv.narrow(2, 4 * h, 4), vl));
    EXPECT_TRUE(all_close(m.attention_weights.select(1, h), dot.attention_weights, 1e-14, 0)) << "head " << h;
  }
  EXPECT_TRUE(all_close(out, m.W_o->forward(cat(heads, -1)), 1e-13, 0));
  // row (b 0, q 2) has length 0: zero weights in every head, so that row's context is W_o's bias alone
  const auto w = values(m.attention_weights);
  for (int h = 0; h < 2; ++h)
    for (int kk = 0; kk < 5; ++kk) EXPECT_EQ(w[((0 * 2 + h) * 3 + 2) * 5 + kk], 0);
  EXPECT_TRUE(all_close(out.select(0, 0).select(0, 2), values(m.W_o->bias), 1e-14, 0));
}

// =====================================================================================================
// The book's ch. 3: CausalAttention, MultiHeadAttentionWrapper, fused MultiHeadAttention
// =====================================================================================================

TEST(BookCh3, ShapesOnTheBooksInputs) {
  const Tensor batch = book_batch();
  ASSERT_EQ(batch.shape(), (Shape{2, 6, 3}));
  manual_seed(123);
  const int64_t context_length = batch.size(1);
  MultiHeadAttentionWrapper mha(3, 2, context_length, 0.0, 2);
  EXPECT_EQ(mha(batch).shape(), (Shape{2, 6, 4}));  // context_vecs.shape: torch.Size([2, 6, 4])
  CausalMultiHeadAttention fused(3, 2, context_length, 0.0, 2);
  EXPECT_EQ(fused(batch).shape(), (Shape{2, 6, 2}));  // torch.Size([2, 6, 2])
  CausalAttention single(3, 2, context_length, 0.0);
  EXPECT_EQ(single(batch).shape(), (Shape{2, 6, 2}));
}

TEST(BookCh3, PrintedOutputsFromTorchsSeed123Weights) {
  // headlab's generator is not torch's, so the book's torch.manual_seed(123) weights are copied in
  // (from torch 1.13); everything after that is headlab's own arithmetic.
  MultiHeadAttentionWrapper mha(3, 2, 6, 0.0, 2);
  auto h0 = mha.heads->at<CausalAttention>(0), h1 = mha.heads->at<CausalAttention>(1);
  set(h0->W_query->weight, {-0.235429645f, 0.0191244762f, -0.286745936f, 0.217726618f, -0.49193421f, 0.423223078f});
  set(h0->W_key->weight, {-0.419641405f, -0.459017664f, -0.364820182f, 0.261478186f, -0.213326395f, 0.216052175f});
  set(h0->W_value->weight, {-0.490014136f, -0.350292057f, -0.211989194f, -0.11346072f, -0.440439373f, 0.378043622f});
  set(h1->W_query->weight, {-0.13615717f, 0.185322329f, 0.408269495f, 0.107563816f, 0.157876849f, 0.557292342f});
  set(h1->W_key->weight, {-0.260390401f, 0.182876408f, -0.256872445f, 0.41260317f, 0.461104512f, -0.532300949f});
  set(h1->W_value->weight, {0.492852628f, 0.275693059f, 0.251590222f, 0.237680584f, 0.479950726f, -0.0762330666f});
  const std::vector<double> printed_wrapper = {-0.4519, 0.2216,  0.4772, 0.1063, -0.5874, 0.0058,  0.5891, 0.3257,
                                               -0.6300, -0.0632, 0.6202, 0.3860, -0.5675, -0.0843, 0.5478, 0.3589,
                                               -0.5526, -0.0981, 0.5321, 0.3428, -0.5299, -0.1081, 0.5077, 0.3493};
  const Tensor got = mha(book_batch());
  EXPECT_TRUE(all_close(got.select(0, 0), printed_wrapper, 5.1e-5, 0));
  EXPECT_TRUE(all_close(got.select(0, 1), printed_wrapper, 5.1e-5, 0));

  CausalMultiHeadAttention fused(3, 2, 6, 0.0, 2);
  set(fused.W_query->weight, {-0.235429645f, 0.0191244762f, -0.286745936f, 0.217726618f, -0.49193421f, 0.423223078f});
  set(fused.W_key->weight, {-0.419641405f, -0.459017664f, -0.364820182f, 0.261478186f, -0.213326395f, 0.216052175f});
  set(fused.W_value->weight, {-0.490014136f, -0.350292057f, -0.211989194f, -0.11346072f, -0.440439373f, 0.378043622f});
  set(fused.out_proj->weight, {-0.166757792f, 0.22697258f, 0.500025988f, 0.131738231f});
  set(fused.out_proj->bias, {0.193358868f, 0.682540953f});
  const std::vector<double> printed_fused = {0.3190, 0.4858, 0.2943, 0.3897, 0.2856, 0.3593,
                                             0.2693, 0.3873, 0.2639, 0.3928, 0.2575, 0.4028};
  const Tensor got_fused = fused(book_batch());
  EXPECT_TRUE(all_close(got_fused.select(0, 0), printed_fused, 5.1e-5, 0));
  EXPECT_TRUE(all_close(got_fused.select(0, 1), printed_fused, 5.1e-5, 0));
}

TEST(BookCh3, PerHeadBatchedMatmulExample) {
  // a: (b, num_heads, num_tokens, head_dim) = (1, 2, 3, 4); a @ a.transpose(2, 3) is one product per head.
  const Tensor a = f32({0.2745, 0.6584, 0.2775, 0.8573, 0.8993, 0.0390, 0.9268, 0.7388, 0.7179, 0.7058, 0.9156, 0.4340,
                        0.0772, 0.3565, 0.1479, 0.5331, 0.4066, 0.2318, 0.4545, 0.9737, 0.4606, 0.5159, 0.4220, 0.5786},
                       {1, 2, 3, 4});
  const Tensor r = matmul(a, a.transpose(2, 3));
  const std::vector<double> printed = {1.3208, 1.1631, 1.2879, 1.1631, 2.2150, 1.8424, 1.2879, 1.8424, 2.0402,
                                       0.4391, 0.7003, 0.5903, 0.7003, 1.3737, 1.0620, 0.5903, 1.0620, 0.9912};
  const auto v = values(r);
  ASSERT_EQ(r.shape(), (Shape{1, 2, 3, 3}));
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(std::round(v[i] * 1e4), std::round(printed[i] * 1e4)) << i;
  EXPECT_EQ(to_string(r),
            "tensor([[[[1.3208, 1.1631, 1.2879],\n"
            "          [1.1631, 2.2150, 1.8424],\n"
            "          [1.2879, 1.8424, 2.0402]],\n"
            "\n"
            "         [[0.4391, 0.7003, 0.5903],\n"
            "          [0.7003, 1.3737, 1.0620],\n"
            "          [0.5903, 1.0620, 0.9912]]]])");
  // first_head = a[0, 0]; first_head @ first_head.T is the same block
  for (int64_t h = 0; h < 2; ++h) {
    const Tensor head = a.select(0, 0).select(0, h);
    EXPECT_TRUE(all_close(matmul(head, head.mT()), r.select(0, 0).select(0, h), 0, 0)) << "head " << h;
  }
}

TEST(BookCh3, CausalAttentionSeesOnlyThePast) {
  manual_seed(5);
  CausalAttention ca(4, 3, 8, 0.0, true);
  ca.to(DType::f64);
  ca.keep_attention_weights = true;
  const Tensor x = rnd({2, 6, 4}, 1);
  const Tensor y = ca(x);
  const Tensor w = ca.attention_weights;
  ASSERT_EQ(w.shape(), (Shape{2, 6, 6}));
  const auto wv = values(w);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 6; ++i) {
      double sum = 0;
      for (int j = 0; j < 6; ++j) {
        if (j > i) {
          EXPECT_EQ(wv[(b * 6 + i) * 6 + j], 0);
        }
        sum += wv[(b * 6 + i) * 6 + j];
      }
      EXPECT_NEAR(sum, 1, 1e-12);
    }
  EXPECT_NEAR(wv[0], 1.0, 0);  // the first token attends to itself alone
  // Changing the last token changes nothing before it.
  Tensor x2 = x.detach().clone();
  {
    NoGradGuard ng;
    x2.narrow(1, 5, 1).fill_(7.0);
  }
  const Tensor y2 = ca(x2);
  EXPECT_TRUE(all_close(y2.narrow(1, 0, 5), y.narrow(1, 0, 5), 0, 0));
  EXPECT_FALSE(all_close(y2.narrow(1, 5, 1), y.narrow(1, 5, 1), 1e-6, 0));
  // Fewer tokens than context_length use the leading block of the mask.
  EXPECT_EQ(ca(rnd({1, 1, 4}, 2)).shape(), (Shape{1, 1, 3}));
}

TEST(BookCh3, WrapperConcatenatesItsHeads) {
  manual_seed(8);
  MultiHeadAttentionWrapper w(3, 2, 6, 0.0, 3);
  const Tensor x = book_batch();
  const Tensor out = w(x);
  ASSERT_EQ(out.shape(), (Shape{2, 6, 6}));
  for (int64_t h = 0; h < 3; ++h)
    EXPECT_TRUE(all_close(out.narrow(2, 2 * h, 2), w.heads->at<CausalAttention>(h)->forward(x), 0, 0)) << h;
}

// =====================================================================================================
// Head gates
// =====================================================================================================

TEST(HeadGates, DefaultOnesAreANoOpAndZeroRemovesAHead) {
  manual_seed(3);
  MultiHeadAttention m(3, 5, 4, 8, 4, 0.0, true);
  m.to(DType::f64);
  const Tensor q = rnd({2, 3, 5}, 1), k = rnd({2, 5, 3}, 2), v = rnd({2, 5, 4}, 3);
  const Tensor vl = i64({2, 5}, {2});
  const Tensor base = m.forward(q, k, v, vl);
  EXPECT_TRUE(all_close(m.forward(q, k, v, vl, ones({4}, DType::f64)), base, 0, 0));
  const Tensor g = f64({1, 1, 0, 1}, {4});
  const Tensor gated = m.forward(q, k, v, vl, g);
  EXPECT_FALSE(all_close(gated, base, 1e-6, 0));
  // module-level gates (heads.gates) act the same, and an explicit argument overrides them
  m.heads.gates = g;
  EXPECT_TRUE(all_close(m.forward(q, k, v, vl), gated, 0, 0));
  EXPECT_TRUE(all_close(m.forward(q, k, v, vl, ones({4}, DType::f64)), base, 0, 0));
  m.heads.gates = Tensor();
  // gate 0 on head 2 == head 2's values projected to zero (W_v rows [4, 6) and their bias)
  {
    NoGradGuard ng;
    m.W_v->weight.detach().narrow(0, 4, 2).zero_();
    m.W_v->bias.detach().narrow(0, 4, 2).zero_();
  }
  EXPECT_TRUE(all_close(gated, m.forward(q, k, v, vl), 1e-14, 0));
}

TEST(HeadGates, GradientIsEachHeadsContributionInEveryForm) {
  // dL/dgate_h = sum(dL/dctx_h * ctx_h): with L = sum(out) and linear heads this is what gating zero
  // removes (the first-order head-importance score); checked against a finite difference of L.
  manual_seed(4);
  MultiHeadAttentionWrapper w(4, 2, 8, 0.0, 3, true, true);
  w.to(DType::f64);
  auto f = nn::wrapper_to_fused(w);
  const Tensor x = rnd({2, 5, 4}, 11);
  for (nn::CausalMultiHead* m : {static_cast<nn::CausalMultiHead*>(&w), static_cast<nn::CausalMultiHead*>(f.get())}) {
    const Tensor g = leaf(f64({1, 0.5, 2}, {3}));
    m->forward(x, g).sum().backward();
    const auto dg = values(g.grad());
    for (int h = 0; h < 3; ++h) {
      const double eps = 1e-6;
      std::vector<double> gp = {1, 0.5, 2}, gm = gp;
      gp[h] += eps;
      gm[h] -= eps;
      const double num =
          (m->forward(x, f64(gp, {3})).sum().item<double>() - m->forward(x, f64(gm, {3})).sum().item<double>()) /
          (2 * eps);
      EXPECT_NEAR(dg[h], num, 1e-7) << "head " << h;
    }
  }
}

TEST(HeadGates, OffsetsImplementMeanAblation) {
  manual_seed(6);
  CausalMultiHeadAttention f(4, 6, 8, 0.0, 2);
  f.to(DType::f64);
  const Tensor x = rnd({1, 3, 4}, 2);
  f.head_control.keep_context = true;
  f(x);
  ASSERT_EQ(f.head_control.context.shape(), (Shape{1, 2, 3, 3}));
  // gate 0 and offset c on head 1: its context becomes c at every position
  f.head_control.gates = f64({1, 0}, {2});
  f.head_control.offsets = f64({0, 0, 0, 0.5, -1, 2}, {2, 3});
  const Tensor ablated = f(x);
  const Tensor ctx0 = f.head_control.context.select(1, 0);  // (1, 3, 3), ungated
  const Tensor c = f64({0.5, -1, 2}, {1, 1, 3}).expand({1, 3, 3});
  EXPECT_TRUE(all_close(ablated, f.out_proj->forward(cat({ctx0, c}, -1)), 1e-14, 0));
}

TEST(HeadGates, PerRowAndPerPositionControlsInBothForms) {
  // gates (B, H, T) and offsets (B, H, T, D): context c becomes g * c + o element by element;
  // (B, H) gates and (B, H, D) offsets are the same values broadcast over positions.
  manual_seed(8);
  MultiHeadAttentionWrapper w(4, 2, 8, 0.0, 3, true, true);
  w.to(DType::f64);
  auto f = nn::wrapper_to_fused(w);
  const int64_t B = 2, H = 3, T = 5, D = 2;
  const Tensor x = rnd({B, T, 4}, 12);
  const Tensor g = rnd({B, H, T}, 13), o = rnd({B, H, T, D}, 14);
  const Tensor g_row = rnd({B, H}, 15), o_row = rnd({B, H, D}, 16);
  for (nn::CausalMultiHead* m : {static_cast<nn::CausalMultiHead*>(&w), static_cast<nn::CausalMultiHead*>(f.get())}) {
    nn::HeadControl& hc = m->control();
    hc.keep_context = true;
    m->forward(x);
    const Tensor ctx = hc.context;  // (B, H, T, D)
    hc.keep_context = false;
    auto projected = [&](const Tensor& c) { return f->out_proj->forward(c.transpose(1, 2).reshape({B, T, H * D})); };
    hc.gates = g;
    hc.offsets = o;
    EXPECT_TRUE(all_close(m->forward(x), projected(add(mul(ctx, g.unsqueeze(-1)), o)), 1e-13, 0)) << m->type_name();
    hc.gates = g_row;
    hc.offsets = o_row;
    const Tensor expected = projected(add(mul(ctx, g_row.view({B, H, 1, 1})), o_row.view({B, H, 1, D})));
    EXPECT_TRUE(all_close(m->forward(x), expected, 1e-13, 0)) << m->type_name();
    hc.gates = ones({B + 1, H}, DType::f64);
    EXPECT_NE(error_of([&] { m->forward(x); }).find("head gates must have shape [3], [2, 3] or [2, 3, 5], got [3, 3]"),
              std::string::npos)
        << error_of([&] { m->forward(x); });
    hc.gates = Tensor();
    hc.offsets = ones({B, H, T}, DType::f64);
    EXPECT_NE(error_of([&] { m->forward(x); }).find("head offsets must have shape [3, 2], [2, 3, 2] or [2, 3, 5, 2]"),
              std::string::npos);
    hc.offsets = Tensor();
    // Given contexts replace the computed ones (analysis replays a layer from recorded contexts).
    hc.given_context = mul(ctx, 2.0);
    EXPECT_TRUE(all_close(m->forward(x), projected(mul(ctx, 2.0)), 1e-13, 0)) << m->type_name();
    hc.given_context = ctx.narrow(2, 0, T - 1);
    EXPECT_NE(
        error_of([&] { m->forward(x); }).find("the given head contexts must have shape [2, 3, 5, 2], got [2, 3, 4, 2]"),
        std::string::npos)
        << error_of([&] { m->forward(x); });
    hc.given_context = Tensor();
  }
}

// =====================================================================================================
// Bad input: clear errors naming the module
// =====================================================================================================

TEST(AttentionErrors, Messages) {
  DotProductAttention dot(0.0);
  const Tensor keys = d2l_keys(), vals = d2l_values(), vl = d2l_valid_lens();
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 2}), keys, vals);
            }),
            "DotProductAttention: queries must be 3-D (batch, length, features), got shape [2, 2]");
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 1, 2}), ones({3, 10, 2}), vals);
            }),
            "DotProductAttention: batch sizes differ: queries [2, 1, 2], keys [3, 10, 2], values [2, 10, 4]");
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 1, 3}), keys, vals);
            }),
            "DotProductAttention: queries [2, 1, 3] and keys [2, 10, 2] must have the same feature size");
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 1, 2}), keys, ones({2, 9, 4}));
            }),
            "DotProductAttention: keys [2, 10, 2] and values [2, 9, 4] must have the same length");
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 1, 2}), keys, vals, i64({1, 2, 3}, {3}));
            }),
            "DotProductAttention: valid_lens must have shape [2] or [2, 1], got [3]");
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 1, 2}), keys, vals, f32({1, 2}, {2}));
            }),
            "DotProductAttention: valid_lens must be int64, got float32");
  EXPECT_EQ(error_of([&] {
              dot(ones({2, 1, 2}), keys, vals, i64({2, 11}, {2}));
            }),
            "DotProductAttention: valid length 11 is out of range for 10 keys (expected 0..10)");

  AdditiveAttention add_att(2, 20, 8, 0.1);
  EXPECT_EQ(error_of([&] {
              add_att(ones({2, 1, 20}), keys, vals, i64({-1, 2}, {2}));
            }),
            "AdditiveAttention: valid length -1 is out of range for 10 keys (expected 0..10)");
  EXPECT_EQ(error_of([&] {
              add_att(ones({2, 1, 19}), keys, vals);
            }),
            "AdditiveAttention: queries must have 20 features, got shape [2, 1, 19]");
  EXPECT_EQ(error_of([&] {
              add_att(ones({2, 1, 20}), ones({2, 10}), vals);
            }),
            "AdditiveAttention: keys must be 3-D (batch, length, features), got shape [2, 10]");

  MultiHeadAttention mha(100, 100, 100, 100, 5, 0.5);
  const Tensor X = ones({2, 4, 100}), Y = ones({2, 6, 100});
  EXPECT_EQ(error_of([&] {
              mha(X, Y, Y, i64({3, 2, 1}, {3}));
            }),
            "MultiHeadAttention: valid_lens must have shape [2] or [2, 4], got [3]");
  EXPECT_EQ(error_of([&] {
              mha(X, Y, Y, i64({3, 2, 1, 7, 1, 1, 1, 1}, {2, 4}));
            }),
            "MultiHeadAttention: valid length 7 is out of range for 6 keys (expected 0..6)");
  EXPECT_EQ(error_of([&] {
              mha(ones({3, 4, 100}), Y, Y);
            }),
            "MultiHeadAttention: batch sizes differ: queries [3, 4, 100], keys [2, 6, 100], values [2, 6, 100]");
  EXPECT_EQ(error_of([&] {
              mha(ones({2, 4, 99}), Y, Y);
            }),
            "MultiHeadAttention: queries must have 100 features, got shape [2, 4, 99]");
  EXPECT_EQ(error_of([&] { mha.forward(X, Y, Y, Tensor(), ones({4})); }),
            "MultiHeadAttention: head gates must have shape [5], [2, 5] or [2, 5, 4], got [4]");
  EXPECT_EQ(error_of([&] { MultiHeadAttention(100, 100, 100, 100, 3, 0.5); }),
            "MultiHeadAttention: num_hiddens 100 must be a positive multiple of num_heads 3");

  CausalAttention ca(3, 2, 8, 0.0);
  EXPECT_EQ(error_of([&] { ca(ones({1, 9, 3})); }), "CausalAttention: 9 tokens exceed context_length 8");
  EXPECT_EQ(error_of([&] { ca(ones({9, 3})); }), "CausalAttention: expected x of shape (batch, tokens, 3), got [9, 3]");
  EXPECT_EQ(error_of([&] {
              ca(ones({1, 4, 5}));
            }),
            "CausalAttention: expected x of shape (batch, tokens, 3), got [1, 4, 5]");

  MultiHeadAttentionWrapper w(3, 2, 8, 0.0, 2);
  EXPECT_EQ(error_of([&] { w(ones({2, 9, 3})); }), "MultiHeadAttentionWrapper: 9 tokens exceed context_length 8");
  EXPECT_EQ(error_of([&] {
              w.forward(ones({2, 4, 3}), ones({3}));
            }),
            "MultiHeadAttentionWrapper: head gates must have shape [2], [2, 2] or [2, 2, 4], got [3]");

  CausalMultiHeadAttention f(3, 4, 8, 0.0, 2);
  EXPECT_EQ(error_of([&] { f(ones({2, 9, 3})); }), "CausalMultiHeadAttention: 9 tokens exceed context_length 8");
  EXPECT_EQ(error_of([&] {
              f(ones({2, 4}));
            }),
            "CausalMultiHeadAttention: expected x of shape (batch, tokens, 3), got [2, 4]");
  EXPECT_EQ(error_of([&] {
              f.forward(ones({2, 4, 3}), ones({2, 1}));
            }),
            "CausalMultiHeadAttention: head gates must have shape [2], [2, 2] or [2, 2, 4], got [2, 1]");
  EXPECT_EQ(error_of([&] { CausalMultiHeadAttention(3, 5, 8, 0.0, 2); }),
            "CausalMultiHeadAttention: d_out 5 must be divisible by num_heads 2");
  EXPECT_EQ(error_of([&] { CausalMultiHeadAttention(3, 4, 0, 0.0, 2); }),
            "CausalMultiHeadAttention: context_length must be positive, got 0");
}

// =====================================================================================================
// Wrapper <-> fused conversion
// =====================================================================================================

namespace {

struct ConvCase {
  bool out_proj, qkv_bias, gates;
};

// a and b on the same input and gates: outputs, attention weights, and gradients of x and gates.
void expect_same_function(nn::CausalMultiHead& a, nn::CausalMultiHead& b, DType dt, bool use_gates, double tol) {
  a.keep_attention_weights(true);
  b.keep_attention_weights(true);
  const Tensor x = rnd({2, 5, 4}, 21, 1.0, dt), xb = leaf(x);
  const Tensor g = use_gates ? leaf(f64({1, 0, 0.5}, {3}).to(dt)) : Tensor();
  const Tensor gb = use_gates ? leaf(g) : Tensor();
  const Tensor ya = a.forward(x, g), yb = b.forward(xb, gb);
  EXPECT_EQ(ya.dtype(), dt);
  EXPECT_TRUE(close(ya, yb, tol));
  EXPECT_TRUE(close(a.last_attention_weights(), b.last_attention_weights(), tol));
  const Tensor dout = rnd(ya.shape(), 22, 1.0, dt).detach();
  ya.backward(dout);
  yb.backward(dout);
  EXPECT_TRUE(close(x.grad(), xb.grad(), tol));
  if (use_gates) {
    EXPECT_TRUE(close(g.grad(), gb.grad(), tol));
  }
}

}  // namespace

TEST(Conversion, WrapperToFusedAndBack) {
  for (const ConvCase c : {ConvCase{false, false, false}, ConvCase{true, false, false}, ConvCase{false, true, true},
                           ConvCase{true, true, true}, ConvCase{true, false, true}}) {
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(std::string("out_proj ") + nn::py_bool(c.out_proj) + ", qkv_bias " + nn::py_bool(c.qkv_bias) +
                   ", gates " + nn::py_bool(c.gates) + ", " + dtype_name(dt));
      const double tol = dt == DType::f64 ? 1e-10 : 1e-6;
      manual_seed(100);
      MultiHeadAttentionWrapper w(4, 2, 8, 0.0, 3, c.qkv_bias, c.out_proj);
      w.to(dt);
      w.eval();
      auto f = nn::wrapper_to_fused(w);
      EXPECT_EQ(f->num_heads, 3);
      EXPECT_EQ(f->head_dim, 2);
      EXPECT_EQ(f->d_out, 6);
      EXPECT_FALSE(f->is_training());
      for (const auto& [name, p] : f->named_parameters()) EXPECT_EQ(p.dtype(), dt) << name;
      // The fused projections are the heads' stacked: rows [2h, 2h + 2) are head h's.
      EXPECT_TRUE(all_close(f->W_key->weight.narrow(0, 2, 2), w.heads->at<CausalAttention>(1)->W_key->weight, 0, 0));
      expect_same_function(w, *f, dt, c.gates, tol);

      // and back: the fused module split into heads (always with out_proj)
      manual_seed(200);
      CausalMultiHeadAttention f2(4, 6, 8, 0.0, 3, c.qkv_bias);
      f2.to(dt);
      auto w2 = nn::fused_to_wrapper(f2);
      ASSERT_NE(w2->out_proj, nullptr);
      EXPECT_EQ(w2->heads->size(), 3u);
      EXPECT_EQ(w2->num_parameters(), f2.num_parameters());
      expect_same_function(f2, *w2, dt, c.gates, tol);
    }
  }
}

TEST(Conversion, ParameterGradientsMapOntoEachOther) {
  manual_seed(300);
  MultiHeadAttentionWrapper w(4, 2, 8, 0.0, 3, true, true);
  w.to(DType::f64);
  auto f = nn::wrapper_to_fused(w);
  const Tensor x = rnd({2, 5, 4}, 1).detach();
  w(x).sum().backward();
  f->forward(x).sum().backward();
  for (int64_t h = 0; h < 3; ++h) {
    auto head = w.heads->at<CausalAttention>(h);
    EXPECT_TRUE(close(f->W_query->weight.grad().narrow(0, 2 * h, 2), head->W_query->weight.grad(), 1e-10));
    EXPECT_TRUE(close(f->W_value->bias.grad().narrow(0, 2 * h, 2), head->W_value->bias.grad(), 1e-10));
  }
  EXPECT_TRUE(close(f->out_proj->weight.grad(), w.out_proj->weight.grad(), 1e-10));
}

TEST(Conversion, ConvertedModulesOwnTheirWeights) {
  manual_seed(400);
  MultiHeadAttentionWrapper w(4, 2, 8, 0.0, 2);
  auto f = nn::wrapper_to_fused(w);
  const Tensor x = rnd({1, 3, 4}, 1, 1.0, DType::f32).detach();
  const auto before = values(f->forward(x));
  {
    NoGradGuard ng;
    w.heads->at<CausalAttention>(0)->W_query->weight.detach().fill_(3.0);
  }
  EXPECT_EQ(values(f->forward(x)), before);
}

// =====================================================================================================
// gradcheck (float64, central differences) of every module: inputs, parameters, gates
// =====================================================================================================

TEST(Gradcheck, MaskedSoftmaxWithZeroLengths) {
  const Tensor x = rnd({2, 3, 4}, 1);
  for (const Tensor& vl : {Tensor(), i64({0, 3}, {2}), i64({0, 2, 4, 1, 0, 3}, {2, 3})})
    EXPECT_TRUE(gradchecks([&](const std::vector<Tensor>& in) { return masked_softmax(in[0], vl); }, {x}));
}

TEST(Gradcheck, DotProductAttention) {
  DotProductAttention dot(0.0);
  const Tensor q = rnd({2, 3, 4}, 1), k = rnd({2, 5, 4}, 2), v = rnd({2, 5, 3}, 3);
  for (const Tensor& vl : {Tensor(), i64({0, 4}, {2}), i64({1, 0, 5, 3, 2, 0}, {2, 3})})
    EXPECT_TRUE(gradchecks([&](const auto& in) { return dot(in[0], in[1], in[2], vl); }, {q, k, v}));
}

TEST(Gradcheck, DotProductAttentionWithDropoutInTraining) {
  DotProductAttention dot(0.4);  // training: the same seed replays the same mask on every call
  const Tensor q = rnd({2, 3, 4}, 1), k = rnd({2, 5, 4}, 2), v = rnd({2, 5, 3}, 3);
  EXPECT_TRUE(gradchecks(
      [&](const auto& in) {
        manual_seed(77);
        return dot(in[0], in[1], in[2], i64({2, 5}, {2}));
      },
      {q, k, v}));
}

TEST(Gradcheck, AdditiveAttention) {
  manual_seed(1);
  AdditiveAttention att(3, 4, 5, 0.0);
  att.to(DType::f64);
  const Tensor q = rnd({2, 3, 4}, 1), k = rnd({2, 5, 3}, 2), v = rnd({2, 5, 2}, 3);
  const Tensor vl = i64({2, 0, 5, 1, 3, 4}, {2, 3});
  EXPECT_TRUE(gradchecks([&](const auto& in) { return att(in[0], in[1], in[2], vl); }, with_params({q, k, v}, att)));
}

TEST(Gradcheck, MultiHeadAttentionWithMaskingAndGates) {
  manual_seed(2);
  MultiHeadAttention m(3, 5, 4, 8, 2, 0.0, true);
  m.to(DType::f64);
  const Tensor q = rnd({2, 3, 5}, 1), k = rnd({2, 4, 3}, 2), v = rnd({2, 4, 4}, 3), g = leaf(f64({0.7, -1.3}, {2}));
  const Tensor vl = i64({1, 4, 0, 3, 2, 4}, {2, 3});
  EXPECT_TRUE(gradchecks([&](const auto& in) { return m.forward(in[0], in[1], in[2], vl, in[3]); },
                         with_params({q, k, v, g}, m)));
  // true self-attention, module(x, x, x): x's gradient sums three uses; a 1-D zero length
  const Tensor x = rnd({2, 3, 5}, 4);
  MultiHeadAttention s(5, 5, 5, 4, 2, 0.0, false);
  s.to(DType::f64);
  EXPECT_TRUE(gradchecks(
      [&](const auto& in) {
        return s.forward(in[0], in[0], in[0], i64({0, 2}, {2}), in[1]);
      },
      {x, g}));
}

TEST(Gradcheck, CausalAttention) {
  manual_seed(3);
  CausalAttention ca(3, 2, 6, 0.0, true);
  ca.to(DType::f64);
  const Tensor x = rnd({2, 4, 3}, 1);
  EXPECT_TRUE(gradchecks([&](const auto& in) { return ca(in[0]); }, with_params({x}, ca)));
}

TEST(Gradcheck, WrapperAndFusedWithGates) {
  manual_seed(4);
  MultiHeadAttentionWrapper w(3, 2, 6, 0.0, 2, true, true);
  w.to(DType::f64);
  const Tensor x = rnd({2, 4, 3}, 1), g = leaf(f64({1.5, -0.5}, {2}));
  EXPECT_TRUE(gradchecks([&](const auto& in) { return w.forward(in[0], in[1]); }, with_params({x, g}, w)));
  MultiHeadAttentionWrapper plain(3, 2, 6, 0.0, 2);  // no out_proj: concatenation only
  plain.to(DType::f64);
  EXPECT_TRUE(gradchecks([&](const auto& in) { return plain.forward(in[0], in[1]); }, with_params({x, g}, plain)));
  CausalMultiHeadAttention f(3, 4, 6, 0.0, 2, true);
  f.to(DType::f64);
  EXPECT_TRUE(gradchecks([&](const auto& in) { return f.forward(in[0], in[1]); }, with_params({x, g}, f)));
}

TEST(Gradcheck, Layers) {
  manual_seed(5);
  nn::Linear lin(3, 4);
  lin.to(DType::f64);
  const Tensor x = rnd({2, 3, 3}, 1);
  EXPECT_TRUE(gradchecks([&](const auto& in) { return lin(in[0]); }, with_params({x}, lin)));
  nn::Embedding emb(6, 3);
  emb.to(DType::f64);
  EXPECT_TRUE(gradchecks([&](const auto&) { return emb(i64({1, 4, 4, 0}, {2, 2})); }, emb.parameters()));
  for (auto style : {nn::LayerNorm::Style::Torch, nn::LayerNorm::Style::Book}) {
    nn::LayerNorm ln(5, 1e-5, style);
    ln.to(DType::f64);
    set(ln.weight, {1, 0.5, -2, 1.5, 0.25});
    set(ln.bias, {0, 1, -1, 0.5, 2});
    EXPECT_TRUE(gradchecks([&](const auto& in) { return ln(in[0]); }, with_params({rnd({2, 3, 5}, 2)}, ln)));
  }
  for (bool approx : {true, false}) {
    nn::GELU gelu(approx);
    EXPECT_TRUE(gradchecks([&](const auto& in) { return gelu(in[0]); }, {rnd({2, 5}, 3, 2.0)}));
  }
  nn::ReLU relu;
  EXPECT_TRUE(gradchecks([&](const auto& in) { return relu(in[0]); }, {leaf(f64({-2, -0.5, 0.3, 1.7}, {4}))}));
  nn::Dropout drop(0.5);  // training, reseeded: one fixed mask
  EXPECT_TRUE(gradchecks(
      [&](const auto& in) {
        manual_seed(13);
        return drop(in[0]);
      },
      {rnd({3, 4}, 4)}));
  nn::FeedForward ff(3);
  ff.to(DType::f64);
  EXPECT_TRUE(gradchecks([&](const auto& in) { return ff(in[0]); }, with_params({rnd({2, 2, 3}, 5)}, ff)));
}

// =====================================================================================================
// Head surgery on the modules: pruning, per-head form, output projection, the table of forms
// =====================================================================================================

namespace {

// Gates (H) that keep exactly the heads in `keep`.
Tensor gates_keeping(const std::vector<int64_t>& keep, int64_t H, DType dt) {
  std::vector<double> g(static_cast<size_t>(H), 0.0);
  for (int64_t h : keep) g[static_cast<size_t>(h)] = 1.0;
  return f64(g, {H}).to(dt);
}

// Every parameter of a and b (same names) bit for bit equal.
void expect_same_parameters(const nn::Module& a, const nn::Module& b) {
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(names_of(a), names_of(b));
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.dtype(), pb[i].second.dtype()) << pa[i].first;
    EXPECT_EQ(values(pa[i].second), values(pb[i].second)) << pa[i].first;
  }
}

// The causal modules of each form (and a wrapper without out_proj), 3 heads of 2, d_in 4, float64.
std::vector<std::shared_ptr<nn::CausalMultiHead>> causal_modules(bool qkv_bias) {
  manual_seed(500);
  std::vector<std::shared_ptr<nn::CausalMultiHead>> ms;
  ms.push_back(std::make_shared<CausalMultiHeadAttention>(4, 5, 8, 0.0, 3, qkv_bias, 2));
  ms.push_back(std::make_shared<MultiHeadAttentionWrapper>(4, 2, 8, 0.0, 3, qkv_bias, true, 5));
  ms.push_back(std::make_shared<MultiHeadAttentionWrapper>(4, 2, 8, 0.0, 3, qkv_bias, false));
  for (auto& m : ms) m->to(DType::f64);
  return ms;
}

}  // namespace

TEST(HeadSurgery, PrunedCausalModuleIsTheModuleWithTheOtherHeadsGatedOff) {
  const std::vector<int64_t> keep = {0, 2};
  for (bool qkv_bias : {false, true}) {
    for (const auto& m : causal_modules(qkv_bias)) {
      SCOPED_TRACE(m->type_name() + (m->output_projection() ? "" : " without out_proj") + ", qkv_bias " +
                   nn::py_bool(qkv_bias));
      m->eval();
      const Tensor x = rnd({2, 5, 4}, 31).detach();
      m->control().keep_context = true;
      const Tensor gated = m->forward(x, gates_keeping(keep, 3, DType::f64));
      const Tensor ctx = m->control().context;  // (B, 3, T, D), before gating
      auto p = m->prune_heads(keep);
      EXPECT_EQ(p->type_name(), m->type_name());
      EXPECT_EQ(p->form(), m->form());
      EXPECT_EQ(p->head_count(), 2);
      EXPECT_EQ(p->head_size(), 2);
      EXPECT_FALSE(p->is_training());
      EXPECT_EQ(p->num_parameters(),
                m->num_parameters() - (qkv_bias ? 3 * (2 * 4 + 2) : 3 * 2 * 4) - (m->output_projection() ? 5 * 2 : 0));
      for (const auto& [name, t] : p->named_parameters()) EXPECT_EQ(t.dtype(), DType::f64) << name;
      const Tensor y = p->forward(x);
      // The kept heads compute exactly what they did.
      EXPECT_EQ(values(p->control().context), values(index_select(ctx, 1, tensor(keep, {2}))));
      if (m->output_projection()) {
        EXPECT_TRUE(close(y, gated, 1e-13));
      } else {  // concatenation alone: the kept heads' columns of the full output
        EXPECT_EQ(values(y), values(index_select(gated, 2, tensor(std::vector<int64_t>{0, 1, 4, 5}, {4}))));
      }
    }
  }
}

TEST(HeadSurgery, PruningCutsTheHeadControlToTheKeptHeads) {
  for (const auto& m : causal_modules(true)) {
    SCOPED_TRACE(m->type_name() + (m->output_projection() ? "" : " without out_proj"));
    const int64_t B = 2, T = 4;
    nn::HeadControl& hc = m->control();
    hc.gates = leaf(f64({0.5, 2, 3}, {3}));
    hc.offsets = rnd({B, 3, 2}, 32).detach();  // per row
    hc.keep_context = true;
    m->keep_attention_weights(true);
    const Tensor x = rnd({B, T, 4}, 33).detach();
    auto p = m->prune_heads({1, 2});
    const nn::HeadControl& pc = p->control();
    EXPECT_EQ(values(pc.gates), (std::vector<double>{2, 3}));
    EXPECT_TRUE(pc.gates.requires_grad());
    EXPECT_TRUE(pc.gates.is_leaf());
    EXPECT_EQ(values(pc.offsets), values(index_select(hc.offsets, 1, tensor(std::vector<int64_t>{1, 2}, {2}))));
    EXPECT_TRUE(pc.keep_context);
    const Tensor y = p->forward(x);
    EXPECT_EQ(p->last_attention_weights().shape(), (Shape{B, 2, T, T}));  // keep_attention_weights carried over
    // The original with head 0 off (gate 0, no offset) and the same control on heads 1 and 2.
    {
      NoGradGuard ng;
      hc.offsets = mul(hc.offsets, f64({0, 1, 1}, {1, 3, 1})).detach();
    }
    const Tensor ref = m->forward(x, f64({0, 2, 3}, {3}));
    if (m->output_projection())
      EXPECT_TRUE(close(y, ref, 1e-13));
    else
      EXPECT_EQ(values(y), values(ref.narrow(2, 2, 4)));
    y.sum().backward();
    EXPECT_EQ(pc.gates.grad().shape(), (Shape{2}));
    EXPECT_FALSE(hc.gates.grad().defined());  // the pruned module's gates are its own leaf
  }
}

TEST(HeadSurgery, PrunedD2lModuleIsTheModuleWithTheOtherHeadsGatedOff) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(nn::py_bool(bias));
    manual_seed(501);
    MultiHeadAttention m(3, 5, 4, 8, 4, 0.0, bias, 6);  // cross-attention sizes, W_o to 6
    m.to(DType::f64);
    m.eval();
    const Tensor q = rnd({2, 3, 5}, 34).detach(), k = rnd({2, 7, 3}, 35).detach(), v = rnd({2, 7, 4}, 36).detach();
    const Tensor vl = tensor(std::vector<int64_t>{4, 7}, {2});
    const std::vector<int64_t> keep = {1, 3};
    m.heads.keep_context = true;
    m.heads.offsets = mul(rnd({4, 2}, 37), f64({0, 1, 0, 1}, {4, 1})).detach();  // none on the removed heads
    const Tensor gated = m.forward(q, k, v, vl, gates_keeping(keep, 4, DType::f64));
    const Tensor ctx = m.heads.context;
    auto p = m.prune_heads(keep);
    EXPECT_EQ(p->num_heads, 2);
    EXPECT_EQ(p->num_hiddens, 4);
    EXPECT_EQ(p->head_size(), 2);
    EXPECT_EQ(p->W_o->out_features, 6);
    EXPECT_FALSE(p->is_training());
    EXPECT_EQ(static_cast<double>(p->num_parameters()), MultiHeadAttention::parameter_count(3, 5, 4, 4, bias, 6));
    const Tensor y = p->forward(q, k, v, vl);
    EXPECT_EQ(values(p->heads.context), values(index_select(ctx, 1, tensor(keep, {2}))));
    EXPECT_EQ(values(p->heads.offsets), values(index_select(m.heads.offsets, 0, tensor(keep, {2}))));
    EXPECT_TRUE(close(y, gated, 1e-13));
  }
}

TEST(HeadSurgery, SplitAndMergeRoundTripsAreExact) {
  for (bool qkv_bias : {false, true}) {
    for (const auto& m : causal_modules(qkv_bias)) {
      SCOPED_TRACE(m->type_name() + (m->output_projection() ? "" : " without out_proj"));
      m->eval();
      m->control().gates = f64({1, 0.5, 0}, {3});
      auto w = m->split_heads();
      EXPECT_EQ(w->form(), nn::AttentionForm::wrapper);
      EXPECT_TRUE(w->control().gates.shares_storage(m->control().gates));  // the same control
      EXPECT_FALSE(w->is_training());
      // Back into the module's own form: the same parameters, bit for bit.
      auto back = nn::merge_heads(*w, m->form());
      if (m->output_projection()) expect_same_parameters(*back, *m);
      // Through every form and back.
      for (const std::string& name : enum_names<nn::AttentionForm>()) {
        const nn::AttentionForm form = parse_enum<nn::AttentionForm>(name, "test");
        auto other = nn::convert_attention(*m, form);
        EXPECT_EQ(other->form(), form);
        auto again = nn::convert_attention(*other, m->form());
        if (m->output_projection() || form == nn::AttentionForm::wrapper) expect_same_parameters(*again, *m);
        const Tensor x = rnd({2, 5, 4}, 38).detach();
        EXPECT_TRUE(close(other->forward(x), m->forward(x), 1e-13)) << name;
      }
    }
  }
}

TEST(HeadSurgery, OutputProjectionOfEveryForm) {
  auto ms = causal_modules(false);
  auto& fused = static_cast<CausalMultiHeadAttention&>(*ms[0]);
  auto& wrapper = static_cast<MultiHeadAttentionWrapper&>(*ms[1]);
  EXPECT_EQ(ms[0]->output_projection(), fused.out_proj.get());
  EXPECT_EQ(ms[1]->output_projection(), wrapper.out_proj.get());
  EXPECT_EQ(ms[2]->output_projection(), nullptr);  // a wrapper built without out_proj
  MultiHeadAttention d2l(4, 4, 4, 8, 2, 0.0);
  const nn::MultiHead& shared = d2l;
  EXPECT_EQ(shared.output_projection(), d2l.W_o.get());
  EXPECT_EQ(shared.output_projection()->weight.shape(), (Shape{8, 8}));
  EXPECT_EQ(ms[0]->output_projection()->weight.shape(), (Shape{5, 6}));  // (d_out, H*D)
}

TEST(HeadSurgery, TheTableOfFormsBuildsAndCountsEveryForm) {
  EXPECT_EQ(enum_names<nn::AttentionForm>(), (std::vector<std::string>{"fused", "wrapper"}));
  EXPECT_EQ(nn::attention_forms_help(), "fused (one W_query/W_key/W_value) | wrapper (one module per head)");
  for (const std::string& name : enum_names<nn::AttentionForm>()) {
    const nn::AttentionForm form = parse_enum<nn::AttentionForm>(name, "test");
    EXPECT_EQ(enum_name(form), name);
    for (bool qkv_bias : {false, true}) {
      nn::CausalAttentionSizes s;
      s.d_in = s.d_out = 12;
      s.context_length = 6;
      s.num_heads = 2;
      s.head_dim = 3;  // 2 x 3 != 12, as in a pruned GPT layer
      s.qkv_bias = qkv_bias;
      auto m = nn::make_causal_attention(form, s);
      EXPECT_EQ(m->form(), form);
      EXPECT_EQ(m->head_count(), 2);
      EXPECT_EQ(m->head_size(), 3);
      EXPECT_EQ(static_cast<double>(m->num_parameters()), nn::causal_attention_parameters(form, s)) << name;
      EXPECT_EQ(m->forward(rnd({1, 6, 12}, 39, 1.0, DType::f32).detach()).shape(), (Shape{1, 6, 12}));
    }
  }
  EXPECT_EQ(static_cast<double>(MultiHeadAttention(3, 5, 4, 8, 4, 0.0, true, 6).num_parameters()),
            MultiHeadAttention::parameter_count(3, 5, 4, 8, true, 6));
  EXPECT_EQ(static_cast<double>(CausalAttention(4, 3, 8, 0.0, true).num_parameters()),
            CausalAttention::parameter_count(4, 3, true));
}

TEST(HeadSurgery, BadKeepListsNameTheModule) {
  CausalMultiHeadAttention f(4, 6, 8, 0.0, 3);
  MultiHeadAttentionWrapper w(4, 2, 8, 0.0, 3);
  MultiHeadAttention d(4, 4, 4, 6, 3, 0.0);
  EXPECT_ERROR(f.prune_heads({}), "CausalMultiHeadAttention: the module must keep at least one head");
  EXPECT_ERROR(w.prune_heads({1, 3}), "MultiHeadAttentionWrapper: the module has no head 3 (it has 3)");
  EXPECT_ERROR(d.prune_heads({2, 0}), "MultiHeadAttention: the heads kept in the module must be sorted and distinct");
  EXPECT_ERROR(parse_enum<nn::AttentionForm>("both", "attention"),
               "attention: expected one of 'fused', 'wrapper', got 'both'");
}
