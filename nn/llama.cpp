// The LLaMA-layout families, one decoder with different parts:
// - llama (Llama 2 and 3, Mistral, Qwen2, TinyLlama, SmolLM, llama2.c's stories models, Phi-3): RMSNorm, rotary
//   embeddings on every dim of each head, grouped-query attention, a SwiGLU MLP, no position table, no out_proj
//   bias; q/k/v biases for Qwen2;
// - qwen3: an RMSNorm over each head's queries and keys before rotary (q_norm, k_norm), no biases;
// - olmo2 (OLMo-2): the norms after attention and MLP instead of before, q/k norms over the whole projections;
// - gemma (Gemma 1): RMSNorm scaled by (1 + weight), embeddings times sqrt(emb_dim), a GeGLU MLP (tanh GELU),
//   the head tied to the embedding;
// - gemma2 (Gemma 2): gemma with four norms a block (before and after attention and MLP), the scores' factor from
//   query_pre_attn_scalar, soft-capped scores and logits, sliding windows on alternate layers;
// - gemma3 (Gemma 3's text model): Gemma 2's norms, per-head q/k norms, no soft-caps, sliding windows on five
//   layers of six with their own rotary base (rope_local_theta).
// Each is its own arch, so that a fresh model has its parts.
#include <algorithm>

#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

// LLaMA's MLP width for a fresh model: 8/3 of the stream's (the parameters of GPT's 4x GELU MLP), rounded up to
// a multiple of 8.
int64_t default_hidden_dim(int64_t emb_dim) { return (8 * emb_dim / 3 + 7) / 8 * 8; }

using K = SectionKey;

// What a family changes in LLaMA's parts; and in a fresh model's config (train), beyond its options.
using Variant = void (*)(DecoderConfig&);

class LlamaFamily final : public DecoderFamily {
 public:
  LlamaFamily(FamilyNames names, Variant parts, Variant fresh = nullptr)
      : DecoderFamily(names, {{"n_kv_heads"},
                              {"hidden_dim", K::required},
                              {"head_dim"},
                              {"norm_eps"},
                              {"rope_theta"},
                              {"rope_local_theta", K::omitted_when_false},
                              {"rope_interleaved"},
                              {"rope_scaling", K::omitted_when_false},
                              {"rope_factor", K::omitted_when_false},
                              {"rope_low_freq_factor", K::omitted_when_false},
                              {"rope_high_freq_factor", K::omitted_when_false},
                              {"rope_original_context", K::omitted_when_false},
                              {"qkv_bias"},
                              {"tie_embeddings"},
                              {"sliding_window", K::omitted_when_false},
                              {"window_layers"},
                              {"attn_scale", K::omitted_when_false},
                              {"attn_softcap", K::omitted_when_false},
                              {"logit_softcap", K::omitted_when_false},
                              {"drop_rate"}}),
        variant_(parts),
        fresh_(fresh) {}
  DecoderConfig parts() const override {
    DecoderConfig c;
    c.norm = NormKind::rms_norm;
    c.learned_positions = false;
    c.out_bias = false;
    c.mlp = MlpKind::swiglu;
    c.rotary_fraction = 1.0;
    variant_(c);
    return c;
  }
  void check(const DecoderConfig& c) const override {
    HL_CHECK(c.hidden_dim > 0, who(), ": hidden_dim must be positive, got ", c.hidden_dim);
    HL_CHECK(c.head_size() % 2 == 0, who(), ": the head size ", c.head_size(), " must be even (rotary pairs)");
    if (c.qk_norm == QkNorm::none) return;
    // Qwen3's attention_bias would put a bias on o_proj too; its norms' weights are in the halves layout
    HL_CHECK(!c.qkv_bias, who(), ": qkv_bias is not supported with q/k norms (Qwen3 has no q/k/v biases)");
    HL_CHECK(!c.rope_interleaved, who(), ": rope_interleaved is not supported with q/k norms (Qwen3 rotates halves)");
  }
  std::string describe(const nlohmann::json& s) const override {
    const DecoderConfig c = config(s);
    return arch() + ", " + std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_heads) + " heads (" +
           std::to_string(c.kv_heads()) + " key/value), emb " + std::to_string(c.emb_dim) + ", ffn " +
           std::to_string(c.hidden_dim) + ", context " + std::to_string(c.context_length);
  }
  void take_options(const ModelOptions& o, DecoderConfig& c) const override {
    HL_CHECK(!o.attn_only, "--attn-only: the ", arch(), " family has no attention-only form");
    HL_CHECK(c.qk_norm != QkNorm::whole || o.attention == AttentionForm::fused, "--attention wrapper: the ", arch(),
             " family's q/k norms over the whole projections mix the heads, which separate heads cannot hold");
    c.n_kv_heads = o.n_kv_heads;
    c.hidden_dim = o.ffn_hiddens ? o.ffn_hiddens : default_hidden_dim(o.emb_dim);
    if (fresh_) fresh_(c);
  }
  void give_options(const DecoderConfig& c, ModelOptions& o) const override {
    o.n_kv_heads = c.n_kv_heads, o.ffn_hiddens = c.hidden_dim == default_hidden_dim(c.emb_dim) ? 0 : c.hidden_dim;
  }

 private:
  Variant variant_, fresh_;
};

