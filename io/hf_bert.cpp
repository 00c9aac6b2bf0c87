// BERT folders in the Hugging Face layout <-> the bert family's parameters (see hf_bert.h): config.json's keys, and
// the weight table: bert.embeddings.word_embeddings / position_embeddings / token_type_embeddings / LayerNorm ->
// tok_emb / pos_emb / type_emb / emb_norm; encoder.layer.N.attention.self.query / key / value ->
// att.W_query / W_key / W_value, attention.output.dense / LayerNorm -> att.out_proj / norm1, intermediate.dense /
// output.dense / output.LayerNorm -> ff.layers.0 / ff.layers.2 / norm2; cls.predictions.transform.dense / LayerNorm
// -> mlm_dense / mlm_norm, cls.predictions.bias -> out_head.bias, the decoder's weight tied to the word embeddings.
#include "io/hf_bert.h"

#include <string>

#include "io/hf_weights.h"
#include "nn/decoder_family.h"

namespace headlab::io {

namespace {

using nlohmann::json;

nn::DecoderConfig bert_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "", file);
  HL_CHECK(type == "bert", file, ": model_type '", type, "' is not one the bert family reads (bert)");
  nn::DecoderConfig c = nn::bert_family().config();
  read_hf_sizes(j, file, c);
  c.type_vocab_size = j.contains("type_vocab_size") ? hf_config_int(j, {"type_vocab_size"}, 1, 1 << 16, file) : 2;
  c.norm_eps = hf_config_value<double>(j, "layer_norm_eps", 1e-12, file);
  c.drop_rate = hf_config_value<double>(j, "hidden_dropout_prob", 0.1, file);
  c.tie_embeddings = hf_config_value<bool>(j, "tie_word_embeddings", true, file);
  const std::string act = hf_config_value<std::string>(j, "hidden_act", "gelu", file);
  HL_CHECK(act == "gelu", file, ": hidden_act '", act,
           "' is not supported (the bert family's MLP and masked-LM head use the exact GELU: 'gelu')");
  const std::string positions = hf_config_value<std::string>(j, "position_embedding_type", "absolute", file);
  HL_CHECK(positions == "absolute", file, ": position_embedding_type '", positions,
           "' is not supported (learned absolute positions only)");
  HL_CHECK(!hf_config_value<bool>(j, "is_decoder", false, file), file,
           ": is_decoder true (BERT as a causal decoder) is not supported; the bert family is an encoder");
  HL_CHECK(!hf_config_value<bool>(j, "add_cross_attention", false, file), file,
           ": add_cross_attention true is not supported (an encoder-decoder's BERT)");
  c.validate();
  return c;
}

