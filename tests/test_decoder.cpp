// nn/decoder.h: the decoder's one forward with hook points, against a forward written out here from the
// model's own modules (the slow reference): every hook point sees what the reference computes there;
// per-head inputs that a hook hands back changed run the reference's per-head path; nothing attached
// changes nothing; the weights as TransformerLens exposes them, with and without the norm folded; the
// frozen final norm; and the family registry (io/families.h).
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <memory>

#include "backends/backend.h"
#include "core_test_util.h"
#include "io/families.h"
#include "nn/decoder_family.h"
#include "nn/transformer.h"
#include "tiny_models.h"

using namespace headlab;
namespace ht = headlab::testing;
using nn::HookPoint;

namespace {

Tensor tokens_for(int64_t V, int64_t B, int64_t T) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * T; ++i) ids.push_back((i * 5 + 3) % V);
  return tensor(ids, {B, T});
}

double max_difference(const Tensor& a, const Tensor& b) { return sub(a, b).abs().max().item<double>(); }

// cfg's model from seed `seed`, in float64 and eval mode (the references here are exact).
std::unique_ptr<nn::DecoderModel> f64_model(const nn::DecoderConfig& cfg, uint64_t seed) {
  manual_seed(seed);
  auto model = std::make_unique<nn::DecoderModel>(cfg);
  model->to(DType::f64);
  model->eval();
  return model;
}

// Every hook point of the model, kept.
nn::ActivationCache keep_all(const nn::DecoderModel& m) {
  const std::vector<nn::HookKey> keys = m.hook_points();
  return nn::ActivationCache(std::set<nn::HookKey>(keys.begin(), keys.end()));
}

// The reference: the book's block written out from the modules, per head: q, k, v, the causal softmax,
// z, each head's result through its out_proj columns; what the points should hold, by key.
std::map<nn::HookKey, Tensor> reference(nn::DecoderModel& m, const Tensor& idx) {
  std::map<nn::HookKey, Tensor> at;
  const int64_t B = idx.size(0), T = idx.size(1), C = m.config().emb_dim;
  at[{HookPoint::embed, -1}] = m.tok_emb->forward(idx);
  at[{HookPoint::pos_embed, -1}] =
      m.pos_emb->forward(arange(0, static_cast<double>(T), 1, DType::i64)).unsqueeze(0).expand({B, T, C});
  Tensor x = add(at[{HookPoint::embed, -1}], at[{HookPoint::pos_embed, -1}]);
  for (int64_t l = 0; l < m.n_layers(); ++l) {
    const auto block = m.block(l);
    const auto w = block->att->split_heads();  // per head
    const int64_t H = w->num_heads, D = w->d_out;
    at[{HookPoint::resid_pre, l}] = x;
    const Tensor n = block->norm1->forward(x);
    at[{HookPoint::ln1_normalized, l}] = n;
    std::vector<Tensor> q, k, v, pattern, z, result;
    for (int64_t h = 0; h < H; ++h) {
      const auto& head = *w->heads->at<nn::CausalAttention>(static_cast<size_t>(h));
      q.push_back(head.W_query->forward(n)), k.push_back(head.W_key->forward(n)), v.push_back(head.W_value->forward(n));
      pattern.push_back(causal_softmax(matmul(q.back(), k.back().mT()), 1.0 / std::sqrt(static_cast<double>(D))));
      z.push_back(matmul(pattern.back(), v.back()));                                     // (B, T, D)
      result.push_back(matmul(z.back(), w->out_proj->weight.narrow(1, h * D, D).mT()));  // (B, T, C)
    }
    at[{HookPoint::q, l}] = stack(q, 2), at[{HookPoint::k, l}] = stack(k, 2), at[{HookPoint::v, l}] = stack(v, 2);
    at[{HookPoint::pattern, l}] = stack(pattern, 1), at[{HookPoint::z, l}] = stack(z, 2);
    at[{HookPoint::result, l}] = stack(result, 2);
    const Tensor attn_out = add(stack(result, 2).sum({2}), w->out_proj->bias);
    at[{HookPoint::attn_out, l}] = attn_out;
    x = add(x, attn_out);
    if (block->ff) {
      at[{HookPoint::resid_mid, l}] = x;
      const Tensor n2 = block->norm2->forward(x);
      at[{HookPoint::ln2_normalized, l}] = n2;
      const Tensor pre = dynamic_cast<nn::FeedForward&>(*block->ff).layers->at(0)->forward(n2);
      at[{HookPoint::mlp_pre, l}] = pre;
      at[{HookPoint::mlp_post, l}] = gelu(pre, true);
      const Tensor out = dynamic_cast<nn::FeedForward&>(*block->ff).layers->at(2)->forward(gelu(pre, true));
      at[{HookPoint::mlp_out, l}] = out;
      x = add(x, out);
    }
    at[{HookPoint::resid_post, l}] = x;
  }
  at[{HookPoint::ln_final_normalized, -1}] = m.final_norm->forward(x);
  return at;
}

}  // namespace

