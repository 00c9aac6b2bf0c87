// The fused scaled_dot_product_attention (ops/attention.cpp, backends/cpu/cpu_attention.cpp) against
// its composite reference (matmul, causal_softmax / masked_softmax, dropout, matmul): values and
// gradients over a grid of batch, heads, lengths (tile-size multiples and not, T = 1) and head sizes,
// every mask, strided inputs, dropout (the same Philox mask as the dropout op), empty rows; and the
// attention modules, whose fused path (weights not kept) must match their composite one.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/backend.h"
#include "nn/attention.h"
#include "tests/core_test_util.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

struct Result {
  Tensor out, dq, dk, dv;
};

enum class MaskKind { none, causal, lens1, lens2 };

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::none:
      return "none";
    case MaskKind::causal:
      return "causal";
    case MaskKind::lens1:
      return "lens(B)";
    default:
      return "lens(B,Tq)";
  }
}

// Valid lengths in 0..Tk, with a zero among them when there are several.
AttentionMask make_mask(MaskKind m, int64_t B, int64_t Tq, int64_t Tk, uint64_t seed) {
  if (m == MaskKind::none) return AttentionMask::none();
  if (m == MaskKind::causal) return AttentionMask::causal();
  Generator g(seed);
  Tensor vl = m == MaskKind::lens1 ? randint(0, Tk + 1, {B}, g) : randint(0, Tk + 1, {B, Tq}, g);
  if (vl.numel() > 1) vl.view({-1}).narrow(0, 0, 1).fill_(0);
  if (vl.numel() > 2) vl.view({-1}).narrow(0, 1, 1).fill_(Tk);
  return AttentionMask::lengths(vl);
}

// Runs one path on fresh leaves copied from q, k, v, with the same generator state and dout.
template <typename F>
Result run(F&& attn, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, uint64_t gen_seed) {
  Tensor lq = q.detach().clone().requires_grad_(), lk = k.detach().clone().requires_grad_(),
         lv = v.detach().clone().requires_grad_();
  Generator g(gen_seed);
  const Tensor out = attn(lq, lk, lv, g);
  out.backward(dout);
  return {out.detach(), lq.grad(), lk.grad(), lv.grad()};
}

double max_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return INFINITY;
    m = std::max(m, std::abs(x[i] - y[i]));
  }
  return m;
}

// Fused vs composite on (B, H, Tq, D) / (B, H, Tk, D) / (B, H, Tk, Dv) inputs; returns the max error.
double compare(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, MaskKind m, DType dt,
               double p = 0.0, bool transposed = false) {
  Generator g(B * 1000 + H * 100 + Tq * 10 + Tk + D);
  auto make = [&](int64_t T, int64_t C) {  // transposed: a (B, T, H, C) buffer viewed as (B, H, T, C)
    return transposed ? randn({B, T, H, C}, g, dt).transpose(1, 2) : randn({B, H, T, C}, g, dt);
  };
  const Tensor q = make(Tq, D), k = make(Tk, D), v = make(Tk, Dv);
  const Tensor dout = randn({B, H, Tq, Dv}, g, dt);
  const AttentionMask mask = make_mask(m, B, Tq, Tk, 7 + Tq);
  const bool train = p > 0;
  const Result f = run([&](auto& a, auto& b, auto& c,
                           Generator& gg) { return scaled_dot_product_attention(a, b, c, mask, p, train, gg); },
                       q, k, v, dout, 5);
  const Result r =
      run([&](auto& a, auto& b, auto& c,
              Generator& gg) { return scaled_dot_product_attention_composite(a, b, c, mask, p, train, gg); },
          q, k, v, dout, 5);
  double e = 0;
  e = std::max(e, max_err(f.out, r.out));
  e = std::max(e, max_err(f.dq, r.dq));
  e = std::max(e, max_err(f.dk, r.dk));
  e = std::max(e, max_err(f.dv, r.dv));
  return e;
}

}  // namespace

TEST(AttentionKernel, MatchesCompositeFloat32) {
  double worst = 0;
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::lens1, MaskKind::lens2})
    for (int64_t T : {1, 5, 64, 65, 130})
      for (int64_t D : {16, 32, 64})
        for (auto [B, H] : {std::pair<int64_t, int64_t>{1, 1}, {2, 3}}) {
          const int64_t Tk = m == MaskKind::causal ? T : T + 3;  // Tq != Tk where the mask allows
          SCOPED_TRACE(std::string(mask_name(m)) + " B=" + std::to_string(B) + " H=" + std::to_string(H) +
                       " T=" + std::to_string(T) + " D=" + std::to_string(D));
          const double e = compare(B, H, T, Tk, D, D, m, DType::f32);
          EXPECT_LT(e, 2e-5);
          worst = std::max(worst, e);
        }
  std::printf("fused vs composite, float32: max abs error %.3g (values and gradients)\n", worst);
}

