// The per-head wrapper form of grouped-query and rotary attention (the LLaMA family's): the wrapper against the
// fused module on the same weights in float64 (split and merge exact, forward, hooked forward and backward equal,
// a group's shared key/value gradients the sum over its heads) across multi-head, grouped-query and multi-query
// attention, rotary layouts and fractions, out_proj and qkv biases; parameter counts; pruning whole groups only;
// gradcheck; and a LlamaModel in wrapper form: converted from the fused form, saved and loaded, trained.
// B = batch, T = tokens, H = heads, G = heads per key/value group, D = head size.
#include <gtest/gtest.h>

#include <set>

#include "analysis/surgery.h"
#include "io/checkpoint.h"
#include "io/families.h"
#include "nn/decoder_family.h"
#include "optim/optim.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::TempDir;

namespace {

Tensor rnd(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randn(shape, g, DType::f64);
}

Tensor leaf(const Tensor& t) {
  Tensor l = t.detach().clone();
  l.requires_grad_(true);
  return l;
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

struct Variant {
  int64_t kv_heads;
  nn::Rotary rotary;
  bool out_bias, qkv_bias;
  std::string name() const {
    return "kv " + std::to_string(kv_heads) + ", rotary dims " + std::to_string(rotary.dims) +
           (rotary.interleaved ? " interleaved" : " halves") + ", out_bias " + std::to_string(out_bias) +
           ", qkv_bias " + std::to_string(qkv_bias);
  }
};

// 4 heads of 6, d_in 8, out_proj to 10 (not H*D: a pruned model keeps its width).
nn::CausalAttentionSizes sizes_of(const Variant& v) {
  return {.d_in = 8,
          .d_out = 10,
          .context_length = 12,
          .num_heads = 4,
          .head_dim = 6,
          .num_kv_heads = v.kv_heads,
          .dropout = 0.0,
          .qkv_bias = v.qkv_bias,
          .out_bias = v.out_bias,
          .rotary = v.rotary};
}

// MHA, GQA and MQA x no rotary, interleaved, halves, partial (4 of 6 dims, either layout) x the biases.
std::vector<Variant> variants() {
  const std::vector<nn::Rotary> rotaries = {
      {}, {6, 10000.0, true, {}}, {6, 500.0, false, {}}, {4, 10000.0, false, {}}, {2, 1000.0, true, {}}};
  std::vector<Variant> out;
  for (int64_t kv : {4, 2, 1})
    for (const nn::Rotary& r : rotaries)
      for (bool out_bias : {true, false})
        for (bool qkv_bias : {false, true}) out.push_back({kv, r, out_bias, qkv_bias});
  return out;
}

std::shared_ptr<nn::CausalMultiHeadAttention> fused_f64(const Variant& v, uint64_t seed) {
  manual_seed(seed);
  auto f = nn::CausalMultiHeadAttention::create(sizes_of(v));
  f->to(DType::f64);
  f->eval();
  return f;
}

}  // namespace

// Split then merge gives the fused module's parameters bit for bit; the wrapper's own per-head loop computes
// the fused forward; its gradients are the fused gradients' rows (a shared key/value module's: the sum over
// its group's heads, which the tape accumulates since every head reads the same Linear).
TEST(WrapperGQA, AgreesWithTheFusedFormForwardAndBackward) {
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name());
    const auto fused = fused_f64(v, 7);
    const auto wrapper = fused->split_heads();
    const int64_t H = 4, G = 4 / v.kv_heads, D = 6;
    EXPECT_EQ(wrapper->kv_head_count(), v.kv_heads);
    EXPECT_EQ(wrapper->num_parameters(), fused->num_parameters());
    EXPECT_EQ(static_cast<double>(wrapper->num_parameters()),
              nn::causal_attention_parameters(nn::AttentionForm::wrapper, sizes_of(v)));
    EXPECT_EQ(static_cast<double>(fused->num_parameters()),
              nn::causal_attention_parameters(nn::AttentionForm::fused, sizes_of(v)));
    // One module per group: each head of the group holds its first head's W_key and W_value.
    for (int64_t h = 0; h < H; ++h) {
      const auto head = wrapper->heads->at<nn::CausalAttention>(static_cast<size_t>(h));
      const auto first = wrapper->heads->at<nn::CausalAttention>(static_cast<size_t>(h - h % G));
      EXPECT_EQ(head->W_key, first->W_key);
      EXPECT_EQ(head->W_value, first->W_value);
      EXPECT_EQ(head->W_query == first->W_query, h % G == 0);
    }
    // Round trip: exact.
    const auto back = nn::CausalMultiHeadAttention::merge_heads(*wrapper);
    const NamedTensors pf = fused->named_parameters(), pb = back->named_parameters();
    ASSERT_EQ(pf.size(), pb.size());
    for (size_t i = 0; i < pf.size(); ++i) {
      EXPECT_EQ(pf[i].first, pb[i].first);
      EXPECT_EQ(max_diff(pf[i].second, pb[i].second), 0.0) << pf[i].first;
    }
    EXPECT_EQ(back->num_kv_heads, v.kv_heads);
    EXPECT_EQ(back->rotary, v.rotary);
    // Forward and backward.
    const Tensor x_f = leaf(rnd({2, 7, 8}, 3)), x_w = leaf(x_f);
    const Tensor dout = rnd({2, 7, 10}, 4);
    const Tensor y_f = fused->forward(x_f), y_w = wrapper->forward(x_w);
    EXPECT_LT(max_diff(y_f, y_w), 1e-12);
    sum(mul(y_f, dout)).backward();
    sum(mul(y_w, dout)).backward();
    EXPECT_LT(max_diff(x_f.grad(), x_w.grad()), 1e-12);
    for (int64_t h = 0; h < H; ++h) {
      const auto head = wrapper->heads->at<nn::CausalAttention>(static_cast<size_t>(h));
      EXPECT_LT(max_diff(fused->W_query->weight.grad().narrow(0, h * D, D), head->W_query->weight.grad()), 1e-12);
      EXPECT_LT(max_diff(fused->W_key->weight.grad().narrow(0, h / G * D, D), head->W_key->weight.grad()), 1e-12);
      EXPECT_LT(max_diff(fused->W_value->weight.grad().narrow(0, h / G * D, D), head->W_value->weight.grad()), 1e-12);
      if (v.qkv_bias) {
        EXPECT_LT(max_diff(fused->W_query->bias.grad().narrow(0, h * D, D), head->W_query->bias.grad()), 1e-12);
        EXPECT_LT(max_diff(fused->W_key->bias.grad().narrow(0, h / G * D, D), head->W_key->bias.grad()), 1e-12);
      }
    }
    EXPECT_LT(max_diff(fused->out_proj->weight.grad(), wrapper->out_proj->weight.grad()), 1e-12);
    EXPECT_EQ(wrapper->out_proj->bias.defined(), v.out_bias);
    if (v.out_bias) {
      EXPECT_LT(max_diff(fused->out_proj->bias.grad(), wrapper->out_proj->bias.grad()), 1e-12);
    }
  }
}