TEST(DecoderForward, EveryHookPointHoldsWhatTheReferenceComputesThere) {
  for (const auto& [name, cfg] : ht::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    const auto owned = f64_model(cfg, 4);
    nn::DecoderModel& model = *owned;
    const NoGradGuard ng;
    const Tensor idx = tokens_for(cfg.vocab_size, 2, 6);
    nn::ActivationCache cache = keep_all(model);
    const Tensor logits = model.forward(idx, &cache);
    const std::map<nn::HookKey, Tensor> want = reference(model, idx);
    EXPECT_EQ(cache.cache().size(), model.hook_points().size());
    for (const auto& [key, t] : cache.cache()) {
      ASSERT_TRUE(want.count(key)) << nn::hook_name(key);
      EXPECT_EQ(t.shape(), want.at(key).shape()) << nn::hook_name(key);
      EXPECT_LT(max_difference(t, want.at(key)), 1e-12) << nn::hook_name(key);
    }
    EXPECT_LT(max_difference(logits, model.out_head->forward(want.at({HookPoint::ln_final_normalized, -1}))), 1e-12);
  }
}

TEST(DecoderForward, NothingAttachedOrNothingWantedChangesNothing) {
  manual_seed(6);
  nn::DecoderModel model(ht::tiny_gpt_config(ht::kFourHeadGpt, nn::AttentionForm::fused, true));
  model.eval();
  const NoGradGuard ng;
  const Tensor idx = tokens_for(ht::kFourHeadGpt.vocab_size, 3, 9);
  const Tensor plain = model.forward(idx);
  nn::ActivationCache none;
  EXPECT_EQ(max_difference(model.forward(idx, &none), plain), 0.0);  // bitwise: the same ops ran
  EXPECT_TRUE(none.cache().empty());
  // Keeping the stream only still runs the fused attention: the same logits to the bit.
  nn::ActivationCache streams({{HookPoint::resid_post, 0}, {HookPoint::resid_pre, 1}});
  EXPECT_EQ(max_difference(model.forward(idx, &streams), plain), 0.0);
  EXPECT_EQ(
      max_difference(streams.cache().at({HookPoint::resid_post, 0}), streams.cache().at({HookPoint::resid_pre, 1})),
      0.0);
}

// The MLP's up-projection and GELU run as one pass (linear_gelu) unless a hook wants the pre-activation; in
// float32 on two threads at a size the CPU's one-pass kernel takes, the logits and the gradients are the
// two-op path's (forced by a hook that only keeps mlp_pre), and the kept pre-activation is what went on.
TEST(DecoderForward, TheMlpsOnePassIsTheTwoOpPath) {
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(2);
  nn::DecoderConfig cfg;
  cfg.vocab_size = 64, cfg.context_length = 64, cfg.emb_dim = 128, cfg.n_heads = 4, cfg.n_layers = 2;
  manual_seed(11);
  nn::DecoderModel model(cfg);
  const Tensor idx = tokens_for(cfg.vocab_size, 2, 64);
  const Tensor one_pass = model.forward(idx);
  one_pass.pow(2.0).mean().backward();
  const Tensor& up = dynamic_cast<nn::FeedForward&>(*model.block(0)->ff).layers->at<nn::Linear>(0)->weight;
  const Tensor g_one_pass = up.grad();
  model.zero_grad();
  nn::ActivationCache pre({{HookPoint::mlp_pre, 0}, {HookPoint::mlp_pre, 1}});
  const Tensor two_ops = model.forward(idx, &pre);
  two_ops.pow(2.0).mean().backward();
  const Tensor g_two_ops = up.grad();
  EXPECT_LT(max_difference(one_pass, two_ops), 1e-6);
  EXPECT_LT(max_difference(g_one_pass, g_two_ops), 1e-8);
  EXPECT_EQ(pre.cache().at({HookPoint::mlp_pre, 1}).shape(), (Shape{2, 64, 512}));
  omp_set_num_threads(threads_before);
}

