// GPTModel (book ch. 4) against PyTorch: logits, the ignore_index cross-entropy loss, every parameter
// gradient and the head-gate gradients of gpt_fused.h5 and gpt_wrapper.h5, in float64 and float32;
// the exact state_dict names, order and shapes of both attention variants (ARCHITECTURE.md section 5);
// config checks; the context-length error; dropout in train and eval mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "analysis/surgery.h"
#include "autograd/engine.h"
#include "nn/generate.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/fixture_util.h"
#include "tests/tiny_models.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

struct GptCase {
  std::string file;
  DType dtype;
  double tol;
};

class GptParity : public ::testing::TestWithParam<GptCase> {};

TEST_P(GptParity, LogitsLossAndEveryGradientMatchPyTorch) {
  const GptCase& c = GetParam();
  const Fixture f = load_fixture(c.file);
  ASSERT_EQ(f.module, "GPTModel");
  const nn::DecoderConfig cfg = nn::gpt_family().config(f.config);
  EXPECT_EQ(cfg.to_json(), f.config) << "the fixture's config is exactly headlab's config keys";
  manual_seed(0);
  nn::DecoderModel model(cfg);
  model.to(c.dtype);
  model.eval();

  // Names: exactly PyTorch's named_parameters(), no more, no fewer.
  const auto params = model.named_parameters();
  std::vector<std::string> mine, theirs;
  for (const auto& [name, t] : params) mine.push_back(name);
  for (const auto& [name, t] : f.params) theirs.push_back(name);
  std::sort(mine.begin(), mine.end());
  EXPECT_EQ(mine, theirs);
  for (const auto& [name, t] : params) {
    ASSERT_TRUE(f.params.count(name)) << name;
    EXPECT_EQ(t.shape(), f.params.at(name).shape()) << name;
  }
  std::vector<std::pair<std::string, Tensor>> values(f.params.begin(), f.params.end());
  model.load_parameters(values, c.file);

  // Head gates at 1 with gradients: dL/dgates is the fixture's head-importance score.
  std::vector<Tensor> gates;
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    gates.push_back(ones({cfg.n_heads}, c.dtype).requires_grad_());
    model.attention(l).control().gates = gates.back();
  }

  const Tensor idx = f.inputs.at("idx"), targets = f.inputs.at("targets");
  ASSERT_EQ(idx.dtype(), DType::i64);
  const Tensor logits = model(idx);
  EXPECT_EQ(logits.dtype(), c.dtype);
  EXPECT_TRUE(close_rel(logits, f.outputs.at("logits"), c.tol)) << c.file << " logits";
  const int64_t V = cfg.vocab_size;
  const Tensor loss = cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}), -100);
  EXPECT_TRUE(close_rel(loss, f.outputs.at("loss"), c.tol)) << c.file << " loss";
  // ignore_index matters: the loss over all 12 positions (no ignoring) is a different number.
  int64_t ignored = 0;
  for (int64_t t : targets.to_vector<int64_t>()) ignored += t == -100;
  EXPECT_EQ(ignored, 3);
  loss.backward();

  for (const auto& [name, p] : params) {
    ASSERT_TRUE(f.grad_params.count(name)) << name;
    ASSERT_TRUE(p.grad().defined()) << c.file << ": no gradient for " << name;
    EXPECT_TRUE(close_rel(p.grad(), f.grad_params.at(name), c.tol)) << c.file << " d loss / d " << name;
  }
  io::h5::Reader r(fixture_path(c.file), "fixture");
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    const std::string name = "trf_blocks." + std::to_string(l) + ".att";
    const Tensor expected = to_tensor(r.read("grads/gates/" + name));
    ASSERT_TRUE(gates[l].grad().defined()) << name;
    EXPECT_TRUE(close_rel(gates[l].grad(), expected, c.tol)) << c.file << " d loss / d gates of " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GptParity,
                         ::testing::Values(GptCase{"gpt_fused.h5", DType::f64, 1e-9},
                                           GptCase{"gpt_fused.h5", DType::f32, 1e-5},
                                           GptCase{"gpt_wrapper.h5", DType::f64, 1e-9},
                                           GptCase{"gpt_wrapper.h5", DType::f32, 1e-5}),
                         [](const auto& info) {
                           std::string n = info.param.file.substr(0, info.param.file.size() - 3);
                           return n + (info.param.dtype == DType::f64 ? "_f64" : "_f32");
                         });

// ---- names and shapes, both variants (ARCHITECTURE.md section 5), in PyTorch's registration order ----

