// SAELens's SAE folders: the fixtures (tools/fixtures_sae.py; every architecture, in v3-v5's and v6's layouts)
// encode and decode as SAELens's maths in numpy does, written folders read back bitwise, and what headlab cannot
// honour is refused by name.
#include <gtest/gtest.h>

#include <fstream>

#include "io/sae_files.h"
#include "io/safetensors.h"
#include "tests/core_test_util.h"
#include "tests/fixture_util.h"
#include "tests/process_util.h"

namespace headlab {
namespace {

using testing::all_close;
using testing::fixture_path;

class SaeLensFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(SaeLensFixture, EncodesAndDecodesAsNumpy) {
  const std::string name = GetParam();
  const io::LoadedSae loaded = io::read_sae_folder(fixture_path("sae/" + name));
  const io::SafetensorsFile ref(fixture_path("sae/reference.safetensors"));
  nn::SparseAutoencoder& sae = *loaded.sae;
  EXPECT_EQ(loaded.layout_version, name.ends_with("v6") ? 6 : 5);
  EXPECT_FALSE(loaded.origin.hook_name.empty());
  const Tensor x = ref.to_float(name + ".x");
  const NoGradGuard no_grad;
  const Tensor f = sae.encode(x);
  EXPECT_TRUE(all_close(f, ref.to_float(name + ".acts_post"), 1e-5));
  EXPECT_TRUE(all_close(sae.decode(f), ref.to_float(name + ".recons"), 1e-5));
  const Tensor in = sae.config().apply_b_dec_to_input ? sub(x, sae.b_dec) : x;
  EXPECT_TRUE(all_close(add(matmul(in, sae.W_enc), sae.b_enc), ref.to_float(name + ".acts_pre"), 1e-5));
}

TEST_P(SaeLensFixture, WritesWhatItReadsBitwise) {
  const io::LoadedSae a = io::read_sae_folder(fixture_path("sae/" + GetParam()));
  const testing::TempDir dir;
  io::write_sae_folder(dir.path("out"), *a.sae, a.origin);
  const io::LoadedSae b = io::read_sae_folder(dir.path("out"));
  EXPECT_EQ(b.layout_version, 6);
  EXPECT_EQ(b.origin.hook_name, a.origin.hook_name);
  EXPECT_EQ(b.origin.hook_name_out, a.origin.hook_name_out);
  EXPECT_EQ(b.sae->config().out_width(), a.sae->config().out_width());
  EXPECT_EQ(b.sae->config().arch, a.sae->config().arch);
  EXPECT_EQ(b.sae->config().k, a.sae->config().k);
  EXPECT_EQ(b.sae->config().apply_b_dec_to_input, a.sae->config().apply_b_dec_to_input);
  const NamedTensors pa = a.sae->named_parameters(), pb = b.sae->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>()) << pa[i].first;
}

INSTANTIATE_TEST_SUITE_P(Cases, SaeLensFixture,
                         ::testing::Values("relu_v5", "relu_v6", "topk_v5", "topk_v6", "jumprelu_v5", "jumprelu_v6",
                                           "transcoder_v6", "jumprelu_transcoder_v6"));

TEST(SaeLensTranscoder, ReadsItsOutputHookAndNeverSubtractsBdecFromItsInput) {
  const io::LoadedSae t = io::read_sae_folder(fixture_path("sae/transcoder_v6"));
  EXPECT_EQ(t.origin.hook_name, "blocks.1.ln2.hook_normalized");
  EXPECT_EQ(t.origin.hook_name_out, "blocks.1.hook_mlp_out");
  EXPECT_EQ(t.sae->config().d_in, 8);
  EXPECT_EQ(t.sae->config().out_width(), 6);
  EXPECT_FALSE(t.sae->config().apply_b_dec_to_input);  // saved true, as SAELens saves it; its transcoder ignores it
}

// A copy of a fixture with cfg.json's text edited by `edit`.
std::string edited_copy(const testing::TempDir& dir, const std::string& name,
                        const std::function<void(std::string&)>& edit) {
  static int copies = 0;
  const std::string to = dir.path(name + "_" + std::to_string(copies++));
  std::filesystem::create_directories(to);
  std::filesystem::copy_file(fixture_path("sae/" + name + "/sae_weights.safetensors"), to + "/sae_weights.safetensors");
  std::ifstream in(fixture_path("sae/" + name + "/cfg.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  edit(text);
  std::ofstream(to + "/cfg.json") << text;
  return to;
}

void expect_refused(const std::string& folder, const std::string& words) {
  try {
    io::read_sae_folder(folder);
    ADD_FAILURE() << folder << " was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

void replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
}

TEST(SaeLensFolders, RefusesWhatItCannotHonourByName) {
  const testing::TempDir dir;
  expect_refused(edited_copy(dir, "relu_v5", [](std::string& s) { replace(s, "\"standard\"", "\"gated\""); }),
                 "architecture 'gated'");
  expect_refused(edited_copy(dir, "topk_v6",
                             [](std::string& s) {
                               replace(s, "\"rescale_acts_by_decoder_norm\": false",
                                       "\"rescale_acts_by_decoder_norm\": true");
                             }),
                 "rescale_acts_by_decoder_norm");
  expect_refused(edited_copy(dir, "relu_v6",
                             [](std::string& s) {
                               replace(s, "\"normalize_activations\": \"none\"",
                                       "\"normalize_activations\": \"layer_norm\"");
                             }),
                 "normalize_activations 'layer_norm'");
  expect_refused(edited_copy(dir, "topk_v5", [](std::string& s) { replace(s, "{\"k\": 4}", "{}"); }), "no 'k'");
  expect_refused(edited_copy(dir, "relu_v5", [](std::string& s) { replace(s, "\"d_sae\": 24", "\"d_sae\": 25"); }),
                 "'W_enc' has shape [8, 24], expected [8, 25]");
  expect_refused(edited_copy(dir, "relu_v5",
                             [](std::string& s) {
                               replace(s, "\"finetuning_scaling_factor\": false",
                                       "\"finetuning_scaling_factor\": true");
                             }),
                 "finetuning_scaling_factor");
  // a threshold tensor in a ReLU SAE's file: a jumprelu file with a relu cfg
  expect_refused(edited_copy(dir, "jumprelu_v6", [](std::string& s) { replace(s, "\"jumprelu\"", "\"standard\""); }),
                 "tensor 'threshold' is not one a relu SAE has");
  expect_refused(
      edited_copy(dir, "transcoder_v6", [](std::string& s) { replace(s, "\"transcoder\"", "\"skip_transcoder\""); }),
      "architecture 'skip_transcoder' (a transcoder with a skip connection, W_skip)");
  expect_refused(edited_copy(dir, "transcoder_v6", [](std::string& s) { replace(s, "\"d_out\": 6, ", ""); }),
                 "no 'd_out'");
  expect_refused(edited_copy(dir, "jumprelu_transcoder_v6",
                             [](std::string& s) { replace(s, "\"blocks.1.hook_mlp_out\"", "\"\""); }),
                 "a transcoder's 'hook_name_out' is missing or empty");
  expect_refused(dir.path("absent"), "does not exist");
}

TEST(SaeLensFolders, RefusesNonFiniteWeightsByName) {
  const testing::TempDir dir;
  const io::LoadedSae a = io::read_sae_folder(fixture_path("sae/relu_v6"));
  {
    const NoGradGuard no_grad;
    Tensor w = a.sae->W_dec;
    w.copy_(div(w, zeros_like(w)));
  }
  io::write_sae_folder(dir.path("nan"), *a.sae, a.origin);
  expect_refused(dir.path("nan"), "'W_dec' holds a NaN or an infinity");
}

}  // namespace
}  // namespace headlab