// A hook that gives one head of one layer its own query input: the reference runs that head's query on
// the changed input, every other head and the keys and values on the stream.
TEST(DecoderForward, PerHeadInputsFeedOnlyTheirHead) {
  for (const auto& [name, cfg] : ht::tiny_gpt_forms(ht::kThreeHeadGpt, true)) {
    SCOPED_TRACE(name);
    const auto owned = f64_model(cfg, 7);
    nn::DecoderModel& model = *owned;
    const NoGradGuard ng;
    const Tensor idx = tokens_for(cfg.vocab_size, 2, 5);
    const int64_t layer = 1, head = model.attention(layer).head_count() - 1;
    // Added to that head's query input; not constant along C, which ln1 would remove.
    const Tensor shift = mul(randn({2, 5, cfg.emb_dim}, default_generator(), DType::f64), 0.25);
    std::map<nn::HookKey, nn::ActivationCache::Callback> call;
    int64_t calls = 0;
    call[{HookPoint::q_input, layer}] = [&](nn::HookKey, const Tensor& x) {  // x: (B, T, H, C), broadcast
      ++calls;
      Tensor mine = x.contiguous();  // written in place (with one head, x itself): the stream must not change
      mine.select(2, head).copy_(add(mine.select(2, head), shift));
      return mine;
    };
    call[{HookPoint::k_input, layer}] = [&](nn::HookKey, const Tensor& x) { return x; };  // unchanged: plain path
    nn::ActivationCache hooks({{HookPoint::q, layer}, {HookPoint::resid_pre, layer}}, call);
    const Tensor logits = model.forward(idx, &hooks);
    EXPECT_EQ(calls, 1);
    // The reference query: ln1 of the shifted stream through the head's W_query rows.
    const auto block = model.block(layer);
    const auto w = block->att->split_heads();
    const Tensor x = hooks.cache().at({HookPoint::resid_pre, layer});
    const Tensor q = w->heads->at<nn::CausalAttention>(static_cast<size_t>(head))
                         ->W_query->forward(block->norm1->forward(add(x, shift)));
    EXPECT_LT(max_difference(hooks.cache().at({HookPoint::q, layer}).select(2, head), q), 1e-12);
    if (head > 0) {  // (a pruned layer may keep one head)
      const Tensor other = w->heads->at<nn::CausalAttention>(0)->W_query->forward(block->norm1->forward(x));
      EXPECT_LT(max_difference(hooks.cache().at({HookPoint::q, layer}).select(2, 0), other), 1e-12);
    }
    EXPECT_GT(max_difference(logits, model.forward(idx)), 1e-9);  // the change reached the logits
  }
}

TEST(DecoderForward, HookNamesAreTransformerLensesAndParseBack) {
  nn::DecoderModel model(ht::tiny_gpt_config(ht::kTwoHeadGpt));
  for (const nn::HookKey& key : model.hook_points(true)) {
    const std::optional<nn::HookKey> back = nn::parse_hook_name(nn::hook_name(key));
    ASSERT_TRUE(back) << nn::hook_name(key);
    EXPECT_EQ(*back, key);
  }
  EXPECT_EQ(nn::hook_name({HookPoint::rot_q, 3}), "blocks.3.attn.hook_rot_q");
  EXPECT_EQ(nn::hook_name({HookPoint::ln1_normalized, 0}), "blocks.0.ln1.hook_normalized");
  EXPECT_EQ(nn::hook_name({HookPoint::mlp_post, 1}), "blocks.1.mlp.hook_post");
  for (const char* bad : {"blocks.x.hook_resid_pre", "blocks.01.hook_resid_pre", "hook_resid_pre",
                          "blocks.0.hook_embed", "blocks.0.attn.hook_nothing", ""})
    EXPECT_FALSE(nn::parse_hook_name(bad)) << bad;
}