// The wrapper's hooked forward (the fused form's on a copy) with per-head inputs of H query and Hkv key/value heads:
// the fused module's pattern, z and output.
TEST(WrapperGQA, HookedForwardWithPerHeadInputsMatchesTheFusedForm) {
  for (const Variant& v :
       {Variant{2, {6, 10000.0, true, {}}, false, true}, Variant{1, {4, 500.0, false, {}}, true, false}}) {
    SCOPED_TRACE(v.name());
    const auto fused = fused_f64(v, 9);
    const auto wrapper = fused->split_heads();
    const NoGradGuard no_grad;
    const Tensor x = rnd({2, 5, 8}, 5);
    const nn::AttentionInput in{x, rnd({2, 5, 4, 8}, 6), rnd({2, 5, v.kv_heads, 8}, 7), Tensor(), Tensor()};
    const std::set<nn::HookKey> keep = {{nn::HookPoint::pattern, 0}, {nn::HookPoint::z, 0}, {nn::HookPoint::rot_k, 0}};
    nn::ActivationCache cf(keep), cw(keep);
    const Tensor yf = fused->forward(in, nn::HookSite{&cf, 0}), yw = wrapper->forward(in, nn::HookSite{&cw, 0});
    EXPECT_LT(max_diff(yf, yw), 1e-12);
    for (const nn::HookKey& k : keep) EXPECT_LT(max_diff(cf.cache().at(k), cw.cache().at(k)), 1e-12);
  }
}