using NameShapes = std::vector<std::pair<std::string, Shape>>;

NameShapes names_of(const nn::DecoderModel& m) {
  NameShapes out;
  for (const auto& [name, t] : m.named_parameters()) out.emplace_back(name, t.shape());
  return out;
}

// Vocabulary 7 and context 5: the names-and-shapes tests below spell these sizes out.
nn::DecoderConfig small_config(const std::string& attention, bool qkv_bias) {
  return tiny_gpt_config(kTwoHeadGpt.sized_for(7, 5), parse_enum<nn::AttentionForm>(attention, "test"), qkv_bias);
}

TEST(GptNames, FusedWithoutQkvBias) {
  nn::DecoderModel m(small_config("fused", false));
  NameShapes expected = {{"tok_emb.weight", {7, 8}}, {"pos_emb.weight", {5, 8}}};
  for (int l = 0; l < 2; ++l) {
    const std::string b = "trf_blocks." + std::to_string(l) + ".";
    NameShapes block = {{b + "att.W_query.weight", {8, 8}},
                        {b + "att.W_key.weight", {8, 8}},
                        {b + "att.W_value.weight", {8, 8}},
                        {b + "att.out_proj.weight", {8, 8}},
                        {b + "att.out_proj.bias", {8}},
                        {b + "ff.layers.0.weight", {32, 8}},
                        {b + "ff.layers.0.bias", {32}},
                        {b + "ff.layers.2.weight", {8, 32}},
                        {b + "ff.layers.2.bias", {8}},
                        {b + "norm1.scale", {8}},
                        {b + "norm1.shift", {8}},
                        {b + "norm2.scale", {8}},
                        {b + "norm2.shift", {8}}};
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.insert(expected.end(), {{"final_norm.scale", {8}}, {"final_norm.shift", {8}}, {"out_head.weight", {7, 8}}});
  EXPECT_EQ(names_of(m), expected);
  int64_t total = 0;
  for (const auto& [n, s] : expected) total += shape_numel(s);
  EXPECT_EQ(m.num_parameters(), total);
}

TEST(GptNames, FusedWithQkvBias) {
  nn::DecoderModel m(small_config("fused", true));
  const NameShapes names = names_of(m);
  const NameShapes att(names.begin() + 2, names.begin() + 10);
  EXPECT_EQ(att, (NameShapes{{"trf_blocks.0.att.W_query.weight", {8, 8}},
                             {"trf_blocks.0.att.W_query.bias", {8}},
                             {"trf_blocks.0.att.W_key.weight", {8, 8}},
                             {"trf_blocks.0.att.W_key.bias", {8}},
                             {"trf_blocks.0.att.W_value.weight", {8, 8}},
                             {"trf_blocks.0.att.W_value.bias", {8}},
                             {"trf_blocks.0.att.out_proj.weight", {8, 8}},
                             {"trf_blocks.0.att.out_proj.bias", {8}}}));
  EXPECT_EQ(names.size(), 2u + 2 * 16 + 3);
}

TEST(GptNames, WrapperWithAndWithoutQkvBias) {
  for (bool bias : {false, true}) {
    nn::DecoderModel m(small_config("wrapper", bias));
    const NameShapes names = names_of(m);
    NameShapes expected_att;
    for (int h = 0; h < 2; ++h)
      for (const char* w : {"W_query", "W_key", "W_value"}) {
        const std::string n = "trf_blocks.1.att.heads." + std::to_string(h) + "." + w;
        expected_att.push_back({n + ".weight", {4, 8}});  // (emb_dim / n_heads, emb_dim)
        if (bias) expected_att.push_back({n + ".bias", {4}});
      }
    expected_att.push_back({"trf_blocks.1.att.out_proj.weight", {8, 8}});
    expected_att.push_back({"trf_blocks.1.att.out_proj.bias", {8}});
    const size_t per_block = expected_att.size() + 8;  // + ff (4) + norms (4)
    const size_t start = 2 + per_block;                // after the embeddings and block 0
    ASSERT_GE(names.size(), start + expected_att.size());
    EXPECT_EQ(NameShapes(names.begin() + start, names.begin() + start + expected_att.size()), expected_att)
        << "qkv_bias " << bias;
    EXPECT_EQ(names.size(), 2 + 2 * per_block + 3);
    EXPECT_EQ(names.back(), (std::pair<std::string, Shape>{"out_head.weight", {7, 8}}));
  }
}

// ---- config, input checks -----------------------------------------------------------------------

// GPTConfig::num_parameters (the estimate made before a model is built) is what the model has.
TEST(GptConfig, NumParametersWithoutBuildingTheModel) {
  for (const nn::AttentionForm form : {nn::AttentionForm::fused, nn::AttentionForm::wrapper})
    for (const bool bias : {false, true}) {
      nn::DecoderConfig c = tiny_gpt_config(kThreeHeadGpt, form, bias);
      EXPECT_DOUBLE_EQ(c.num_parameters(), static_cast<double>(nn::DecoderModel(c).num_parameters()));
      c.kept_heads = kPrunedHeads;  // after pruning
      EXPECT_DOUBLE_EQ(c.num_parameters(), static_cast<double>(nn::DecoderModel(c).num_parameters()));
    }
}

TEST(GptConfig, JsonRoundTripAndClearErrors) {
  nn::DecoderConfig c = small_config("wrapper", true);
  c.drop_rate = 0.1;
  const nn::DecoderConfig back = nn::gpt_family().config(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.head_size(), 4);

  nlohmann::json j = c.to_json();
  j.erase("n_heads");
  EXPECT_NE(error_of([&] { nn::gpt_family().config(j); }).find("GPT config: missing key 'n_heads'"),
            std::string::npos);
  j = c.to_json();
  j["emb_dim"] = "eight";
  EXPECT_NE(error_of([&] { nn::gpt_family().config(j); }).find("key 'emb_dim' must be an integer, got \"eight\""),
            std::string::npos);
  j["emb_dim"] = 8.5;  // not truncated to 8
  EXPECT_NE(error_of([&] { nn::gpt_family().config(j); }).find("key 'emb_dim' must be an integer, got 8.5"),
            std::string::npos);
  j = c.to_json();
  j["drop_rate"] = "none";
  EXPECT_NE(error_of([&] { nn::gpt_family().config(j); }).find("key 'drop_rate' has the wrong type (string)"),
            std::string::npos);
  j = c.to_json();
  j["n_heads"] = 3;
  EXPECT_NE(error_of([&] { nn::gpt_family().config(j); }).find("emb_dim 8 must be divisible by n_heads 3"),
            std::string::npos);
  j = c.to_json();
  j["attention"] = "flash";
  EXPECT_NE(error_of([&] {
              nn::gpt_family().config(j);
            }).find("GPT config: attention: expected one of 'fused', 'wrapper', got 'flash'"),
            std::string::npos);
  j = c.to_json();
  j["drop_rate"] = 1.0;
  EXPECT_NE(error_of([&] { nn::gpt_family().config(j); }).find("drop_rate must be in [0, 1)"), std::string::npos);
  EXPECT_NE(error_of([] { nn::gpt_family().config(nlohmann::json::array()); }).find("expected a JSON object"),
            std::string::npos);
}

TEST(GptModel, ContextOverflowAndBadInputsAreClearErrors) {
  for (const char* att : {"fused", "wrapper"}) {
    nn::DecoderModel m(small_config(att, false));
    EXPECT_EQ(m(zeros({2, 5}, DType::i64)).shape(), (Shape{2, 5, 7}));  // T = context_length is fine
    EXPECT_EQ(m(zeros({3, 1}, DType::i64)).shape(), (Shape{3, 1, 7}));
    EXPECT_NE(error_of([&] {
                m(zeros({1, 6}, DType::i64));
              }).find("GPTModel: 6 tokens exceed context_length 5"),
              std::string::npos);
    EXPECT_NE(error_of([&] { m(zeros({6}, DType::i64)); }).find("expected token ids of shape (batch, tokens), got [6]"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                m(zeros({1, 3}, DType::f32));
              }).find("token ids must be int64, got float32"),
              std::string::npos);
    EXPECT_THROW(m(full({1, 3}, 7, DType::i64)), Error) << "token id == vocab_size is out of range";
  }
}