// head_weights: W_Q x + b_Q is the head's query, W_O maps z to its result; folded, ln1's weight and bias
// are inside, so the normalised-but-unscaled stream gives the same query.
TEST(DecoderWeights, HeadWeightsAreTheHeadsOwnAndFoldTheNorm) {
  for (const auto& [name, cfg] : ht::tiny_gpt_forms(ht::kThreeHeadGpt, true)) {
    SCOPED_TRACE(name);
    const auto owned = f64_model(cfg, 8);
    nn::DecoderModel& model = *owned;
    const NoGradGuard ng;
    {  // a norm that is not the identity
      model.block(0)->norm1->weight.copy_(add(rand({cfg.emb_dim}, default_generator(), DType::f64), 0.5));
      model.block(0)->norm1->bias.copy_(rand({cfg.emb_dim}, default_generator(), DType::f64));
    }
    const Tensor idx = tokens_for(cfg.vocab_size, 1, 4);
    nn::ActivationCache cache({{HookPoint::resid_pre, 0},
                               {HookPoint::ln1_normalized, 0},
                               {HookPoint::q, 0},
                               {HookPoint::z, 0},
                               {HookPoint::result, 0}});
    model.forward(idx, &cache);
    const auto got = [&](HookPoint p) { return cache.cache().at({p, 0}); };
    const nn::HeadWeights w = model.head_weights(0), f = model.head_weights(0, true);
    const int64_t H = model.attention(0).head_count();
    const Tensor x = got(HookPoint::resid_pre);
    const Tensor centred = sub(x, x.mean({-1}, true));
    const Tensor unscaled = mul(centred, rsqrt(add(mul(centred, centred).mean({-1}, true), 1e-5)));
    for (int64_t h = 0; h < H; ++h) {
      const Tensor q = add(matmul(got(HookPoint::ln1_normalized), w.W_Q.select(0, h)), w.b_Q.select(0, h));
      EXPECT_LT(max_difference(q, got(HookPoint::q).select(2, h)), 1e-12) << h;
      const Tensor qf = add(matmul(unscaled, f.W_Q.select(0, h)), f.b_Q.select(0, h));
      EXPECT_LT(max_difference(qf, got(HookPoint::q).select(2, h)), 1e-12) << h;
      const Tensor r = matmul(got(HookPoint::z).select(2, h), w.W_O.select(0, h));
      EXPECT_LT(max_difference(r, got(HookPoint::result).select(2, h)), 1e-12) << h;
    }
  }
}

// The final norm frozen at x: the shares of x's parts along a direction, plus the bias's, are the real
// norm's output along it, for LayerNorm exactly; W_U and b_U are the head's.
TEST(DecoderWeights, FrozenFinalNormSplitsTheStreamExactly) {
  manual_seed(9);
  nn::DecoderModel model(ht::tiny_gpt_config(ht::kFourHeadGpt));
  model.to(DType::f64);
  const NoGradGuard ng;
  model.final_norm->weight.copy_(add(rand({32}, default_generator(), DType::f64), 0.5));
  model.final_norm->bias.copy_(rand({32}, default_generator(), DType::f64));
  const Tensor a = randn({5, 32}, default_generator(), DType::f64), b = randn({5, 32}, default_generator(), DType::f64),
               dir = randn({5, 32}, default_generator(), DType::f64);
  const Tensor x = add(a, b);
  const nn::FrozenNorm frozen = model.freeze_final_norm(x);
  const Tensor split =
      add(add(mul(a, frozen.back(dir)).sum({1}), mul(b, frozen.back(dir)).sum({1})), frozen.bias_along(dir));
  const Tensor whole = mul(model.normalize_final(x), dir).sum({1});
  EXPECT_LT(max_difference(split, whole), 1e-12);
  EXPECT_EQ(model.W_U().shape(), Shape({32, ht::kFourHeadGpt.vocab_size}));
  EXPECT_FALSE(model.b_U().defined());
  const Tensor y = randn({2, 3, 32}, default_generator(), DType::f64);
  EXPECT_LT(max_difference(model.unembed_normalized(y), matmul(y, model.W_U())), 1e-12);
}

