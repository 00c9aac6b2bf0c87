// Gemma 1, 2 and 3 and OLMo-2 (nn/llama.cpp's gemma, gemma2, gemma3 and olmo2 families): their folders against the
// float64 twin (tools/fixtures_llama_folders.py: gemma_mqa, gemma_bf16, gemma2_caps, gemma2_types_bf16,
// gemma3_pattern, gemma3_types_bf16, olmo2_gqa, olmo2_tied_bf16, in tests/test_llama.cpp's LlamaFolders), and here
// their new parts against the maths written out: the (1 + w) norms, the scaled embeddings, the post norms' place and
// the soft-caps read at the hook points; the per-head form
// against the fused form, cached decoding against the full forward across the windows and the two rotary bases;
// direct logit attribution through the post norms adding up; export read back bitwise; fresh models from train's
// options; and what each refuses by name.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "analysis/circuit.h"
#include "analysis/logit_attribution.h"
#include "analysis/surgery.h"
#include "io/families.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/family_checks.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::max_diff;
using headlab::testing::TempDir;
using headlab::testing::tokens;

namespace {

// Gemma 3's parts at test sizes: heads 4 x 10 wide on a 24-wide stream, layer 0 windowed (5) with its own base.
nn::DecoderConfig gemma3_config(int64_t kv_heads, nn::AttentionForm form = nn::AttentionForm::fused) {
  nn::DecoderConfig c = nn::gemma3_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = kv_heads, c.head_dim = 10;
  c.n_layers = 2, c.hidden_dim = 40, c.rope_theta = 1e6, c.rope_local_theta = 1e4, c.attn_scale = 1.0 / std::sqrt(12.0);
  c.sliding_window = 5, c.window_layers = {0}, c.attention = form;
  return c;
}

// Gemma 2's: soft-caps that bind (scores at 0.3, logits at 1.5), layer 0 windowed (5).
nn::DecoderConfig gemma2_config(int64_t kv_heads) {
  nn::DecoderConfig c = nn::gemma2_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = kv_heads, c.head_dim = 10;
  c.n_layers = 2, c.hidden_dim = 40, c.attn_scale = 0.25, c.attn_softcap = 0.3, c.logit_softcap = 1.5;
  c.sliding_window = 5, c.window_layers = {0};
  return c;
}

nn::DecoderConfig olmo2_config(int64_t kv_heads) {
  nn::DecoderConfig c = nn::olmo2_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = kv_heads;
  c.n_layers = 2, c.hidden_dim = 40, c.rope_theta = 5e5;
  return c;
}

nn::DecoderConfig gemma_config() {
  nn::DecoderConfig c = nn::gemma_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = 1, c.head_dim = 8;
  c.n_layers = 2, c.hidden_dim = 40;
  return c;
}

Tensor rms(const Tensor& x, const Tensor& gain, double eps) {  // x / sqrt(mean(x^2) + eps) * gain, over the last dim
  return mul(div(x, sqrt(add(mean(mul(x, x), {-1}, true), eps))), gain);
}

bool has_point(const nn::DecoderModel& m, nn::HookPoint p, int64_t layer) {
  for (const nn::HookKey& k : m.hook_points())
    if (k.point == p && k.layer == layer) return true;
  return false;
}

}  // namespace

