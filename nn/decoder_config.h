// A decoder-only model as a configuration of parts: one struct of choices (norms, positions, attention,
// MLP, residual, head), from which nn::DecoderModel (nn/decoder.h) builds every family. Its fields carry
// the book's names (vocab_size, emb_dim, n_heads, ...) and LLaMA's and GPT-NeoX's for what the book lacks,
// so that each family's checkpoint section is a subset of them under the same keys; a family (nn/
// decoder_family.h) says which keys its section has and sets the parts it fixes. Like TransformerLens's
// HookedTransformerConfig: one flat config, every family a setting of it.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/enum_names.h"
#include "nn/attention.h"

namespace headlab::nn {

// The normalisation before attention and MLP and after the last block.
enum class NormKind {
  layer_norm,  // y = (x - mean) / sqrt(var + eps) * weight + bias (GPT-2, GPT-NeoX)
  rms_norm,    // y = x / sqrt(mean(x^2) + eps) * weight (LLaMA)
  none,        // y = x, no parameters (TransformerLens's normalization_type None: Nanda et al.'s grokking models)
};
constexpr auto enum_table(NormKind) {  // enum_name, parse_enum, enum_names (base/enum_names.h)
  return std::to_array<EnumName<NormKind>>(
      {{NormKind::layer_norm, "layer_norm"}, {NormKind::rms_norm, "rms_norm"}, {NormKind::none, "none"}});
}

// The block's MLP.
enum class MlpKind {
  gelu_tanh,   // Linear(C, F), GELU (tanh approximation), Linear(F, C), with biases (GPT-2; the book's FeedForward)
  gelu_exact,  // the same with the exact GELU (GPT-NeoX)
  swiglu,      // fc3(silu(fc1 x) * fc2 x), no biases (LLaMA)
  geglu,       // fc3(gelu_tanh(fc1 x) * fc2 x), no biases (Gemma)
  relu,        // Linear(C, F), ReLU, Linear(F, C), with biases (TransformerLens's act_fn "relu"; the grokking models)
};
constexpr auto enum_table(MlpKind) {
  return std::to_array<EnumName<MlpKind>>({{MlpKind::gelu_tanh, "gelu_tanh"},
                                           {MlpKind::gelu_exact, "gelu_exact"},
                                           {MlpKind::swiglu, "swiglu"},
                                           {MlpKind::geglu, "geglu"},
                                           {MlpKind::relu, "relu"}});
}

class DecoderFamily;
const DecoderFamily& gpt_family();  // the default: the book's GPTModel

struct DecoderConfig {
  // The family whose section this config is (its arch, its names, its fixed parts).
  const DecoderFamily* family = &gpt_family();

  // ---- sizes ----
  int64_t vocab_size = 0, context_length = 0, emb_dim = 0, n_heads = 0, n_layers = 0;  // vocab_size: the input's
  int64_t out_vocab_size = 0;  // the logits' width (TransformerLens's d_vocab_out); 0: vocab_size
  int64_t n_kv_heads = 0;      // key/value heads, dividing n_heads (grouped-query; 1: multi-query); 0: n_heads
  int64_t head_dim = 0;        // 0: emb_dim / n_heads
  int64_t hidden_dim = 0;      // the MLP's width; 0: 4 * emb_dim
  double drop_rate = 0.0;      // every dropout: embeddings, attention weights, residual branches