// One config of each part a family chooses: GPT (fused, wrapper with biases and a tied head, attention-only,
// pruned), LLaMA (grouped-query, head_dim apart from the width, pruned to whole groups), GPT-NeoX (parallel,
// sequential without biases, tied), HookedTransformer (no norms, a ReLU MLP, fewer outputs than inputs; LayerNorm,
// every bias and b_U; attention-only without norms).
std::vector<std::pair<std::string, nn::DecoderConfig>> every_part() {
  const auto sized = [](nn::DecoderConfig c) {
    c.vocab_size = 29, c.context_length = 16, c.emb_dim = 32, c.n_heads = 4, c.n_layers = 2;
    return c;
  };
  std::vector<std::pair<std::string, nn::DecoderConfig>> all;
  nn::DecoderConfig c = sized(nn::gpt_family().config());
  all.emplace_back("gpt fused", c);
  c.attention = nn::AttentionForm::wrapper, c.qkv_bias = true, c.tie_embeddings = true;
  all.emplace_back("gpt wrapper, biases, tied", c);
  c = sized(nn::gpt_family().config()), c.attn_only = true;
  all.emplace_back("gpt attention-only", c);
  c = sized(nn::gpt_family().config()), c.kept_heads = {{0, 2}, {1}};
  all.emplace_back("gpt pruned", c);
  c = sized(nn::llama_family().config()), c.n_kv_heads = 2, c.hidden_dim = 48;
  all.emplace_back("llama grouped-query", c);
  c.head_dim = 16, c.kept_heads = {{0, 1}, {2, 3}};
  all.emplace_back("llama head_dim 16, pruned", c);
  c = sized(nn::neox_family().config()), c.hidden_dim = 64, c.rotary_dims = 2;
  all.emplace_back("neox parallel", c);
  c.parallel_residual = false, c.qkv_bias = false, c.tie_embeddings = true;
  all.emplace_back("neox sequential, no biases, tied", c);
  c = sized(nn::hooked_family().config()), c.norm = nn::NormKind::none, c.mlp = nn::MlpKind::relu;
  c.out_vocab_size = 10, c.qkv_bias = false, c.out_bias = false, c.unembed_bias = false, c.hidden_dim = 48;
  all.emplace_back("hooked no norms, relu, 10 outputs", c);
  c = sized(nn::hooked_family().config()), c.mlp = nn::MlpKind::gelu_exact;
  all.emplace_back("hooked LayerNorm, every bias, b_U", c);
  c = sized(nn::hooked_family().config()), c.norm = nn::NormKind::none, c.attn_only = true, c.unembed_bias = false;
  all.emplace_back("hooked attention-only without norms", c);
  return all;
}

