// The hooked family (nn/hooked.cpp): TransformerLens's HookedTransformer and Nanda et al.'s grokking models, against
// float64 PyTorch twins of their files' own maths (tools/fixtures_hooked.py: the 5-digit addition layout, no norms,
// a ReLU MLP, 10 outputs for 12 input tokens; the induction layout, attention-only without norms; TransformerLens's
// GPT-2 layout, LayerNorm, every bias and b_U); its section's keys, refusals and train's options; a checkpoint's round
// trip; the hook points a model without norms has (TransformerLens's); and the analyses that read norms and W_U
// (head weights folded, the frozen final norm, direct logit attribution, the logit lens, residual stacks, ablation)
// on a model without norms that predicts fewer tokens than it reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "analysis/heads.h"
#include "analysis/hooked_run.h"
#include "analysis/logit_attribution.h"
#include "analysis/residual.h"
#include "io/checkpoint.h"
#include "io/families.h"
#include "io/safetensors.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;

namespace {

std::string fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/hooked/" + name;
}

const nlohmann::json& reference(const std::string& variant) {
  static const nlohmann::json all = [] {
    std::ifstream in(fixture("reference.json"));
    return nlohmann::json::parse(in);
  }();
  return all.at(variant);
}

double max_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

Tensor ids_of(const nlohmann::json& rows) {
  const auto ids = rows.get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
  return tensor(flat, {static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids[0].size())});
}

// The variant's model from its section, its parameters the fixture's (every name and shape both ways), in dtype.
std::shared_ptr<nn::DecoderModel> fixture_model(const std::string& variant, DType dtype = DType::f64) {
  const nlohmann::json& section = reference(variant).at("section");
  auto model = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(section));
  const io::SafetensorsModel file = io::SafetensorsModel::open(fixture(variant + ".safetensors"));
  const NamedTensors params = model->named_parameters();
  EXPECT_EQ(params.size(), file.names().size()) << variant;
  {
    const NoGradGuard no_grad;
    for (const auto& [name, p] : params) {
      const Tensor t = file.to_float(name);  // throws naming a parameter the file lacks
      EXPECT_EQ(t.shape(), p.shape()) << name;
      p.detach().copy_(t);
    }
  }
  model->to(dtype);
  model->eval();
  return model;
}

// The 5-digit addition layout: no norms, a ReLU MLP, 12 tokens in and 10 out.
constexpr const char* kAddition = "grokking_addition";

}  // namespace

class HookedParity : public ::testing::TestWithParam<std::string> {};

// Logits to 1e-10 of the float64 twin (float32 to 1e-4), the parameters under the names and shapes the fixture's
// converter gives them.
TEST_P(HookedParity, MatchesThePyTorchTwin) {
  const nlohmann::json& ref = reference(GetParam());
  const Tensor ids = ids_of(ref["ids"]);
  const auto want = ref["logits"].get<std::vector<std::vector<std::vector<double>>>>();
  std::vector<double> flat;
  for (const auto& row : want)
    for (const auto& t : row) flat.insert(flat.end(), t.begin(), t.end());
  const NoGradGuard no_grad;
  auto f64 = fixture_model(GetParam());
  const Tensor logits = f64->forward(ids);
  const int64_t V_out = ref["section"]["out_vocab_size"].get<int64_t>();
  EXPECT_EQ(logits.shape(), (Shape{ids.size(0), ids.size(1), V_out}));
  EXPECT_LT(max_diff(logits, tensor(flat, logits.shape())), 1e-10);
  EXPECT_LT(max_diff(fixture_model(GetParam(), DType::f32)->forward(ids), logits), 1e-4);
  EXPECT_EQ(f64->type_name(), "HookedTransformer");
}

INSTANTIATE_TEST_SUITE_P(Layouts, HookedParity,
                         ::testing::Values("grokking_addition", "grokking_induction", "lens_gpt2"));

