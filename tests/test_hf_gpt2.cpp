// GPT-2 folders in the Hugging Face layout (io/hf_gpt2.h) against PyTorch: the four variants of
// tests/fixtures/gpt2_folders (tools/fixtures_gpt2_folders.py: prefixed names with mask buffers, an
// untied head, GPT2Model names in F16, BF16 shards) give GPT2LMHeadModel's logits and greedy
// continuation; export writes the folder back bitwise, pruned models at full width; every lie in a
// folder is an error naming the file and the key or tensor.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "analysis/surgery.h"
#include "autograd/engine.h"
#include "io/hf_gpt2.h"
#include "io/safetensors.h"
#include "nn/generate.h"
#include "ops/ops.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "train/evaluate.h"

namespace fs = std::filesystem;
using namespace headlab;

namespace {

std::string fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/gpt2_folders/" + name;
}

nlohmann::json reference() {
  std::ifstream in(fixture("reference.json"));
  return nlohmann::json::parse(in);
}

std::shared_ptr<nn::DecoderModel> build(const io::HfGpt2& hf) {
  auto model = std::make_shared<nn::DecoderModel>(hf.config);
  model->load_parameters(hf.parameters, "test");
  model->eval();
  return model;
}

Tensor logits_of(nn::DecoderModel& model, const nlohmann::json& ids_json) {
  const auto ids = ids_json.get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
  const NoGradGuard no_grad;
  return model.forward(tensor(flat, {int64_t(ids.size()), int64_t(ids[0].size())}));
}

double max_abs_diff(const Tensor& a, const std::vector<float>& b) {
  const std::vector<float> av = a.contiguous().to_vector<float>();
  EXPECT_EQ(av.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(av.size(), b.size()); ++i) m = std::max(m, double(std::abs(av[i] - b[i])));
  return m;
}

std::vector<float> flat_floats(const nlohmann::json& j) {
  std::vector<float> out;
  for (const auto& a : j)
    for (const auto& b : a)
      for (const auto& v : b) out.push_back(v.get<float>());
  return out;
}

class HfGpt2Variants : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGpt2Variants, LogitsAndGreedyEqualPyTorch) {
  const io::HfGpt2 hf = io::read_hf_gpt2(fixture(GetParam()));
  const bool untied = GetParam() == "untied";
  EXPECT_EQ(hf.config.tie_embeddings, !untied);
  EXPECT_TRUE(hf.config.qkv_bias);
  EXPECT_EQ(hf.config.n_layers, 2);
  EXPECT_EQ(hf.config.context_length, 16);
  // The names of the model's own parameters, each once.
  const nn::DecoderModel fresh(hf.config);
  const auto names = [](const NamedTensors& ts) {
    std::vector<std::string> n;
    for (const auto& [name, t] : ts) n.push_back(name);
    std::sort(n.begin(), n.end());
    return n;
  };
  EXPECT_EQ(names(hf.parameters), names(fresh.named_parameters()));

  const std::shared_ptr<nn::DecoderModel> model = build(hf);
  const nlohmann::json ref = reference();
  const Tensor logits = logits_of(*model, ref["ids"]);
  EXPECT_LT(max_abs_diff(logits, flat_floats(ref[untied ? "logits_untied" : "logits_tied"])), 1e-5);

  nn::GenerateOptions g;
  g.max_new_tokens = 24;
  EXPECT_EQ(nn::generate(*model, ref["prompt"].get<std::vector<int64_t>>(), g),
            ref[untied ? "greedy_untied" : "greedy_tied"].get<std::vector<int64_t>>());
}

INSTANTIATE_TEST_SUITE_P(Folders, HfGpt2Variants,
                         ::testing::Values("lm_head_model", "untied", "base_model_f16", "sharded_bf16"));