TEST(Gemma, NamesCountsAndRegisteredParts) {
  for (const nn::DecoderConfig& c : {gemma_config(), gemma2_config(2), gemma3_config(2), olmo2_config(2)}) {
    nn::DecoderModel m(c);
    SCOPED_TRACE(m.type_name());
    EXPECT_EQ(static_cast<double>(m.num_parameters()), m.config().num_parameters());
    EXPECT_EQ(io::family_of(m.config_json()).model.arch(), c.family->arch());
    EXPECT_EQ(nn::DecoderModel(c.family->config(m.config_json())).num_parameters(), m.num_parameters());
  }
  nn::DecoderModel g3(gemma3_config(2));
  EXPECT_EQ(g3.type_name(), "Gemma3");
  EXPECT_TRUE(g3.decoder_block(0).ln1_post() && g3.decoder_block(1).ln2_post());
  EXPECT_EQ(g3.decoder_block(0).ln1().weight_offset, 1.0);
  EXPECT_EQ(g3.decoder_block(0).ln1().weight.sum().item<double>(), 0.0) << "(1 + w) starts at w = 0: a gain of 1";
  EXPECT_EQ(g3.config_json().at("rope_local_theta"), 1e4);
  EXPECT_EQ(g3.config().attention_sizes(0).rotary.theta, 1e4);  // the windowed layer's base
  EXPECT_EQ(g3.config().attention_sizes(1).rotary.theta, 1e6);
  nn::DecoderModel o(olmo2_config(2));
  EXPECT_TRUE(o.decoder_block(0).ln1().identity()) << "OLMo-2 has no norm before attention";
  EXPECT_FALSE(has_point(o, nn::HookPoint::ln1_normalized, 0));
  EXPECT_TRUE(has_point(o, nn::HookPoint::ln1_post_normalized, 0));
  EXPECT_TRUE(has_point(o, nn::HookPoint::ln2_post_normalized, 1));
  EXPECT_EQ(nn::hook_name({nn::HookPoint::ln2_post_normalized, 1}), "blocks.1.ln2_post.hook_normalized");
  EXPECT_EQ(nn::parse_hook_name("blocks.0.ln1_post.hook_normalized")->point, nn::HookPoint::ln1_post_normalized);
  EXPECT_FALSE(has_point(nn::DecoderModel(gemma_config()), nn::HookPoint::ln1_post_normalized, 0));
}