// The section: its keys read and written back, the counts without building, the registry's answers, the refusals.
TEST(Hooked, TheSectionsKeysCountsAndRefusals) {
  const nlohmann::json& s = reference(kAddition).at("section");
  const io::Family& family = io::family_of(s);
  EXPECT_EQ(family.model.arch(), "hooked");
  EXPECT_EQ(family.folder, nullptr);
  const nn::DecoderConfig c = nn::hooked_family().config(s);
  EXPECT_EQ(c.norm, nn::NormKind::none);
  EXPECT_EQ(c.mlp, nn::MlpKind::relu);
  EXPECT_EQ(c.output_vocab(), 10);
  EXPECT_FALSE(c.qkv_bias || c.has_out_bias() || c.unembed_bias || c.book_norm_names);
  const nlohmann::json canonical = family.model.canonical(s);
  EXPECT_EQ(family.model.canonical(canonical), canonical);
  for (const char* key : {"norm", "mlp", "out_vocab_size", "unembed_bias", "out_bias", "head_dim", "hidden_dim"})
    EXPECT_EQ(canonical.at(key), s.at(key)) << key;
  EXPECT_EQ(family.model.describe(s),
            "hooked, 1 layers x 4 heads of 4, emb 16, no norms, relu MLP 32, vocabulary 12 -> 10, context 18");
  for (const std::string variant : {"grokking_addition", "grokking_induction", "lens_gpt2"}) {
    const nlohmann::json& v = reference(variant).at("section");
    EXPECT_EQ(io::num_parameters(v), static_cast<double>(io::make_model(v)->num_parameters())) << variant;
  }
  const auto without = [&](const char* key) {
    nlohmann::json b = s;
    b.erase(key);
    return b;
  };
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json b = s;
    b[key] = value;
    return b;
  };
  for (const char* key : {"norm", "qkv_bias", "out_bias", "unembed_bias"})
    EXPECT_ERROR(family.model.canonical(without(key)),
                 std::string("HookedTransformer config: missing key '").append(key).append("'"));
  EXPECT_ERROR(family.model.canonical(with("norm", "rms_norm")),
               "HookedTransformer config: norm must be 'layer_norm' or 'none', got 'rms_norm'");
  EXPECT_ERROR(family.model.canonical(with("norm", "batch")),
               "HookedTransformer config: norm: expected one of 'layer_norm', 'rms_norm', 'none', got 'batch'");
  EXPECT_ERROR(family.model.canonical(with("mlp", "swiglu")), "mlp must be 'relu', 'gelu_tanh' or 'gelu_exact'");
  EXPECT_ERROR(family.model.canonical(with("tie_embeddings", true)),
               "HookedTransformer config: a tied head predicts the 12 input tokens; out_vocab_size is 10");
  EXPECT_ERROR(family.model.canonical(with("out_bias", 1)), "key 'out_bias' has the wrong type");
}

// train --arch hooked: TransformerLens's defaults (LayerNorm, GELU 4x, out_proj's bias and b_U; q/k/v biases by
// --qkv-bias), and the options its section answers to.
TEST(Hooked, AFreshModelFromTrainsOptions) {
  nn::ModelOptions o;
  o.arch = "hooked", o.emb_dim = 32, o.n_heads = 4, o.n_layers = 2;
  const nn::ModelFamily& f = io::family_named("hooked", "test").model;
  const nn::TaskSizes sizes{.task = "copy", .vocab_size = 13, .context_length = 12};
  const nlohmann::json s = f.from_options(o, sizes);
  const nn::DecoderConfig c = nn::hooked_family().config(s);
  EXPECT_EQ(c.norm, nn::NormKind::layer_norm);
  EXPECT_EQ(c.mlp, nn::MlpKind::gelu_tanh);
  EXPECT_EQ(c.mlp_width(), 128);
  EXPECT_TRUE(c.has_out_bias() && c.unembed_bias && !c.qkv_bias && !c.book_norm_names);
  EXPECT_EQ(c.output_vocab(), 13);
  EXPECT_EQ(f.from_options(f.options(s), sizes), s);
  o.attn_only = true, o.ffn_hiddens = 0;
  EXPECT_TRUE(nn::hooked_family().config(f.from_options(o, sizes)).attn_only);
  o.n_kv_heads = 2;
  EXPECT_ERROR(f.from_options(o, sizes), "--n-kv-heads: the hooked family has multi-head attention only");
  // Its names: PyTorch's LayerNorm's, the head's bias.
  const auto model = io::make_model(s);
  const NamedTensors p = model->named_parameters();
  for (const char* name : {"trf_blocks.0.norm1.weight", "trf_blocks.1.norm2.bias", "final_norm.weight", "out_head.bias",
                           "trf_blocks.0.att.out_proj.bias"})
    EXPECT_TRUE(std::any_of(p.begin(), p.end(), [&](const auto& e) { return e.first == name; })) << name;
}

// Saved and loaded through a headlab checkpoint: the same logits, bit for bit, and the same section.
TEST(Hooked, ACheckpointRoundTrip) {
  const headlab::testing::TempDir dir("hooked_checkpoint");
  auto m = fixture_model(kAddition, DType::f32);
  io::Checkpoint ck;
  std::vector<std::string> vocab;
  for (const char* t : {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "+", "="}) vocab.emplace_back(t);
  ck.config = {{"model", m->config_json()},
               {"tokenizer", {{"type", "char"}, {"vocab", vocab}}},
               {"task", {{"name", "copy"}, {"options", nlohmann::json::object()}}},
               {"training", {{"steps", 1}, {"batch_size", 1}, {"seed", 1}}}};
  ck.model = io::snapshot_parameters(*m);
  const std::string path = dir.path("hooked.h5");
  io::save_checkpoint(path, ck);
  const io::Checkpoint back = io::load_checkpoint(path);
  EXPECT_EQ(back.config["model"], m->config_json());
  const auto loaded = io::model_from_checkpoint<nn::DecoderModel>(back, path);
  const NoGradGuard no_grad;
  const Tensor ids = ids_of(reference(kAddition)["ids"]);
  EXPECT_EQ(max_diff(loaded->forward(ids), m->forward(ids)), 0.0);
}

