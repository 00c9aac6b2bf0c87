// Qwen3 (nn/llama.cpp's qwen3 family: llama with an RMSNorm over each head's queries and keys before rotary):
// its folders against the float64 twin (tools/fixtures_llama_folders.py: qwen3_tied, qwen3_untied_bf16, in
// tests/test_llama.cpp's LlamaFolders), and here the model against its own slow references: the per-head form
// (the wrapper, whose heads share the one pair of norms) against the fused form, cached decoding against the full
// forward, pruning whole key/value groups against gating them off, export read back bitwise, a fresh model from
// train's options, and what it refuses by name.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "analysis/surgery.h"
#include "io/families.h"
#include "nn/decoder_family.h"
#include "nn/generate.h"
#include "tests/core_test_util.h"
#include "tests/family_checks.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::max_diff;
using headlab::testing::TempDir;
using headlab::testing::tokens;

namespace {

// Sizes where the heads' width (4 x 10) differs from the stream's (24), as Qwen3's do.
nn::DecoderConfig qwen3_config(int64_t kv_heads, nn::AttentionForm form = nn::AttentionForm::fused) {
  nn::DecoderConfig c = nn::qwen3_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = kv_heads, c.head_dim = 10;
  c.n_layers = 2, c.hidden_dim = 40, c.rope_theta = 1e6, c.attention = form;
  return c;
}

}  // namespace

TEST(Qwen3, NamesCountsAndTheNormsPlace) {
  nn::DecoderModel m(qwen3_config(2));
  EXPECT_EQ(m.type_name(), "Qwen3");
  EXPECT_EQ(static_cast<double>(m.num_parameters()), m.config().num_parameters());
  const NamedTensors p = m.named_parameters();
  const auto shape_of = [&](const std::string& n) {
    for (const auto& [name, t] : p)
      if (name == n) return t.shape();
    ADD_FAILURE() << n << " missing";
    return Shape{};
  };
  EXPECT_EQ(shape_of("trf_blocks.0.att.W_query.weight"), Shape({40, 24}));  // heads x head_dim, not emb_dim
  EXPECT_EQ(shape_of("trf_blocks.0.att.q_norm.weight"), Shape({10}));
  EXPECT_EQ(shape_of("trf_blocks.1.att.k_norm.weight"), Shape({10}));
  // The wrapper's heads share one pair: counted once, as in the fused form.
  nn::DecoderModel w(qwen3_config(2, nn::AttentionForm::wrapper));
  EXPECT_EQ(w.num_parameters(), m.num_parameters());
  EXPECT_EQ(static_cast<double>(w.num_parameters()), w.config().num_parameters());
  // The section names its arch and reads back as the same family.
  EXPECT_EQ(m.config_json().at("arch"), "qwen3");
  EXPECT_EQ(io::family_of(m.config_json()).model.arch(), "qwen3");
}

// The norm runs after attn.hook_q / hook_k and before rotary: the wrapper (per-head modules sharing the norms), the
// fused form and the fused form with the pattern kept (the composite path) compute one function, and the per-head
// norm equals an RMSNorm over each head's slice of the hooked queries.
TEST(Qwen3, PerHeadFormFusedFormAndTheCompositePathAgree) {
  for (const int64_t kv : {4, 2, 1}) {
    SCOPED_TRACE("kv " + std::to_string(kv));
    headlab::testing::expect_forms_agree(qwen3_config(kv));
  }
}

TEST(Qwen3, CachedDecodingEqualsTheFullForwardAtEveryPosition) {
  for (const int64_t kv : {2, 1}) {
    manual_seed(11);
    nn::DecoderModel m(qwen3_config(kv));
    headlab::testing::perturb_norms(m, 4);
    m.eval();
    const NoGradGuard no_grad;
    const Tensor idx = tokens(2, 12, 37, 7);
    const Tensor full = m.forward(idx);
    std::vector<nn::KVCache> caches(2);
    Tensor last = m.forward_cached(idx.narrow(1, 0, 5), caches);
    EXPECT_LT(max_diff(last, full.select(1, 4)), 2e-5);
    for (int64_t t = 5; t < 12; ++t) {
      last = m.forward_cached(idx.narrow(1, t, 1), caches);
      EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "kv " << kv << " position " << t;
    }
    std::vector<nn::KVCache> chunked(2);
    EXPECT_LT(max_diff(m.forward_cached(idx, chunked, 5), full.select(1, 11)), 2e-5);
  }
}

// Pruning keeps the shared norms whole (they act on each head alone): the pruned model equals the full one with
// the dropped groups gated off; export writes it at full width and the folder computes the same.
TEST(Qwen3, PruningWholeKeyValueGroupsEqualsGatingThemOff) {
  manual_seed(21);
  nn::DecoderModel m(qwen3_config(2));
  headlab::testing::perturb_norms(m, 5);
  m.eval();
  const std::vector<std::vector<int64_t>> keep{{2, 3}, {0, 1}};
  const auto [config, params] = analysis::prune_parameters(m.config_json(), m.named_parameters(), keep);
  nn::DecoderModel pruned(nn::qwen3_family().config(config));
  pruned.load_parameters(params, "pruned");
  pruned.eval();
  const NoGradGuard no_grad;
  m.attention(0).control().gates = tensor(std::vector<double>{0, 0, 1, 1}, {4});
  m.attention(1).control().gates = tensor(std::vector<double>{1, 1, 0, 0}, {4});
  const Tensor idx = tokens(2, 9, 37, 5);
  const Tensor gated = m.forward(idx);
  EXPECT_LT(max_diff(pruned.forward(idx), gated), 1e-5);
  TempDir dir("qwen3_pruned_export");
  io::family_named("qwen3", "test").folder->write(dir.path("out"), pruned, {});
  auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
  EXPECT_EQ(dynamic_cast<nn::DecoderModel&>(*back).attention(0).head_count(), 4) << "full width";
  EXPECT_LT(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), gated), 1e-5);
}

