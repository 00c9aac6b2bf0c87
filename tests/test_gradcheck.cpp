// Central-difference gradient checks (float64, autograd/engine.h's gradcheck) for every
// differentiable op: broadcast operands, non-contiguous leaves (transposed, sliced with a step)
// and expanded operands, reductions over several dims, matmul in every rank combination, and the
// fused nn ops with their masks, ignored targets and replayed dropout masks, and fused attention;
// then d2l's Transformer modules (nn/transformer.h) w.r.t. inputs, parameters and per-head gates.
#include <gtest/gtest.h>

#include "nn/transformer.h"
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// A float64 leaf that requires grad, with distinct values.
Tensor leaf(const Shape& s, double scale = 0.37, double shift = -1.1) {
  Tensor t = seq64(s, scale, shift);
  t.requires_grad_();
  return t;
}
// Strictly positive values (log, sqrt, pow, division).
Tensor pos_leaf(const Shape& s) { return leaf(s, 0.21, 0.3); }
// A (R, C) leaf stored column-major: a transposed view, not contiguous.
Tensor transposed_leaf(int64_t R, int64_t C) {
  Tensor t = seq64({C, R}).transpose(0, 1).detach();
  t.requires_grad_();
  return t;
}
// A (R, C) leaf whose columns are every second column of a (R, 2C) buffer, at offset 1.
Tensor stepped_leaf(int64_t R, int64_t C) {
  Tensor t = seq64({R, 2 * C + 1}, 0.29, -0.8).slice(1, 1, 2 * C + 1, 2).detach();
  t.requires_grad_();
  return t;
}

void check(const Fn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-5,
           double rtol = 1e-3) {
  const GradcheckResult r = gradcheck(fn, inputs, eps, atol, rtol);
  EXPECT_TRUE(r.ok) << r.message << " (max abs error " << r.max_abs_error << ")";
}

}  // namespace

// gradcheck itself must be able to fail: a deliberately wrong backward is caught.
TEST(Gradcheck, CatchesAWrongBackward) {
  const Fn bad_square = [](const std::vector<Tensor>& v) {
    const Tensor x = v[0];
    Tensor out = mul(x.detach(), x.detach());
    record("bad_square", out, {x}, {x}, [](const Tensor& dout, Saved s, Grads& g) {
      g.acc(0, mul(dout, s[0]));  // misses 2x
    });
    return out;
  };
  const GradcheckResult r = gradcheck(bad_square, {leaf({3})});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("input 0"), std::string::npos) << r.message;
  EXPECT_GT(r.max_abs_error, 0.1);
  EXPECT_ERROR(gradcheck(bad_square, {seq64({3})}), "gradcheck: input 0 does not require grad");
  EXPECT_ERROR(gradcheck(bad_square, {zeros({3}).requires_grad_()}), "must be a float64 CPU tensor");
}

// ---- elementwise ----

TEST(Gradcheck, BinaryBroadcast) {
  check([](const auto& v) { return add(v[0], v[1]); }, {leaf({3, 1, 4}), leaf({2, 4})});
  check([](const auto& v) { return sub(v[0], v[1]); }, {leaf({2, 3}), leaf({3})});
  check([](const auto& v) { return sub(v[1], v[0]); }, {leaf({2, 1}), leaf({1, 3})});
  check([](const auto& v) { return mul(v[0], v[1]); }, {leaf({3, 1}), leaf({1, 4})});
  check([](const auto& v) { return mul(v[0], v[1]); }, {leaf({2, 3}), leaf({})});  // 0-d operand
  check([](const auto& v) { return div(v[0], v[1]); }, {leaf({2, 3}), pos_leaf({3})});
  check([](const auto& v) { return div(v[1], v[0]); }, {pos_leaf({2, 1, 3}), leaf({4, 1})});
  // The same leaf on both sides: contributions add.
  check([](const auto& v) { return mul(v[0], v[0]); }, {leaf({4})});
  check([](const auto& v) { return div(v[0], add(v[0], 3.0)); }, {pos_leaf({4})});
}

