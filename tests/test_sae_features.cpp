// Features of heads (analysis/sae_features.h) on tiny GPTs of every form (pruned and attention-only too): a feature's
// pre-activation splits over heads so that the parts and the bias sum to it, and each head's part is what zeroing
// that head's z takes away from the pre-activation (the model's own forward through hooks, a check independent of
// the split); a feature's logit effects are its direction through the final norm's weight and W_U.
#include <gtest/gtest.h>

#include "analysis/files.h"
#include "analysis/hooked_run.h"
#include "analysis/sae_features.h"
#include "core_test_util.h"
#include "tiny_models.h"

using namespace headlab;
namespace ht = headlab::testing;

namespace {

constexpr int64_t kFeatures = 12, kT = 7, kPos = 5;

std::vector<int64_t> prompt(int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < kT; ++t) ids.push_back((t * 5 + 3) % vocab);
  return ids;
}

io::SaeOrigin at(const std::string& hook) {
  io::SaeOrigin o;
  o.model_name = "tiny", o.hook_name = hook;
  return o;
}

// A ReLU SAE on d_in-wide rows with random float64 weights (b_dec subtracted from its input).
std::unique_ptr<nn::SparseAutoencoder> random_sae(int64_t d_in) {
  nn::SaeConfig c;
  c.d_in = d_in, c.d_sae = kFeatures, c.arch = nn::SaeArch::relu;
  auto sae = std::make_unique<nn::SparseAutoencoder>(c);
  sae->to(DType::f64);
  const NoGradGuard no_grad;
  sae->b_dec.copy_(mul(randn({d_in}, default_generator(), DType::f64), scalar_tensor(0.1, DType::f64)));
  sae->b_enc.copy_(mul(randn({kFeatures}, default_generator(), DType::f64), scalar_tensor(0.1, DType::f64)));
  return sae;
}

// The SAE's pre-activations (kFeatures) at kPos, from the hook's activation when `ablate` (a local head of `layer`,
// or -1) has its z zeroed.
std::vector<double> pre_activations(nn::DecoderModel& model, nn::SparseAutoencoder& sae, const std::string& hook,
                                    int64_t layer, int64_t ablate) {
  const std::vector<int64_t> ids = prompt(model.shape().vocab_size);
  std::map<std::string, analysis::Hook> hooks;
  if (ablate >= 0)
    hooks["blocks." + std::to_string(layer) + ".attn.hook_z"] = [ablate](const std::string&, const Tensor& z) {
      Tensor out = z.clone();
      out.select(2, ablate).zero_();
      return out;
    };
  const analysis::HookedRun r = analysis::run_hooked(model, tensor(ids, {1, kT}), {hook}, hooks);
  const Tensor x = reshape(r.cache.at(hook), {kT, sae.config().d_in}).select(0, kPos);
  const NoGradGuard no_grad;
  return add(matmul(sub(x, sae.b_dec), sae.W_enc), sae.b_enc).to_vector<double>();
}

// Features split at kPos: parts + bias = the pre-activation; each head's part = what zeroing its z removes (where
// `linear`: the hook is a linear function of that layer's z).
void expect_split_is_exact(nn::DecoderModel& model, const std::string& hook, int64_t width, int64_t head_layer,
                           bool linear) {
  SCOPED_TRACE(hook);
  auto sae = random_sae(width);
  analysis::FeatureOptions o;
  o.position = kPos;
  for (int64_t j = 0; j < kFeatures; ++j) o.chosen.push_back(j);
  const io::SaeOrigin origin = at(hook);
  const analysis::FeatureReport r =
      analysis::features_on_prompt(model, *sae, origin, prompt(model.shape().vocab_size), o);
  ASSERT_EQ(r.features.size(), static_cast<size_t>(kFeatures));
  EXPECT_FALSE(r.split.empty());
  const std::vector<double> clean = pre_activations(model, *sae, hook, head_layer, -1);
  const int64_t H = model.attention(head_layer).head_count();
  std::vector<std::vector<double>> ablated;
  for (int64_t h = 0; h < H; ++h) ablated.push_back(pre_activations(model, *sae, hook, head_layer, h));
  for (const analysis::FeatureOnPrompt& f : r.features) {
    SCOPED_TRACE(f.feature);
    EXPECT_EQ(f.position, kPos);
    EXPECT_NEAR(f.pre_activation, clean[static_cast<size_t>(f.feature)], 1e-12);
    double total = f.bias;
    for (double p : f.parts) total += p;
    EXPECT_NEAR(total, f.pre_activation, 1e-12);
    EXPECT_NEAR(f.activation, std::max(0.0, f.pre_activation), 1e-12);
    if (!linear) continue;
    for (int64_t h = 0; h < H; ++h) {
      const std::string label = analysis::head_name(model, head_layer, h);
      const auto at = std::find(f.labels.begin(), f.labels.end(), label);
      ASSERT_NE(at, f.labels.end()) << label;
      const double part = f.parts[static_cast<size_t>(at - f.labels.begin())];
      EXPECT_NEAR(
          clean[static_cast<size_t>(f.feature)] - ablated[static_cast<size_t>(h)][static_cast<size_t>(f.feature)], part,
          1e-10)
          << label;
    }
  }
}

