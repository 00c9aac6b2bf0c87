// GPTModel of "Build a LLM from Scratch" ch. 4, with the attention form chosen by config (built by
// nn/attention's make_causal_attention: "fused" or "wrapper" with out_proj) and optional
// per-layer head lists for physically pruned models. Parameter names: ARCHITECTURE.md section 5.
#pragma once
#include <nlohmann/json.hpp>

#include "base/enum_names.h"
#include "nn/model.h"

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

class TransformerBlock : public UnaryModule {
 public:
  TransformerBlock(const GPTConfig& cfg, int64_t layer);
  std::string type_name() const override { return "TransformerBlock"; }
  Tensor forward(const Tensor& x) override;                // x: (B, T, emb_dim)
  Tensor forward_cached(const Tensor& x, KVCache& cache);  // as CausalMultiHead::forward_cached
  std::shared_ptr<CausalMultiHead> att;
  std::shared_ptr<FeedForward> ff;          // null in an attention-only model
  std::shared_ptr<LayerNorm> norm1, norm2;  // norm2 null in an attention-only model
  std::shared_ptr<Dropout> drop_shortcut;
};

class GPTModel : public Model {
 public:
  explicit GPTModel(const GPTConfig& cfg);
  std::string type_name() const override { return "GPTModel"; }
  Tensor logits(const ModelInputs& in) override { return forward(in.tokens); }
  nlohmann::json config_json() const override { return cfg_.to_json(); }
  int64_t attention_count() const override { return cfg_.n_layers; }
  HeadControl& head_control(int64_t i) override { return attention(i).control(); }
  int64_t heads_at(int64_t i) const override { return attention(i).head_count(); }
  int64_t full_heads() const override { return cfg_.n_heads; }
  int64_t head_size_at(int64_t i) const override { return attention(i).head_size(); }
  std::string attention_label(int64_t i) const override { return std::string("L").append(std::to_string(i)); }
  std::string attention_kind(int64_t) const override { return "self"; }
  int64_t attention_layer(int64_t i) const override { return i; }
  int64_t original_head(int64_t i, int64_t h) const override;
  void keep_attention_weights(bool on) override;
  Tensor attention_weights(int64_t i) const override { return attention(i).last_attention_weights(); }
  Tensor forward(const Tensor& idx);  // idx: (B, T) int64 -> logits (B, T, vocab_size)
  // forward = unembed(blocks(embed(idx))), in pieces for analyses that replay part of the model:
  // (B, T) int64 at positions [offset, offset + T) -> the residual stream entering block 0 (B, T, emb_dim)
  Tensor embed(const Tensor& idx, int64_t offset = 0);
  Tensor unembed(const Tensor& x);  // the residual stream after the last block -> logits (B, T, vocab_size)
  Tensor operator()(const Tensor& idx) { return forward(idx); }
  // Incremental decoding (nn/generate.h): idx (B, T) are the tokens after the caches' positions
  // (a prefill into empty caches, then one token a step); one cache per layer. Returns the logits
  // of the last position only, (B, vocab_size): the head's GEMM runs on one row, not T.
  bool supports_kv_cache() const;
  Tensor forward_cached(const Tensor& idx, std::vector<KVCache>& caches);
  const GPTConfig& config() const { return cfg_; }
  int64_t n_layers() const { return cfg_.n_layers; }
  CausalMultiHead& attention(int64_t layer) const;
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
