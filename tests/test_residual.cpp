// analysis/residual.h against numbers computed by hand from a run's cache, on one tiny model of each kind (GPT
// with biases, attention-only, pruned wrapper; LLaMA's RMSNorm with grouped-query rotary attention; GPT-NeoX's
// parallel residual), in float64: the accumulated and decomposed stream, head results, the frozen and recomputed
// norms, the logit lens, and gradients at hook points against central differences.
#include <gtest/gtest.h>

#include <cmath>

#include "analysis/hooked_run.h"
#include "analysis/residual.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"
#include "tests/core_test_util.h"
#include "tests/tiny_models.h"

using namespace headlab;
using analysis::StackOptions;
namespace ht = headlab::testing;

namespace {

double max_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return sub(a, b).abs().max().item<double>();
}

std::vector<std::pair<std::string, nn::DecoderConfig>> kinds() {
  const auto sized = [](nn::DecoderConfig c) {
    c.vocab_size = 23, c.context_length = 12, c.emb_dim = 16, c.n_heads = 4, c.n_layers = 2;
    return c;
  };
  std::vector<std::pair<std::string, nn::DecoderConfig>> all;
  nn::DecoderConfig c = sized(nn::gpt_family().config());
  c.qkv_bias = true;
  all.emplace_back("gpt, biases", c);
  c = sized(nn::gpt_family().config()), c.attn_only = true;
  all.emplace_back("gpt attention-only", c);
  c = sized(nn::gpt_family().config()), c.attention = nn::AttentionForm::wrapper, c.kept_heads = {{0, 2}, {1, 3}};
  all.emplace_back("gpt wrapper, pruned", c);
  c = sized(nn::llama_family().config()), c.n_kv_heads = 2, c.hidden_dim = 24;
  all.emplace_back("llama grouped-query", c);
  c = sized(nn::neox_family().config()), c.hidden_dim = 24, c.rotary_dims = 2;
  all.emplace_back("neox parallel", c);
  return all;
}

// A model of kind c in float64 with its norms' weights and biases away from 1 and 0, so that leaving one out shows.
std::unique_ptr<nn::DecoderModel> model_of(const nn::DecoderConfig& c) {
  manual_seed(3);
  auto m = std::make_unique<nn::DecoderModel>(c);
  m->to(DType::f64);
  const NoGradGuard ng;
  for (auto& [name, p] : m->named_parameters())
    if (name.find("norm") != std::string::npos)
      p.copy_(add(p, uniform(p.shape(), -0.5, 0.5, default_generator(), DType::f64)));
  return m;
}

Tensor tokens_of(const nn::DecoderConfig& c) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 7; ++i) ids.push_back((i * 5 + 3) % c.vocab_size);
  return tensor(ids, {2, 7});
}

analysis::Activations everything(nn::DecoderModel& m, const Tensor& tokens) {
  const std::vector<std::string> names = analysis::hook_names(m);
  return analysis::run_hooked(m, tokens, std::set<std::string>(names.begin(), names.end())).cache;
}

std::string hook(int64_t l, const std::string& point) { return "blocks." + std::to_string(l) + "." + point; }

// The norm by its formula: (x - mean) / sqrt(var + eps) (LayerNorm) or x / sqrt(mean(x^2) + eps) (RMSNorm); the
// scale taken from `at` (the stream itself, or the stream a frozen norm saw), then the weight and (bias) bias.
Tensor norm_by_hand(const nn::Norm& n, const Tensor& x, const Tensor& at, bool bias) {
  const auto centre = [&](const Tensor& t) { return n.centres() ? sub(t, t.mean({-1}, true)) : t; };
  const Tensor c = centre(at);
  const Tensor scale = sqrt(add(mul(c, c).mean({-1}, true), n.eps));
  Tensor y = mul(div(centre(x), scale), n.weight.detach());
  return bias && n.bias.defined() ? add(y, n.bias.detach()) : y;
}

}  // namespace