TEST(AttentionKernel, MatchesCompositeFloat64) {
  double worst = 0;
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::lens1, MaskKind::lens2})
    for (int64_t T : {1, 7, 64, 97})
      for (int64_t D : {16, 40}) {
        const int64_t Tk = m == MaskKind::causal ? T : 2 * T + 1;
        SCOPED_TRACE(std::string(mask_name(m)) + " T=" + std::to_string(T) + " D=" + std::to_string(D));
        const double e = compare(2, 2, T, Tk, D, D / 2 + 3, m, DType::f64);  // Dv != D too
        EXPECT_LT(e, 1e-12);
        worst = std::max(worst, e);
      }
  std::printf("fused vs composite, float64: max abs error %.3g\n", worst);
}

// One query over many keys (decoding with a cache takes its own path, one pass over the keys and one over the
// values): against the composite reference across the key tiles' edges (128), every mask, both dtypes, keys and
// values in (B, T, H, D) buffers, and grouped-query heads (3 query heads a key/value head) against keys and
// values repeated for every query head.
TEST(AttentionKernel, OneQueryOverManyKeys) {
  for (DType dt : {DType::f32, DType::f64})
    for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::lens1, MaskKind::lens2})
      for (int64_t Tk : {1, 2, 127, 128, 129, 961}) {
        SCOPED_TRACE(std::string(mask_name(m)) + " Tk=" + std::to_string(Tk) + (dt == DType::f32 ? " f32" : " f64"));
        const double e = compare(2, 3, 1, m == MaskKind::causal ? 1 : Tk, 64, 48, m, dt, 0.0, true);
        EXPECT_LT(e, dt == DType::f32 ? 2e-5 : 1e-12);
      }
  // The AVX-512 paths' edges: keys 16 at a time (D a multiple of 16) and a remainder, values 64 columns at a time.
  for (const auto& [D, Dv] : {std::pair<int64_t, int64_t>{128, 128}, {80, 80}, {16, 64}, {48, 192}})
    for (int64_t Tk : {15, 16, 17, 961})
      for (MaskKind m : {MaskKind::none, MaskKind::lens2}) {
        SCOPED_TRACE(std::string(mask_name(m)) + " Tk=" + std::to_string(Tk) + " D=" + std::to_string(D));
        EXPECT_LT(compare(2, 3, 1, Tk, D, Dv, m, DType::f32, 0.0, true), 2e-5);
      }
  for (int64_t Tk : {5, 300, 961})
    for (MaskKind m : {MaskKind::none, MaskKind::lens2}) {
      SCOPED_TRACE(std::string("grouped ") + mask_name(m) + " Tk=" + std::to_string(Tk));
      Generator g(11 + Tk);
      const int64_t B = 2, Hkv = 2, H = 6, D = 64;
      const Tensor q = randn({B, H, 1, D}, g), k = randn({B, Tk, Hkv, D}, g).transpose(1, 2),
                   v = randn({B, Tk, Hkv, D}, g).transpose(1, 2);
      const AttentionMask mask = make_mask(m, B, 1, Tk, 3);  // a length per (batch row, query): 0, Tk, ...
      const NoGradGuard no_grad;
      const Tensor fused = scaled_dot_product_attention(q, k, v, mask);
      const Tensor ref = scaled_dot_product_attention_composite(q, repeat_kv(k, H), repeat_kv(v, H), mask);
      EXPECT_LT(max_err(fused, ref), 2e-5);
    }
}

// (B, T, H, D) buffers viewed as (B, H, T, D), as the multi-head modules hand them over.
TEST(AttentionKernel, StridedInputs) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::lens2}) {
    SCOPED_TRACE(mask_name(m));
    EXPECT_LT(compare(2, 4, 70, m == MaskKind::causal ? 70 : 33, 32, 32, m, DType::f32, 0.0, true), 2e-5);
    EXPECT_LT(compare(2, 3, 9, 9, 8, 8, m, DType::f64, 0.0, true), 1e-12);
  }
}