// ---- dropout --------------------------------------------------------------------------------------

TEST(GptModel, DropoutActsInTrainModeOnlyAndFollowsTheSeed) {
  for (const char* att : {"fused", "wrapper"}) {
    nn::DecoderConfig c = small_config(att, false);
    c.drop_rate = 0.5;
    manual_seed(3);
    nn::DecoderModel m(c);
    c.drop_rate = 0.0;
    nn::DecoderModel plain(c);
    plain.load_parameters(m.named_parameters());
    const Tensor idx = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 0, 1}, {2, 4});

    m.eval();
    plain.eval();
    const std::vector<float> ref = plain(idx).to_vector<float>();
    EXPECT_EQ(m(idx).to_vector<float>(), ref) << att << ": eval mode ignores drop_rate";
    EXPECT_EQ(m(idx).to_vector<float>(), ref) << att;
    plain.train();
    EXPECT_EQ(plain(idx).to_vector<float>(), ref) << att << ": drop_rate 0 is the identity in train mode too";

    m.train();
    manual_seed(11);
    const std::vector<float> a = m(idx).to_vector<float>();
    const std::vector<float> b = m(idx).to_vector<float>();
    EXPECT_NE(a, ref) << att << ": train mode drops";
    EXPECT_NE(a, b) << att << ": each forward draws new masks";
    manual_seed(11);
    EXPECT_EQ(m(idx).to_vector<float>(), a) << att << ": the same seed gives the same masks";
    m.eval();
    EXPECT_EQ(m(idx).to_vector<float>(), ref) << att << ": back in eval mode";
    EXPECT_FALSE(m.is_training());
  }
}