TEST(Residual, AccumulatedResidIsEachStreamAndTheLogitLensNormsEachByItself) {
  for (const auto& [kind, c] : kinds()) {
    SCOPED_TRACE(kind);
    auto m = model_of(c);
    const Tensor tokens = tokens_of(c);
    const analysis::Activations cache = everything(*m, tokens);
    const analysis::ResidualStack acc = analysis::accumulated_resid(*m, cache);
    EXPECT_EQ(acc.labels, (std::vector<std::string>{"0_pre", "1_pre", "final_post"}));
    EXPECT_EQ(max_difference(acc.stack.select(0, 1), cache.at(hook(1, "hook_resid_pre"))), 0);
    EXPECT_EQ(max_difference(acc.stack.select(0, 2), cache.at(hook(1, "hook_resid_post"))), 0);
    // apply_ln at the end: every stream through ln_final with its own scale, weight and bias.
    StackOptions o;
    o.apply_ln = true;
    const Tensor lens = analysis::accumulated_resid(*m, cache, o).stack;
    for (int64_t r = 0; r < 3; ++r) {
      const Tensor x = acc.stack.select(0, r);
      EXPECT_LT(max_difference(lens.select(0, r), norm_by_hand(m->ln_final(), x, x, true)), 1e-12) << r;
    }
    EXPECT_LT(max_difference(lens.select(0, 2), cache.at("ln_final.hook_normalized")), 1e-12);
    // Up to layer 1: the streams through layer 1's ln1 frozen at its input, weight and no bias; at one position.
    o.layer = 1, o.pos = -1;
    const analysis::ResidualStack one = analysis::accumulated_resid(*m, cache, o);
    EXPECT_EQ(one.labels, (std::vector<std::string>{"0_pre", "1_pre"}));
    const Tensor at = cache.at(hook(1, "hook_resid_pre")).select(1, 6);  // (B, C)
    EXPECT_LT(max_difference(one.stack, norm_by_hand(m->decoder_block(1).ln1(), acc.stack.narrow(0, 0, 2).select(2, 6),
                                                     at, false)),
              1e-12);
    // The same from tokens, keeping only what it reads.
    EXPECT_LT(max_difference(analysis::accumulated_resid(*m, tokens, o).stack, one.stack), 1e-12);
    StackOptions mid;
    mid.incl_mid = true;
    if (m->shape().has_mlp && !m->shape().parallel_residual) {
      EXPECT_EQ(analysis::accumulated_resid(*m, cache, mid).labels,
                (std::vector<std::string>{"0_pre", "0_mid", "1_pre", "1_mid", "final_post"}));
    } else {
      EXPECT_ERROR(analysis::accumulated_resid(*m, cache, mid), "needs blocks.L.hook_resid_mid");
    }
    o = {}, o.layer = 3;
    EXPECT_ERROR(analysis::accumulated_resid(*m, cache, o), "accumulated_resid: layer 3 is outside -1..2");
    o = {}, o.pos = 7;
    EXPECT_ERROR(analysis::accumulated_resid(*m, cache, o), "position 7 is outside the 7 tokens");
    analysis::Activations some = cache;
    some.erase(hook(1, "hook_resid_pre"));
    EXPECT_ERROR(analysis::accumulated_resid(*m, some), "the cache has no 'blocks.1.hook_resid_pre'");
  }
}