// older files (the original BERT checkpoints' conversions) name a LayerNorm's weight and bias gamma and beta
WeightMap bert_weights(const nn::DecoderConfig& c, bool gamma_beta) {
  const int64_t C = c.emb_dim, F = c.hidden_dim, V = c.vocab_size;
  WeightMap m;
  m.what = "a BERT masked-LM model", m.head_dim = c.head_size();
  m.buffer_suffixes = {"embeddings.position_ids", "embeddings.token_type_ids"};  // buffers some files save
  // what BertModel, BertForPreTraining and BertForSequenceClassification save beyond the masked-LM model
  m.ignored = {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
               "cls.seq_relationship.bias", "cls.predictions.decoder.bias"};
  const auto linear = [&](const std::string& hf, const std::string& ours, Shape shape) {
    m.add(hf + ".weight", {ours + ".weight"}, shape);
    m.add(hf + ".bias", {ours + ".bias"}, {shape[0]});
  };
  const auto norm = [&](const std::string& hf, const std::string& ours) {
    m.add(hf + (gamma_beta ? ".gamma" : ".weight"), {ours + ".weight"}, {C});
    m.add(hf + (gamma_beta ? ".beta" : ".bias"), {ours + ".bias"}, {C});
  };
  m.add("bert.embeddings.word_embeddings.weight", {"tok_emb.weight"}, {V, C}).missing =
      "missing tensor 'bert.embeddings.word_embeddings.weight' (a BertModel folder, whose names lack 'bert.' and "
      "which has no masked-LM head, is not supported yet: BertForMaskedLM's is)";
  m.add("bert.embeddings.position_embeddings.weight", {"pos_emb.weight"}, {c.context_length, C});
  m.add("bert.embeddings.token_type_embeddings.weight", {"type_emb.weight"}, {c.type_vocab_size, C});
  norm("bert.embeddings.LayerNorm", "emb_norm");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "bert.encoder.layer." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    linear(hf + ".attention.self.query", ours + ".att.W_query", {C, C});
    linear(hf + ".attention.self.key", ours + ".att.W_key", {C, C});
    linear(hf + ".attention.self.value", ours + ".att.W_value", {C, C});
    linear(hf + ".attention.output.dense", ours + ".att.out_proj", {C, C});
    norm(hf + ".attention.output.LayerNorm", ours + ".norm1");
    linear(hf + ".intermediate.dense", ours + ".ff.layers.0", {F, C});
    linear(hf + ".output.dense", ours + ".ff.layers.2", {C, F});
    norm(hf + ".output.LayerNorm", ours + ".norm2");
  }
  m.add("cls.predictions.transform.dense.weight", {"mlm_dense.weight"}, {C, C}).missing =
      "missing tensor 'cls.predictions.transform.dense.weight': the folder has no masked-LM head (a BertModel or a "
      "fine-tuned classifier, not BertForMaskedLM), which headlab's bert family needs for its logits";
  m.add("cls.predictions.transform.dense.bias", {"mlm_dense.bias"}, {C});
  norm("cls.predictions.transform.LayerNorm", "mlm_norm");
  m.add("cls.predictions.bias", {"out_head.bias"}, {V});
  if (c.tie_embeddings)
    m.ignored.push_back("cls.predictions.decoder.weight");  // the word embeddings, saved beside them
  else
    m.add("cls.predictions.decoder.weight", {"out_head.weight"}, {V, C});
  return m;
}

class HfBertFormat final : public DecoderFolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"bert"}; }
  const nn::DecoderFamily& family() const override { return nn::bert_family(); }
  nn::DecoderConfig config_from_hf(const json& j, const std::string& file) const override {
    return bert_config_from_hf(j, file);
  }
  WeightMap weight_map(const nn::DecoderConfig& c, const std::string&, const WeightFiles* files) const override {
    return bert_weights(c, files != nullptr && files->contains("bert.embeddings.LayerNorm.gamma"));
  }
  json hf_config(const nn::DecoderConfig& c) const override {
    return {{"architectures", {"BertForMaskedLM"}},
            {"model_type", "bert"},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"hidden_size", c.emb_dim},
            {"intermediate_size", c.hidden_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.context_length},
            {"type_vocab_size", c.type_vocab_size},
            {"layer_norm_eps", c.norm_eps},
            {"hidden_act", "gelu"},
            {"position_embedding_type", "absolute"},
            {"hidden_dropout_prob", c.drop_rate},
            {"attention_probs_dropout_prob", c.drop_rate},
            {"tie_word_embeddings", c.tie_embeddings},
            {"torch_dtype", "float32"}};
  }
  std::string describe(const nn::DecoderConfig& c) const override {
    return std::string("encoder (bidirectional, post-LN); masked-LM head, decoder ") +
           (c.tie_embeddings ? "tied to word_embeddings" : "cls.predictions.decoder.weight") + "; " +
           std::to_string(c.type_vocab_size) + " token types (type 0 used)";
  }
};

}  // namespace

const FolderFormat& hf_bert_format() {
  static const HfBertFormat f;
  return f;
}

}  // namespace headlab::io