// The fused kernel draws the dropout op's own mask (element index of the (B, H, Tq, Tk) weights,
// counters reserved the same way), so with one generator state both paths agree exactly.
TEST(AttentionKernel, DropoutMatchesTheDropoutOp) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::lens1}) {
    SCOPED_TRACE(mask_name(m));
    EXPECT_LT(compare(2, 2, 67, m == MaskKind::causal ? 67 : 70, 16, 16, m, DType::f32, 0.3), 2e-5);
    EXPECT_LT(compare(2, 2, 13, 13, 8, 8, m, DType::f64, 0.5, true), 1e-12);
  }
  // The generator advances by the same counters, whichever path ran.
  Generator a(9), b(9);
  const Tensor q = randn({2, 2, 10, 4}, a);
  b.set_state(a.seed(), a.offset());
  (void)scaled_dot_product_attention(q, q, q, AttentionMask::causal(), 0.2, true, a);
  (void)scaled_dot_product_attention_composite(q, q, q, AttentionMask::causal(), 0.2, true, b);
  EXPECT_EQ(a.offset(), b.offset());
  // Eval mode and p = 0 draw nothing.
  const uint64_t before = a.offset();
  (void)scaled_dot_product_attention(q, q, q, AttentionMask::causal(), 0.2, false, a);
  (void)scaled_dot_product_attention(q, q, q, AttentionMask::causal(), 0.0, true, a);
  EXPECT_EQ(a.offset(), before);
}

TEST(AttentionKernel, ThreeDimensionalInputsAreOneHead) {
  Generator g(3);
  const Tensor q = randn({3, 6, 8}, g, DType::f64), k = randn({3, 9, 8}, g, DType::f64),
               v = randn({3, 9, 5}, g, DType::f64);
  const AttentionMask mask = AttentionMask::lengths(i64({2, 0, 9}));
  const Tensor out = scaled_dot_product_attention(q, k, v, mask);
  EXPECT_EQ(out.shape(), (Shape{3, 6, 5}));
  EXPECT_TRUE(all_close(out, scaled_dot_product_attention_composite(q, k, v, mask), 1e-12, 0));
  EXPECT_TRUE(all_close(out.select(0, 1), zeros({6, 5}, DType::f64), 0, 0));  // valid length 0
}

TEST(AttentionKernel, EmptyRowsGiveZerosNotNaN) {
  Tensor q = randn({2, 2, 3, 4}).requires_grad_(), k = randn({2, 2, 5, 4}).requires_grad_(),
         v = randn({2, 2, 5, 4}).requires_grad_();
  const Tensor out = scaled_dot_product_attention(q, k, v, AttentionMask::lengths(i64({0, 0, 0, 0, 0, 0}, {2, 3})));
  EXPECT_TRUE(all_close(out, zeros(out.shape()), 0, 0));
  out.sum().backward();
  for (const Tensor* t : {&q, &k, &v}) EXPECT_TRUE(all_close(t->grad(), zeros(t->shape()), 0, 0));
}

// No queries, or no keys: the fused op runs no kernel (a launch over zero rows is an error on CUDA); the output is
// empty or zeros as the composite path gives, and every gradient zero.
TEST(AttentionKernel, NoQueriesOrNoKeys) {
  const FusedAttention before = fused_attention();
  set_fused_attention(FusedAttention::always);
  for (const auto& [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {3, 0}, {0, 0}}) {
    Tensor q = randn({2, 2, Tq, 4}).requires_grad_(), k = randn({2, 2, Tk, 4}).requires_grad_(),
           v = randn({2, 2, Tk, 3}).requires_grad_();
    const Tensor out = scaled_dot_product_attention(q, k, v);
    EXPECT_NE(out.grad_fn()->name.find("ScaledDotProductAttention"), std::string::npos) << out.grad_fn()->name;
    EXPECT_EQ(out.shape(), (Shape{2, 2, Tq, 3}));
    EXPECT_TRUE(all_close(out, zeros(out.shape()), 0, 0)) << Tq << " " << Tk;
    out.sum().backward();
    for (const Tensor* t : {&q, &k, &v}) EXPECT_TRUE(all_close(t->grad(), zeros(t->shape()), 0, 0)) << Tq << " " << Tk;
  }
  set_fused_attention(before);
}