void gemma_parts(DecoderConfig& c) {
  c.norm_weight_offset = 1.0, c.embed_scale = true, c.mlp = MlpKind::geglu, c.tie_embeddings = true;
}

}  // namespace

const DecoderFamily& llama_family() {
  static const LlamaFamily family(
      {"llama", "llama (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention: --n-kv-heads)", "Llama",
       "Llama config"},
      [](DecoderConfig&) {});
  return family;
}

const DecoderFamily& qwen3_family() {
  static const LlamaFamily family(
      {"qwen3", "qwen3 (llama with an RMSNorm over each head's queries and keys)", "Qwen3", "Qwen3 config"},
      [](DecoderConfig& c) { c.qk_norm = QkNorm::per_head; });
  return family;
}

const DecoderFamily& olmo2_family() {
  static const LlamaFamily family(
      {"olmo2", "olmo2 (llama with its norms after attention and MLP, q/k norms over the whole projections)", "Olmo2",
       "OLMo-2 config"},
      [](DecoderConfig& c) { c.pre_norms = false, c.post_norms = true, c.qk_norm = QkNorm::whole; });
  return family;
}

const DecoderFamily& gemma_family() {
  static const LlamaFamily family(
      {"gemma", "gemma (llama with (1 + w) norms, scaled embeddings, GeGLU, a tied head)", "Gemma", "Gemma config"},
      gemma_parts);
  return family;
}

// A fresh Gemma 2 as the real ones: the even layers windowed (half the context), scores capped at 50, logits at 30.
const DecoderFamily& gemma2_family() {
  static const LlamaFamily family(
      {"gemma2", "gemma2 (gemma with four norms a block, soft-capped scores and logits, alternating windows)", "Gemma2",
       "Gemma 2 config"},
      [](DecoderConfig& c) { gemma_parts(c), c.post_norms = true; },
      [](DecoderConfig& c) {
        c.attn_softcap = 50.0, c.logit_softcap = 30.0;
        c.sliding_window = c.n_layers > 1 ? std::max<int64_t>(1, c.context_length / 2) : 0;
        for (int64_t l = 0; c.sliding_window && l < c.n_layers; l += 2) c.window_layers.push_back(l);
      });
  return family;
}

// A fresh Gemma 3 as the real ones: five windowed layers (half the context) to one global, two rotary bases.
const DecoderFamily& gemma3_family() {
  static const LlamaFamily family(
      {"gemma3", "gemma3 (gemma with four norms a block, q/k norms, 5:1 local/global layers)", "Gemma3",
       "Gemma 3 config"},
      [](DecoderConfig& c) { gemma_parts(c), c.post_norms = true, c.qk_norm = QkNorm::per_head; },
      [](DecoderConfig& c) {
        c.rope_theta = 1e6, c.rope_local_theta = 1e4;
        c.sliding_window = c.n_layers > 1 ? std::max<int64_t>(1, c.context_length / 2) : 0;
        for (int64_t l = 0; c.sliding_window && l < c.n_layers; ++l)
          if ((l + 1) % 6 != 0) c.window_layers.push_back(l);
        if (static_cast<int64_t>(c.window_layers.size()) == c.n_layers) c.window_layers.pop_back();  // one global
      });
  return family;
}

}  // namespace headlab::nn