// Without norms there are no ln1/ln2/ln_final hook points (TransformerLens's nn.Identity and absent ln_final); the
// attention and the MLP read the stream itself. With LayerNorm they are there.
TEST(Hooked, HookPointsWithoutNorms) {
  auto m = fixture_model(kAddition);
  const std::vector<std::string> names = analysis::hook_names(*m);
  for (const char* absent :
       {"blocks.0.ln1.hook_normalized", "blocks.0.ln2.hook_normalized", "ln_final.hook_normalized"})
    EXPECT_EQ(std::count(names.begin(), names.end(), absent), 0) << absent;
  EXPECT_ERROR(analysis::run_hooked(*m, ids_of(reference(kAddition)["ids"]), {"ln_final.hook_normalized"}, {}),
               "run_with_cache: the model has no hook point 'ln_final.hook_normalized'");
  const std::vector<std::string> with_norms = analysis::hook_names(*fixture_model("lens_gpt2"));
  for (const char* present :
       {"blocks.1.ln1.hook_normalized", "blocks.1.ln2.hook_normalized", "ln_final.hook_normalized"})
    EXPECT_EQ(std::count(with_norms.begin(), with_norms.end(), present), 1) << present;

  // The query is resid_pre W_Q; the MLP's pre-activation is resid_mid W_in + b_in.
  const analysis::HookedRun r = analysis::run_hooked(
      *m, ids_of(reference(kAddition)["ids"]),
      {"blocks.0.hook_resid_pre", "blocks.0.attn.hook_q", "blocks.0.hook_resid_mid", "blocks.0.mlp.hook_pre"}, {});
  const nn::HeadWeights w = m->head_weights(0);
  for (int64_t h = 0; h < 4; ++h) {
    const Tensor q = matmul(r.cache.at("blocks.0.hook_resid_pre"), w.W_Q.select(0, h));  // (B, T, D)
    EXPECT_LT(max_diff(q, r.cache.at("blocks.0.attn.hook_q").select(2, h)), 1e-12) << h;
  }
  auto& up = *dynamic_cast<nn::FeedForward&>(*m->block(0)->ff).layers->at<nn::Linear>(0);
  EXPECT_LT(max_diff(up.forward(r.cache.at("blocks.0.hook_resid_mid")), r.cache.at("blocks.0.mlp.hook_pre")), 1e-12);
}

// The weights analyses read: nothing to fold, the identity frozen, W_U (C, 10), no b_U; b_U where the file has it.
TEST(HookedAnalyses, WeightsAndTheFrozenNormWithoutNorms) {
  auto m = fixture_model(kAddition);
  const nn::HeadWeights plain = m->head_weights(0), folded = m->head_weights(0, true);
  EXPECT_EQ(max_diff(plain.W_Q, folded.W_Q), 0.0);
  EXPECT_FALSE(folded.b_Q.defined());
  EXPECT_EQ(m->W_U().shape(), (Shape{16, 10}));
  EXPECT_FALSE(m->b_U().defined());
  EXPECT_EQ(m->shape().out_vocab_size, 10);
  EXPECT_EQ(m->shape().vocab_size, 12);
  EXPECT_FALSE(m->shape().normalized);
  const Tensor x = randn({3, 16}, default_generator(), DType::f64), d = randn({3, 16}, default_generator(), DType::f64);
  const nn::FrozenNorm frozen = m->freeze_final_norm(x);
  EXPECT_TRUE(frozen.identity());
  EXPECT_EQ(max_diff(frozen.back(d), d), 0.0);
  EXPECT_EQ(max_diff(frozen.apply(d.unsqueeze(0)), d.unsqueeze(0)), 0.0);
  EXPECT_EQ(max_diff(frozen.bias_along(d), zeros({3}, DType::f64)), 0.0);
  const auto lens = fixture_model("lens_gpt2");
  EXPECT_EQ(lens->b_U().shape(), (Shape{24}));
  const Tensor y = randn({2, 16}, default_generator(), DType::f64);
  EXPECT_LT(max_diff(lens->unembed_normalized(y), add(matmul(y, lens->W_U()), lens->b_U())), 1e-12);
}