TEST(Gradcheck, MaximumWithTies) {
  Tensor a = f64({1, 2, 3, -1}), b = f64({1, 0, 5, -1});  // ties at 0 and 3 share the gradient
  a.requires_grad_();
  b.requires_grad_();
  check([](const auto& v) { return maximum(v[0], v[1]); }, {a, b});
  check([](const auto& v) { return maximum(v[0], v[1]); }, {leaf({2, 3}), leaf({3}, 0.2, -0.3)});
}

TEST(Gradcheck, ScalarForms) {
  check([](const auto& v) { return affine(v[0], -2.5, 1.0); }, {leaf({5})});
  check([](const auto& v) { return add(mul(v[0], 3.0), 2.0); }, {leaf({5})});
  check([](const auto& v) { return 2.0 - v[0] / 4.0; }, {leaf({5})});
  check([](const auto& v) { return 3.0 / v[0] + (v[0] - 1.0) * 2.0; }, {pos_leaf({5})});
  check([](const auto& v) { return -v[0]; }, {leaf({2, 2})});
  check([](const auto& v) { return neg(v[0]); }, {leaf({2, 2})});
}

TEST(Gradcheck, UnaryMath) {
  const Tensor x = leaf({2, 5}), p = pos_leaf({2, 5});
  check([](const auto& v) { return exp(v[0]); }, {x});
  check([](const auto& v) { return log(v[0]); }, {p});
  check([](const auto& v) { return sqrt(v[0]); }, {p});
  check([](const auto& v) { return rsqrt(v[0]); }, {p});
  check([](const auto& v) { return pow(v[0], 3); }, {x});
  check([](const auto& v) { return pow(v[0], 0.5); }, {p});
  check([](const auto& v) { return pow(v[0], -1.5); }, {p});
  check([](const auto& v) { return abs(v[0]); }, {x});  // no element sits at the kink
  check([](const auto& v) { return tanh(v[0]); }, {x});
  check([](const auto& v) { return sigmoid(v[0]); }, {x});
  check([](const auto& v) { return relu(v[0]); }, {x});
  check([](const auto& v) { return gelu(v[0]); }, {x});
  check([](const auto& v) { return gelu(v[0], true); }, {x});
  // Non-contiguous leaves: transposed, and sliced with a step at an offset.
  check([](const auto& v) { return exp(v[0]); }, {transposed_leaf(3, 4)});
  check([](const auto& v) { return tanh(v[0]); }, {stepped_leaf(3, 4)});
  check([](const auto& v) { return mul(gelu(v[0], true), v[1]); }, {transposed_leaf(3, 4), stepped_leaf(3, 4)});
}

TEST(Gradcheck, WhereAndMaskedFill) {
  const Tensor cond = tensor_bool({true, false, false, true, true, false}, {2, 3});
  check([cond](const auto& v) { return where(cond, v[0], v[1]); }, {leaf({2, 3}), leaf({3}, 0.5, 0.1)});
  const Tensor c2 = tensor_bool({true, false}, {2, 1});
  check([c2](const auto& v) { return where(c2, v[0], v[1]); }, {leaf({1, 3}), leaf({2, 3})});
  const Tensor mask = tensor_bool({false, true, true, false});
  check([mask](const auto& v) { return masked_fill(v[0], mask, -3.0); }, {leaf({3, 4})});
  check([c2](const auto& v) { return masked_fill(v[0], c2, 0.0); }, {transposed_leaf(2, 3)});
  // In place on a non-leaf: the filled positions get no gradient, the others flow through.
  check([mask](const auto& v) {
    Tensor y = mul(v[0], v[0]);
    y.masked_fill_(mask, 1.5);
    return mul(y, v[0]);
  }, {leaf({3, 4})});
}

// ---- reductions ----