TEST(Residual, DecomposeResidSumsToTheStreamAndHeadResultsToAttnOut) {
  for (const auto& [kind, c] : kinds()) {
    SCOPED_TRACE(kind);
    auto m = model_of(c);
    const analysis::Activations cache = everything(*m, tokens_of(c));
    const analysis::ResidualStack d = analysis::decompose_resid(*m, cache);
    std::vector<std::string> labels = {"embed"};
    if (m->shape().learned_positions) labels.push_back("pos_embed");
    for (const std::string l : {"0", "1"}) {
      labels.push_back(l + "_attn_out");
      if (m->shape().has_mlp) labels.push_back(l + "_mlp_out");
    }
    EXPECT_EQ(d.labels, labels);
    const Tensor final_stream = cache.at(hook(1, "hook_resid_post"));
    EXPECT_LT(max_difference(d.stack.sum({0}), final_stream), 1e-12);
    StackOptions o;
    o.layer = 1;
    EXPECT_LT(
        max_difference(analysis::decompose_resid(*m, cache, o).stack.sum({0}), cache.at(hook(1, "hook_resid_pre"))),
        1e-12);
    if (m->shape().has_mlp && !m->shape().parallel_residual) {
      o.mlp_input = true;
      const analysis::ResidualStack into_mlp = analysis::decompose_resid(*m, cache, o);
      EXPECT_EQ(into_mlp.labels.back(), "1_attn_out");
      EXPECT_LT(max_difference(into_mlp.stack.sum({0}), cache.at(hook(1, "hook_resid_mid"))), 1e-12);
    }
    // Through the final norm frozen at the final stream the rows still sum to its output, less its bias.
    o = {}, o.apply_ln = true;
    Tensor through = analysis::decompose_resid(*m, cache, o).stack.sum({0});
    if (m->ln_final().bias.defined()) through = add(through, m->ln_final().bias.detach());
    EXPECT_LT(max_difference(through, cache.at("ln_final.hook_normalized")), 1e-12);

    // Heads: their results and out_proj's bias are attn_out; with the remainder they are the stream.
    const analysis::ResidualStack heads = analysis::stack_head_results(*m, cache);
    const int64_t H0 = m->attention(0).head_count();
    EXPECT_EQ(heads.labels.size(), static_cast<size_t>(H0 + m->attention(1).head_count()));
    EXPECT_EQ(heads.labels[1], c.kept_heads.empty() ? "L0H1" : "L0H2");  // original indices after pruning
    for (int64_t l = 0; l < 2; ++l) {
      Tensor sum = heads.stack.narrow(0, l == 0 ? 0 : H0, m->attention(l).head_count()).sum({0});
      if (const nn::Linear* proj = m->attention(l).output_projection(); proj && proj->bias.defined())
        sum = add(sum, proj->bias.detach());
      EXPECT_LT(max_difference(sum, cache.at(hook(l, "hook_attn_out"))), 1e-12) << l;
    }
    o = {}, o.incl_remainder = true, o.pos = 2;
    const analysis::ResidualStack rest = analysis::stack_head_results(*m, cache, o);
    EXPECT_EQ(rest.labels.back(), "remainder");
    EXPECT_LT(max_difference(rest.stack.sum({0}), final_stream.select(1, 2)), 1e-12);
    // apply_ln: each head's result through the frozen final norm, by hand: its direct logit attribution.
    o = {}, o.apply_ln = true;
    const Tensor scaled = analysis::stack_head_results(*m, cache, o).stack;  // (S, B, T, C)
    EXPECT_LT(max_difference(scaled, norm_by_hand(m->ln_final(), heads.stack, final_stream, false)), 1e-12);
    EXPECT_EQ(max_difference(analysis::apply_ln_to_stack(*m, cache, heads.stack), scaled), 0);
    EXPECT_LT(max_difference(analysis::stack_head_results(*m, tokens_of(c), o).stack, scaled), 1e-12);
    EXPECT_ERROR(analysis::apply_ln_to_stack(*m, cache, heads.stack.select(2, 0)),
                      "apply_ln_to_stack: expected a stack (components, ...) of vectors shaped as the stream");
    o = {}, o.mode = "both";
    EXPECT_ERROR(analysis::decompose_resid(*m, cache, o), "mode is 'all', 'attn' or 'mlp', not 'both'");
  }
}