namespace {

// Random batches: inputs over the 12 tokens the addition model reads, targets over the 10 it predicts, some
// unscored; a full context's rows and shorter ones.
analysis::EvalSet addition_data(int64_t context) {
  analysis::EvalSet s;
  for (int64_t T : {context, context - 3}) {
    tasks::Batch b;
    b.B = 3, b.T = T;
    for (int64_t i = 0; i < b.B * T; ++i) {
      b.inputs.push_back((i * 7 + 3) % 12);
      b.targets.push_back(i % 5 == 0 ? kIgnoreIndex : (i * 3 + 1) % 10);
    }
    s.batches.push_back(std::move(b));
  }
  return s;
}

}  // namespace

// Direct logit attribution adds up to the model's own logits without norms and with b_U (in the final shift).
TEST(HookedAnalyses, DirectLogitAttributionAddsUp) {
  for (const std::string variant : {"grokking_addition", "lens_gpt2"}) {
    SCOPED_TRACE(variant);
    auto m = fixture_model(variant);
    const analysis::LogitAttribution a = analysis::logit_attribution(*m, addition_data(m->shape().context_length));
    EXPECT_GT(a.tokens, 0);
    for (const analysis::DirectAttribution* d : {&a.vs_mean, &a.logit}) EXPECT_NEAR(d->sum(), d->total, 1e-9);
    if (variant == kAddition) {
      EXPECT_EQ(a.logit.final_shift, 0.0);  // no norm, no b_U
    }
  }
}

// The logit lens reads each stream through no norm and W_U's 10 outputs; a next token the model does not predict
// ('+' 10, '=' 11) gets probability 0 and rank 10. Stacks through the identity norm are the stacks.
TEST(HookedAnalyses, TheLogitLensAndResidualStacks) {
  auto m = fixture_model(kAddition);
  const std::vector<int64_t> ids = {1, 2, 3, 10, 4, 5, 6, 11, 5, 7};
  const analysis::LogitLens lens = analysis::logit_lens(*m, ids);
  ASSERT_EQ(lens.rows, (std::vector<std::string>{"0_pre", "final_post"}));
  const NoGradGuard no_grad;
  const Tensor logp = log_softmax(m->forward(tensor(ids, {1, 10})).to(DType::f64), -1).select(0, 0);  // (T, 10)
  const std::vector<double> lp = logp.to_vector<double>();
  for (int64_t t = 0; t + 1 < lens.T; ++t) {
    const int64_t next = ids[static_cast<size_t>(t) + 1];
    if (next >= 10) {
      EXPECT_EQ(lens.prob_at(1, t), 0.0) << t;
      EXPECT_EQ(lens.rank_at(1, t), 10.0) << t;
      continue;
    }
    EXPECT_NEAR(lens.prob_at(1, t), std::exp(lp[static_cast<size_t>(t * 10 + next)]), 1e-12) << t;
    double above = 0;
    for (int64_t v = 0; v < 10; ++v)
      above += lp[static_cast<size_t>(t * 10 + v)] > lp[static_cast<size_t>(t * 10 + next)];
    EXPECT_EQ(lens.rank_at(1, t), above) << t;
  }
  analysis::StackOptions o;
  const Tensor tokens = tensor(ids, {1, 10});
  const Tensor plain = analysis::accumulated_resid(*m, tokens, o).stack;
  o.apply_ln = true;
  EXPECT_EQ(max_diff(analysis::accumulated_resid(*m, tokens, o).stack, plain), 0.0);
  o.layer = 0;
  EXPECT_EQ(max_diff(analysis::accumulated_resid(*m, tokens, o).stack, plain.narrow(0, 0, 1)), 0.0);
}

// Ablating each head: the unablated loss is the cross entropy over the 10 outputs, and every head is measured.
TEST(HookedAnalyses, AblationOverTheHeads) {
  auto m = fixture_model(kAddition);
  const analysis::EvalSet data = addition_data(18);
  const analysis::AblationResult r = analysis::ablate_heads(*m, data);
  ASSERT_EQ(r.heads.size(), 4u);
  const NoGradGuard no_grad;
  double nll = 0;
  for (const tasks::Batch& b : data.batches) {
    const Tensor logits = m->forward(tensor(b.inputs, {b.B, b.T})).reshape({b.B * b.T, 10});
    nll += cross_entropy(logits, tensor(b.targets, {b.B * b.T}), kIgnoreIndex, Reduction::sum).item<double>();
  }
  EXPECT_NEAR(r.base.loss, nll / static_cast<double>(data.tokens()), 1e-9);
  for (const analysis::HeadAblation& h : r.heads) EXPECT_TRUE(std::isfinite(h.zero.loss)) << h.head;
}