TEST(Gradcheck, Reductions) {
  const Tensor x = leaf({2, 3, 4});
  check([](const auto& v) { return sum(v[0]); }, {x});
  check([](const auto& v) { return sum(v[0], {0, 2}); }, {x});
  check([](const auto& v) { return sum(v[0], {-1, 0}, true); }, {x});
  check([](const auto& v) { return mean(v[0], {1, 2}); }, {x});
  check([](const auto& v) { return mean(v[0], {1}, true); }, {x});
  check([](const auto& v) { return v[0].mean(); }, {x});
  check([](const auto& v) { return var(v[0], {0, 2}); }, {x});
  check([](const auto& v) { return var(v[0], {1}, true, 0); }, {x});
  check([](const auto& v) { return var(v[0]); }, {x});
  check([](const auto& v) { return amax(v[0], {0, 2}); }, {x});
  check([](const auto& v) { return amax(v[0], {1}, true); }, {x});
  check([](const auto& v) { return sum_to(v[0], {3, 1}); }, {x});
  check([](const auto& v) { return sum(v[0], {0}); }, {transposed_leaf(4, 3)});
  check([](const auto& v) { return mean(v[0], {1}); }, {stepped_leaf(3, 4)});
}

TEST(Gradcheck, AmaxWithTies) {
  Tensor t = f64({1, 3, 3, 2, 2, 0}, {2, 3});  // row 0: tie at 3; row 1: tie at 2
  t.requires_grad_();
  check([](const auto& v) { return amax(v[0], {1}); }, {t});
  check([](const auto& v) { return amax(v[0]); }, {t});
  // A three-way tie splits the gradient in thirds (as PyTorch's amax does). Central differences
  // see 1/2 there (one side moves the max, the other does not), so this one is checked by value.
  Tensor u = f64({5, 1, 5, 5}, {2, 2});
  u.requires_grad_();
  const std::vector<Tensor> g = grad({amax(u)}, {u});
  EXPECT_TRUE(all_close(g[0], {1.0 / 3, 0, 1.0 / 3, 1.0 / 3}, 1e-12));
}

// ---- matmul and linear ----