TEST(Residual, LogitLensIsEachStreamsReadoutOfTheNextToken) {
  for (const auto& [kind, c] : kinds()) {
    SCOPED_TRACE(kind);
    auto m = model_of(c);
    const std::vector<int64_t> ids = {3, 9, 1, 14, 9, 20};
    const int64_t T = 6;
    const analysis::LogitLens lens = analysis::logit_lens(*m, ids);
    EXPECT_EQ(lens.rows, (std::vector<std::string>{"0_pre", "1_pre", "final_post"}));
    EXPECT_EQ(lens.T, T);
    ASSERT_EQ(lens.prob.size(), 3u * (T - 1));
    ASSERT_EQ(lens.rank.size(), 3u * (T - 1));
    const analysis::Activations cache = everything(*m, tensor(ids, {1, T}));
    const Tensor streams[] = {cache.at(hook(0, "hook_resid_pre")), cache.at(hook(1, "hook_resid_pre")),
                              cache.at(hook(1, "hook_resid_post"))};
    for (size_t r = 0; r < 3; ++r) {
      // By hand: the norm's formula, W_U, softmax; the rank by counting.
      const Tensor y = norm_by_hand(m->ln_final(), streams[r], streams[r], true);
      const std::vector<double> logits = matmul(y, m->W_U()).to_vector<double>();  // (1, T, V)
      for (int64_t t = 0; t + 1 < T; ++t) {
        const double* row = logits.data() + t * c.vocab_size;
        const double target = row[ids[static_cast<size_t>(t + 1)]];
        double total = 0, above = 0;
        for (int64_t v = 0; v < c.vocab_size; ++v) total += std::exp(row[v] - target), above += row[v] > target;
        EXPECT_NEAR(lens.prob_at(r, t), 1 / total, 1e-12) << r << " " << t;
        EXPECT_EQ(lens.rank_at(r, t), above) << r << " " << t;
      }
    }
    EXPECT_ERROR(analysis::logit_lens(*m, {3}), "logit_lens: needs at least 2 tokens");
  }
}

// d metric / d activation at hook points, metric = sum(R * logits), against central differences of the metric with
// the activation moved along a direction u (the model's own forward, moved by a hook).
TEST(Residual, GradientsAtHookPointsAreCentralDifferences) {
  for (const auto& [kind, c] : kinds()) {
    SCOPED_TRACE(kind);
    auto m = model_of(c);
    const Tensor tokens = tokens_of(c);
    const Tensor R = randn({2, 7, c.vocab_size}, default_generator(), DType::f64);
    const auto metric = [&](const std::map<std::string, analysis::Hook>& hooks) {
      return mul(analysis::run_hooked(*m, tokens, {}, hooks).logits, R).sum().item<double>();
    };
    std::set<std::string> names = {"hook_embed",           "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z",
                                   "blocks.1.attn.hook_v", "blocks.0.hook_resid_post",   "ln_final.hook_normalized"};
    if (m->shape().has_mlp) names.insert({"blocks.1.mlp.hook_post", "blocks.0.hook_mlp_out"});
    const analysis::HookedBackward b =
        analysis::run_hooked_backward(*m, tokens, {"blocks.1.attn.hook_z"}, names, [&](const Tensor& logits) {
          EXPECT_FALSE(logits.requires_grad());
          return R;
        });
    EXPECT_LT(max_difference(b.logits, analysis::run_hooked(*m, tokens).logits), 1e-12);
    EXPECT_FALSE(b.cache.at("blocks.1.attn.hook_z").requires_grad());
    ASSERT_EQ(b.gradients.size(), names.size());
    for (const std::string& name : names) {
      const Tensor& g = b.gradients.at(name);
      const Tensor u = randn(g.shape(), default_generator(), DType::f64);
      const double eps = 1e-5;
      const auto moved = [&](double by) {
        return metric({{name, [&](const std::string&, const Tensor& x) { return add(x, mul(u, by)); }}});
      };
      const double numeric = (moved(eps) - moved(-eps)) / (2 * eps), analytic = mul(g, u).sum().item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 * (1 + std::abs(numeric))) << name;
    }
    EXPECT_ERROR(analysis::run_hooked_backward(*m, tokens, {}, {"hook_embed"},
                                                    [](const Tensor&) { return zeros({2}, DType::f64); }),
                      "d metric / d logits must have the logits' shape [2, 7, 23], got [2]");
    EXPECT_ERROR(
        analysis::run_hooked_backward(*m, tokens, {}, {"blocks.9.hook_resid_pre"}, [&](const Tensor&) { return R; }),
        "no hook point 'blocks.9.hook_resid_pre'");
  }
}