// The parts at the hook points, in float64: hook_embed = tok_emb[idx] * sqrt(C); ln1.hook_normalized =
// rms(resid_pre) * (1 + w); ln1_post.hook_normalized = rms(the heads' results summed) * (1 + w_post) = hook_attn_out;
// resid_mid = resid_pre + attn_out; the MLP's the same through ln2 and ln2_post; GeGLU's hook_post =
// gelu_tanh(hook_pre) * (fc2 x).
TEST(Gemma, EveryNewPartEqualsItsMathsAtTheHookPoints) {
  for (const nn::DecoderConfig& c : {gemma3_config(2), gemma2_config(1), olmo2_config(1)}) {
    manual_seed(4);
    nn::DecoderModel m(c);
    headlab::testing::perturb_norms(m, 3);
    m.to(DType::f64);
    m.eval();
    SCOPED_TRACE(m.type_name());
    const bool gemma = c.family != &nn::olmo2_family();
    std::set<nn::HookKey> keep;
    for (const nn::HookKey& k : m.hook_points()) keep.insert(k);
    nn::ActivationCache acts(keep);
    const NoGradGuard no_grad;
    const Tensor idx = tokens(2, 9, 37, 5);
    m.forward(idx, &acts);
    const auto at = [&](nn::HookPoint p, int64_t l) { return acts.cache().at({p, l}); };
    const double scale = gemma ? static_cast<double>(std::sqrt(24.0F)) : 1.0;
    EXPECT_LT(max_diff(at(nn::HookPoint::embed, -1),
                       mul(index_select(m.tok_emb->weight, 0, idx.reshape({-1})).view({2, 9, 24}), scale)),
              1e-12);
    for (int64_t l = 0; l < 2; ++l) {
      nn::DecoderBlock& b = m.decoder_block(l);
      const Tensor x = at(nn::HookPoint::resid_pre, l);
      if (gemma) {
        EXPECT_LT(max_diff(at(nn::HookPoint::ln1_normalized, l), rms(x, add(b.ln1().weight, 1.0), c.norm_eps)), 1e-12);
      }
      const Tensor summed = at(nn::HookPoint::result, l).sum({2});  // no out_proj bias
      const Tensor post = rms(summed, b.ln1_post()->gain(), c.norm_eps);
      EXPECT_LT(max_diff(at(nn::HookPoint::ln1_post_normalized, l), post), 1e-12);
      EXPECT_LT(max_diff(at(nn::HookPoint::attn_out, l), post), 1e-12);
      const Tensor mid = at(nn::HookPoint::resid_mid, l);
      EXPECT_LT(max_diff(mid, add(x, post)), 1e-12);
      auto& ff = dynamic_cast<nn::GatedFeedForward&>(*b.mlp());
      const Tensor m_in = gemma ? rms(mid, add(b.ln2()->weight, 1.0), c.norm_eps) : mid;
      const Tensor pre = at(nn::HookPoint::mlp_pre, l);
      EXPECT_LT(max_diff(pre, linear(m_in, ff.fc1->weight, Tensor())), 1e-12);
      const Tensor gate = gemma ? gelu(pre, true) : silu(pre);
      EXPECT_LT(max_diff(at(nn::HookPoint::mlp_post, l), mul(gate, linear(m_in, ff.fc2->weight, Tensor()))), 1e-12);
      const Tensor f_post =
          rms(linear(at(nn::HookPoint::mlp_post, l), ff.fc3->weight, Tensor()), b.ln2_post()->gain(), c.norm_eps);
      EXPECT_LT(max_diff(at(nn::HookPoint::mlp_out, l), f_post), 1e-12);
      EXPECT_LT(max_diff(at(nn::HookPoint::resid_post, l), add(mid, f_post)), 1e-12);
    }
    if (c.attn_softcap == 0) continue;
    // Gemma 2's caps: layer 1's (global) pattern from the rotated queries and keys, the logits from ln_final's
    const double cap = c.attn_softcap, logit_cap = c.logit_softcap;
    const Tensor rq = at(nn::HookPoint::rot_q, 1).transpose(1, 2), rk = at(nn::HookPoint::rot_k, 1).transpose(1, 2);
    const Tensor scores = matmul(rq, repeat_kv(rk, 4).mT());  // (B, H, T, T)
    const Tensor capped = mul(tanh(mul(scores, c.attn_scale / cap)), cap);
    EXPECT_LT(max_diff(at(nn::HookPoint::pattern, 1), causal_softmax(capped)), 1e-12);
    EXPECT_GT(amax(abs(scores)).item<double>() * c.attn_scale, cap) << "the cap binds";
    const Tensor raw = linear(at(nn::HookPoint::ln_final_normalized, -1), m.lm_head().weight, Tensor());
    EXPECT_LT(max_diff(m.forward(idx), mul(tanh(mul(raw, 1.0 / logit_cap)), logit_cap)), 1e-12);
    EXPECT_GT(amax(abs(raw)).item<double>(), logit_cap) << "the cap binds";
  }
}

// Gemma 3's per-head q/k norms with (1 + w), shared by the wrapper's heads, and Gemma 2's soft-capped scores: the
// wrapper, the fused form and the composite path (the pattern kept) compute one function; the conversion back gives
// the same weights.
TEST(Gemma3, PerHeadFormFusedFormAndTheCompositePathAgree) {
  for (const nn::DecoderConfig& c : {gemma3_config(4), gemma3_config(2), gemma3_config(1), gemma2_config(2)}) {
    SCOPED_TRACE(c.family->arch() + " kv " + std::to_string(c.kv_heads()));
    headlab::testing::expect_forms_agree(c);
  }
}