TEST(Gradcheck, MatmulEveryRankCombination) {
  struct Case { Shape a, b; };
  const std::vector<Case> cases = {
      {{3}, {3}},          {{3}, {3, 2}},          {{2, 3}, {3}},          {{2, 3}, {3, 4}},
      {{2, 2, 3}, {2, 3, 2}}, {{2, 2, 3}, {3, 2}},  {{2, 3}, {2, 3, 2}},   {{3}, {2, 3, 2}},
      {{2, 2, 3}, {3}},    {{2, 1, 2, 3}, {3, 3, 2}}, {{2, 1, 1, 3}, {1, 2, 3, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(shape_str(c.a) + " @ " + shape_str(c.b));
    check([](const auto& v) { return matmul(v[0], v[1]); }, {leaf(c.a), leaf(c.b, 0.23, -0.6)});
  }
}

TEST(Gradcheck, MatmulNonContiguous) {
  check([](const auto& v) { return matmul(v[0], v[1]); }, {transposed_leaf(2, 3), transposed_leaf(3, 4)});
  check([](const auto& v) { return matmul(v[0], v[1]); }, {stepped_leaf(2, 3), stepped_leaf(3, 2)});
  // expanded and transposed inside the function
  check([](const auto& v) { return matmul(v[0].expand({2, 2, 3}), v[1].mT()); }, {leaf({2, 3}), leaf({2, 4, 3})});
  // heads split out of a projection: (B, T, H*D) -> (B, H, T, D)
  check([](const auto& v) {
    const Tensor q = v[0].view({2, 3, 2, 2}).transpose(1, 2);
    return matmul(q, q.mT());
  }, {leaf({2, 3, 4})});
}

TEST(Gradcheck, Linear) {
  check([](const auto& v) { return linear(v[0], v[1], v[2]); }, {leaf({3, 4}), leaf({2, 4}, 0.3), leaf({2}, 0.5)});
  check([](const auto& v) { return linear(v[0], v[1]); }, {leaf({3, 4}), leaf({2, 4}, 0.3)});
  check([](const auto& v) { return linear(v[0], v[1], v[2]); }, {leaf({2, 2, 3}), leaf({4, 3}, 0.3), leaf({4})});
  check([](const auto& v) { return linear(v[0], v[1], v[2]); }, {leaf({3}), transposed_leaf(2, 3), leaf({2})});
  check([](const auto& v) { return linear(v[0], v[1]); }, {stepped_leaf(3, 2), leaf({2, 2})});
}

// ---- shape ops ----

TEST(Gradcheck, Views) {
  const Tensor x = leaf({2, 3, 4});
  auto weighted = [](const Tensor& t) { return mul(t, seq64(t.shape(), 0.5, 0.2)); };  // not a plain sum
  check([&](const auto& v) { return weighted(v[0].view({6, 4})); }, {x});
  check([&](const auto& v) { return weighted(v[0].transpose(0, 2).reshape({-1})); }, {x});  // copy path
  check([&](const auto& v) { return weighted(v[0].flatten(1)); }, {x});
  check([&](const auto& v) { return weighted(v[0].permute({2, 0, 1})); }, {x});
  check([&](const auto& v) { return weighted(v[0].unsqueeze(1).squeeze(1)); }, {x});
  check([&](const auto& v) { return weighted(v[0].unsqueeze(0).squeeze()); }, {x});
  check([&](const auto& v) { return weighted(v[0].narrow(1, 1, 2)); }, {x});
  check([&](const auto& v) { return weighted(v[0].slice(2, 0, 4, 3)); }, {x});
  check([&](const auto& v) { return weighted(v[0].select(1, -1)); }, {x});
  check([&](const auto& v) { return weighted(v[0].contiguous()); }, {transposed_leaf(3, 2)});
  check([&](const auto& v) { return weighted(v[0].clone()); }, {x});
  check([&](const auto& v) { return weighted(v[0].expand({3, 2, 4})); }, {leaf({2, 1})});
  check([&](const auto& v) { return weighted(v[0].expand({2, -1, 3})); }, {leaf({4, 1})});
}

TEST(Gradcheck, DtypeRoundTrip) {
  // float32 in the middle: a larger step keeps rounding error out of the difference quotient.
  check([](const auto& v) { return mul(v[0].to(DType::f32).to(DType::f64), 3.0); }, {leaf({4})}, 1e-2, 1e-4);
  check([](const auto& v) { return v[0].to(kCPU); }, {leaf({2})});
}

TEST(Gradcheck, CatStackSplit) {
  check([](const auto& v) { return cat({v[0], exp(v[1]), v[2]}, 1); }, {leaf({2, 1}), leaf({2, 3}), leaf({2, 2})});
  check([](const auto& v) { return cat({v[0], v[1]}, 0); }, {transposed_leaf(2, 3), leaf({1, 3})});
  check([](const auto& v) { return stack({v[0], mul(v[1], v[1])}, 1); }, {leaf({2, 3}), leaf({2, 3}, 0.4)});
  check([](const auto& v) {
    const std::vector<Tensor> parts = split(v[0], 2, 1);  // widths 2, 2, 1
    return cat({mul(parts[0], 2.0), parts[2], exp(parts[1])}, 1);
  }, {leaf({2, 5})});
  check([](const auto& v) {
    const std::vector<Tensor> parts = split(v[0], std::vector<int64_t>{1, 3}, 0);
    return add(parts[0], mul(parts[1], parts[1]));  // (1, 2) + (3, 2) broadcasts
  }, {leaf({4, 2})});
  check([](const auto& v) {
    const std::vector<Tensor> c = chunk(v[0], 2, -1);
    return mul(c[0], c[1]);
  }, {leaf({3, 4})});
}

TEST(Gradcheck, Indexing) {
  check([](const auto& v) { return index_select(v[0], 0, i64({2, 0, 2, 2}, {4})); }, {leaf({3, 4})});
  check([](const auto& v) { return index_select(v[0], 1, i64({3, 3, 1}, {3})); }, {transposed_leaf(2, 4)});
  check([](const auto& v) { return embedding(v[0], i64({1, 3, 1, 0, 1, 1}, {2, 3})); }, {leaf({4, 3})});
  check([](const auto& v) { return repeat_interleave(v[0], 3, 1); }, {leaf({2, 2})});
  check([](const auto& v) { return triu(v[0]); }, {leaf({3, 4})});
  check([](const auto& v) { return triu(v[0], 1); }, {leaf({2, 3, 3})});
  check([](const auto& v) { return tril(v[0], -1); }, {leaf({4, 3})});
}

// ---- nn ops ----

TEST(Gradcheck, SoftmaxFamily) {
  const Tensor x = leaf({2, 3, 4});
  for (int64_t d : {0, 1, 2}) {
    SCOPED_TRACE("dim " + std::to_string(d));
    check([d](const auto& v) { return softmax(v[0], d); }, {x});
    check([d](const auto& v) { return log_softmax(v[0], d); }, {x});
  }
  check([](const auto& v) { return softmax(v[0], 0); }, {transposed_leaf(3, 2)});
  check([](const auto& v) { return log_softmax(v[0], -1); }, {stepped_leaf(2, 3)});
  // masked_softmax: 1-D and 2-D valid_lens with zero lengths, a scale, and no lengths.
  check([](const auto& v) { return masked_softmax(v[0], i64({0, 3}, {2})); }, {x});
  check([](const auto& v) { return masked_softmax(v[0], i64({1, 0, 4, 2, 3, 0}, {2, 3}), 0.5); }, {x});
  check([](const auto& v) { return masked_softmax(v[0], Tensor(), 2.0); }, {x});
  // causal with a scale, also on a (B, H, T, T) transposed view
  check([](const auto& v) { return causal_softmax(v[0], 0.7); }, {leaf({2, 3, 3})});
  check([](const auto& v) { return causal_softmax(v[0].transpose(-1, -2), 1.3); }, {leaf({2, 1, 3, 3})});
}

TEST(Gradcheck, DropoutReplaysItsMask) {
  check([](const auto& v) {
    Generator g(3);  // fixed state: every call draws the same mask
    return dropout(v[0], 0.4, true, g);
  }, {leaf({3, 5})});
  check([](const auto& v) {
    Generator g(8);
    return mul(dropout(v[0], 0.5, true, g), v[0]);
  }, {transposed_leaf(3, 4)});
  check([](const auto& v) { return dropout(v[0], 0.4, false); }, {leaf({3})});
}

// The fused attention op: every mask (zero valid lengths included), Tq != Tk, transposed (B, T, H, D)
// views, 3-D inputs, and dropout replayed from a generator rebuilt in the same state on each call.
TEST(Gradcheck, ScaledDotProductAttention) {
  using M = AttentionMask;
  // (B, H, T, D) views of (B, T, H, D) leaves, as the multi-head modules pass them.
  auto heads = [](const Tensor& t) { return t.transpose(1, 2); };
  const Tensor q = leaf({2, 2, 3, 4}, 0.21, -0.7), k = leaf({2, 2, 5, 4}, 0.17, -0.5), v = leaf({2, 2, 5, 3});
  check([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); }, {q, k, v});
  check([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(i64({0, 4}))); },
        {q, k, v});
  check([](const auto& x) {
    return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(i64({1, 0, 5, 2, 3, 4}, {2, 3})), 0.0, false,
                                        default_generator(), 0.6);
  }, {q, k, v});
  const Tensor qt = leaf({2, 4, 2, 3}, 0.23, -0.6), kt = leaf({2, 4, 2, 3}, 0.19, -0.4), vt = leaf({2, 4, 2, 2});
  check([heads](const auto& x) {
    return scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), M::causal());
  }, {qt, kt, vt});
  check([heads](const auto& x) {  // q and k from one leaf, as self-attention on a shared projection
    return scaled_dot_product_attention(heads(x[0]), heads(x[0]), heads(x[1]), M::causal());
  }, {qt, vt});
  check([](const auto& x) { return scaled_dot_product_attention(x[0], x[1], x[2], M::lengths(i64({2, 5}))); },
        {leaf({2, 3, 4}), leaf({2, 5, 4}, 0.2), leaf({2, 5, 2})});  // 3-D: one head
  // Dropout: the mask is a function of (seed, offset) only, so a fresh Generator(3) replays it.
  check([](const auto& x) {
    Generator g(3);
    return scaled_dot_product_attention(x[0], x[1], x[2], M::causal(), 0.4, true, g);
  }, {leaf({1, 2, 4, 3}, 0.3), leaf({1, 2, 4, 3}, 0.2), leaf({1, 2, 4, 2})});
  check([heads](const auto& x) {
    Generator g(8);
    return scaled_dot_product_attention(heads(x[0]), heads(x[1]), heads(x[2]), M::lengths(i64({3, 1})), 0.5, true, g);
  }, {leaf({2, 3, 2, 3}, 0.3), leaf({2, 4, 2, 3}, 0.2), leaf({2, 4, 2, 2})});
}

