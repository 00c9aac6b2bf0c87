// Model: what the trainer, evaluation and head analysis see of a trainable model. Token ids go in,
// logits come out, and the multi-head attention modules are listed with their head controls, so
// that one evaluation, one head-gating analysis and one pruning loop serve every family: the decoders
// (nn/decoder.h) and d2l's EncoderDecoder (nn/transformer.h), each answering for its kind (as_decoder,
// as_encoder_decoder) so that no caller casts. Which family a config is: io/families.h.
// B = batch, S = source tokens, T = tokens (decoder side), V = vocabulary, H = heads, D = head size.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "nn/attention.h"

namespace headlab::nn {

class DecoderModel;
class EncoderDecoder;

struct ModelInputs {
  Tensor tokens;             // (B, T) int64: the GPT's input, the decoder's input (bos, target...)
  Tensor valid_lens;         // (B,) int64: tokens per row before its padding (an encoder's attention mask); or none
  Tensor source;             // (B, S) int64: the encoder's input (encoder-decoder only)
  Tensor source_valid_lens;  // (B,) int64: source tokens per row (encoder-decoder only)
};

class Model : public Module {
 public:
  virtual Tensor logits(const ModelInputs& in) = 0;  // (B, T, V), teacher forced
  virtual nlohmann::json config_json() const = 0;    // the checkpoint's "model" section
  // The "model" section of this model physically pruned to keep, of module i, the original heads kept[i].
  virtual nlohmann::json pruned_config(const std::vector<std::vector<int64_t>>& kept) const = 0;

  // The multi-head attention modules, in a fixed order analysis calls "layers": the GPT's blocks;
  // the encoder-decoder's encoder self-attention, then decoder self-attention, then cross-attention.
  virtual int64_t attention_count() const = 0;
  virtual MultiHead& multi_head(int64_t i) const = 0;  // module i itself
  virtual HeadControl& head_control(int64_t i) = 0;
  virtual int64_t heads_at(int64_t i) const = 0;
  virtual int64_t full_heads() const = 0;  // heads per module before any pruning
  virtual int64_t head_size_at(int64_t i) const = 0;
  // How reports name module i and its heads: "L0" (GPT), "enc.L0" / "dec.L0" / "cross.L0".
  virtual std::string attention_label(int64_t i) const = 0;
  // The kind of module i ("self" for the GPT; "encoder", "decoder", "cross") and its layer in that kind.
  virtual std::string attention_kind(int64_t i) const = 0;
  virtual int64_t attention_layer(int64_t i) const = 0;
  // The original index of head h of module i (differs from h only in physically pruned models).
  virtual int64_t original_head(int64_t i, int64_t h) const = 0;
  // Keep every module's attention weights (B, H, Q, K) from the next forward on (the composite path).
  virtual void keep_attention_weights(bool on) = 0;
  virtual Tensor attention_weights(int64_t i) const = 0;

  // The model as its kind, for what only that kind has (null where it is another).
  virtual DecoderModel* as_decoder() { return nullptr; }
  virtual EncoderDecoder* as_encoder_decoder() { return nullptr; }
  const DecoderModel* as_decoder() const { return const_cast<Model*>(this)->as_decoder(); }
  bool is_decoder() const { return as_decoder() != nullptr; }
};

}  // namespace headlab::nn
