// The GPT-NeoX family (Pythia): pre-norm blocks with LayerNorm (with a bias), rotary embeddings on the first
// rotary_dims of each head (a quarter in Pythia), attention and MLP reading the same block input and added
// together (the parallel residual; sequential where use_parallel_residual is false), an exact-GELU MLP with
// biases, no position table and an unembedding of its own. A DecoderModel (nn/decoder.h) under the book's
// names (tok_emb, trf_blocks.N.{att, ff.layers.0/2, norm1, norm2}, final_norm, out_head), so that its block
// runs DecoderBlock's maths and every analysis reads it as it reads GPT-2 and LLaMA.
#pragma once
#include <nlohmann/json.hpp>

#include "nn/decoder.h"
#include "nn/family.h"

namespace headlab::nn {

struct NeoXConfig {
  int64_t vocab_size = 0, context_length = 0, emb_dim = 0, n_heads = 0, n_layers = 0;
  int64_t hidden_dim = 0;         // the MLP's width (intermediate_size)
  int64_t rotary_dims = 0;        // the rotated dims of each head (Hugging Face: head size x rotary_pct)
  double rope_theta = 10000.0;    // rotary_emb_base
  double norm_eps = 1e-5;         // layer_norm_eps
  bool parallel_residual = true;  // use_parallel_residual
  bool qkv_bias = true;           // attention_bias: query_key_value's and dense's biases
  bool tie_embeddings = false;    // the head is tok_emb.weight
  double drop_rate = 0.0;
  AttentionForm attention = AttentionForm::fused;
  std::vector<std::vector<int64_t>> kept_heads;  // a pruned model's heads per layer (original indices); empty: all

  int64_t head_size() const { return n_heads ? emb_dim / n_heads : 0; }
  int64_t heads_in_layer(int64_t layer) const;
  CausalAttentionSizes attention_sizes(int64_t layer) const;
  double num_parameters() const;  // what NeoXModel(*this).num_parameters() will be, without building
  void validate() const;          // clear errors naming the key
  nlohmann::json to_json() const;
  static NeoXConfig from_json(const nlohmann::json& j);  // validates
};

class NeoXBlock : public DecoderBlock {
 public:
  NeoXBlock(const NeoXConfig& cfg, int64_t layer);
  std::string type_name() const override { return "TransformerBlock"; }
  CausalMultiHead& attention() const override { return *att; }
  Norm& ln1() const override { return *norm1; }
  Norm* ln2() const override { return norm2.get(); }
  Mlp* mlp() const override { return ff.get(); }
  Dropout& residual_dropout() const override { return *drop_shortcut; }
  bool parallel_residual() const override { return parallel; }
  std::shared_ptr<CausalMultiHead> att;
  std::shared_ptr<FeedForward> ff;  // Linear(C, F), exact GELU, Linear(F, C)
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> drop_shortcut;
  bool parallel = true;
};

// The family's face to the registry (io/families.h): sections with "arch": "neox".
const ModelFamily& neox_family();

class NeoXModel : public DecoderModel {
 public:
  explicit NeoXModel(const NeoXConfig& cfg);
  std::string type_name() const override { return "GPTNeoX"; }
  nlohmann::json config_json() const override { return cfg_.to_json(); }
  nlohmann::json pruned_config(const std::vector<std::vector<int64_t>>& kept) const override;
  nlohmann::json converted_config(AttentionForm form) const override;
  // x = drop_emb(tok_emb(idx)) (hook_embed); positions enter through the rotary embedding.
  Tensor embed(const Tensor& idx, int64_t offset = 0, Hooks* hooks = nullptr) override;
  DecoderBlock& decoder_block(int64_t layer) const override { return *block(layer); }
  Norm& ln_final() const override { return *final_norm; }
  Linear& lm_head() const override { return *out_head; }
  const NeoXConfig& config() const { return cfg_; }
  std::shared_ptr<NeoXBlock> block(int64_t layer) const;

  std::shared_ptr<Embedding> tok_emb;
  std::shared_ptr<Dropout> drop_emb;
  std::shared_ptr<Sequential> trf_blocks;
  std::shared_ptr<LayerNorm> final_norm;
  std::shared_ptr<Linear> out_head;

 private:
  NeoXConfig cfg_;
};

}  // namespace headlab::nn