TEST(Gradcheck, LayerNorm) {
  check([](const auto& v) { return layer_norm(v[0], v[1], v[2]); }, {leaf({3, 4}), leaf({4}, 0.4, 0.5), leaf({4})});
  check([](const auto& v) { return layer_norm(v[0], Tensor(), Tensor()); }, {leaf({2, 3, 4})});
  check([](const auto& v) { return layer_norm(v[0], v[1], Tensor()); }, {leaf({2, 5}), leaf({5})});
  check([](const auto& v) { return layer_norm(v[0], Tensor(), v[1]); }, {leaf({2, 5}), leaf({5})});
  check([](const auto& v) { return layer_norm(v[0], v[1], v[2], 1e-3); },
        {transposed_leaf(3, 4), leaf({4}, 0.4, 0.5), leaf({4})});
}

TEST(Gradcheck, Losses) {
  const Tensor t = i64({2, -100, 0, 1}, {4});
  check([t](const auto& v) { return cross_entropy(v[0], t); }, {leaf({4, 3})});
  check([t](const auto& v) { return cross_entropy(v[0], t, -100, Reduction::sum); }, {leaf({4, 3})});
  check([t](const auto& v) { return cross_entropy(v[0], t, -100, Reduction::none); }, {leaf({4, 3})});
  check([](const auto& v) { return cross_entropy(v[0], i64({1, 1, 0, 2}, {2, 2}), 1); }, {leaf({2, 2, 3})});
  check([t](const auto& v) { return cross_entropy(v[0], t); }, {transposed_leaf(4, 3)});
  check([](const auto& v) { return mse_loss(v[0], v[1]); }, {leaf({2, 3}), leaf({2, 3}, 0.2)});
  check([](const auto& v) { return mse_loss(v[0], v[1], Reduction::none); }, {leaf({4}), leaf({4}, 0.2)});
  check([](const auto& v) { return mse_loss(v[0], v[1], Reduction::sum); }, {leaf({4}), leaf({4}, 0.2)});
}

