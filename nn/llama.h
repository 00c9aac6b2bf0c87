// The LLaMA family: pre-norm blocks with RMSNorm, rotary position embeddings, grouped-query attention and
// a SwiGLU feed-forward, no position table (Llama 2 and 3, Mistral, Qwen2, TinyLlama, SmolLM, llama2.c's
// stories models). A DecoderModel (nn/decoder.h) under the names of "Build a LLM from Scratch"'s Llama
// conversion (tok_emb, trf_blocks.N.{att, ff.fc1/fc2/fc3, norm1, norm2}, final_norm, out_head), so that its
// block runs DecoderBlock's maths and every analysis reads it as it reads GPT-2.
#pragma once
#include <nlohmann/json.hpp>

#include "nn/decoder.h"
#include "nn/family.h"

namespace headlab::nn {

struct LlamaConfig {
  int64_t vocab_size = 0, context_length = 0, emb_dim = 0, n_heads = 0, n_layers = 0;
  int64_t n_kv_heads = 0;  // key/value heads: dividing n_heads (grouped-query); 0 in a section: n_heads
  int64_t hidden_dim = 0;  // the SwiGLU's width
  int64_t head_dim = 0;    // 0: emb_dim / n_heads
  double norm_eps = 1e-5;  // RMSNorm's eps (rms_norm_eps)
  double rope_theta = 10000.0;
  // Rotary pairs: interleaved (2i, 2i+1), as Meta's and llama2.c's checkpoints; else halves (Hugging Face's).
  bool rope_interleaved = false;
  bool qkv_bias = false;        // Qwen2's q/k/v biases
  bool tie_embeddings = false;  // the head is tok_emb.weight
  double drop_rate = 0.0;
  AttentionForm attention = AttentionForm::fused;
  // A pruned model's heads per layer (original indices, increasing, whole key/value groups); empty: all.
  std::vector<std::vector<int64_t>> kept_heads;

  int64_t head_size() const { return head_dim ? head_dim : (n_heads ? emb_dim / n_heads : 0); }
  int64_t kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  int64_t group_size() const { return n_heads / kv_heads(); }  // query heads per key/value head
  int64_t heads_in_layer(int64_t layer) const;
  CausalAttentionSizes attention_sizes(int64_t layer) const;
  double num_parameters() const;  // what LlamaModel(*this).num_parameters() will be, without building
  void validate() const;          // clear errors naming the key
  nlohmann::json to_json() const;
  static LlamaConfig from_json(const nlohmann::json& j);  // validates
};

// down(silu(gate x) * up x) as fc3(silu(fc1 x) * fc2 x), no biases. mlp.hook_pre: fc1 x; mlp.hook_post:
// the product fc3 reads.
class SwiGLUFeedForward : public Mlp {
 public:
  SwiGLUFeedForward(int64_t emb_dim, int64_t hidden_dim);
  std::string type_name() const override { return "FeedForward"; }
  using Mlp::forward;
  Tensor forward(const Tensor& x, const HookSite& site) override;
  std::shared_ptr<Linear> fc1, fc2, fc3;
};

class LlamaBlock : public DecoderBlock {
 public:
  LlamaBlock(const LlamaConfig& cfg, int64_t layer);
  std::string type_name() const override { return "TransformerBlock"; }
  CausalMultiHead& attention() const override { return *att; }
  Norm& ln1() const override { return *norm1; }
  Norm* ln2() const override { return norm2.get(); }
  Mlp* mlp() const override { return ff.get(); }
  Dropout& residual_dropout() const override { return *drop_shortcut; }
  std::shared_ptr<CausalMultiHead> att;
  std::shared_ptr<SwiGLUFeedForward> ff;
  std::shared_ptr<RMSNorm> norm1, norm2;
  std::shared_ptr<Dropout> drop_shortcut;
};

// The family's face to the registry (io/families.h): sections with "arch": "llama".
const ModelFamily& llama_family();

class LlamaModel : public DecoderModel {
 public:
  explicit LlamaModel(const LlamaConfig& cfg);
  std::string type_name() const override { return "Llama"; }
  nlohmann::json config_json() const override { return cfg_.to_json(); }
  nlohmann::json pruned_config(const std::vector<std::vector<int64_t>>& kept) const override;
  nlohmann::json converted_config(AttentionForm form) const override;
  // x = drop_emb(tok_emb(idx)) (hook_embed); positions enter through the rotary embedding.
  Tensor embed(const Tensor& idx, int64_t offset = 0, Hooks* hooks = nullptr) override;
  DecoderBlock& decoder_block(int64_t layer) const override { return *block(layer); }
  Norm& ln_final() const override { return *final_norm; }
  Linear& lm_head() const override { return *out_head; }
  const LlamaConfig& config() const { return cfg_; }
  std::shared_ptr<LlamaBlock> block(int64_t layer) const;

  std::shared_ptr<Embedding> tok_emb;
  std::shared_ptr<Dropout> drop_emb;
  std::shared_ptr<Sequential> trf_blocks;
  std::shared_ptr<RMSNorm> final_norm;
  std::shared_ptr<Linear> out_head;

 private:
  LlamaConfig cfg_;
};

}  // namespace headlab::nn