// The counts a config gives before any model is built are the built model's: its parameters, the floats its
// key/value caches hold after a prefill, and a training step's activations as the allocator measures them
// (the estimate the memory checks use is an upper bound of the measured peak, and not far above it).
TEST(DecoderConfig, CountsAreTheBuiltModelsAndAMeasuredRun) {
  Backend& cpu = backend_for(kCPU);
  for (const auto& [name, c] : every_part()) {
    SCOPED_TRACE(name);
    manual_seed(5);
    nn::DecoderModel model(c);
    EXPECT_EQ(c.num_parameters(), static_cast<double>(model.num_parameters()));
    EXPECT_EQ(nn::DecoderModel(c.family->config(c.to_json())).num_parameters(), model.num_parameters());

    // The caches after an 11-token prefill: keys and values of every key/value head, capacity tokens each.
    {
      const NoGradGuard no_grad;
      model.eval();
      std::vector<nn::KVCache> caches(static_cast<size_t>(c.n_layers));
      for (nn::KVCache& k : caches) k.expected = 11;
      model.forward_cached(tokens_for(c.vocab_size, 1, 11), caches);
      double floats = 0;
      for (const nn::KVCache& k : caches)
        floats += static_cast<double>(k.keys.numel() + k.values.numel()) / static_cast<double>(k.keys.size(2));
      EXPECT_EQ(floats, c.cache_floats());
    }

    // A training step's peak beyond the parameters and their gradients, and a forward's without a tape, per
    // token of the batch.
    const int64_t B = 8, T = c.context_length;
    const Tensor idx = tokens_for(c.vocab_size, B, T), targets = tokens_for(c.output_vocab(), B, T);
    for (const bool training : {true, false}) {
      SCOPED_TRACE(training ? "training" : "inference");
      const double weights = training ? static_cast<double>(model.num_parameters()) * sizeof(float) : 0.0;
      model.train(training);
      cpu.reset_peak();
      const double before = static_cast<double>(cpu.bytes_in_use());
      if (training) {
        cross_entropy(model.forward(idx).view({B * T, c.output_vocab()}), targets.view({B * T})).backward();
      } else {
        const NoGradGuard no_grad;
        model.forward(idx);
      }
      const double measured = (static_cast<double>(cpu.peak_bytes()) - before - weights) / sizeof(float) /
                              static_cast<double>(B * T);
      const double estimate = c.activation_floats(training);
      EXPECT_LE(measured, estimate) << "measured " << measured << " floats a token, estimated " << estimate;
      EXPECT_GE(measured, 0.3 * estimate) << "measured " << measured << " floats a token, estimated " << estimate;
      model.zero_grad();
    }
  }
}

// The registry: a section's family by its "arch", building, counting; a folder's by its model_type.
TEST(Families, TheRegistryKnowsEveryFamilyBySectionAndFolder) {
  const nlohmann::json gpt = ht::tiny_gpt_config(ht::kTwoHeadGpt).to_json();
  EXPECT_EQ(io::family_of(gpt).model.arch(), "gpt");
  EXPECT_TRUE(io::family_of(gpt).folder != nullptr);
  EXPECT_EQ(io::make_model(gpt)->type_name(), "GPTModel");
  EXPECT_EQ(io::num_parameters(gpt), static_cast<double>(io::make_model(gpt)->num_parameters()));
  nn::TransformerConfig t;
  t.src_vocab_size = 11, t.tgt_vocab_size = 9, t.num_hiddens = 8, t.ffn_num_hiddens = 16, t.num_heads = 2;
  const nlohmann::json s2s = t.to_json();
  EXPECT_EQ(io::family_of(s2s).model.arch(), "encoder-decoder");
  EXPECT_TRUE(io::family_of(s2s).model.seq2seq());
  EXPECT_EQ(io::family_of(s2s).folder, nullptr);
  EXPECT_EQ(io::num_parameters(s2s), static_cast<double>(io::make_model(s2s)->num_parameters()));
  // The options a section answers to build the section again, where the family has every choice.
  const nn::ModelFamily& f = io::family_of(gpt).model;
  nn::TaskSizes sizes;
  sizes.vocab_size = ht::kTwoHeadGpt.vocab_size, sizes.context_length = ht::kTwoHeadGpt.context_length;
  EXPECT_EQ(f.from_options(f.options(gpt), sizes), gpt);
  EXPECT_EQ(f.describe(gpt), "fused attention, 2 layers x 2 heads, emb 8, context 10");
  EXPECT_EQ(nlohmann::json(f.with_dropout(gpt, 0.25))["drop_rate"], 0.25);
  // Errors name what is wrong.
  nlohmann::json bad = gpt;
  bad["arch"] = "roberta";
  EXPECT_THROW(io::family_of(bad), Error);
  try {
    io::family_of(bad);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "expected one of 'gpt', 'encoder-decoder', 'llama', 'qwen3', 'olmo2', 'gemma', 'gemma2', 'gemma3', "
                  "'neox', 'gpt_neo', 'bert', 'hooked', got 'roberta'"),
              std::string::npos)
        << e.what();
  }
}