  // ---- parts ----
  NormKind norm = NormKind::layer_norm;
  bool book_norm_names = true;  // a LayerNorm's scale/shift (the book's) rather than weight/bias (PyTorch's)
  double norm_eps = 1e-5;
  double norm_weight_offset = 0.0;  // every RMSNorm's, q/k norms' too: scaled by offset + weight (Gemma: 1)
  bool pre_norms = true;            // norm1, norm2 before attention and MLP; false: identities (OLMo-2)
  bool post_norms = false;          // norm1_post, norm2_post on attention's and MLP's outputs (Gemma 2/3, OLMo-2)
  bool embed_scale = false;         // the token embeddings times sqrt(emb_dim) (Gemma)
  // ---- an encoder's parts (BERT) ----
  bool causal = true;             // false: every position sees every other (but padding: ModelInputs::valid_lens)
  bool post_ln = false;           // norms after the residual adds, x = norm1(x + att(x)); x = norm2(x + ff(x))
  int64_t type_vocab_size = 0;    // token type embeddings (type_emb; BERT: 2), type 0 (segment A) at every token
  bool embed_norm = false;        // a norm over the summed embeddings (emb_norm), before drop_emb
  bool mlm_head = false;          // the masked-LM head's transform before out_head: mlm_dense, GELU, mlm_norm
  bool learned_positions = true;  // a position table added to the token embedding (pos_emb)
  int64_t rotary_dims = 0;        // queries' and keys' rotated dims per head (even, <= head size)
  double rotary_fraction = 0.0;   // or this fraction of each head's dims, where rotary_dims is 0 (LLaMA: 1)
  double rope_theta = 10000.0;
  double rope_local_theta = 0.0;        // the windowed layers' rotary base; 0: rope_theta (Gemma 3)
  bool rope_interleaved = false;        // pairs (2i, 2i+1) as Meta's and llama2.c's; else halves (Hugging Face's)
  // rope_scaling (transformers'; ops.h's RopeScaling), on every layer but those with rope_local_theta (Gemma 3's)
  RopeScalingKind rope_scaling = RopeScalingKind::none;
  double rope_factor = 0.0;             // linear, llama3: 0 when none
  double rope_low_freq_factor = 0.0;    // llama3's
  double rope_high_freq_factor = 0.0;   // llama3's
  int64_t rope_original_context = 0;    // llama3's original_max_position_embeddings
  bool qkv_bias = false;                // W_query, W_key, W_value biases
  std::optional<bool> out_bias = true;  // out_proj's bias; unset: as qkv_bias (GPT-NeoX's attention_bias)
  QkNorm qk_norm = QkNorm::none;        // RMSNorm (eps norm_eps) over queries and keys before rotary (Qwen3)
  int64_t sliding_window = 0;           // a windowed layer's query sees itself and the sliding_window - 1 before
  std::vector<int64_t> window_layers;   // the windowed layers (increasing); empty: all, where sliding_window > 0
  double attn_scale = 0.0;              // the scores' factor; 0: 1 / sqrt(head size) (GPT-Neo: 1, unscaled)
  double attn_softcap = 0.0;            // scaled scores soft-capped, cap * tanh(s / cap) (Gemma 2: 50); 0: none
  double logit_softcap = 0.0;           // the logits soft-capped the same way (Gemma 2: 30); 0: none
  MlpKind mlp = MlpKind::gelu_tanh;
  bool attn_only = false;          // blocks without MLP and norm2: x += att(norm1(x))
  bool parallel_residual = false;  // x += att(norm1(x)) + mlp(norm2(x)), both reading the block's input (GPT-NeoX)
  bool tie_embeddings = false;     // the head's weight is tok_emb.weight itself, one parameter
  bool unembed_bias = false;       // out_head.bias (out_vocab_size): TransformerLens's b_U
  AttentionForm attention = AttentionForm::fused;
  // After physical pruning: the original head indices each layer keeps (increasing; whole key/value groups);
  // empty: all.
  std::vector<std::vector<int64_t>> kept_heads;

  // ---- what follows ----
  int64_t head_size() const { return head_dim ? head_dim : (n_heads ? emb_dim / n_heads : 0); }
  int64_t kv_heads() const { return n_kv_heads ? n_kv_heads : n_heads; }
  int64_t group_size() const { return n_heads / kv_heads(); }  // query heads per key/value head
  int64_t mlp_width() const { return hidden_dim ? hidden_dim : 4 * emb_dim; }
  bool gated_mlp() const { return mlp == MlpKind::swiglu || mlp == MlpKind::geglu; }
  int64_t output_vocab() const { return out_vocab_size ? out_vocab_size : vocab_size; }
  int64_t rotary_size() const;  // the rotated dims per head; 0: no rotary
  bool has_out_bias() const { return out_bias.value_or(qkv_bias); }
  int64_t heads_in_layer(int64_t layer) const;
  RopeScaling rope_scaling_of() const;     // the rope_* fields as ops' RopeScaling
  int64_t window_of(int64_t layer) const;  // the layer's sliding window; 0: it sees every position before it
  CausalAttentionSizes attention_sizes(int64_t layer) const;  // layer `layer`'s attention

  // What DecoderModel(*this).num_parameters() will be, counted part by part without building (a double: a
  // size someone mistyped may not fit an int64); tests/test_decoder.cpp holds it to the built model's.
  double num_parameters() const;
  // Floats per token of a batch row: a training step's peak (forward and backward) or one forward without a
  // tape; and a generation's key/value cache, all layers.
  double activation_floats(bool training) const;
  double cache_floats() const;

  // Every check on the values (errors start with the family's name: "GPT config: emb_dim must be positive").
  void validate() const;
  // The family's section: its keys only, "arch" where it is not the default family.
  nlohmann::json to_json() const;
};

}  // namespace headlab::nn