// The F32 file's tensors, without the mask buffers export does not write.
std::map<std::string, std::vector<float>> float_tensors(const std::string& folder) {
  const io::SafetensorsModel st = io::SafetensorsModel::open(folder);
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : st.names())
    if (!name.ends_with(".attn.bias") && !name.ends_with(".attn.masked_bias"))
      out[name] = st.to_float(name).to_vector<float>();
  return out;
}

TEST(HfGpt2Export, RoundTripIsBitwiseTiedAndUntied) {
  headlab::testing::TempDir tmp("hf_gpt2_export");
  for (const std::string variant : {"lm_head_model", "untied"}) {
    const io::HfGpt2 hf = io::read_hf_gpt2(fixture(variant));
    io::write_hf_gpt2(tmp.path(variant), *build(hf));
    EXPECT_EQ(float_tensors(tmp.path(variant)), float_tensors(fixture(variant))) << variant;
    const io::HfGpt2 back = io::read_hf_gpt2(tmp.path(variant));
    EXPECT_EQ(back.config.tie_embeddings, hf.config.tie_embeddings) << variant;
    std::ifstream cfg(tmp.path(variant) + "/config.json");
    EXPECT_EQ(nlohmann::json::parse(cfg)["tie_word_embeddings"].get<bool>(), variant != "untied");
  }
}

// A tied head is wte itself: one parameter (listed once, as PyTorch's named_parameters), whose gradient
// is the sum of what the embedding and the head give it, so training keeps them tied.
TEST(HfGpt2Tied, TheHeadIsOneParameterWithBothGradients) {
  const io::HfGpt2 hf = io::read_hf_gpt2(fixture("lm_head_model"));
  ASSERT_TRUE(hf.config.tie_embeddings);
  const std::shared_ptr<nn::DecoderModel> tied = build(hf);
  EXPECT_EQ(tied->out_head->weight.impl(), tied->tok_emb->weight.impl());
  const NamedTensors listed = tied->named_parameters();
  EXPECT_TRUE(find_named(listed, "out_head.weight") == listed.end());
  EXPECT_EQ(double(tied->num_parameters()), hf.config.num_parameters());
  EXPECT_EQ(tied->parameter("out_head.weight").impl(), tied->tok_emb->weight.impl());  // answers to both names

  nn::DecoderConfig untied_cfg = hf.config;
  untied_cfg.tie_embeddings = false;
  nn::DecoderModel untied(untied_cfg);
  NamedTensors values = hf.parameters;
  values.emplace_back("out_head.weight", find_named(hf.parameters, "tok_emb.weight")->second);
  untied.load_parameters(values, "test");
  untied.eval();  // as build() leaves the tied one: no dropout
  const Tensor ids = tensor(std::vector<int64_t>{1, 5, 9, 2, 7, 3}, {1, 6});
  const Tensor targets = tensor(std::vector<int64_t>{5, 9, 2, 7, 3, 1}, {1, 6});
  for (nn::DecoderModel* m : {tied.get(), &untied}) {
    m->zero_grad();
    const Tensor logits = m->forward(ids);
    cross_entropy(logits.reshape({6, logits.size(-1)}), targets.reshape({6})).backward();
  }
  const std::vector<float> got = tied->tok_emb->weight.grad().to_vector<float>();
  const std::vector<float> emb = untied.tok_emb->weight.grad().to_vector<float>();
  const std::vector<float> head = untied.out_head->weight.grad().to_vector<float>();
  ASSERT_EQ(got.size(), emb.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], emb[i] + head[i], 1e-6) << i;
}

