// The HookedTransformer family: TransformerLens's HookedTransformer and the models of Nanda et al.'s grokking
// code (its plain transformer): learned positions, LayerNorm with PyTorch's names or no norm at all, a ReLU or
// GELU MLP with biases or none (attention-only), and each bias (q/k/v, out_proj, the unembedding's b_U) as the
// file has it; the unembedding may predict fewer tokens than the embedding reads (d_vocab_out).
#include <sstream>

#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

using K = SectionKey;

class HookedFamily final : public DecoderFamily {
 public:
  // The biases and the norm are required: the files differ in each (the grokking models have none of them).
  HookedFamily()
      : DecoderFamily({"hooked",
                       "hooked (TransformerLens's HookedTransformer: learned positions, LayerNorm or none, ReLU or "
                       "GELU MLP or none, biases as the file has them)",
                       "HookedTransformer", "HookedTransformer config"},
                      {{"norm", K::required},
                       {"norm_eps"},
                       {"mlp"},
                       {"hidden_dim"},
                       {"head_dim"},
                       {"qkv_bias", K::required},
                       {"out_bias", K::required},
                       {"unembed_bias", K::required},
                       {"out_vocab_size"},
                       {"attn_only"},
                       {"tie_embeddings"},
                       {"drop_rate"}}) {}
  // A fresh model as TransformerLens's default: LayerNorm, GELU (gelu_new) 4x, every bias.
  DecoderConfig parts() const override {
    DecoderConfig c;
    c.book_norm_names = false;
    c.qkv_bias = true;
    c.out_bias = true;
    c.unembed_bias = true;
    return c;
  }
  void check(const DecoderConfig& c) const override {
    HL_CHECK(c.norm == NormKind::layer_norm || c.norm == NormKind::none, who(),
             ": norm must be 'layer_norm' or 'none', got '", enum_name(c.norm), "'");
    HL_CHECK(c.mlp != MlpKind::swiglu, who(), ": mlp must be 'relu', 'gelu_tanh' or 'gelu_exact', got 'swiglu'");
  }
  std::string describe(const nlohmann::json& s) const override {
    const DecoderConfig c = config(s);
    std::ostringstream os;
    os << "hooked, " << c.n_layers << " layers x " << c.n_heads << " heads of " << c.head_size() << ", emb "
       << c.emb_dim << ", " << (c.norm == NormKind::none ? "no norms" : "LayerNorm") << ", "
       << (c.attn_only ? std::string("attention only")
                       : std::string(enum_name(c.mlp)) + " MLP " + std::to_string(c.mlp_width()))
       << ", vocabulary " << c.vocab_size;
    if (c.output_vocab() != c.vocab_size) os << " -> " << c.output_vocab();
    os << ", context " << c.context_length;
    return os.str();
  }
  // train: the family's parts with --attn-only, --ffn-hiddens and --qkv-bias (the other biases stay on).
  void take_options(const ModelOptions& o, DecoderConfig& c) const override {
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: the hooked family has multi-head attention only (grouped-query: --arch llama)");
    c.attn_only = o.attn_only;
    c.hidden_dim = o.ffn_hiddens;
  }
  void give_options(const DecoderConfig& c, ModelOptions& o) const override {
    o.attn_only = c.attn_only, o.ffn_hiddens = c.hidden_dim;
  }
};

}  // namespace

const DecoderFamily& hooked_family() {
  static const HookedFamily family;
  return family;
}

}  // namespace headlab::nn
