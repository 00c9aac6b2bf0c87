// SAEs on a real model (stories260K, from ../shared/models; skipped where absent): trained on its residual stream
// from text sampled from the model itself (TinyStories is not here), they reach a stated explained variance and keep
// most of the loss on held-out text, as an MLP transcoder does its MLP's output; `headlab sae train` and `sae eval`
// run end to end and write SAELens folders.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "analysis/sae_activations.h"
#include "analysis/sae_features.h"
#include "nn/generate.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "tests/shared_models.h"

namespace headlab {
namespace {

using testing::kStories260KDir;

bool have_stories260k() { return std::filesystem::exists(kStories260KDir + "/stories260K.bin"); }

// Stories the model writes at temperature 1, one seed each: text in its own distribution.
std::string sampled_text(int stories) {
  const loader::Loaded l =
      loader::load("test", kStories260KDir + "/stories260K.bin", "cpu", "", kStories260KDir + "/tok512.model");
  nn::DecoderModel& model = l.decoder("test");
  const tasks::Prompt p = l.task->encode_prompt("");
  std::string text;
  for (int s = 0; s < stories; ++s) {
    nn::GenerateOptions o;
    o.max_new_tokens = 255, o.temperature = 1.0, o.seed = static_cast<uint64_t>(s) + 1;
    text += l.task->format_continuation(p, nn::generate(model, p.ids, o)) + "\n";
  }
  return text;
}

const std::string& story_file() {
  static const testing::TempDir dir("sae_model");
  static const std::string path = [] {
    std::ofstream(dir.path("stories.txt")) << sampled_text(60);
    return dir.path("stories.txt");
  }();
  return path;
}

// `headlab sae ACTION` on stories260K and the sampled stories in windows of 64 tokens, then `rest`.
testing::ProcessResult run_sae(const std::string& action, const std::vector<std::string>& rest,
                               const testing::TempDir& dir) {
  const std::string S = kStories260KDir;
  std::vector<std::string> argv = {std::string(HEADLAB_BINARY_DIR) + "/headlab",
                                   "sae",
                                   action,
                                   S + "/stories260K.bin",
                                   "--tokenizer",
                                   S + "/tok512.model",
                                   "--text",
                                   story_file(),
                                   "--tokens",
                                   "64"};
  argv.insert(argv.end(), rest.begin(), rest.end());
  return testing::run_process(argv, dir.dir());
}

// One SAE (or transcoder) trained on the sampled stories (windows of 128 tokens, batches of 512, a buffer of 8192
// activations, 8x expansion), read back from its folder and evaluated on 4 held-out batches of 8 x 128. The sanitizer
// pass trains on a tenth of the tokens (the same code under its checks, ten times slower there); the figures the
// tests hold are the Release pass's.
struct Trained {
  analysis::SaeTrainReport report;
  io::LoadedSae sae;
  analysis::SaeEvalReport eval;
};
Trained train_on_stories(const analysis::SaeTarget& target, nn::SaeArch arch, int64_t tokens, double lr,
                         const std::function<void(analysis::SaeTrainArgs&)>& more = {}) {
  const loader::Loaded l = loader::load("test", kStories260KDir + "/stories260K.bin", "cpu", story_file(),
                                        kStories260KDir + "/tok512.model");
  const testing::TempDir out("sae_out");
  analysis::SaeTrainArgs a;
  a.targets = {target};
  a.arch = arch, a.k = 16, a.expansion = 8;
  a.training_tokens = testing::kAddressSanitizer ? tokens / 10 : tokens, a.batch_size = 512, a.buffer_rows = 8192,
  a.rows_per_forward = 8, a.context = 128;
  a.options.adam.lr = lr;
  a.out = out.path("saes");
  if (more) more(a);
  Trained t{analysis::train_saes(l, "stories260K", a, [](const std::string&) {}), {}, {}};
  t.sae = io::read_sae_folder(t.report.folders.at(0));
  t.eval = analysis::evaluate_sae(l, *t.sae.sae, t.sae.origin, 4, 8, 128);
  std::cerr << enum_name(arch) << " on " << target.name() << ": explained variance " << t.eval.explained_variance
            << " (held out during training " << t.report.held_out[0].explained_variance << "), ce_loss_score "
            << t.eval.ce_loss_score << ", L0 " << t.eval.l0 << ", dead " << t.eval.dead_features << "\n";
  return t;
}

TEST(SaeOnStories260K, ResidualStreamSaeReconstructsHeldOutText) {
  if (!have_stories260k()) GTEST_SKIP() << kStories260KDir << " is absent";
  const Trained t = train_on_stories({"blocks.2.hook_resid_post", ""}, nn::SaeArch::topk, 150'000, 1e-3);
  const analysis::SaeEvalReport& e = t.eval;
  EXPECT_EQ(t.sae.origin.hook_name, "blocks.2.hook_resid_post");
  EXPECT_NEAR(e.l0, 16.0, 1e-9);
  if (testing::kAddressSanitizer) return;  // a tenth of the tokens: no figures to hold
  EXPECT_GE(e.explained_variance, 0.8);
  EXPECT_GE(e.ce_loss_score, 0.8);
  EXPECT_LT(e.ce_loss_without_sae, e.ce_loss_with_sae);
  EXPECT_LT(e.ce_loss_with_sae, e.ce_loss_with_ablation);
}

TEST(SaeOnStories260K, JumpReluSaeIsSparseAndReconstructsHeldOutText) {
  if (!have_stories260k()) GTEST_SKIP() << kStories260KDir << " is absent";
  const Trained t = train_on_stories(
      {"blocks.2.hook_resid_post", ""}, nn::SaeArch::jumprelu, 150'000, 1e-3,
      [](auto& a) { a.options.loss.l0 = 3, a.options.loss.bandwidth = 0.05, a.options.init_threshold = 1.0; });
  if (testing::kAddressSanitizer) return;
  EXPECT_GE(t.eval.explained_variance, 0.68);  // 0.715 measured
  EXPECT_LE(t.eval.l0, 12.0);                  // 8.5
  EXPECT_GE(t.eval.ce_loss_score, 0.7);
}

TEST(SaeOnStories260K, MlpTranscoderReconstructsHeldOutMlpOutput) {
  if (!have_stories260k()) GTEST_SKIP() << kStories260KDir << " is absent";
  const Trained t =
      train_on_stories({"blocks.2.ln2.hook_normalized", "blocks.2.hook_mlp_out"}, nn::SaeArch::topk, 300'000, 3e-3);
  EXPECT_EQ(t.sae.origin.hook_name_out, "blocks.2.hook_mlp_out");
  EXPECT_EQ(t.eval.hook, "blocks.2.hook_mlp_out");
  EXPECT_LE(t.eval.l0, 16.0);
  if (testing::kAddressSanitizer) return;
  EXPECT_GE(t.eval.explained_variance, 0.6);  // 0.636 measured (a TopK transcoder of 512 latents, 300k tokens)
  EXPECT_GE(t.eval.ce_loss_score, 0.6);       // 0.671
}

TEST(SaeOnStories260K, CommandTrainsTwoHooksFromOneStreamAndEvaluates) {
  if (!have_stories260k()) GTEST_SKIP() << kStories260KDir << " is absent";
  const testing::TempDir dir("sae_cli");
  const std::string S = kStories260KDir, out = dir.path("saes");
  const auto headlab = [&](const std::string& action, const std::vector<std::string>& rest) {
    return run_sae(action, rest, dir);
  };
  const testing::ProcessResult t = headlab("train", {"--hook",
                                                     "blocks.1.hook_resid_post",
                                                     "--hook",
                                                     "blocks.1.attn.hook_z",
                                                     "--transcoder",
                                                     "blocks.1.ln2.hook_normalized:blocks.1.hook_mlp_out",
                                                     "--eval-every",
                                                     "4",
                                                     "--eval-tokens",
                                                     "512",
                                                     "--arch",
                                                     "relu",
                                                     "--l1",
                                                     "0.5",
                                                     "--expansion",
                                                     "2",
                                                     "--training-tokens",
                                                     "8192",
                                                     "--batch-size",
                                                     "1024",
                                                     "--buffer-rows",
                                                     "4096",
                                                     "--log-every",
                                                     "2",
                                                     "--out",
                                                     out});
  ASSERT_EQ(t.code, 0) << t.err << t.out;
  EXPECT_NE(t.out.find("step 8, 8192 tokens"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("held-out at step 4 (512 rows of the val split)"), std::string::npos) << t.out;
  const std::string transcoder = out + "/blocks.1.ln2.hook_normalized_to_blocks.1.hook_mlp_out";
  const testing::ProcessResult e = headlab("eval", {out + "/blocks.1.hook_resid_post", out + "/blocks.1.attn.hook_z",
                                                    transcoder, "--batches", "1", "--json"});
  ASSERT_EQ(e.code, 0) << e.err;
  const nlohmann::json j = nlohmann::json::parse(e.out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[1]["hook_name"], "blocks.1.attn.hook_z");
  EXPECT_EQ(j[1]["d_sae"], 2 * 64);  // hook_z: 8 heads x 8 wide, concatenated
  EXPECT_EQ(j[0]["tokens"], 8 * 64);
  EXPECT_EQ(j[2]["hook_name"], "blocks.1.ln2.hook_normalized");
  EXPECT_EQ(j[2]["hook_name_out"], "blocks.1.hook_mlp_out");
  EXPECT_TRUE(std::isfinite(j[2]["explained_variance"].get<double>()));  // 8 steps: trained, not yet good
  const io::LoadedSae tc = io::read_sae_folder(transcoder);
  EXPECT_EQ(tc.origin.hook_name_out, "blocks.1.hook_mlp_out");
  EXPECT_FALSE(tc.sae->config().apply_b_dec_to_input);
  // the hook_z SAE's features split over the heads that write them: each row sums to the feature's output norm
  const loader::Loaded l = loader::load("test", S + "/stories260K.bin", "cpu", "", S + "/tok512.model");
  const io::LoadedSae z = io::read_sae_folder(out + "/blocks.1.attn.hook_z");
  const analysis::FeatureHeads fh = analysis::feature_head_shares(l.decoder("test"), *z.sae, 1);
  ASSERT_EQ(fh.shares.shape(), (Shape{128, 8}));
  EXPECT_TRUE(testing::all_close(sum(fh.shares, {1}), fh.output_norms, 1e-12));
  EXPECT_GT(amax(fh.output_norms).item<double>(), 0.0);
  const testing::ProcessResult same =
      headlab("train", {"--transcoder", "hook_embed:hook_embed", "--out", dir.path("y")});
  EXPECT_EQ(same.code, 1);
  EXPECT_NE(same.err.find("that is an SAE (--hook hook_embed)"), std::string::npos) << same.err;
  const testing::ProcessResult no_hook = headlab("train", {"--out", dir.path("x")});
  EXPECT_EQ(no_hook.code, 1);
  EXPECT_NE(no_hook.err.find("--hook NAME"), std::string::npos) << no_hook.err;
}

TEST(SaeOnStories260K, TrainingResumesFromItsCheckpoint) {
  if (!have_stories260k()) GTEST_SKIP() << kStories260KDir << " is absent";
  const testing::TempDir dir("sae_resume");
  const std::string out = dir.path("saes");
  const auto train = [&](std::vector<std::string> rest) {
    const std::vector<std::string> base = {"--hook",
                                           "blocks.1.hook_resid_post",
                                           "--expansion",
                                           "2",
                                           "--k",
                                           "8",
                                           "--batch-size",
                                           "256",
                                           "--buffer-rows",
                                           "1024",
                                           "--log-every",
                                           "8",
                                           "--checkpoint-every",
                                           "8",
                                           "--out",
                                           out};
    rest.insert(rest.begin(), base.begin(), base.end());
    return run_sae("train", rest, dir);
  };
  const testing::ProcessResult none = train({"--training-tokens", "4096", "--resume"});
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("sae train --resume: " + out + "/checkpoint/state.json does not exist"), std::string::npos)
      << none.err;
  const testing::ProcessResult first = train({"--training-tokens", "4096"});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("checkpoint at step 16: " + out + "/checkpoint"), std::string::npos) << first.out;
  std::ifstream in(out + "/checkpoint/state.json");
  const nlohmann::json state = nlohmann::json::parse(in);
  EXPECT_EQ(state["step"], 16);
  EXPECT_EQ(state["tokens"], 4096);
  {  // a damaged state.json is refused by name, and then put back
    std::string text = state.dump();
    std::ofstream(out + "/checkpoint/state.json") << text.replace(text.find("stream_rows"), 11, "stream_roes");
    const testing::ProcessResult damaged = train({"--training-tokens", "8192", "--resume"});
    EXPECT_EQ(damaged.code, 1);
    EXPECT_NE(damaged.err.find(out + "/checkpoint/state.json: not a checkpoint sae train wrote"), std::string::npos)
        << damaged.err;
    std::ofstream(out + "/checkpoint/state.json") << state.dump();
  }
  const testing::ProcessResult other = train({"--training-tokens", "8192", "--resume", "--arch", "relu"});
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.err.find("its SAE 1's arch is \"topk\", this run's is \"relu\""), std::string::npos) << other.err;
  const testing::ProcessResult second = train({"--training-tokens", "8192", "--resume"});
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(second.out.find("step 8,"), std::string::npos) << second.out;  // it goes on after step 16
  EXPECT_NE(second.out.find("step 24, 6144 tokens"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("resumed from " + out + "/checkpoint; the 0 activations"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("32 steps, 8192 tokens"), std::string::npos) << second.out;
}

}  // namespace
}  // namespace headlab