// Under grouped-query attention a selection keeps whole key/value groups (their W_key/W_value go with them) and
// computes what the module computes with the other heads gated off; part of a group is refused by name.
TEST(WrapperGQA, PruningKeepsWholeGroupsOnly) {
  for (const Variant& v : {Variant{2, {6, 10000.0, false, {}}, true, true},
                           Variant{4, {4, 10000.0, true, {}}, false, false}, Variant{1, {}, true, false}}) {
    SCOPED_TRACE(v.name());
    const auto fused = fused_f64(v, 11);
    const auto wrapper = fused->split_heads();
    const Tensor x = rnd({2, 6, 8}, 8);
    const NoGradGuard no_grad;
    const std::vector<int64_t> keep = v.kv_heads == 1 ? std::vector<int64_t>{0, 1, 2, 3} : std::vector<int64_t>{2, 3};
    Tensor gates = zeros({4}, DType::f64);
    for (int64_t h : keep) gates.narrow(0, h, 1).fill_(1.0);
    const Tensor gated = fused->forward(x, gates);
    for (const std::shared_ptr<nn::CausalMultiHead>& m :
         {std::shared_ptr<nn::CausalMultiHead>(fused), std::shared_ptr<nn::CausalMultiHead>(wrapper)}) {
      const auto pruned = m->prune_heads(keep);
      EXPECT_EQ(pruned->form(), m->form());
      EXPECT_EQ(pruned->head_count(), static_cast<int64_t>(keep.size()));
      EXPECT_EQ(pruned->kv_head_count(), v.kv_heads * static_cast<int64_t>(keep.size()) / 4);
      const int64_t removed = 4 - static_cast<int64_t>(keep.size());
      const int64_t per_head = 6 * 8 + (v.qkv_bias ? 6 : 0);
      EXPECT_EQ(pruned->num_parameters(),
                m->num_parameters() - per_head * (removed + 2 * removed * v.kv_heads / 4) - removed * 6 * 10);
      EXPECT_LT(max_diff(pruned->forward(x), gated), 1e-12);
    }
  }
  const auto gqa = fused_f64({2, {}, true, false}, 12)->split_heads();
  EXPECT_ERROR(gqa->select_heads({0, 2}),
               "grouped-query attention (4 heads in key/value groups of 2) prunes whole groups only; the selection "
               "keeps head(s) 0 of group 0 (heads 0-1)");
  EXPECT_ERROR(fused_f64({1, {}, true, false}, 12)->prune_heads({1, 2, 3}),
               "keeps head(s) 1, 2, 3 of group 0 (heads 0-3)");
}

// The wrapper's forward in float64 against central differences, through its shared key/value module and a
// partial rotary embedding.
TEST(WrapperGQA, GradcheckOfTheWrapperForward) {
  manual_seed(13);
  nn::CausalAttentionSizes s = sizes_of({1, {2, 100.0, true, {}}, false, true});
  s.d_in = 3, s.head_dim = 4, s.num_heads = 2, s.d_out = 3;
  nn::MultiHeadAttentionWrapper w(s);
  w.to(DType::f64);
  std::vector<Tensor> inputs = {leaf(rnd({1, 3, 3}, 14))};
  for (const Tensor& p : w.parameters()) inputs.push_back(p);  // perturbed in place: the module reads them
  ASSERT_EQ(inputs.size(), 1u + 2 * 2 + 2 * 2 + 1);  // x; 2 heads' W_query; the shared W_key, W_value; out_proj
  const GradcheckResult r = gradcheck([&](const std::vector<Tensor>& in) { return w.forward(in[0]); }, inputs);
  EXPECT_TRUE(r.ok) << r.message;
}

