// The GPT family: GPTModel of "Build a LLM from Scratch" ch. 4 (GPT-2's maths with qkv_bias and tied
// embeddings), a DecoderModel (nn/decoder.h) under the book's state_dict names, with the attention form
// chosen by config (built by nn/attention's make_causal_attention: "fused" or "wrapper" with out_proj) and
// optional per-layer head lists for physically pruned models. Parameter names: ARCHITECTURE.md section 5.
#pragma once
#include <nlohmann/json.hpp>

#include "base/enum_names.h"
#include "nn/decoder.h"
#include "nn/family.h"

namespace headlab::nn {

struct GPTConfig {
  int64_t vocab_size = 0, context_length = 0, emb_dim = 0, n_heads = 0, n_layers = 0;
  double drop_rate = 0.0;
  bool qkv_bias = false;
  // The head's weight is the token embedding itself (GPT-2's tie_word_embeddings): one parameter,
  // tok_emb.weight, so training keeps them tied; the book's GPT unties them.
  bool tie_embeddings = false;
  // Attention-only blocks (Elhage et al.'s and TransformerLens's attn-only models): no MLP and no norm2,
  // x = x + att(norm1(x)) per block.
  bool attn_only = false;
  AttentionForm attention = AttentionForm::fused;
  // After physical pruning: the original head indices each layer keeps (empty: all heads).
  std::vector<std::vector<int64_t>> kept_heads;

  int64_t head_dim() const { return n_heads ? emb_dim / n_heads : 0; }
  int64_t heads_in_layer(int64_t layer) const;
  // The sizes of layer `layer`'s attention (emb_dim -> emb_dim, its heads of head_dim()).
  CausalAttentionSizes attention_sizes(int64_t layer) const;
  // What GPTModel(*this).num_parameters() will be, computed without building it (as a double: a
  // size someone mistyped may not fit an int64).
  double num_parameters() const;
  void validate() const;  // clear errors naming the key
  nlohmann::json to_json() const;
  static GPTConfig from_json(const nlohmann::json& j);  // validates
};

// The book's block: att, ff, norm1, norm2, drop_shortcut, in the book's registration order; its maths
// is DecoderBlock's.
class TransformerBlock : public DecoderBlock {
 public:
  TransformerBlock(const GPTConfig& cfg, int64_t layer);
  std::string type_name() const override { return "TransformerBlock"; }
  CausalMultiHead& attention() const override { return *att; }
  Norm& ln1() const override { return *norm1; }
  Norm* ln2() const override { return norm2.get(); }
  Mlp* mlp() const override { return ff.get(); }
  Dropout& residual_dropout() const override { return *drop_shortcut; }
  std::shared_ptr<CausalMultiHead> att;
  std::shared_ptr<FeedForward> ff;          // null in an attention-only model
  std::shared_ptr<LayerNorm> norm1, norm2;  // norm2 null in an attention-only model
  std::shared_ptr<Dropout> drop_shortcut;
};

// The family's face to the registry (io/families.h): sections without "arch", or "arch": "gpt".
const ModelFamily& gpt_family();

class GPTModel : public DecoderModel {
 public:
  explicit GPTModel(const GPTConfig& cfg);
  std::string type_name() const override { return "GPTModel"; }
  nlohmann::json config_json() const override { return cfg_.to_json(); }
  nlohmann::json pruned_config(const std::vector<std::vector<int64_t>>& kept) const override;
  nlohmann::json converted_config(AttentionForm form) const override;
  // x = drop_emb(tok_emb(idx) (hook_embed) + pos_emb(arange(offset, offset + T)) (hook_pos_embed))
  Tensor embed(const Tensor& idx, int64_t offset = 0, Hooks* hooks = nullptr) override;
  DecoderBlock& decoder_block(int64_t layer) const override { return *block(layer); }
  Norm& ln_final() const override { return *final_norm; }
  Linear& lm_head() const override { return *out_head; }
  const GPTConfig& config() const { return cfg_; }
  std::shared_ptr<TransformerBlock> block(int64_t layer) const;

  std::shared_ptr<Embedding> tok_emb, pos_emb;
  std::shared_ptr<Dropout> drop_emb;
  std::shared_ptr<Sequential> trf_blocks;
  std::shared_ptr<LayerNorm> final_norm;
  std::shared_ptr<Linear> out_head;

 private:
  GPTConfig cfg_;
};

}  // namespace headlab::nn