TEST(Gradcheck, SmallMlpEndToEnd) {
  const Tensor x = seq64({5, 3}), y = seq64({5, 2}, 0.1);
  check([x, y](const auto& v) {
    const Tensor h = tanh(linear(x, v[0], v[1]));
    return mse_loss(linear(h, v[2], v[3]), y);
  }, {leaf({4, 3}, 0.3, -0.5), leaf({4}, 0.1), leaf({2, 4}, 0.2, -0.4), leaf({2}, 0.1)});
}

// ---- d2l's Transformer (nn/transformer.h): modules in float64, eval mode (dropout 0). A module's
// parameters are gradcheck inputs as they are (leaves whose memory gradcheck perturbs in place). ----

namespace {

template <typename M>
std::shared_ptr<M> f64_module(std::shared_ptr<M> m) {
  m->to(DType::f64);
  m->eval();
  return m;
}

// The named parameters of m followed by `extra` (inputs and gates), as gradcheck's inputs.
std::vector<Tensor> with_params(const nn::Module& m, const std::vector<std::string>& names, std::vector<Tensor> extra) {
  for (const std::string& n : names) extra.push_back(m.parameter(n));
  return extra;
}

nn::BlockSizes tiny_block(bool bias) {
  nn::BlockSizes s;
  s.key_size = s.query_size = s.value_size = s.num_hiddens = s.norm_shape = s.ffn_num_input = 8;
  s.ffn_num_hiddens = 10;
  s.num_heads = 2;
  s.dropout = 0;
  s.use_bias = bias;
  return s;
}

}  // namespace

TEST(Gradcheck, TransformerAddNormAndPositionWiseFFN) {
  manual_seed(31);
  auto an = f64_module(std::make_shared<nn::AddNorm>(6, 0.0));
  check([an](const auto& v) { return an->forward(v[0], v[1]); },
        with_params(*an, {"ln.weight", "ln.bias"}, {leaf({2, 3, 6}), leaf({2, 3, 6}, 0.23, -0.4)}));
  auto ffn = f64_module(std::make_shared<nn::PositionWiseFFN>(5, 7, 4));
  check([ffn](const auto& v) { return ffn->forward(v[0]); },
        with_params(*ffn, {"dense1.weight", "dense1.bias", "dense2.weight", "dense2.bias"}, {leaf({2, 3, 5})}));
}

