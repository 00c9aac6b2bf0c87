// Central-difference gradient checks (float64, autograd/engine.h's gradcheck): gradcheck catching a
// wrong backward, every differentiable case of the op registry (tests/op_cases.h: broadcasting,
// non-contiguous and expanded leaves, reductions, matmul in every rank combination, masks, ignored
// targets, replayed dropout, fused attention), then d2l's Transformer modules (nn/transformer.h)
// w.r.t. inputs, parameters and per-head gates.
#include <gtest/gtest.h>

#include "nn/transformer.h"
#include "tests/core_test_util.h"
#include "tests/op_cases.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

using Fn = OpFn;

// A float64 leaf that requires grad, with distinct values.
Tensor leaf(const Shape& s, double scale = 0.37, double shift = -1.1) {
  Tensor t = seq64(s, scale, shift);
  t.requires_grad_();
  return t;
}

void check(const Fn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3) {
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

// ---- every differentiable case of the op registry (tests/op_cases.h) ----

// The inputs are what their specs name: floating leaves in the asked dtype (views that are not
// contiguous where the spec says transposed or stepped), int64 and bool constants.
TEST(OpRegistry, InputsAreWhatTheirSpecsName) {
  for (const OpCase& c : op_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<Tensor> in = c.make_inputs(DType::f64, kCPU);
    ASSERT_EQ(in.size(), c.inputs.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const InputSpec& spec = c.inputs[i];
      EXPECT_EQ(in[i].shape(), spec.shape) << "input " << i;
      switch (spec.kind) {
        case InputSpec::Kind::floating:
          EXPECT_EQ(in[i].dtype(), DType::f64) << "input " << i;
          EXPECT_TRUE(in[i].requires_grad()) << "input " << i;
          EXPECT_EQ(in[i].is_contiguous(), spec.layout == InputSpec::Layout::contiguous) << "input " << i;
          break;
        case InputSpec::Kind::index:
          EXPECT_EQ(in[i].dtype(), DType::i64) << "input " << i;
          break;
        case InputSpec::Kind::mask:
          EXPECT_EQ(in[i].dtype(), DType::b8) << "input " << i;
          break;
      }
    }
  }
}

class GradcheckOp : public ::testing::TestWithParam<OpCase> {};

// Index and mask inputs are constants of the function gradcheck sees; only floating inputs vary.
TEST_P(GradcheckOp, Float64) {
  const OpCase& c = GetParam();
  const std::vector<Tensor> all = c.make_inputs(DType::f64, kCPU);
  std::vector<Tensor> varied;
  std::vector<size_t> slot;  // where each varied input sits among all
  for (size_t i = 0; i < all.size(); ++i)
    if (is_floating(all[i].dtype())) varied.push_back(all[i]), slot.push_back(i);
  const Fn fn = [&](const std::vector<Tensor>& v) {
    std::vector<Tensor> in = all;
    for (size_t j = 0; j < v.size(); ++j) in[slot[j]] = v[j];
    return c.fn(in);
  };
  check(fn, varied, c.eps, c.grad_atol, c.grad_rtol);
}

INSTANTIATE_TEST_SUITE_P(Registry, GradcheckOp, ::testing::ValuesIn(differentiable_op_cases()), op_case_name);

// A three-way tie splits amax's gradient in thirds (as PyTorch's amax does). Central differences
// see 1/2 there (one side moves the max, the other does not), so this one is checked by value.
TEST(Gradcheck, AmaxThreeWayTieByValue) {
  Tensor u = f64({5, 1, 5, 5}, {2, 2});
  u.requires_grad_();
  const std::vector<Tensor> g = grad({amax(u)}, {u});
  EXPECT_TRUE(all_close(g[0], {1.0 / 3, 0, 1.0 / 3, 1.0 / 3}, 1e-12));
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
        with_params(*blk,
                    {"attention.W_q.weight", "attention.W_v.bias", "attention.W_o.weight", "ffn.dense1.bias",
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
    check(
        [blk, enc_valid_lens, past, cached](const auto& v) {
          nn::DecoderState state;
          state.enc_outputs = v[1];
          state.enc_valid_lens = enc_valid_lens;
          state.key_values.resize(2);
          if (cached) state.key_values[1] = past;
          return blk->forward(v[0], state);
        },
        with_params(*blk,
                    {"attention1.W_k.weight", "attention2.W_q.weight", "attention2.W_v.weight", "ffn.dense2.weight",
                     "addnorm3.ln.weight"},
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
  check(
      [model, enc_X, dec_X, enc_valid_lens, L](const auto& v) {
        for (int64_t k = 0; k < 3; ++k)
          for (int64_t l = 0; l < L; ++l) model->head_control(k * L + l).gates = v[0].select(0, k).select(0, l);
        return model->forward(enc_X, dec_X, enc_valid_lens);  // logits (2, 4, 9)
      },
      with_params(*model,
                  {"encoder.embedding.weight", "encoder.blks.block1.attention.W_v.weight",
                   "decoder.blks.block0.attention1.W_q.weight", "decoder.blks.block1.attention2.W_k.bias",
                   "decoder.blks.block1.addnorm3.ln.weight", "decoder.embedding.weight", "decoder.dense.bias"},
                  {gates}));
}
