// Feature pages (analysis/sae_pages.h): the corpus scan's contexts and frequencies against the model's own activations,
// the page needs no network, and in a real browser (tests/browser/features_driver.py) `headlab sae pages`'s page shows
// the feature its address names, each context token coloured by its activation over the feature's largest, and
// choosing a feature rewrites the address. The screenshot stays in <build>/tests/artifacts/features.png.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "analysis/hooked_run.h"
#include "analysis/sae_pages.h"
#include "io/checkpoint.h"
#include "io/sae_files.h"
#include "tests/browser_util.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "tests/tiny_models.h"

namespace headlab {
namespace {

constexpr int64_t kB = 4, kBatches = 3, kFeatures = 16;
const std::string kHook = "blocks.1.hook_resid_post";

struct PagesSetup {
  std::unique_ptr<tasks::Task> task;
  nn::DecoderConfig cfg;
  std::unique_ptr<nn::DecoderModel> model;
  std::unique_ptr<nn::SparseAutoencoder> sae;
  int64_t T = 0;
};

// A random 2-layer reverse GPT and a random ReLU SAE on its last residual stream (pages do not care what they learned).
PagesSetup setup() {
  PagesSetup s;
  tasks::TaskOptions o;
  s.task = tasks::make_task("reverse", o);
  s.cfg = testing::tiny_gpt_config(
      testing::kFourHeadGpt.sized_for(s.task->vocab_size(), s.task->required_context_length()));
  s.T = s.task->required_context_length();
  manual_seed(5);
  s.model = std::make_unique<nn::DecoderModel>(s.cfg);
  nn::SaeConfig c;
  c.d_in = s.cfg.emb_dim, c.d_sae = kFeatures, c.arch = nn::SaeArch::relu;
  s.sae = std::make_unique<nn::SparseAutoencoder>(c);
  const NoGradGuard no_grad;
  s.sae->b_enc.fill_(-0.5);  // most features quiet on most tokens, as a trained SAE's
  return s;
}

io::SaeOrigin origin() {
  io::SaeOrigin o;
  o.model_name = "tiny", o.hook_name = kHook;
  return o;
}

TEST(SaePages, ContextsAndFrequenciesAreTheModelsOwn) {
  PagesSetup s = setup();
  analysis::FeaturePagesOptions o;
  o.features = 4, o.contexts = 3;
  const analysis::FeaturePages p = analysis::feature_pages(*s.model, *s.task, *s.sae, origin(), kBatches, kB, s.T, o);
  EXPECT_EQ(p.tokens, kBatches * kB * s.T);
  // every feature's activations over the same batches, independently
  std::vector<double> largest(kFeatures, 0.0), fired(kFeatures, 0.0);
  for (int64_t b = 0; b < kBatches; ++b) {
    const tasks::Batch batch = s.task->batch(tasks::Split::val, static_cast<uint64_t>(b), kB, s.T);
    const analysis::HookedRun r = analysis::run_hooked(*s.model, tensor(batch.inputs, {kB, s.T}), {kHook});
    const NoGradGuard no_grad;
    const std::vector<float> f = s.sae->encode(reshape(r.cache.at(kHook), {kB * s.T, -1})).to_vector<float>();
    for (size_t i = 0; i < f.size(); ++i) {
      largest[i % kFeatures] = std::max(largest[i % kFeatures], static_cast<double>(f[i]));
      fired[i % kFeatures] += f[i] > 0;
    }
  }
  ASSERT_EQ(p.features.size(), 4u);
  for (size_t i = 0; i < p.features.size(); ++i) {
    const analysis::FeaturePage& f = p.features[i];
    SCOPED_TRACE(f.feature);
    if (i > 0) {
      EXPECT_GE(p.features[i - 1].max_activation, f.max_activation);  // the most active first
    }
    EXPECT_NEAR(f.max_activation, largest[static_cast<size_t>(f.feature)], 1e-5);
    EXPECT_DOUBLE_EQ(f.frequency, fired[static_cast<size_t>(f.feature)] / static_cast<double>(p.tokens));
    ASSERT_FALSE(f.contexts.empty());
    EXPECT_LE(f.contexts.size(), 3u);
    EXPECT_NEAR(f.contexts[0].activation, f.max_activation, 1e-5);  // the top context is where it peaked
    for (size_t c = 0; c < f.contexts.size(); ++c) {
      const analysis::FeatureContext& ctx = f.contexts[c];
      EXPECT_EQ(static_cast<int64_t>(ctx.ids.size()), s.T);
      EXPECT_EQ(ctx.activations[static_cast<size_t>(ctx.position)], ctx.activation);
      if (c > 0) {
        EXPECT_GE(f.contexts[c - 1].activation, ctx.activation);
      }
      for (size_t d = 0; d < c; ++d) EXPECT_NE(f.contexts[d].ids, ctx.ids);  // one context a sequence
    }
    ASSERT_EQ(f.labels.size(), f.parts.size());
    EXPECT_EQ(f.labels.back(), "remainder");
  }
  const std::string page = analysis::feature_pages_html(p, *s.task, "t");
  for (const char* external : {"http://", "https://", "src=", "href=", "@import"})
    EXPECT_EQ(page.find(external), std::string::npos) << external;
}

TEST(SaePages, ChromiumShowsTheAddressedFeatureWithEachTokenColouredByItsActivation) {
  if (std::system("command -v python3 > /dev/null 2>&1") != 0) GTEST_SKIP() << "needs python3";
  PagesSetup s = setup();
  testing::TempDir tmp("headlab_pages");
  io::Checkpoint ck;
  tasks::TaskOptions o;
  ck.config = {{"model", s.cfg.to_json()},
               {"tokenizer", {{"type", "char"}, {"vocab", s.task->tokenizer().vocab()}}},
               {"task", {{"name", "reverse"}, {"options", tasks::options_to_map("reverse", o)}}}};
  ck.model = io::snapshot_parameters(*s.model);
  io::save_checkpoint(tmp.path("model.h5"), ck);
  io::write_sae_folder(tmp.path("sae"), *s.sae, origin());
  const testing::ProcessResult made = testing::run_process(
      {std::string(HEADLAB_BINARY_DIR) + "/headlab", "sae", "pages", tmp.path("model.h5"), tmp.path("sae"), "--batches",
       "3", "--rows-per-forward", "4", "--features", "3", "--contexts", "4", "--out", tmp.path("features.html")},
      tmp.dir());
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_NE(made.out.find("sae pages: 3 features of "), std::string::npos) << made.out;
  analysis::FeaturePagesOptions po;
  po.features = 3, po.contexts = 4;
  const analysis::FeaturePages p = analysis::feature_pages(*s.model, *s.task, *s.sae, origin(), 3, 4, s.T, po);
  ASSERT_EQ(p.features.size(), 3u);
  const analysis::FeaturePage& second = p.features[1];
  const std::optional<nlohmann::json> driven =
      testing::run_page_driver("features_driver.py", tmp.path("features.html"), "features.png",
                               "--hash F" + std::to_string(second.feature) + " --click-index 0 --then-hash F" +
                                   std::to_string(p.features[2].feature));
  if (!driven) GTEST_SKIP() << "no browser";
  const nlohmann::json& opened = (*driven)["opened"];
  EXPECT_EQ(opened["feature"], second.feature);
  EXPECT_EQ(opened["listed"], 3);
  EXPECT_EQ(opened["title"], "Feature " + std::to_string(second.feature));
  ASSERT_EQ(opened["contexts"].size(), second.contexts.size());
  for (size_t c = 0; c < second.contexts.size(); ++c) {
    const analysis::FeatureContext& ctx = second.contexts[c];
    int peaks = 0;
    for (const nlohmann::json& tok : opened["contexts"][c]) {
      const auto t = tok["t"].get<size_t>();
      EXPECT_EQ(tok["text"], s.task->token_text(ctx.ids[t]));
      // the computed colour: orange, its alpha the activation over the feature's largest
      double r = 0, g = 0, b = 0, alpha = 1;
      const std::string bg = tok["background"];
      const int n = std::sscanf(bg.c_str(), bg.starts_with("rgba") ? "rgba(%lf, %lf, %lf, %lf)" : "rgb(%lf, %lf, %lf)",
                                &r, &g, &b, &alpha);
      ASSERT_GE(n, 3) << bg;
      EXPECT_EQ(r, 255) << bg;
      EXPECT_EQ(g, 140) << bg;
      // chromium keeps alpha in 8 bits and prints it to 2 decimals: within 1/255 + 0.005
      EXPECT_NEAR(alpha, std::clamp(ctx.activations[t] / second.max_activation, 0.0, 1.0), 0.0095) << bg;
      if (tok["peak"].get<bool>()) {
        ++peaks;
        EXPECT_EQ(static_cast<int64_t>(t), ctx.position);
      }
    }
    EXPECT_EQ(peaks, 1);
  }
  EXPECT_EQ((*driven)["clicked"]["hash"], "#F" + std::to_string(p.features[0].feature));
  EXPECT_EQ((*driven)["clicked"]["feature"], p.features[0].feature);
  EXPECT_EQ((*driven)["rehashed"]["feature"], p.features[2].feature);
}

}  // namespace
}  // namespace headlab