// Wrong sizes are refused by name.
TEST(WrapperGQA, BadSizesAreRefusedByName) {
  nn::CausalAttentionSizes s = sizes_of({3, {}, true, false});
  EXPECT_ERROR(nn::MultiHeadAttentionWrapper{s}, "MultiHeadAttentionWrapper: num_kv_heads 3 must divide num_heads 4");
  s = sizes_of({2, {5, 10000.0, false, {}}, true, false});
  EXPECT_ERROR(nn::MultiHeadAttentionWrapper{s},
               "MultiHeadAttentionWrapper: rotary dims 5 must be even and at most head_dim 6");
  const auto shared = std::make_shared<nn::Linear>(8, 5, false);
  EXPECT_ERROR(nn::CausalAttention(8, 6, 12, 0.0, false, nn::Rotary{}, shared),
               "CausalAttention: the shared W_key must be Linear(8, 6, bias=0), got Linear(8, 5, bias=0)");
}

// ---- the LLaMA family in wrapper form ----
namespace {

nn::DecoderConfig llama_config(int64_t kv_heads, bool interleaved, nn::AttentionForm form) {
  nn::DecoderConfig c = nn::llama_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = kv_heads;
  c.n_layers = 2, c.hidden_dim = 40, c.rope_theta = 500.0, c.rope_interleaved = interleaved, c.attention = form;
  return c;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, g);
}

}  // namespace

// A fused LLaMA converted to wrapper form (analysis/surgery, what `headlab convert --attention` runs) gives the
// same logits, and back gives the same parameters; its parameter count is the config's.
TEST(WrapperGQA, LlamaModelConvertsBetweenFormsWithTheSameLogits) {
  for (int64_t kv : {4, 2, 1})
    for (bool interleaved : {false, true}) {
      SCOPED_TRACE("kv " + std::to_string(kv) + (interleaved ? " interleaved" : " halves"));
      manual_seed(21);
      const nn::DecoderConfig fc = llama_config(kv, interleaved, nn::AttentionForm::fused);
      nn::DecoderModel fused(fc);
      auto [wconfig, wparams] =
          analysis::convert_parameters(fused.config_json(), fused.named_parameters(), nn::AttentionForm::wrapper);
      EXPECT_EQ(wconfig["attention"], "wrapper");
      auto wrapper = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(wconfig));
      ASSERT_TRUE(wrapper);
      wrapper->load_parameters(wparams);
      EXPECT_EQ(wrapper->attention(0).form(), nn::AttentionForm::wrapper);
      EXPECT_EQ(static_cast<double>(wrapper->num_parameters()), wrapper->config().num_parameters());
      EXPECT_EQ(wrapper->num_parameters(), fused.num_parameters());
      // Shared key/value parameters once, under their group's first head.
      const NamedTensors wp = wrapper->named_parameters();
      EXPECT_NE(find_named(wp, "trf_blocks.0.att.heads.0.W_key.weight"), wp.end());
      EXPECT_EQ(find_named(wp, "trf_blocks.0.att.heads.1.W_key.weight") == wp.end(), kv < 4);
      EXPECT_EQ(find_named(wp, "trf_blocks.0.att.out_proj.bias"), wp.end());
      fused.to(DType::f64);
      wrapper->to(DType::f64);
      fused.eval(), wrapper->eval();
      const NoGradGuard no_grad;
      const Tensor idx = tokens(2, 11, 37, 3);
      EXPECT_LT(max_diff(fused.forward(idx), wrapper->forward(idx)), 1e-12);
      // And back to fused: the parameters it came from.
      auto [fconfig, fparams] =
          analysis::convert_parameters(wrapper->config_json(), wrapper->named_parameters(), nn::AttentionForm::fused);
      EXPECT_EQ(fconfig, fused.config_json());
      const NamedTensors orig = fused.named_parameters();
      ASSERT_EQ(fparams.size(), orig.size());
      for (size_t i = 0; i < orig.size(); ++i) {
        EXPECT_EQ(fparams[i].first, orig[i].first);
        EXPECT_EQ(max_diff(fparams[i].second, orig[i].second), 0.0) << orig[i].first;
      }
    }
}