TEST(HfGpt2Export, APrunedModelIsWrittenAtFullWidthWithTheSameFunction) {
  headlab::testing::TempDir tmp("hf_gpt2_pruned");
  const std::shared_ptr<nn::DecoderModel> model = build(io::read_hf_gpt2(fixture("lm_head_model")));
  for (const nn::AttentionForm form : {nn::AttentionForm::fused, nn::AttentionForm::wrapper}) {
    std::shared_ptr<nn::DecoderModel> pruned = analysis::prune_model(*model, {{0, 2}, {1, 2, 3}});
    if (form == nn::AttentionForm::wrapper) {
      auto [cfg, params] = analysis::convert_parameters(pruned->config().to_json(), pruned->named_parameters(), form);
      pruned = std::make_shared<nn::DecoderModel>(nn::gpt_family().config(cfg));
      pruned->load_parameters(params, "test");
    }
    pruned->eval();
    const std::string out = tmp.path(std::string(enum_name(form)));
    io::write_hf_gpt2(out, *pruned);
    const io::HfGpt2 back = io::read_hf_gpt2(out);
    EXPECT_EQ(back.config.n_heads, 4);
    EXPECT_TRUE(back.config.kept_heads.empty());
    const nlohmann::json ids = reference()["ids"];
    const Tensor want = logits_of(*pruned, ids);
    EXPECT_LT(max_abs_diff(logits_of(*build(back), ids), want.contiguous().to_vector<float>()), 1e-5);
  }
}

// ---- bad folders ----------------------------------------------------------------------------------

class HfGpt2Errors : public ::testing::Test {
 protected:
  // A copy of the F32 tied fixture, its config.json edited by `edit`.
  std::string folder(const std::function<void(nlohmann::json&)>& edit = nullptr) {
    const std::string d = tmp_.path(std::string("m").append(std::to_string(n_++)));
    fs::copy(fixture("lm_head_model"), d, fs::copy_options::recursive);
    if (edit) {
      std::ifstream in(d + "/config.json");
      nlohmann::json j = nlohmann::json::parse(in);
      edit(j);
      std::ofstream(d + "/config.json") << j.dump();
    }
    return d;
  }
  static void read(const std::string& d) { io::read_hf_gpt2(d); }
  headlab::testing::TempDir tmp_{"hf_gpt2_errors"};
  int n_ = 0;
};

TEST_F(HfGpt2Errors, ConfigProblemsNameTheFileAndKey) {
  EXPECT_ERROR(read(folder([](auto& j) { j.erase("n_layer"); })), "config.json: missing n_layer");
  EXPECT_ERROR(read(folder([](auto& j) { j["n_head"] = -3; })), "n_head must be a whole number");
  EXPECT_ERROR(read(folder([](auto& j) { j["n_embd"] = 1e30; })), "n_embd");
  EXPECT_ERROR(read(folder([](auto& j) { j["n_head"] = 5; })), "not divisible by n_head 5");
  EXPECT_ERROR(read(folder([](auto& j) { j["activation_function"] = "relu"; })), "activation_function 'relu'");
  EXPECT_ERROR(read(folder([](auto& j) { j["layer_norm_epsilon"] = 1e-6; })), "layer_norm_epsilon");
  EXPECT_ERROR(read(folder([](auto& j) { j["n_inner"] = 7; })), "n_inner 7");
  EXPECT_ERROR(read(folder([](auto& j) { j["model_type"] = "llama"; })), "model_type 'llama'");
  EXPECT_ERROR(read(folder([](auto& j) { j["resid_pdrop"] = "x"; })), "resid_pdrop has the wrong type");
  const std::string d = folder();
  std::ofstream(d + "/config.json") << "{not json";
  EXPECT_ERROR(read(d), "config.json: not JSON");
  std::ofstream(d + "/config.json") << std::string("{}\0\0\0padding", 12);  // a file padded with NULs
  EXPECT_ERROR(read(d), "config.json: not JSON (a NUL byte at offset 2 of 12");
  std::ofstream(d + "/config.json") << "{} {}";
  EXPECT_ERROR(read(d), "config.json: not JSON");
  fs::remove(d + "/config.json");
  EXPECT_ERROR(read(d), "config.json");
  EXPECT_ERROR(read(tmp_.path("nowhere")), "does not exist");
}

