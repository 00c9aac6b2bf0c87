// The GPT-NeoX family (Pythia): LayerNorm with a bias (PyTorch's names), rotary embeddings on the first
// rotary_dims of each head (halves, as rotate_half), attention and MLP reading the same block input (the
// parallel residual; sequential where use_parallel_residual is false), an exact-GELU MLP with biases, biases
// on every projection (attention_bias), no position table.
#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

using K = SectionKey;

class NeoXFamily final : public DecoderFamily {
 public:
  NeoXFamily()
      : DecoderFamily({"neox", "neox (GPT-NeoX, Pythia: parallel attention and MLP, rotary on a quarter of each head)",
                       "GPTNeoX", "GPT-NeoX config"},
                      {{"hidden_dim", K::required},
                       {"rotary_dims", K::required},
                       {"rope_theta"},
                       {"norm_eps"},
                       {"parallel_residual"},
                       {"qkv_bias"},
                       {"tie_embeddings"},
                       {"drop_rate"}}) {}
  DecoderConfig parts() const override {
    DecoderConfig c;
    c.book_norm_names = false;
    c.learned_positions = false;
    c.mlp = MlpKind::gelu_exact;
    c.parallel_residual = true;
    c.qkv_bias = true;
    c.out_bias.reset();  // attention_bias: every projection's
    return c;
  }
  void check(const DecoderConfig& c) const override {
    HL_CHECK(c.hidden_dim > 0, who(), ": hidden_dim must be positive, got ", c.hidden_dim);
  }
  std::string describe(const nlohmann::json& s) const override {
    const DecoderConfig c = config(s);
    return "neox, " + std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_heads) + " heads, emb " +
           std::to_string(c.emb_dim) + ", ffn " + std::to_string(c.hidden_dim) + ", rotary " +
           std::to_string(c.rotary_dims) + " of " + std::to_string(c.head_size()) + " dims, " +
           (c.parallel_residual ? "parallel" : "sequential") + " residual, context " + std::to_string(c.context_length);
  }
  // A fresh model as Pythia's: MLP 4x the width, rotary on a quarter of each head, the parallel residual.
  void take_options(const ModelOptions& o, DecoderConfig& c) const override {
    HL_CHECK(!o.attn_only, "--attn-only: the neox family has no attention-only form");
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: the neox family has multi-head attention only (grouped-query: --arch llama)");
    HL_CHECK(o.n_heads > 0 && o.emb_dim % o.n_heads == 0, "train: --emb-dim ", o.emb_dim,
             " must be divisible by --n-heads ", o.n_heads);
    c.hidden_dim = o.ffn_hiddens ? o.ffn_hiddens : 4 * o.emb_dim;
    c.rotary_dims = o.emb_dim / o.n_heads / 4 / 2 * 2;
    c.qkv_bias = true;  // attention_bias, not an option here
  }
  void give_options(const DecoderConfig& c, ModelOptions& o) const override {
    o.ffn_hiddens = c.hidden_dim == 4 * c.emb_dim ? 0 : c.hidden_dim;
    o.qkv_bias = false;  // not an option of this family: its biases follow attention_bias
  }
};

}  // namespace

const DecoderFamily& neox_family() {
  static const NeoXFamily family;
  return family;
}

}  // namespace headlab::nn