// Cached decoding = the full forward at every position, one token at a time past the window's edge and in chunks,
// for Gemma 3 (a windowed layer with its own rotary base beside a global one) and OLMo-2 (whole-projection norms).
TEST(Gemma3, CachedDecodingEqualsTheFullForwardAtEveryPosition) {
  for (const nn::DecoderConfig& c :
       {gemma3_config(2), gemma3_config(1), gemma2_config(2), olmo2_config(2), gemma_config()}) {
    manual_seed(11);
    nn::DecoderModel m(c);
    headlab::testing::perturb_norms(m, 4);
    m.eval();
    SCOPED_TRACE(m.type_name());
    const NoGradGuard no_grad;
    const Tensor idx = tokens(2, 14, 37, 7);
    const Tensor full = m.forward(idx);
    std::vector<nn::KVCache> caches(2);
    Tensor last = m.forward_cached(idx.narrow(1, 0, 3), caches);
    EXPECT_LT(max_diff(last, full.select(1, 2)), 2e-5);
    for (int64_t t = 3; t < 14; ++t) {
      last = m.forward_cached(idx.narrow(1, t, 1), caches);
      EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "position " << t;
    }
    for (const int64_t chunk : {2, 5}) {
      std::vector<nn::KVCache> chunked(2);
      EXPECT_LT(max_diff(m.forward_cached(idx, chunked, chunk), full.select(1, 13)), 2e-5) << "chunk " << chunk;
    }
  }
}

// Direct logit attribution through the post norms (each frozen at the attention output it normed) adds up to the
// model's own logits, as without them.
TEST(Gemma3, DirectLogitAttributionThroughThePostNormsAddsUp) {
  for (const nn::DecoderConfig& c : {gemma3_config(2), gemma2_config(2), olmo2_config(2)}) {
    manual_seed(8);
    nn::DecoderModel m(c);
    headlab::testing::perturb_norms(m, 2);
    m.to(DType::f64);
    analysis::EvalSet s;
    tasks::Batch b;
    b.B = 2, b.T = 12;
    for (int64_t i = 0; i < b.B * b.T; ++i) b.inputs.push_back((i * 7 + 3) % 37), b.targets.push_back((i * 5 + 1) % 37);
    s.batches.push_back(b);
    const analysis::LogitAttribution a = analysis::logit_attribution(m, s);
    for (const analysis::DirectAttribution* d : {&a.vs_mean, &a.logit}) EXPECT_NEAR(d->sum(), d->total, 1e-9);
    // ln1_post's gain folded into W_O (composition's reads): W_O scaled per output dim
    const nn::HeadWeights plain = m.head_weights(0), folded = m.head_weights(0, true);
    const Tensor g = m.decoder_block(0).ln1_post()->gain().view({1, 1, -1});
    EXPECT_LT(max_diff(folded.W_O, mul(plain.W_O, g)), 1e-12);
    EXPECT_ERROR(analysis::CircuitGraph{m}, "path patching over post-norm models (circuit, heads --task) is not");
  }
}

// export writes each family's layout and reads back bit for bit, the config's keys included.
TEST(Gemma3, ExportReadsBackBitwise) {
  for (const nn::DecoderConfig& c :
       {gemma3_config(2), gemma3_config(1), gemma2_config(2), olmo2_config(2), gemma_config()}) {
    TempDir dir("gemma_export");
    manual_seed(6);
    nn::DecoderModel m(c);
    headlab::testing::perturb_norms(m, 8);
    const std::string arch = c.family->arch();
    SCOPED_TRACE(arch);
    io::family_named(arch, "test").folder->write(dir.path("out"), m, {});
    std::ifstream cfg(dir.path("out") + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(cfg);
    EXPECT_EQ(j.at("model_type"), arch == "gemma3" ? "gemma3_text" : arch);
    if (arch == "gemma2") {
      EXPECT_EQ(j.at("attn_logit_softcapping"), 0.3);
      EXPECT_EQ(j.at("final_logit_softcapping"), 1.5);
      EXPECT_EQ(j.at("query_pre_attn_scalar"), 16.0);
    }
    if (arch == "gemma3") {
      EXPECT_EQ(j.at("query_pre_attn_scalar"), 12.0);
      EXPECT_EQ(j.at("layer_types"), nlohmann::json({"sliding_attention", "full_attention"}));
      EXPECT_EQ(j.at("rope_local_base_freq"), 1e4);
    }
    auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
    EXPECT_EQ(dynamic_cast<nn::DecoderModel&>(*back).config().to_json(), m.config().to_json());
    const NamedTensors a = m.named_parameters(), b = back->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_EQ(max_diff(a[i].second, b[i].second), 0.0) << a[i].first;
    }
  }
}