// A backward pass in train mode with dropout flows through the same masks as the forward.
TEST(GptModel, DropoutGradientUsesTheForwardMask) {
  nn::DecoderConfig c = small_config("fused", false);
  c.drop_rate = 0.3;
  manual_seed(5);
  nn::DecoderModel m(c);
  m.to(DType::f64);
  m.train();
  const Tensor idx = tensor(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  const Tensor w = m.parameter("out_head.weight");
  manual_seed(21);
  const Tensor loss = sum(m(idx));
  loss.backward();
  const std::vector<double> g = w.grad().to_vector<double>();
  // Finite difference on one element of out_head.weight, replaying the same masks by re-seeding.
  const double eps = 1e-6;
  auto loss_at = [&](double delta) {
    NoGradGuard ng;
    Tensor wd = w.detach();
    std::vector<double> v = wd.to_vector<double>();
    v[3] += delta;
    wd.copy_(tensor(v, wd.shape()));
    manual_seed(21);
    const double l = sum(m(idx)).item<double>();
    v[3] -= delta;
    wd.copy_(tensor(v, wd.shape()));
    return l;
  };
  EXPECT_NEAR((loss_at(eps) - loss_at(-eps)) / (2 * eps), g[3], 1e-6);
}

}  // namespace

// ---- key/value cache ----------------------------------------------------------------------------

// An attention-only model is the full model with its MLPs removed: its parameters are the full model's
// but ff and norm2, and it computes what the full model computes with every MLP weight and bias zero
// (x + ff(norm2(x)) = x then), the KV cache included; its config round-trips and counts its parameters.
TEST(GptAttnOnly, EqualsTheFullModelWithZeroMlps) {
  nn::DecoderConfig c = tiny_gpt_config(kFourHeadGpt, nn::AttentionForm::fused, true);
  c.attn_only = true;
  manual_seed(4);
  nn::DecoderModel attn_only(c);
  attn_only.eval();
  EXPECT_DOUBLE_EQ(c.num_parameters(), double(attn_only.num_parameters()));
  EXPECT_EQ(nn::gpt_family().config(c.to_json()).attn_only, true);
  EXPECT_TRUE(c.to_json().contains("attn_only"));
  nn::DecoderConfig full_cfg = c;
  full_cfg.attn_only = false;
  EXPECT_FALSE(full_cfg.to_json().contains("attn_only")) << "absent when false, as older configs";
  nn::DecoderModel full(full_cfg);
  full.eval();
  NamedTensors values = attn_only.named_parameters();
  for (const auto& [name, t] : full.named_parameters()) {
    const bool mlp = name.find(".ff.") != std::string::npos || name.find(".norm2.") != std::string::npos;
    EXPECT_EQ(mlp, find_named(values, name) == values.end()) << name;
    if (mlp) values.emplace_back(name, zeros(t.shape()));
  }
  full.load_parameters(values, "test");
  NoGradGuard no_grad;
  const std::vector<int64_t> ids{3, 1, 4, 1, 5, 9, 2, 6};
  const Tensor want = full.forward(tensor(ids, {1, 8}));
  EXPECT_TRUE(all_close(attn_only.forward(tensor(ids, {1, 8})), want));
  std::vector<nn::KVCache> caches(2);
  attn_only.forward_cached(tensor(std::vector<int64_t>(ids.begin(), ids.begin() + 7), {1, 7}), caches);
  EXPECT_TRUE(
      all_close(attn_only.forward_cached(tensor(std::vector<int64_t>{ids[7]}, {1, 1}), caches), want.select(1, 7)));
}

