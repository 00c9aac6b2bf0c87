// The GPT-Neo family (nn/gpt_neo.cpp, io/hf_gpt_neo.cpp): its folders against the float64 twin
// (tools/fixtures_gpt_neo_folders.py: logits to 1e-5, the same greedy tokens through the cached decode, in safetensors
// and pytorch_model.bin, with local layers whose window is shorter than the prompt), cached decoding against the full
// forward, export read back bit for bit, a fresh model from train's options, and what it refuses by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "io/families.h"
#include "nn/decoder_family.h"
#include "nn/generate.h"
#include "tests/core_test_util.h"
#include "tests/family_checks.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::max_diff;
using headlab::testing::nested;
using headlab::testing::TempDir;

namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/gpt_neo_folders/" + name;
}

std::shared_ptr<nn::DecoderModel> read_folder(const std::string& folder) {
  const io::Family& family = io::family_of_folder(folder);
  EXPECT_EQ(family.model.arch(), "gpt_neo");
  return std::dynamic_pointer_cast<nn::DecoderModel>(io::build_folder_model(family.folder->read(folder), folder));
}

}  // namespace

class GptNeoFolders : public ::testing::TestWithParam<std::string> {};

TEST_P(GptNeoFolders, MatchPyTorchLogitsAndGreedyTokens) {
  auto m = read_folder(fixture(GetParam()));
  ASSERT_TRUE(m);
  std::ifstream in(fixture("reference.json"));
  const nlohmann::json ref = nlohmann::json::parse(in).at(GetParam());
  const NoGradGuard no_grad;
  const Tensor logits = m->forward(nested(ref["ids"], DType::i64));
  EXPECT_LT(max_diff(logits, nested(ref["logits"], DType::f64)), 1e-5);
  nn::GenerateOptions g;
  g.max_new_tokens = 12;
  EXPECT_EQ(nn::generate(*m, ref["prompt"].get<std::vector<int64_t>>(), g), ref["greedy"].get<std::vector<int64_t>>());
}

INSTANTIATE_TEST_SUITE_P(Variants, GptNeoFolders,
                         ::testing::Values("global_local", "local_global_bin", "wide_window_f16"));

TEST(GptNeo, ConfigReadsTheLocalLayersAndCachedDecodingEqualsTheFullForward) {
  auto m = read_folder(fixture("global_local"));
  const nn::DecoderConfig& c = m->config();
  EXPECT_EQ(m->type_name(), "GPTNeo");
  EXPECT_EQ(c.sliding_window, 5);
  EXPECT_EQ(c.window_layers, std::vector<int64_t>{1});
  EXPECT_EQ(c.attn_scale, 1.0);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(read_folder(fixture("wide_window_f16"))->config().sliding_window, 0);  // longer than the context
  const NoGradGuard no_grad;
  Generator g(4);
  const Tensor idx = randint(0, 80, {2, 16}, g);
  const Tensor full = m->forward(idx);
  std::vector<nn::KVCache> caches(2);
  Tensor last = m->forward_cached(idx.narrow(1, 0, 3), caches);
  EXPECT_LT(max_diff(last, full.select(1, 2)), 2e-5);
  for (int64_t t = 3; t < 16; ++t) {
    last = m->forward_cached(idx.narrow(1, t, 1), caches);
    EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "position " << t;
  }
}

TEST(GptNeo, ExportReadsBackBitwise) {
  TempDir dir("gpt_neo_export");
  auto m = read_folder(fixture("local_global_bin"));
  io::family_named("gpt_neo", "test").folder->write(dir.path("out"), *m, {});
  auto back = read_folder(dir.path("out"));
  EXPECT_EQ(back->config_json(), m->config_json());
  const NamedTensors a = m->named_parameters(), b = back->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(max_diff(a[i].second, b[i].second), 0.0) << a[i].first;
}

TEST(GptNeo, AFreshModelAlternatesGlobalAndLocalLayers) {
  nn::ModelOptions o;
  o.arch = "gpt_neo", o.emb_dim = 16, o.n_heads = 2, o.n_layers = 4;
  const io::Family& f = io::family_named("gpt_neo", "test");
  const nn::TaskSizes sizes{.task = "copy", .vocab_size = 13, .context_length = 12};
  auto model = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(f.model.from_options(o, sizes)));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->config().window_layers, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(model->config().sliding_window, 6);
  EXPECT_EQ(model->config().hidden_dim, 64);
  o.qkv_bias = true;
  EXPECT_ERROR(f.model.from_options(o, sizes), "--qkv-bias: GPT-Neo's q, k and v have no biases");
}

TEST(GptNeo, WhatItDoesNotComputeIsRefusedByName) {
  TempDir dir("gpt_neo_bad");
  const std::string base = headlab::testing::slurp(fixture("global_local/config.json"));
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = nlohmann::json::parse(base);
    change(j);
    fs::create_directories(dir.path(name));
    std::ofstream(dir.path(name) + "/config.json") << j.dump();
    return dir.path(name);
  };
  const auto read_config = [](const std::string& folder) {
    return io::family_of_folder(folder).folder->read_config(folder);
  };
  EXPECT_ERROR(read_config(with("act", [](auto& j) { j["activation_function"] = "relu"; })),
               "activation_function 'relu' is not supported");
  EXPECT_ERROR(read_config(with("untied", [](auto& j) { j["tie_word_embeddings"] = false; })),
               "tie_word_embeddings false is not supported");
  EXPECT_ERROR(read_config(with("kinds",
                                [](auto& j) {
                                  j["attention_types"] = {{{"global", "sparse"}, 1}};
                                })),
               "attention layer 1 is 'sparse', expected global or local");
  EXPECT_ERROR(read_config(with("count",
                                [](auto& j) {
                                  j["attention_types"] = {{{"global"}, 1}};
                                })),
               "attention layers list 1 kinds for num_layers 2");
}
