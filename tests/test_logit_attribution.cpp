// Tests of analysis/logit_attribution.h on small random GPTs in float64, fused, wrapper and pruned,
// with random LayerNorm scales and shifts (they start at 1 and 0, which would hide a missing gamma or
// shift): the components add up to model.forward's logits; every head's share equals an explicit loop
// over its out_proj columns and, in the last layer, its ablation with the final scale frozen; planted
// heads; errors, and the model left as it was.
#include "analysis/logit_attribution.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/core_test_util.h"
#include "tests/tiny_models.h"

using namespace headlab;
using namespace headlab::analysis;

namespace {

using headlab::testing::kThreeHeadGpt;
constexpr int64_t kVocab = kThreeHeadGpt.vocab_size, kContext = kThreeHeadGpt.context_length,
                  kEmb = kThreeHeadGpt.emb_dim, kHeads = kThreeHeadGpt.n_heads, kHeadDim = kEmb / kHeads;
constexpr double kEps = 1e-5;  // the final LayerNorm's

nn::DecoderConfig tiny_config(nn::AttentionForm form) { return headlab::testing::tiny_gpt_config(kThreeHeadGpt, form); }

// Every form the attribution must handle.
std::vector<std::pair<std::string, nn::DecoderConfig>> configs() { return headlab::testing::tiny_gpt_forms(kThreeHeadGpt); }

std::shared_ptr<nn::DecoderModel> tiny_model(const nn::DecoderConfig& cfg, DType dtype = DType::f64) {
  manual_seed(5);
  auto m = std::make_shared<nn::DecoderModel>(cfg);
  m->to(dtype);
  NoGradGuard no_grad;
  for (auto& [name, p] : m->named_parameters()) {
    if (name.ends_with(".scale")) p.detach().copy_(uniform(p.shape(), 0.5, 1.5, default_generator(), dtype));
    if (name.ends_with(".shift")) p.detach().copy_(uniform(p.shape(), -0.5, 0.5, default_generator(), dtype));
  }
  return m;
}

// Two batches of random ids, the second shorter than the context, about a quarter of the targets unscored.
EvalSet random_data() {
  std::mt19937_64 rng(1);
  EvalSet s;
  for (int64_t T : {kContext, kContext - 3}) {
    Batch b;
    b.B = 3;
    b.T = T;
    for (int64_t i = 0; i < b.B * T; ++i) {
      b.inputs.push_back(static_cast<int64_t>(rng() % kVocab));
      b.targets.push_back(rng() % 4 == 0 ? kIgnoreIndex : static_cast<int64_t>(rng() % kVocab));
    }
    s.batches.push_back(std::move(b));
  }
  return s;
}

std::vector<double> param(const nn::Module& m, const std::string& name) {
  for (const auto& [n, p] : m.named_parameters())
    if (n == name) return p.to_vector<double>();
  ADD_FAILURE() << "no parameter " << name;
  return {};
}

// Calls f(row of the (B*T) flattening, target) for every scored target of the batch.
template <typename F>
void for_each_scored(const Batch& b, F f) {
  for (int64_t i = 0; i < b.B * b.T; ++i)
    if (b.target(i / b.T, i % b.T) != kIgnoreIndex) f(i, b.target(i / b.T, i % b.T));
}

// x_L (B*T*C values) through the model's own blocks (TransformerBlock::forward), not the function's pass.
std::vector<double> final_residual(nn::DecoderModel& m, const Batch& b) {
  NoGradGuard no_grad;
  const Tensor idx = tensor(b.inputs, {b.B, b.T});
  return m.trf_blocks->forward(add(m.tok_emb->forward(idx), m.pos_emb->forward(arange(b.T)))).to_vector<double>();
}

double sigma_of(const double* x) {  // the final LayerNorm's, on one token's residual
  double mean = 0, var = 0;
  for (int64_t c = 0; c < kEmb; ++c) mean += x[c] / kEmb;
  for (int64_t c = 0; c < kEmb; ++c) var += (x[c] - mean) * (x[c] - mean) / kEmb;
  return std::sqrt(var + kEps);
}

// The two unembedding rows of target y: W_U[y] - mean row (vs_mean) and W_U[y] (logit).
struct Unembed {
  std::vector<double> W_U, mean_row;
  explicit Unembed(const nn::DecoderModel& m) : W_U(param(m, "out_head.weight")), mean_row(kEmb, 0.0) {
    for (int64_t v = 0; v < kVocab; ++v)
      for (int64_t c = 0; c < kEmb; ++c) mean_row[c] += W_U[v * kEmb + c] / kVocab;
  }
  double logit(int64_t y, int64_t c) const { return W_U[y * kEmb + c]; }
  double vs_mean(int64_t y, int64_t c) const { return W_U[y * kEmb + c] - mean_row[c]; }
};

struct Totals {
  double vs_mean = 0, logit = 0;
};

// Mean correct-token logit, and that minus the mean logit, from model.forward.
Totals forward_totals(nn::DecoderModel& m, const EvalSet& d) {
  NoGradGuard no_grad;
  Totals t;
  for (const Batch& b : d.batches) {
    const std::vector<double> logits = m.forward(tensor(b.inputs, {b.B, b.T})).to_vector<double>();
    for_each_scored(b, [&](int64_t i, int64_t y) {
      double mean = 0;
      for (int64_t v = 0; v < kVocab; ++v) mean += logits[i * kVocab + v] / kVocab;
      t.logit += logits[i * kVocab + y];
      t.vs_mean += logits[i * kVocab + y] - mean;
    });
  }
  t.logit /= static_cast<double>(d.tokens());
  t.vs_mean /= static_cast<double>(d.tokens());
  return t;
}

// Every head's share by explicit loops: comp = W_O[:, hD:(h+1)D] c_h with c_h kept by model.forward,
// then ((comp - mean comp) / sigma(x_L) * gamma) . row. {vs_mean, logit}.
std::pair<HeadMatrix, HeadMatrix> loop_reference(nn::DecoderModel& m, const EvalSet& d) {
  const Unembed U(m);
  const std::vector<double> gamma = param(m, "final_norm.scale");
  HeadMatrix vs_mean = head_matrix(m, 0.0), logit = head_matrix(m, 0.0);
  const int64_t L = m.n_layers();
  for (int64_t l = 0; l < L; ++l) m.attention(l).control().keep_context = true;
  for (const Batch& b : d.batches) {
    NoGradGuard no_grad;
    m.forward(tensor(b.inputs, {b.B, b.T}));
    const std::vector<double> x_L = final_residual(m, b);
    std::vector<std::vector<double>> ctx, W_O;  // per layer: (B, H, T, D), (C, H*D)
    for (int64_t l = 0; l < L; ++l) {
      ctx.push_back(m.attention(l).control().context.to_vector<double>());
      W_O.push_back(param(m, "trf_blocks." + std::to_string(l) + ".att.out_proj.weight"));
    }
    for_each_scored(b, [&](int64_t i, int64_t y) {
      const int64_t row = i / b.T, t = i % b.T;
      const double sigma = sigma_of(&x_L[i * kEmb]);
      for (int64_t l = 0; l < L; ++l) {
        const int64_t H = m.attention(l).head_count();
        for (int64_t h = 0; h < H; ++h) {
          std::vector<double> comp(kEmb, 0.0);
          double mean = 0;
          for (int64_t c = 0; c < kEmb; ++c) {
            for (int64_t k = 0; k < kHeadDim; ++k)
              comp[c] += W_O[l][c * H * kHeadDim + h * kHeadDim + k] * ctx[l][((row * H + h) * b.T + t) * kHeadDim + k];
            mean += comp[c] / kEmb;
          }
          for (int64_t c = 0; c < kEmb; ++c) {
            const double normed = (comp[c] - mean) / sigma * gamma[c];
            vs_mean[l][h] += normed * U.vs_mean(y, c);
            logit[l][h] += normed * U.logit(y, c);
          }
        }
      }
    });
  }
  for (int64_t l = 0; l < L; ++l) {
    m.attention(l).control().keep_context = false;
    for (int64_t h = 0; h < m.attention(l).head_count(); ++h) {
      vs_mean[l][h] /= static_cast<double>(d.tokens());
      logit[l][h] /= static_cast<double>(d.tokens());
    }
  }
  return {vs_mean, logit};
}

TEST(LogitAttribution, ComponentsAddUpToTheModelsLogits) {
  const EvalSet d = random_data();
  for (const auto& [name, cfg] : configs()) {
    SCOPED_TRACE(name);
    auto m = tiny_model(cfg);
    const Totals ref = forward_totals(*m, d);
    const LogitAttribution a = logit_attribution(*m, d);
    EXPECT_EQ(a.tokens, d.tokens());
    // total: the block-by-block pass reproduces model.forward; sum(): the frozen-scale split is exact.
    EXPECT_NEAR(a.logit.total, ref.logit, 1e-9);
    EXPECT_NEAR(a.logit.sum(), ref.logit, 1e-9);
    EXPECT_NEAR(a.vs_mean.total, ref.vs_mean, 1e-9);
    EXPECT_NEAR(a.vs_mean.sum(), ref.vs_mean, 1e-9);
    for (const DirectAttribution* v : {&a.vs_mean, &a.logit}) {
      ASSERT_EQ(v->heads.size(), 2u);
      ASSERT_EQ(v->out_proj_bias.size(), 2u);
      ASSERT_EQ(v->feed_forward.size(), 2u);
      for (int64_t l = 0; l < 2; ++l) EXPECT_EQ(static_cast<int64_t>(v->heads[l].size()), cfg.heads_in_layer(l));
      EXPECT_NE(v->final_shift, 0.0);
    }
  }
  // float32 models are attributed in double too; they add up to float32 rounding.
  auto m = tiny_model(configs()[0].second, DType::f32);
  const LogitAttribution a = logit_attribution(*m, d);
  EXPECT_NEAR(a.logit.sum(), forward_totals(*m, d).logit, 1e-4);
}

TEST(LogitAttribution, HeadsMatchAnExplicitLoopOverOutProjColumns) {
  const EvalSet d = random_data();
  for (const auto& [name, cfg] : configs()) {
    SCOPED_TRACE(name);
    auto m = tiny_model(cfg);
    const LogitAttribution a = logit_attribution(*m, d);
    const auto [vs_mean, logit] = loop_reference(*m, d);
    for (size_t l = 0; l < 2; ++l)
      for (size_t h = 0; h < vs_mean[l].size(); ++h) {
        EXPECT_NEAR(a.vs_mean.heads[l][h], vs_mean[l][h], 1e-10) << "layer " << l << " head " << h;
        EXPECT_NEAR(a.logit.heads[l][h], logit[l][h], 1e-10) << "layer " << l << " head " << h;
      }
  }
}

// A last-layer head feeds x_L and the last feed-forward; with that feed-forward silenced (its output
// Linear zeroed), gate 0 changes x_L by exactly W_O[:, h] c_h, so with sigma frozen at the unablated
// run's, the logit changes by exactly the head's share.
TEST(LogitAttribution, LastLayerHeadIsItsFrozenScaleAblation) {
  const EvalSet d = random_data();
  for (const auto& [name, cfg] : configs()) {
    SCOPED_TRACE(name);
    auto m = tiny_model(cfg);
    {
      NoGradGuard no_grad;
      for (auto& [n, p] : m->named_parameters())
        if (n.starts_with("trf_blocks.1.ff.layers.2.")) p.detach().zero_();
    }
    const LogitAttribution a = logit_attribution(*m, d);
    const Unembed U(*m);
    const std::vector<double> gamma = param(*m, "final_norm.scale"), shift = param(*m, "final_norm.shift");
    const int64_t last = 1, H = m->attention(last).head_count();
    for (int64_t h = 0; h < H; ++h) {
      Totals change;
      for (const Batch& b : d.batches) {
        const std::vector<double> x0 = final_residual(*m, b);
        std::vector<double> gates(static_cast<size_t>(H), 1.0);
        gates[static_cast<size_t>(h)] = 0.0;
        m->attention(last).control().gates = tensor(gates, {H});
        const std::vector<double> x1 = final_residual(*m, b);
        m->attention(last).control().gates = Tensor();
        for_each_scored(b, [&](int64_t i, int64_t y) {
          const double sigma = sigma_of(&x0[i * kEmb]);
          const auto frozen = [&](const std::vector<double>& x, auto row) {  // final_norm with sigma frozen, . row
            double mean = 0, out = 0;
            for (int64_t c = 0; c < kEmb; ++c) mean += x[i * kEmb + c] / kEmb;
            for (int64_t c = 0; c < kEmb; ++c) out += ((x[i * kEmb + c] - mean) / sigma * gamma[c] + shift[c]) * row(c);
            return out;
          };
          const auto vs_mean = [&](int64_t c) { return U.vs_mean(y, c); };
          const auto logit = [&](int64_t c) { return U.logit(y, c); };
          change.vs_mean += frozen(x0, vs_mean) - frozen(x1, vs_mean);
          change.logit += frozen(x0, logit) - frozen(x1, logit);
        });
      }
      const auto n = static_cast<double>(d.tokens());
      EXPECT_NEAR(a.vs_mean.heads[last][h], change.vs_mean / n, 1e-10) << "head " << h;
      EXPECT_NEAR(a.logit.heads[last][h], change.logit / n, 1e-10) << "head " << h;
    }
  }
}

// Layer 0 head 1's out_proj columns zeroed: a share of exactly 0. Layer 1 head 2 made a copy of head 0
// (the same W_query/W_key/W_value rows, so the same context) with out_proj columns doubled: twice head
// 0's share, in the same run, so under the same sigma.
TEST(LogitAttribution, PlantedHeads) {
  for (const nn::AttentionForm form : {nn::AttentionForm::fused, nn::AttentionForm::wrapper}) {
    SCOPED_TRACE(enum_name(form));
    auto m = tiny_model(tiny_config(form));
    const auto weight = [&](int64_t l, const std::string& rest) {
      for (const auto& [n, p] : m->named_parameters())
        if (n == "trf_blocks." + std::to_string(l) + ".att." + rest) return p.detach();
      ADD_FAILURE() << "no parameter " << rest;
      return Tensor();
    };
    const int64_t D = kHeadDim;
    {
      NoGradGuard no_grad;
      weight(0, "out_proj.weight").narrow(1, 1 * D, D).zero_();
      for (const char* w : {"W_query.weight", "W_key.weight", "W_value.weight"}) {
        if (form == nn::AttentionForm::fused)
          weight(1, w).narrow(0, 2 * D, D).copy_(weight(1, w).narrow(0, 0, D));
        else
          weight(1, std::string("heads.2.") + w).copy_(weight(1, std::string("heads.0.") + w));
      }
      const Tensor W_O = weight(1, "out_proj.weight");
      W_O.narrow(1, 2 * D, D).copy_(mul(W_O.narrow(1, 0, D), 2.0));
    }
    const LogitAttribution a = logit_attribution(*m, random_data());
    for (const DirectAttribution* v : {&a.vs_mean, &a.logit}) {
      EXPECT_EQ(v->heads[0][1], 0.0);
      EXPECT_GT(std::abs(v->heads[1][0]), 1e-3);
      EXPECT_NEAR(v->heads[1][2], 2 * v->heads[1][0], 1e-12 * std::abs(v->heads[1][0]));
      EXPECT_NEAR(v->sum(), v->total, 1e-9);
    }
  }
}

TEST(LogitAttribution, ErrorsAndTheModelLeftAsItWas) {
  auto m = tiny_model(tiny_config(nn::AttentionForm::fused));
  const EvalSet d = random_data();
  const LogitAttribution plain = logit_attribution(*m, d);
  EXPECT_ERROR(logit_attribution(*m, EvalSet{}), "logit_attribution: the evaluation data has no scored tokens");
  EvalSet unscored = d;
  for (Batch& b : unscored.batches) b.targets.assign(b.targets.size(), kIgnoreIndex);
  EXPECT_ERROR(logit_attribution(*m, unscored), "logit_attribution: the evaluation data has no scored tokens");
  EvalSet too_long = d;
  too_long.batches[1].T = kContext + 1;
  too_long.batches[1].inputs.assign(static_cast<size_t>(3 * (kContext + 1)), 1);
  too_long.batches[1].targets.assign(static_cast<size_t>(3 * (kContext + 1)), 2);
  EXPECT_ERROR(logit_attribution(*m, too_long), "logit_attribution: 11 tokens exceed context_length 10");

  // A caller's gates, offsets and train mode: ignored, and restored, also after an error.
  nn::HeadControl& hc = m->attention(0).control();
  hc.gates = tensor(std::vector<double>{1.0, 0.0, 0.5}, {3});
  hc.offsets = full({3, kHeadDim}, 0.25, DType::f64);
  m->train();  // drop_rate 0: forward is still deterministic
  const Tensor idx = tensor(d.batches[0].inputs, {3, kContext});
  const std::vector<double> before = m->forward(idx).to_vector<double>();
  const auto expect_restored = [&] {
    EXPECT_TRUE(m->is_training());
    EXPECT_EQ(hc.gates.to_vector<double>(), std::vector<double>({1.0, 0.0, 0.5}));
    EXPECT_TRUE(hc.offsets.defined());
    for (int64_t l = 0; l < 2; ++l) {
      EXPECT_FALSE(m->attention(l).control().keep_context);
      EXPECT_FALSE(m->attention(l).control().context.defined());
    }
    EXPECT_EQ(m->forward(idx).to_vector<double>(), before);
  };
  EvalSet bad_target = d;
  bad_target.batches[1].targets[0] = kVocab;
  EXPECT_ERROR(logit_attribution(*m, bad_target),
               "logit_attribution: target 13 is outside the vocabulary of 13 tokens");
  expect_restored();
  const LogitAttribution gated = logit_attribution(*m, d);
  expect_restored();
  EXPECT_EQ(gated.logit.heads, plain.logit.heads);
  EXPECT_EQ(gated.vs_mean.heads, plain.vs_mean.heads);
  EXPECT_EQ(gated.logit.total, plain.logit.total);
}

}  // namespace