TEST(GptKvCache, EachStepsLogitsEqualTheFullForward) {
  for (const bool bias : {false, true}) {
    nn::DecoderModel m(tiny_gpt_config(kFourHeadGpt, nn::AttentionForm::fused, bias));
    m.eval();
    NoGradGuard no_grad;
    const std::vector<int64_t> ids{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};  // 12 = context_length
    std::vector<nn::KVCache> caches(2);
    const Tensor all = m.forward(tensor(ids, {1, 12}));  // (1, 12, V)
    Tensor last = m.forward_cached(tensor(std::vector<int64_t>(ids.begin(), ids.begin() + 5), {1, 5}), caches);
    EXPECT_TRUE(all_close(last, all.select(1, 4)));
    for (int64_t t = 5; t < 12; ++t) {
      last = m.forward_cached(tensor(std::vector<int64_t>{ids[size_t(t)]}, {1, 1}), caches);
      EXPECT_TRUE(all_close(last, all.select(1, t))) << "position " << t;
    }
    EXPECT_EQ(caches[0].length, 12);
    EXPECT_ERROR(m.forward_cached(tensor(std::vector<int64_t>{1}, {1, 1}), caches), "exceed context_length 12");
    // A prompt in chunks (each attends to the cache and causally to itself): the same logits, and a chunk
    // that runs past the context is refused before it is cached.
    for (const int64_t chunk : {1, 3, 5, 12}) {
      std::vector<nn::KVCache> chunked(2);
      EXPECT_TRUE(all_close(m.forward_cached(tensor(ids, {1, 12}), chunked, chunk), all.select(1, 11))) << chunk;
      EXPECT_EQ(chunked[1].length, 12);
    }
    std::vector<nn::KVCache> fresh(2);
    m.forward_cached(tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 1}, {1, 10}), fresh);
    EXPECT_ERROR(m.forward_cached(tensor(std::vector<int64_t>{1, 2, 3}, {1, 3}), fresh, 1),
                 "3 tokens after 10 cached exceed context_length 12");
    EXPECT_EQ(fresh[0].length, 10);
    EXPECT_ERROR(m.forward_cached(tensor(std::vector<int64_t>{1}, {1, 1}), fresh, -1), "chunk must be >= 0");
  }
}

// generate() with the cache (fused form) gives the tokens of the same model in the wrapper form,
// which has none and recomputes its window: greedy and sampled, past the context (the window slides).
TEST(GptKvCache, GenerationEqualsTheUncachedPath) {
  nn::DecoderModel fused(tiny_gpt_config(kFourHeadGpt, nn::AttentionForm::fused, true));
  auto [cfg, params] =
      analysis::convert_parameters(fused.config().to_json(), fused.named_parameters(), nn::AttentionForm::wrapper);
  nn::DecoderModel wrapper(nn::gpt_family().config(cfg));
  wrapper.load_parameters(params, "test");
  ASSERT_TRUE(fused.supports_kv_cache());
  ASSERT_FALSE(wrapper.supports_kv_cache());
  for (const double temperature : {0.0, 1.0}) {
    nn::GenerateOptions o;
    o.max_new_tokens = 30;  // 3 + 30 tokens > context_length 12
    o.temperature = temperature;
    o.top_k = 5;
    o.seed = 11;
    const std::vector<int64_t> prompt{2, 7, 1};
    const std::vector<int64_t> a = nn::generate(fused, prompt, o), b = nn::generate(wrapper, prompt, o);
    EXPECT_EQ(a.size(), 30u);
    EXPECT_EQ(a, b) << "temperature " << temperature;
    if (temperature > 0) continue;
    // Greedy with the cache keeps the ids on the device and reads them in batches: an end token within the
    // context (the first 10 tokens) or after the window slid stops at the same place, kept or dropped.
    for (const size_t at : {size_t{4}, size_t{15}}) {
      for (const bool keep : {false, true}) {
        nn::GenerateOptions e = o;
        e.end_id = b[at];
        e.keep_end = keep;
        const size_t first = static_cast<size_t>(std::find(b.begin(), b.end(), b[at]) - b.begin());
        const std::vector<int64_t> expected(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(first + (keep ? 1 : 0)));
        EXPECT_EQ(nn::generate(fused, prompt, e), expected) << "end at " << at << " keep " << keep;
      }
    }
  }
}