TEST(AttentionKernel, SavesNoScoreSizedState) {
  // With grad on, the composite path keeps (B, H, T, T) weights alive for backward; the fused one
  // keeps q, k, v, the output and (B, H, T) log-sum-exps.
  const int64_t B = 2, H = 2, T = 256, D = 16;
  Generator g(1);
  Tensor q = randn({B, H, T, D}, g).requires_grad_();
  Backend& be = cpu_backend();
  const size_t base = be.bytes_in_use();
  Tensor out = scaled_dot_product_attention(q, q, q, AttentionMask::causal());
  const size_t fused = be.bytes_in_use() - base;
  out = Tensor();
  const size_t base2 = be.bytes_in_use();
  out = scaled_dot_product_attention_composite(q, q, q, AttentionMask::causal());
  const size_t composite = be.bytes_in_use() - base2;
  EXPECT_LT(fused, static_cast<size_t>(B * H * T * (D + 2) * 4 + 4096));
  EXPECT_GT(composite, static_cast<size_t>(B * H * T * T * 4));
}

TEST(AttentionKernel, TheSwitchPicksThePath) {
  Tensor q = randn({1, 2, 8, 4}).requires_grad_();
  const auto node = [&] { return scaled_dot_product_attention(q, q, q, AttentionMask::causal()).grad_fn()->name; };
  EXPECT_EQ(fused_attention(), FusedAttention::automatic);
  const std::string fused = node();  // the CPU's kernel always pays
  set_fused_attention(FusedAttention::never);
  const std::string composite = node();
  set_fused_attention(FusedAttention::always);
  const std::string forced = node();
  set_fused_attention(FusedAttention::automatic);
  EXPECT_NE(fused.find("ScaledDotProductAttention"), std::string::npos) << fused;
  EXPECT_EQ(forced, fused);
  EXPECT_NE(composite, fused);  // the last op of the composite path: matmul
}

TEST(AttentionKernel, RejectsBadInput) {
  const Tensor q = randn({2, 2, 3, 4}), k = randn({2, 2, 5, 4});
  EXPECT_ERROR(scaled_dot_product_attention(q, k, k, AttentionMask::causal()), "causal mask needs as many queries");
  EXPECT_ERROR(scaled_dot_product_attention(q, randn({2, 2, 5, 3}), k), "same head size");
  EXPECT_ERROR(scaled_dot_product_attention(q, k, randn({2, 2, 4, 4})), "same number of keys");
  EXPECT_ERROR(scaled_dot_product_attention(q, k, k, AttentionMask::lengths(i64({1, 6}))), "out of range");
  EXPECT_ERROR(scaled_dot_product_attention(q, k, k, AttentionMask::lengths(i64({1, 2, 3}))), "valid_lens must have");
  EXPECT_ERROR(scaled_dot_product_attention(q, k, k, {}, 1.5, true), "dropout probability");
}

// The modules' fused path (weights not kept) and composite path (kept, as analysis asks) compute the
// same function, dropout in training included, and leave the generator at the same offset.
TEST(AttentionKernel, ModulesFusedAndCompositePathsAgree) {
  for (double p : {0.0, 0.25}) {
    SCOPED_TRACE("dropout " + std::to_string(p));
    manual_seed(4);
    nn::CausalMultiHeadAttention mha(8, 8, 16, p, 2);
    nn::CausalAttention head(8, 4, 16, p);
    nn::DotProductAttention dot(p);
    const Tensor x = randn({3, 11, 8});
    const Tensor q = randn({3, 5, 4}), kv = randn({3, 7, 4}), vl = i64({0, 7, 3});
    auto run_all = [&](bool keep) {
      mha.keep_attention_weights(keep);
      head.keep_attention_weights = keep;
      dot.keep_attention_weights = keep;
      manual_seed(99);
      Tensor xl = x.detach().clone().requires_grad_();
      Tensor y = add(add(mha.forward(xl).sum(), head.forward(xl).sum()), dot.forward(q, kv, kv, vl).sum());
      y.backward();
      return std::make_tuple(y.detach(), xl.grad(), mha.W_query->weight.grad().clone(), default_generator().offset());
    };
    mha.zero_grad();
    head.zero_grad();
    const auto [y1, gx1, gw1, off1] = run_all(false);
    mha.zero_grad();
    head.zero_grad();
    const auto [y2, gx2, gw2, off2] = run_all(true);
    EXPECT_TRUE(all_close(y1, y2, 1e-4, 1e-5));
    EXPECT_TRUE(all_close(gx1, gx2, 1e-5, 1e-4));
    EXPECT_TRUE(all_close(gw1, gw2, 1e-5, 1e-4));
    EXPECT_EQ(off1, off2);
    EXPECT_TRUE(mha.last_attention_weights().defined());
  }
}
