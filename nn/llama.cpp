// The LLaMA family (Llama 2 and 3, Mistral, Qwen2, TinyLlama, SmolLM, llama2.c's stories models): RMSNorm,
// rotary embeddings on every dim of each head, grouped-query attention, a SwiGLU MLP, no position table,
// no out_proj bias; q/k/v biases for Qwen2. Qwen3 is the same decoder with an RMSNorm over each head's queries
// and keys before rotary (q_norm, k_norm) and no biases: its own arch, so that a fresh model has its parts.
#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

// LLaMA's MLP width for a fresh model: 8/3 of the stream's (the parameters of GPT's 4x GELU MLP), rounded up to
// a multiple of 8.
int64_t default_hidden_dim(int64_t emb_dim) { return (8 * emb_dim / 3 + 7) / 8 * 8; }

using K = SectionKey;

class LlamaFamily final : public DecoderFamily {
 public:
  LlamaFamily(FamilyNames names, QkNorm qk_norm)
      : DecoderFamily(names, {{"n_kv_heads"},
                              {"hidden_dim", K::required},
                              {"head_dim"},
                              {"norm_eps"},
                              {"rope_theta"},
                              {"rope_interleaved"},
                              {"qkv_bias"},
                              {"tie_embeddings"},
                              {"sliding_window", K::omitted_when_false},
                              {"window_layers"},
                              {"drop_rate"}}),
        qk_norm_(qk_norm) {}
  DecoderConfig parts() const override {
    DecoderConfig c;
    c.norm = NormKind::rms_norm;
    c.learned_positions = false;
    c.out_bias = false;
    c.mlp = MlpKind::swiglu;
    c.rotary_fraction = 1.0;
    c.qk_norm = qk_norm_;
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
    c.n_kv_heads = o.n_kv_heads;
    c.hidden_dim = o.ffn_hiddens ? o.ffn_hiddens : default_hidden_dim(o.emb_dim);
  }
  void give_options(const DecoderConfig& c, ModelOptions& o) const override {
    o.n_kv_heads = c.n_kv_heads, o.ffn_hiddens = c.hidden_dim == default_hidden_dim(c.emb_dim) ? 0 : c.hidden_dim;
  }

 private:
  QkNorm qk_norm_;
};

}  // namespace

const DecoderFamily& llama_family() {
  static const LlamaFamily family(
      {"llama", "llama (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention: --n-kv-heads)", "Llama",
       "Llama config"},
      QkNorm::none);
  return family;
}

const DecoderFamily& qwen3_family() {
  static const LlamaFamily family(
      {"qwen3", "qwen3 (llama with an RMSNorm over each head's queries and keys)", "Qwen3", "Qwen3 config"},
      QkNorm::per_head);
  return family;
}

}  // namespace headlab::nn
