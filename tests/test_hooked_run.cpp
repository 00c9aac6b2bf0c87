// analysis/hooked_run.h: the forward with hook points equals the model's, caches what was asked,
// and a hook that edits an activation does what the model's own head controls do.
#include <gtest/gtest.h>

#include "analysis/hooked_run.h"
#include "core_test_util.h"
#include "ops/ops.h"
#include "tiny_models.h"

using namespace headlab;
using analysis::run_hooked;
namespace ht = headlab::testing;

namespace {

Tensor tokens_for(const nn::DecoderConfig& c, int64_t B, int64_t T, uint64_t seed) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * T; ++i) ids.push_back(static_cast<int64_t>((i * 7 + seed * 13) % c.vocab_size));
  return tensor(ids, {B, T});
}

double max_difference(const Tensor& a, const Tensor& b) { return sub(a, b).abs().max().item<double>(); }

}  // namespace

TEST(HookedRun, EqualsTheModelsForwardAndCachesOnlyWhatWasAsked) {
  for (const auto& [name, cfg] : ht::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    manual_seed(2);
    nn::DecoderModel model(cfg);
    model.to(DType::f64);
    model.train();  // the run is in eval mode and gives the model back as it was
    const Tensor idx = tokens_for(cfg, 3, 7, 1);
    const std::vector<std::string> names = analysis::hook_names(model);
    const std::set<std::string> all(names.begin(), names.end());
    const analysis::HookedRun r = run_hooked(model, idx, all);
    EXPECT_TRUE(model.is_training());
    model.eval();
    const NoGradGuard ng;
    EXPECT_LT(max_difference(r.logits, model.forward(idx)), 1e-10);
    EXPECT_EQ(r.cache.size(), all.size());
    EXPECT_EQ(names.front(), "hook_embed");
    EXPECT_EQ(names.back(), "ln_final.hook_normalized");
    EXPECT_EQ(all.count("blocks.0.hook_mlp_out"), cfg.attn_only ? 0u : 1u);
    // The stream after each block is the model's own; the pattern is the module's kept weights.
    Tensor x = model.embed(idx);
    for (int64_t l = 0; l < model.n_layers(); ++l) {
      model.attention(l).keep_attention_weights(true);
      x = model.block(l)->forward(x);
      const std::string p = "blocks." + std::to_string(l) + ".";
      EXPECT_LT(max_difference(r.cache.at(p + "hook_resid_post"), x), 1e-10) << l;
      if (cfg.attention == nn::AttentionForm::fused) {
        EXPECT_LT(max_difference(r.cache.at(p + "attn.hook_pattern"), model.attention(l).last_attention_weights()),
                  1e-12)
            << l;
      }
      const int64_t H = model.attention(l).head_count(), D = model.attention(l).head_size();
      EXPECT_EQ(r.cache.at(p + "attn.hook_z").shape(), (Shape{3, 7, H, D}));
      // The heads' results and out_proj's bias are attn_out.
      Tensor heads = r.cache.at(p + "attn.hook_result").sum({2});
      if (const Tensor& b = model.attention(l).output_projection()->bias; b.defined()) heads = add(heads, b);
      EXPECT_LT(max_difference(heads, r.cache.at(p + "hook_attn_out")), 1e-10) << l;
      EXPECT_EQ(r.cache.at(p + "attn.hook_pattern").shape(), (Shape{3, H, 7, 7}));
      model.attention(l).keep_attention_weights(false);
    }
    const analysis::HookedRun some = run_hooked(model, idx, {"blocks.1.attn.hook_pattern"});
    EXPECT_EQ(some.cache.size(), 1u);
  }
}

TEST(HookedRun, AHookZeroingAHeadIsThatHeadsGateAtZero) {
  for (const auto& [name, cfg] : ht::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    manual_seed(3);
    nn::DecoderModel model(cfg);
    model.to(DType::f64);
    model.eval();
    const Tensor idx = tokens_for(cfg, 2, 6, 2);
    const int64_t layer = 1, head = model.attention(layer).head_count() - 1;
    int64_t calls = 0;
    const analysis::Hook zero_head = [&](const std::string&, const Tensor& z) {  // z (B, T, H, D)
      ++calls;
      std::vector<double> m(static_cast<size_t>(z.size(2)), 1.0);
      m[static_cast<size_t>(head)] = 0.0;
      return mul(z, tensor(m, {1, 1, z.size(2), 1}).to(DType::f64));
    };
    const analysis::HookedRun hooked = run_hooked(model, idx, {}, {{"blocks.1.attn.hook_z", zero_head}});
    EXPECT_EQ(calls, 1);
    std::vector<double> gates(static_cast<size_t>(model.attention(layer).head_count()), 1.0);
    gates[static_cast<size_t>(head)] = 0.0;
    model.attention(layer).control().gates = tensor(gates, {static_cast<int64_t>(gates.size())}).to(DType::f64);
    const NoGradGuard ng;
    const Tensor gated = model.forward(idx);
    model.attention(layer).control().gates = Tensor();
    EXPECT_LT(max_difference(hooked.logits, gated), 1e-10);
    EXPECT_GT(max_difference(hooked.logits, model.forward(idx)), 1e-6);  // the head mattered
    // In place: a hook editing its argument and returning nothing.
    const analysis::HookedRun in_place =
        run_hooked(model, idx, {}, {{"blocks.1.attn.hook_z", [&](const std::string& n, const Tensor& z) {
                                       Tensor(z).copy_(zero_head(n, z));
                                       return Tensor();
                                     }}});
    EXPECT_LT(max_difference(in_place.logits, gated), 1e-10);
    // The same through the head's result: its share of attn_out zeroed.
    const analysis::HookedRun by_result =
        run_hooked(model, idx, {}, {{"blocks.1.attn.hook_result", [&](const std::string&, const Tensor& r) {
                                       Tensor(r.select(2, head)).fill_(0.0);
                                       return Tensor();
                                     }}});
    EXPECT_LT(max_difference(by_result.logits, gated), 1e-10);
  }
}

TEST(HookedRun, RefusesUnknownNamesBadTokensAndMisshapenReplacements) {
  nn::DecoderModel model(ht::tiny_gpt_config(ht::kThreeHeadGpt));
  const Tensor idx = tokens_for(model.config(), 1, 4, 0);
  EXPECT_ERROR(run_hooked(model, idx, {"blocks.9.hook_resid_pre"}),
               "run_with_cache: the model has no hook point 'blocks.9.hook_resid_pre'");
  EXPECT_ERROR(run_hooked(model, idx.to(DType::f32)), "run_hooked: tokens must be a (B, T) int64 tensor");
  EXPECT_ERROR(run_hooked(model, idx, {},
                          {{"hook_embed", [](const std::string&, const Tensor& x) { return x.narrow(1, 0, 2); }}}),
               "run_with_hooks: the hook at 'hook_embed' returned [1, 2, 24] float32; the activation is [1, 4, 24]");
}