// A wrapper LLaMA (shared key/value modules) saved and loaded computes the same logits.
TEST(WrapperGQA, LlamaWrapperCheckpointSavesAndLoads) {
  TempDir dir("wrapper_gqa");
  manual_seed(23);
  nn::DecoderModel m(llama_config(2, true, nn::AttentionForm::wrapper));
  m.eval();
  io::Checkpoint ck;
  std::vector<std::string> vocab;
  for (int i = 0; i < 37; ++i) vocab.push_back(std::string(1, static_cast<char>('A' + i)));
  ck.config = {{"model", m.config_json()},
               {"tokenizer", {{"type", "char"}, {"vocab", vocab}}},
               {"task", {{"name", "copy"}, {"options", nlohmann::json::object()}}},
               {"training", {{"steps", 1}, {"batch_size", 1}, {"seed", 1}}}};
  ck.model = io::snapshot_parameters(m);
  const std::string path = dir.path("llama_wrapper.h5");
  io::save_checkpoint(path, ck);
  const io::Checkpoint back = io::load_checkpoint(path);
  EXPECT_EQ(back.model.size(), m.named_parameters().size());
  const auto loaded = io::model_from_checkpoint<nn::DecoderModel>(back, path);
  const NoGradGuard no_grad;
  const Tensor idx = tokens(2, 9, 37, 4);
  EXPECT_EQ(max_diff(loaded->forward(idx), m.forward(idx)), 0.0);
  // The loaded heads still share their group's modules (a load that untied them would train them apart).
  const auto& att = dynamic_cast<nn::MultiHeadAttentionWrapper&>(loaded->attention(1));
  EXPECT_EQ(att.heads->at<nn::CausalAttention>(0)->W_key, att.heads->at<nn::CausalAttention>(1)->W_key);
}

// A wrapper LLaMA exported as a Hugging Face folder (its heads stacked back to q_proj, k_proj, v_proj) reads back
// as the fused model of the same logits.
TEST(WrapperGQA, LlamaWrapperExportsAHuggingFaceFolder) {
  TempDir dir("wrapper_gqa_export");
  manual_seed(25);
  nn::DecoderModel m(llama_config(2, true, nn::AttentionForm::wrapper));
  m.eval();
  io::family_named("llama", "test").folder->write(dir.path("out"), m, {});
  auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
  const NoGradGuard no_grad;
  const Tensor idx = tokens(2, 11, 37, 4);
  EXPECT_LT(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), m.forward(idx)), 1e-5);
}

// `train --arch llama --attention wrapper`: the family's section from the options builds the wrapper form, whose
// shared key/value weights learn a fixed batch.
TEST(WrapperGQA, LlamaTrainsInWrapperForm) {
  nn::ModelOptions o;
  o.arch = "llama", o.emb_dim = 16, o.n_heads = 4, o.n_kv_heads = 2, o.n_layers = 1;
  o.attention = nn::AttentionForm::wrapper;
  const io::Family& f = io::family_named("llama", "test");
  const nlohmann::json s = f.model.from_options(o, {.task = "copy", .vocab_size = 13, .context_length = 12});
  EXPECT_EQ(f.model.options(s).attention, nn::AttentionForm::wrapper);
  manual_seed(5);
  auto model = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(s));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->attention(0).form(), nn::AttentionForm::wrapper);
  const Tensor idx = tokens(4, 12, 13, 1), targets = tokens(4, 12, 13, 2);
  optim::Optimizer opt(model->named_parameters(), {.kind = optim::OptimizerKind::adamw, .lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const Tensor loss = cross_entropy(model->forward(idx), targets);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first);
}