TEST_F(HfGpt2Errors, WeightProblemsNameTheTensor) {
  // The config claims more layers than the file holds, or a different width.
  EXPECT_ERROR(read(folder([](auto& j) { j["n_layer"] = 3; })), "missing tensor 'transformer.h.2.");
  EXPECT_ERROR(read(folder([](auto& j) { j["vocab_size"] = 95; })), "tensor 'transformer.wte.weight' has shape");
  EXPECT_ERROR(read(folder([](auto& j) { j["n_layer"] = 1; })), "'transformer.h.1.");
  EXPECT_ERROR(read(folder([](auto& j) { j["tie_word_embeddings"] = false; })), "no lm_head.weight");
  const std::string d = folder();
  fs::remove(d + "/model.safetensors");
  EXPECT_ERROR(read(d), "model.safetensors");
}

// ---- perplexity over a whole text -------------------------------------------------------------------

// The loss of predicting ids[p] from ids[begin, p), where begin is the start of the first window (a
// multiple of the stride) whose context reaches p: evaluate_text's windows, one forward per token.
double naive_text_loss(nn::DecoderModel& m, const std::vector<int64_t>& ids, int64_t stride) {
  const int64_t n = int64_t(ids.size()), ctx = m.config().context_length;
  const NoGradGuard no_grad;
  double sum = 0;
  for (int64_t p = 1; p < n; ++p) {
    const int64_t begin = p <= ctx ? 0 : stride * ((p - ctx + stride - 1) / stride);
    const std::vector<int64_t> in(ids.begin() + begin, ids.begin() + p);
    const Tensor logp = m.forward(tensor(in, {1, p - begin})).select(1, p - begin - 1).log_softmax(-1);  // (1, V)
    sum -= logp.select(0, 0).select(0, ids[size_t(p)]).item<double>();
  }
  return sum / double(n - 1);
}

TEST(HfGpt2Text, EvaluateTextScoresEveryTokenOnceWithTheStridesContext) {
  const std::shared_ptr<nn::DecoderModel> m = build(io::read_hf_gpt2(fixture("lm_head_model")));  // context 16
  std::vector<int64_t> ids;
  for (int i = 0; i < 53; ++i) ids.push_back((i * 37 + 11) % 96);
  for (const int64_t stride : {1, 3, 8, 16}) {
    const train::TextScores s = train::evaluate_text(*m, ids, stride);
    EXPECT_EQ(s.tokens, 52) << stride;
    EXPECT_NEAR(s.loss, naive_text_loss(*m, ids, stride), 1e-5) << "stride " << stride;
    EXPECT_NEAR(s.perplexity, std::exp(s.loss), 1e-9);
  }
  EXPECT_EQ(train::evaluate_text(*m, ids, 16).windows, 4);  // 52 targets in windows of 16
  EXPECT_ERROR(train::evaluate_text(*m, ids, 17), "stride 17 must be in [1, context_length 16]");
  EXPECT_ERROR(train::evaluate_text(*m, {5}, 4), "need at least 2");
}

// A context longer than evaluate_text's head chunk (2^21 logits: 16 positions of a 2^17 vocabulary):
// the chunks, and those it skips (no scored target), give the same loss.
TEST(HfGpt2Text, EvaluateTextChunksTheHeadExactly) {
  nn::DecoderConfig c;
  c.vocab_size = 1 << 17, c.context_length = 60, c.emb_dim = 8, c.n_heads = 2, c.n_layers = 1, c.qkv_bias = true;
  manual_seed(3);
  nn::DecoderModel m(c);
  m.eval();
  std::vector<int64_t> ids;
  for (int i = 0; i < 90; ++i) ids.push_back((i * 7919 + 3) % (1 << 17));
  for (const int64_t stride : {20, 60}) {
    const train::TextScores s = train::evaluate_text(m, ids, stride);
    EXPECT_EQ(s.tokens, 89) << stride;
    EXPECT_NEAR(s.loss, naive_text_loss(m, ids, stride), 1e-5) << "stride " << stride;
  }
}

}  // namespace
