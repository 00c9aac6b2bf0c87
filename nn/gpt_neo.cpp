// The GPT-Neo family (EleutherAI's GPT-Neo, the TinyStories models): GPT-2's block (learned positions, LayerNorm
// with PyTorch's names, a GELU (tanh) MLP with biases, out_proj with a bias, the head tied to the embedding) with
// q/k/v without biases, scores NOT divided by sqrt(head size), and local layers (attention_layers "local") that
// see only the last window_size positions.
#include <algorithm>

#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

using K = SectionKey;

class GptNeoFamily final : public DecoderFamily {
 public:
  GptNeoFamily()
      : DecoderFamily({"gpt_neo", "gpt_neo (GPT-Neo, TinyStories: unscaled scores, local layers alternating)", "GPTNeo",
                       "GPT-Neo config"},
                      {{"hidden_dim", K::required},
                       {"norm_eps"},
                       {"sliding_window", K::omitted_when_false},
                       {"window_layers"},
                       {"drop_rate"}}) {}
  DecoderConfig parts() const override {
    DecoderConfig c;
    c.book_norm_names = false;
    c.tie_embeddings = true;
    c.attn_scale = 1.0;
    return c;
  }
  void check(const DecoderConfig& c) const override {
    HL_CHECK(c.hidden_dim > 0, who(), ": hidden_dim must be positive, got ", c.hidden_dim);
  }
  std::string describe(const nlohmann::json& s) const override {
    const DecoderConfig c = config(s);
    const int64_t local = c.sliding_window == 0     ? 0
                          : c.window_layers.empty() ? c.n_layers
                                                    : static_cast<int64_t>(c.window_layers.size());
    return "gpt_neo, " + std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_heads) + " heads (" +
           std::to_string(local) + " local, window " + std::to_string(c.sliding_window) + "), emb " +
           std::to_string(c.emb_dim) + ", ffn " + std::to_string(c.hidden_dim) + ", context " +
           std::to_string(c.context_length);
  }
  // A fresh model as TinyStories': global and local layers alternating, the local ones seeing half the context.
  void take_options(const ModelOptions& o, DecoderConfig& c) const override {
    HL_CHECK(!o.attn_only, "--attn-only: the gpt_neo family has no attention-only form");
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: the gpt_neo family has multi-head attention only (grouped-query: --arch llama)");
    HL_CHECK(!o.qkv_bias, "--qkv-bias: GPT-Neo's q, k and v have no biases");
    c.hidden_dim = o.ffn_hiddens ? o.ffn_hiddens : 4 * o.emb_dim;
    c.sliding_window = c.n_layers > 1 ? std::max<int64_t>(1, c.context_length / 2) : 0;
    for (int64_t l = 1; l < c.n_layers; l += 2) c.window_layers.push_back(l);
  }
  void give_options(const DecoderConfig& c, ModelOptions& o) const override {
    o.ffn_hiddens = c.hidden_dim == 4 * c.emb_dim ? 0 : c.hidden_dim;
  }
};

}  // namespace

const DecoderFamily& gpt_neo_family() {
  static const GptNeoFamily family;
  return family;
}

}  // namespace headlab::nn
