// The tiny GPTs the suites build: three sizes (each the smallest that gives its tests what they need),
// the two attention forms, with and without qkv_bias, and pruned kept_heads. Configs only, so that a
// test picks its own seed and dtype; headlab::core is all it needs (the CUDA suites use it too).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/decoder_family.h"

namespace headlab::testing {

// The sizes of a tiny GPT; vocab_size and context_length are usually a task's.
struct TinyGpt {
  int64_t vocab_size, context_length, emb_dim, n_heads, n_layers;

  // The same model width for another vocabulary and context.
  constexpr TinyGpt sized_for(int64_t vocab, int64_t context) const {
    return {vocab, context, emb_dim, n_heads, n_layers};
  }
};

// 2 layers of 2 heads of size 4: the smallest with more than one of each (names, checkpoints).
inline constexpr TinyGpt kTwoHeadGpt{13, 10, 8, 2, 2};
// 2 layers of 3 heads of size 8: an odd head count that prunes unevenly (kPrunedHeads).
inline constexpr TinyGpt kThreeHeadGpt{13, 10, 24, 3, 2};
// 2 layers of 4 heads of size 8: wide enough to learn a toy task in 150 steps (analysis, explorer).
inline constexpr TinyGpt kFourHeadGpt{13, 12, 32, 4, 2};

// The original heads a pruned kThreeHeadGpt keeps: two in layer 0, one in layer 1.
inline const std::vector<std::vector<int64_t>> kPrunedHeads = {{0, 2}, {1}};
// The same counts with other heads, for the other attention form.
inline const std::vector<std::vector<int64_t>> kPrunedHeadsOther = {{1}, {0, 2}};

// A tiny GPT of sizes `s` in one attention form; drop_rate 0 and every head kept unless the caller
// sets them on the result.
inline nn::DecoderConfig tiny_gpt_config(const TinyGpt& s, nn::AttentionForm form = nn::AttentionForm::fused,
                                     bool qkv_bias = false) {
  nn::DecoderConfig c;
  c.vocab_size = s.vocab_size;
  c.context_length = s.context_length;
  c.emb_dim = s.emb_dim;
  c.n_heads = s.n_heads;
  c.n_layers = s.n_layers;
  c.attention = form;
  c.qkv_bias = qkv_bias;
  return c;
}

// A pruned copy of c keeping `kept` (original head indices per layer).
inline nn::DecoderConfig pruned(nn::DecoderConfig c, std::vector<std::vector<int64_t>> kept) {
  c.kept_heads = std::move(kept);
  return c;
}

// Every form a head-level computation must handle, by name: fused, wrapper, and both pruned (fused
// keeping kPrunedHeads, wrapper kPrunedHeadsOther); a kThreeHeadGpt-like size (3 heads, 2 layers).
inline std::vector<std::pair<std::string, nn::DecoderConfig>> tiny_gpt_forms(const TinyGpt& s, bool qkv_bias = false) {
  using nn::AttentionForm;
  return {{"fused", tiny_gpt_config(s, AttentionForm::fused, qkv_bias)},
          {"wrapper", tiny_gpt_config(s, AttentionForm::wrapper, qkv_bias)},
          {"pruned fused", pruned(tiny_gpt_config(s, AttentionForm::fused, qkv_bias), kPrunedHeads)},
          {"pruned wrapper", pruned(tiny_gpt_config(s, AttentionForm::wrapper, qkv_bias), kPrunedHeadsOther)}};
}

// Every kind of GPT an analysis that writes out the forward must handle: both forms with qkv biases and a
// feed-forward, pruned ones, and an attention-only one (kThreeHeadGpt's sizes).
inline std::vector<std::pair<std::string, nn::DecoderConfig>> analysis_gpt_forms() {
  auto forms = tiny_gpt_forms(kThreeHeadGpt, true);
  nn::DecoderConfig attn_only = tiny_gpt_config(kThreeHeadGpt);
  attn_only.attn_only = true;
  forms.emplace_back("attention-only", attn_only);
  return forms;
}

// An induction circuit built by hand in a 2-layer attention-only model (Elhage et al.'s), with 2 heads of
// 64 per layer: the residual stream holds one-hot slots, token [0, 32), position [32, 48), previous token
// [48, 80), copied token [80, 112); L0H0 attends to the previous position and writes its token into the
// previous-token slot; L1H0's query reads the token, its key the previous-token slot (K-composition), its
// value copies the attended token into the copied slot, which the unembedding reads. L0H1 writes only
// into the spare dims [112, 128), L1H1 reads with its random query and key and writes nothing. Every
// position holds the same one-hot pattern, so the layer norms act alike on all of them.
inline constexpr int64_t kPlantedVocab = 32, kPlantedContext = 16;
inline nn::DecoderConfig planted_induction_config() {
  nn::DecoderConfig cfg;
  cfg.vocab_size = kPlantedVocab, cfg.context_length = kPlantedContext, cfg.emb_dim = 128, cfg.n_heads = 2;
  cfg.n_layers = 2, cfg.attn_only = true;
  return cfg;
}
// The model, in eval mode; what the circuit does not set keeps seed 5's initial values.
inline std::shared_ptr<nn::DecoderModel> planted_induction_gpt() {
  constexpr int64_t V = kPlantedVocab, T = kPlantedContext, C = 128, D = 64, kPrev = 48, kCopy = 80, kSpare = 112;
  manual_seed(5);
  auto m = std::make_shared<nn::DecoderModel>(planted_induction_config());
  nn::DecoderModel& model = *m;
  model.eval();
  const auto set = [](const Tensor& w, int64_t row, int64_t col, double v) {
    w.select(0, row).narrow(0, col, 1).fill_(v);
  };
  {
    NoGradGuard ng;
    model.tok_emb->weight.zero_();
    model.pos_emb->weight.zero_();
    for (int64_t v = 0; v < V; ++v) set(model.tok_emb->weight, v, v, 10.0);
    for (int64_t t = 0; t < T; ++t) set(model.pos_emb->weight, t, V + t, 10.0);
    auto& a0 = dynamic_cast<nn::CausalMultiHeadAttention&>(model.attention(0));
    auto& a1 = dynamic_cast<nn::CausalMultiHeadAttention&>(model.attention(1));
    for (nn::CausalMultiHeadAttention* a : {&a0, &a1}) {  // head 0's rows [0, D) all rebuilt below
      for (const Tensor& w : {a->W_query->weight, a->W_key->weight, a->W_value->weight}) w.narrow(0, 0, D).zero_();
      a->out_proj->bias.zero_();
    }
    // L0H0: query at position t = the code of t - 1, key = the code of t; value = the token, out -> prev slot.
    for (int64_t i = 0; i + 1 < T; ++i) set(a0.W_query->weight, i, V + i + 1, 5.0);
    for (int64_t i = 0; i < T; ++i) set(a0.W_key->weight, i, V + i, 5.0);
    for (int64_t i = 0; i < V; ++i) set(a0.W_value->weight, i, i, 1.0);
    const Tensor o0 = a0.out_proj->weight.clone();
    a0.out_proj->weight.zero_();
    for (int64_t i = 0; i < V; ++i) set(a0.out_proj->weight, kPrev + i, i, 1.0);
    a0.out_proj->weight.narrow(0, kSpare, C - kSpare)
        .narrow(1, D, C - kSpare)
        .copy_(o0.narrow(0, kSpare, C - kSpare).narrow(1, D, C - kSpare));  // L0H1 -> the spare dims only
    // L1H0: query = the token, key = the previous-token slot; value = the token, out -> the copied slot.
    for (int64_t i = 0; i < V; ++i) {
      set(a1.W_query->weight, i, i, 5.0);
      set(a1.W_key->weight, i, kPrev + i, 5.0);
      set(a1.W_value->weight, i, i, 1.0);
    }
    a1.out_proj->weight.zero_();
    for (int64_t i = 0; i < V; ++i) set(a1.out_proj->weight, kCopy + i, i, 1.0);
    a1.W_value->weight.narrow(0, D, D).zero_();  // L1H1 writes nothing
    model.out_head->weight.zero_();
    for (int64_t v = 0; v < V; ++v) set(model.out_head->weight, v, kCopy + v, 5.0);
  }
  return m;
}

}  // namespace headlab::testing
