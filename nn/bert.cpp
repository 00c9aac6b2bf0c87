// The BERT family (BertForMaskedLM and its layout's models: BERT, MiniLM, ...): an encoder as parts of the one
// decoder. Bidirectional attention (padding hidden through ModelInputs::valid_lens), learned positions and token
// types summed and normed, post-LN blocks (the norms after the residual adds), q/k/v and every projection with
// biases, the exact GELU, and the masked-LM head's transform (dense, GELU, LayerNorm) before an unembedding tied
// to the word embeddings, with its own bias.
#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

using K = SectionKey;

class BertFamily final : public DecoderFamily {
 public:
  BertFamily()
      : DecoderFamily(
            {"bert", "bert (an encoder: bidirectional attention, post-LN blocks, a masked-LM head)", "Bert",
             "BERT config"},
            {{"hidden_dim", K::required}, {"norm_eps"}, {"type_vocab_size"}, {"tie_embeddings"}, {"drop_rate"}}) {}
  DecoderConfig parts() const override {
    DecoderConfig c;
    c.book_norm_names = false;
    c.norm_eps = 1e-12;
    c.mlp = MlpKind::gelu_exact;
    c.qkv_bias = true;
    c.causal = false, c.post_ln = true, c.embed_norm = true, c.mlm_head = true;
    c.type_vocab_size = 2;
    c.tie_embeddings = true, c.unembed_bias = true;
    return c;
  }
  void check(const DecoderConfig& c) const override {
    HL_CHECK(c.hidden_dim > 0, who(), ": hidden_dim must be positive, got ", c.hidden_dim);
  }
  std::string describe(const nlohmann::json& s) const override {
    const DecoderConfig c = config(s);
    return "bert, " + std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_heads) + " heads, emb " +
           std::to_string(c.emb_dim) + ", ffn " + std::to_string(c.hidden_dim) + ", context " +
           std::to_string(c.context_length) + " (bidirectional)";
  }
  void take_options(const ModelOptions&, DecoderConfig&) const override {
    HL_FAIL(
        "train --arch bert: an encoder trains on a masked-LM objective, which train does not run yet "
        "(a decoder family trains: --arch gpt, llama, ...)");
  }
};

}  // namespace

const DecoderFamily& bert_family() {
  static const BertFamily family;
  return family;
}

}  // namespace headlab::nn
