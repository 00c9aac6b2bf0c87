// The GPT family: GPTModel of "Build a LLM from Scratch" ch. 4, GPT-2's maths with qkv_bias and tied
// embeddings: learned positions, LayerNorm (the book's scale/shift, eps 1e-5), a GELU MLP 4x the width with
// biases, out_proj with a bias; optionally attention-only blocks. Sections without "arch" are this family's.
#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

using K = SectionKey;

class GptFamily final : public DecoderFamily {
 public:
  // The book's keys; attention absent in the oldest checkpoints (fused), tie_embeddings and attn_only
  // before GPT-2's folders and attention-only models (false).
  GptFamily()
      : DecoderFamily({"gpt", "gpt (the book's decoder-only GPTModel)", "GPTModel", "GPT config"},
                      {{"drop_rate", K::required},
                       {"qkv_bias", K::required},
                       {"tie_embeddings", K::omitted_when_false},
                       {"attn_only", K::omitted_when_false}}) {}
  bool arch_in_section() const override { return false; }
  DecoderConfig parts() const override { return DecoderConfig{}; }  // DecoderConfig's defaults are the book's
  std::string describe(const nlohmann::json& s) const override {
    const DecoderConfig c = config(s);
    return std::string(enum_name(c.attention)) + " attention, " + std::to_string(c.n_layers) + " layers x " +
           std::to_string(c.n_heads) + " heads, emb " + std::to_string(c.emb_dim) + ", context " +
           std::to_string(c.context_length);
  }
  void take_options(const ModelOptions& o, DecoderConfig& c) const override {
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: the gpt family has multi-head attention only (grouped-query: --arch llama)");
    c.attn_only = o.attn_only;
  }
  void give_options(const DecoderConfig& c, ModelOptions& o) const override { o.attn_only = c.attn_only; }
};

}  // namespace

const DecoderFamily& gpt_family() {
  static const GptFamily family;
  return family;
}

}  // namespace headlab::nn