// export writes Qwen3's layout (model_type qwen3, q_norm and k_norm) and reads back bit for bit.
TEST(Qwen3, ExportReadsBackBitwise) {
  TempDir dir("qwen3_export");
  manual_seed(6);
  nn::DecoderModel m(qwen3_config(2));
  headlab::testing::perturb_norms(m, 8);
  io::family_named("qwen3", "test").folder->write(dir.path("out"), m, {});
  std::ifstream cfg(dir.path("out") + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j.at("model_type"), "qwen3");
  EXPECT_EQ(j.at("head_dim"), 10);
  auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
  const NamedTensors a = m.named_parameters(), b = back->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(max_diff(a[i].second, b[i].second), 0.0) << a[i].first;
  }
}

TEST(Qwen3, TrainsFromTrainsOptionsAndRefusesWhatItLacks) {
  nn::ModelOptions o;
  o.arch = "qwen3", o.emb_dim = 16, o.n_heads = 4, o.n_kv_heads = 2, o.n_layers = 1;
  const io::Family& f = io::family_named("qwen3", "test");
  const nn::TaskSizes sizes{.task = "copy", .vocab_size = 13, .context_length = 12};
  auto model = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(f.model.from_options(o, sizes)));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->config().qk_norm, nn::QkNorm::per_head);
  headlab::testing::expect_fresh_model_learns(*model, 0.5);
  // Refusals by name: biases (Qwen3's attention_bias would bias o_proj too), interleaved pairs, a folder's
  // attention_bias and sliding layers without a window.
  nn::DecoderConfig c = qwen3_config(2);
  c.qkv_bias = true;
  EXPECT_ERROR(nn::DecoderModel{c}, "Qwen3 config: qkv_bias is not supported with q/k norms");
  c.qkv_bias = false, c.rope_interleaved = true;
  EXPECT_ERROR(nn::DecoderModel{c}, "rope_interleaved is not supported with q/k norms");
  TempDir dir("qwen3_bad");
  const std::string base =
      headlab::testing::slurp(std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/llama_folders/qwen3_tied/config.json");
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    return headlab::testing::config_variant(dir, base, name, change);
  };
  const std::string bias = with("bias", [](auto& j) { j["attention_bias"] = true; });
  const std::string sliding = with("sliding", [](auto& j) { j["layer_types"][1] = "sliding_attention"; });
  EXPECT_ERROR(io::family_of_folder(bias).folder->read_config(bias), "attention_bias is not supported");
  EXPECT_ERROR(io::family_of_folder(sliding).folder->read_config(sliding),
               "layer_types has sliding_attention layers but sliding_window is not given");
}

// The q/k norm over the whole projection (QkNorm::whole, OLMo-2's: RMSNorm(H*D) on the queries, RMSNorm(Hkv*D) on the
// keys, before the heads split) against the same maths written out: the fused form computes it; the per-head form,
// which cannot hold a norm that mixes heads, refuses it by name.
TEST(QkNorm, WholeProjectionNormEqualsTheMathsWrittenOut) {
  manual_seed(12);
  nn::CausalAttentionSizes s;
  s.d_in = 12, s.d_out = 12, s.context_length = 8, s.num_heads = 4, s.num_kv_heads = 2, s.head_dim = 3;
  s.qk_norm = nn::QkNorm::whole, s.qk_norm_eps = 1e-6;
  nn::CausalMultiHeadAttention att(s);
  att.to(DType::f64);
  Generator g(2);
  {
    const NoGradGuard no_grad;
    att.q_norm->weight.detach().copy_(add(att.q_norm->weight, mul(randn({12}, g, DType::f64), 0.3)));
    att.k_norm->weight.detach().copy_(add(att.k_norm->weight, mul(randn({6}, g, DType::f64), 0.3)));
  }
  const Tensor x = randn({2, 5, 12}, g, DType::f64);
  const NoGradGuard no_grad;
  const auto rms = [](const Tensor& t, const Tensor& w) {  // over the last dim: t / sqrt(mean(t^2) + eps) * w
    return mul(div(t, sqrt(add(mean(mul(t, t), {-1}, true), 1e-6))), w);
  };
  const Tensor q = rms(linear(x, att.W_query->weight, att.W_query->bias), att.q_norm->weight).view({2, 5, 4, 3});
  const Tensor k = rms(linear(x, att.W_key->weight, att.W_key->bias), att.k_norm->weight).view({2, 5, 2, 3});
  const Tensor v = linear(x, att.W_value->weight, att.W_value->bias).view({2, 5, 2, 3});
  const Tensor kh = repeat_kv(k.transpose(1, 2), 4), vh = repeat_kv(v.transpose(1, 2), 4);
  const Tensor w = causal_softmax(matmul(q.transpose(1, 2), kh.mT()), 1.0 / std::sqrt(3.0));  // (2, 4, 5, 5)
  const Tensor want =
      linear(matmul(w, vh).transpose(1, 2).reshape({2, 5, 12}), att.out_proj->weight, att.out_proj->bias);
  EXPECT_LT(max_diff(att.forward(x), want), 1e-12);
  EXPECT_ERROR(att.split_heads(), "q/k norms over the whole projection (OLMo-2's) mix the heads");
}