TEST(Gemma3, FreshModelsTrainAndWhatTheyLackIsRefusedByName) {
  for (const std::string arch : {"gemma3", "gemma2", "olmo2", "gemma"}) {
    SCOPED_TRACE(arch);
    nn::ModelOptions o;
    o.arch = arch, o.emb_dim = 16, o.n_heads = 4, o.n_kv_heads = 2, o.n_layers = 2;
    const io::Family& f = io::family_named(arch, "test");
    const nn::TaskSizes sizes{.task = "copy", .vocab_size = 13, .context_length = 12};
    auto model = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(f.model.from_options(o, sizes)));
    ASSERT_TRUE(model);
    if (arch == "gemma3") {  // five windowed layers to one global: of two, the first
      EXPECT_EQ(model->config().window_layers, std::vector<int64_t>{0});
      EXPECT_EQ(model->config().sliding_window, 6);
    }
    if (arch == "gemma2") {  // the even layers windowed; Gemma 2's caps
      EXPECT_EQ(model->config().window_layers, std::vector<int64_t>{0});
      EXPECT_EQ(model->config().attn_softcap, 50.0);
      EXPECT_EQ(model->config().logit_softcap, 30.0);
    }
    headlab::testing::expect_fresh_model_learns(*model, 0.6);
  }
  nn::ModelOptions o;
  o.arch = "olmo2", o.emb_dim = 16, o.n_heads = 4, o.n_layers = 1, o.attention = nn::AttentionForm::wrapper;
  EXPECT_ERROR(
      io::family_named("olmo2", "test").model.from_options(o, {.task = "copy", .vocab_size = 13, .context_length = 12}),
      "--attention wrapper: the olmo2 family's q/k norms over the whole projections mix the heads");
  // A Gemma 3 folder that sets soft-caps has them; Gemma 2's defaults are its config class's; another activation, a
  // rope_scaling headlab does not compute (yarn) and the multimodal folder are refused by name.
  TempDir dir("gemma_bad");
  const std::string base = headlab::testing::slurp(std::string(HEADLAB_SOURCE_DIR) +
                                                   "/tests/fixtures/llama_folders/gemma3_pattern/config.json");
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    return headlab::testing::config_variant(dir, base, name, change);
  };
  const std::string capped = with("capped", [](auto& j) { j["attn_logit_softcapping"] = 50.0; });
  const std::string gemma2 = with("gemma2", [](auto& j) {
    j["model_type"] = "gemma2";
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "sliding_window_pattern"}) j.erase(k);
  });
  const std::string act = with("act", [](auto& j) { j["hidden_activation"] = "silu"; });
  const std::string scaled = with("scaled", [](auto& j) {
    j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  });
  const std::string multimodal = with("multimodal", [](auto& j) { j["model_type"] = "gemma3"; });
  EXPECT_EQ(io::family_of_folder(capped).folder->read_config(capped).at("attn_softcap"), 50.0);
  const nlohmann::json g2 = io::family_of_folder(gemma2).folder->read_config(gemma2);
  EXPECT_EQ(g2.at("arch"), "gemma2");
  EXPECT_EQ(g2.at("attn_softcap"), 50.0);
  EXPECT_EQ(g2.at("logit_softcap"), 30.0);
  EXPECT_EQ(g2.at("window_layers"), nlohmann::json::array({0}));
  EXPECT_ERROR(io::family_of_folder(act).folder->read_config(act), "hidden_activation 'silu' is not supported");
  EXPECT_ERROR(io::family_of_folder(scaled).folder->read_config(scaled), "(rope_type default, linear or llama3");
  EXPECT_ERROR(io::family_of_folder(multimodal), "model_type 'gemma3' is not one headlab reads");
}