TEST(Gradcheck, TransformerEncoderBlockWithAFullyPaddedRow) {
  manual_seed(32);
  auto blk = f64_module(std::make_shared<nn::TransformerEncoderBlock>(tiny_block(true)));
  const Tensor valid_lens = i64({4, 0, 2}, {3});  // row 1: nothing valid
  check([blk, valid_lens](const auto& v) { return blk->forward(v[0], valid_lens); },
        with_params(*blk, {"attention.W_q.weight", "attention.W_v.bias", "attention.W_o.weight", "ffn.dense1.bias",
                           "addnorm1.ln.bias", "addnorm2.ln.weight"},
                    {leaf({3, 4, 8}, 0.21, -0.9)}));
}

TEST(Gradcheck, TransformerDecoderBlockWithACache) {
  manual_seed(33);
  auto blk = f64_module(std::make_shared<nn::TransformerDecoderBlock>(tiny_block(false), 1));
  const Tensor enc_valid_lens = i64({5, 0, 3}, {3});
  const Tensor past = seq64({3, 2, 8}, 0.17, -0.6);  // two positions decoded before: a constant cache
  for (bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "after a cache of 2 positions" : "empty cache");
    check([blk, enc_valid_lens, past, cached](const auto& v) {
      nn::DecoderState state;
      state.enc_outputs = v[1];
      state.enc_valid_lens = enc_valid_lens;
      state.key_values.resize(2);
      if (cached) state.key_values[1] = past;
      return blk->forward(v[0], state);
    }, with_params(*blk, {"attention1.W_k.weight", "attention2.W_q.weight", "attention2.W_v.weight",
                          "ffn.dense2.weight", "addnorm3.ln.weight"},
                   {leaf({3, 3, 8}, 0.19, -0.8), leaf({3, 5, 8}, 0.23, -1.0)}));
  }
}

// The whole model w.r.t. some of its parameters and the gates (3, L, H) of every attention module:
// encoder l -> head_control(l), decoder self-attention l -> L + l, cross-attention l -> 2L + l.
TEST(Gradcheck, EncoderDecoderParametersAndGates) {
  manual_seed(34);
  nn::TransformerConfig c;
  c.src_vocab_size = 7;
  c.tgt_vocab_size = 9;
  c.num_hiddens = 8;
  c.ffn_num_hiddens = 10;
  c.num_heads = 2;
  c.num_layers = 2;
  c.dropout = 0;
  c.use_bias = true;
  auto model = f64_module(std::make_shared<nn::EncoderDecoder>(c));
  const Tensor enc_X = i64({3, 5, 2, 6, 4, 6, 1, 1, 1, 1}, {2, 5}), dec_X = i64({0, 4, 8, 3, 0, 7, 2, 1}, {2, 4});
  const Tensor enc_valid_lens = i64({5, 2}, {2});
  Tensor gates = f64({1.0, 0.0, 0.5, 1.5, 2.0, 1.0, 1.0, 0.25, 0.0, 0.75, 1.25, 1.0}, {3, 2, 2});
  gates.requires_grad_();
  const int64_t L = c.num_layers;
  check([model, enc_X, dec_X, enc_valid_lens, L](const auto& v) {
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t l = 0; l < L; ++l) model->head_control(k * L + l).gates = v[0].select(0, k).select(0, l);
    return model->forward(enc_X, dec_X, enc_valid_lens);  // logits (2, 4, 9)
  }, with_params(*model, {"encoder.embedding.weight", "encoder.blks.block1.attention.W_v.weight",
                          "decoder.blks.block0.attention1.W_q.weight", "decoder.blks.block1.attention2.W_k.bias",
                          "decoder.blks.block1.addnorm3.ln.weight", "decoder.embedding.weight", "decoder.dense.bias"},
                 {gates}));
}