TEST(SaeFeatures, PreActivationsSplitOverTheHeadsThatWroteThemExactly) {
  for (const auto& [name, cfg] : ht::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    manual_seed(5);
    nn::DecoderModel model(cfg);
    model.to(DType::f64);
    const int64_t C = cfg.emb_dim, last = cfg.n_layers - 1;
    const int64_t z_width = model.attention(last).head_count() * model.attention(last).head_size();
    expect_split_is_exact(model, "blocks." + std::to_string(last) + ".attn.hook_z", z_width, last, true);
    expect_split_is_exact(model, "blocks." + std::to_string(last) + ".hook_attn_out", C, last, true);
    // the stream into the last layer: every earlier head, the rest a remainder; linear in layer 0's z only
    // without an MLP in between
    expect_split_is_exact(model, "blocks." + std::to_string(last) + ".hook_resid_pre", C, 0, cfg.attn_only);
  }
}

TEST(SaeFeatures, RanksTheMostActiveAndReadsTheirLogitEffectsThroughTheFinalNorm) {
  manual_seed(6);
  const nn::DecoderConfig cfg = ht::tiny_gpt_config(ht::kThreeHeadGpt);
  nn::DecoderModel model(cfg);
  model.to(DType::f64);
  const std::string hook = "blocks.1.hook_resid_post";
  auto sae = random_sae(cfg.emb_dim);
  analysis::FeatureOptions o;
  o.features = 3, o.logits = 4;
  const analysis::FeatureReport r = analysis::features_on_prompt(model, *sae, at(hook), prompt(cfg.vocab_size), o);
  ASSERT_EQ(r.features.size(), 3u);
  for (size_t i = 1; i < r.features.size(); ++i) EXPECT_GE(r.features[i - 1].activation, r.features[i].activation);
  const NoGradGuard no_grad;
  for (const analysis::FeatureOnPrompt& f : r.features) {
    EXPECT_EQ(*std::max_element(f.activations.begin(), f.activations.end()), f.activation);
    ASSERT_EQ(f.top_logits.size(), 4u);
    ASSERT_EQ(f.bottom_logits.size(), 4u);
    // the direction as ln_final frozen at any stream maps it, without that stream's scale, times W_U
    const Tensor d = sae->W_dec.select(0, f.feature).unsqueeze(0);  // (1, C)
    const nn::FrozenNorm frozen = model.freeze_final_norm(randn({1, cfg.emb_dim}, default_generator(), DType::f64));
    const Tensor folded = div(frozen.apply(d.unsqueeze(0)).select(0, 0), frozen.inv_scale);  // (1, C)
    const std::vector<double> logits = matmul(folded, model.W_U()).select(0, 0).to_vector<double>();
    EXPECT_NEAR(f.top_logits[0].effect, *std::max_element(logits.begin(), logits.end()), 1e-12);
    EXPECT_NEAR(f.bottom_logits[0].effect, *std::min_element(logits.begin(), logits.end()), 1e-12);
    EXPECT_NEAR(logits[static_cast<size_t>(f.top_logits[1].token)], f.top_logits[1].effect, 1e-12);
  }
}

TEST(SaeFeatures, HeadSharesOfChosenFeaturesAreTheirRowsOfAllAcrossChunks) {
  manual_seed(8);
  const nn::DecoderConfig cfg = ht::tiny_gpt_config(ht::kThreeHeadGpt);
  nn::DecoderModel model(cfg);
  nn::SaeConfig c;
  c.d_in = cfg.emb_dim, c.d_sae = 1100, c.arch = nn::SaeArch::relu;  // past one chunk of 1024 features
  nn::SparseAutoencoder sae(c);
  const analysis::FeatureHeads all = analysis::feature_head_shares(model, sae, 1);
  ASSERT_EQ(all.shares.shape(), (Shape{1100, 3}));
  EXPECT_TRUE(ht::all_close(sum(all.shares, {1}), all.output_norms, 1e-12));
  const analysis::FeatureHeads some = analysis::feature_head_shares(model, sae, 1, {1050, 3});
  EXPECT_EQ(some.shares.select(0, 0).to_vector<double>(), all.shares.select(0, 1050).to_vector<double>());
  EXPECT_EQ(some.shares.select(0, 1).to_vector<double>(), all.shares.select(0, 3).to_vector<double>());
}

TEST(SaeFeatures, RefusesWhatItCannotRead) {
  manual_seed(7);
  const nn::DecoderConfig cfg = ht::tiny_gpt_config(ht::kThreeHeadGpt);
  nn::DecoderModel model(cfg);
  auto sae = random_sae(cfg.emb_dim + 1);
  sae->to(DType::f32);
  const io::SaeOrigin origin = at("blocks.0.hook_resid_post");
  EXPECT_ERROR(analysis::features_on_prompt(model, *sae, origin, prompt(cfg.vocab_size)),
               "sae features: blocks.0.hook_resid_post's activations are 24 wide a token, the SAE's d_in is 25");
  auto fits = random_sae(cfg.emb_dim);
  fits->to(DType::f32);
  analysis::FeatureOptions o;
  o.chosen = {kFeatures};
  EXPECT_ERROR(analysis::features_on_prompt(model, *fits, origin, prompt(cfg.vocab_size), o),
               "sae features: feature 12 is not one of the SAE's 12");
  o.chosen = {}, o.position = kT;
  EXPECT_ERROR(analysis::features_on_prompt(model, *fits, origin, prompt(cfg.vocab_size), o),
               "sae features: --position 7 is outside the prompt's 7 tokens");
  // a hook heads do not write: features and logit effects, no split
  const analysis::FeatureReport q =
      analysis::features_on_prompt(model, *fits, at("blocks.0.ln2.hook_normalized"), prompt(cfg.vocab_size), {});
  EXPECT_TRUE(q.split.empty());
  for (const analysis::FeatureOnPrompt& f : q.features) EXPECT_TRUE(f.parts.empty());
}

}  // namespace
