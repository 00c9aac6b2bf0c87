// d2l's encoder-decoder Transformer (d2l.ai 10.7 in the edition of the seeds): PositionalEncoding,
// PositionWiseFFN, AddNorm (post-norm), the encoder and decoder blocks, TransformerEncoder,
// TransformerDecoder and EncoderDecoder, with d2l's argument and state_dict names
// ("encoder.blks.block0.attention.W_q.weight", "decoder.blks.block1.addnorm3.ln.bias",
// "decoder.dense.weight"). Every attention is d2l's MultiHeadAttention, so every head has a gate.
// Two deliberate differences from d2l's code, both where d2l's is only right in the case it runs:
// - the decoder's self-attention is causal in every mode (d2l masks only in training and relies on
//   decoding one token at a time otherwise), so a teacher-forced evaluation is what training saw;
// - incremental decoding adds the positional encoding of the position being decoded (d2l adds
//   position 0's at every step, since its decoder sees one token at a time).
// B = batch, S = source tokens, T = target tokens, N = num_hiddens, V = vocabulary.
#pragma once
#include <nlohmann/json.hpp>
#include <vector>

#include "nn/family.h"
#include "nn/model.h"

namespace headlab::nn {

// X (B, T, N) -> dropout(X + P[offset : offset + T]); P[t, 2i] = sin(t / 10000^(2i/N)), P[t, 2i+1] = cos(...).
// P is a constant, not a parameter or buffer (d2l keeps it as a plain attribute: no state_dict entry).
class PositionalEncoding : public Module {
 public:
  PositionalEncoding(int64_t num_hiddens, double dropout, int64_t max_len = 1000);
  std::string type_name() const override { return "PositionalEncoding"; }
  Tensor forward(const Tensor& X, int64_t offset = 0);
  int64_t num_hiddens, max_len;
  Tensor P;  // (max_len, num_hiddens), float64
  std::shared_ptr<Dropout> dropout;

 private:
  Tensor cast_;  // P in the dtype and on the device of the last input
};

// X (..., ffn_num_input) -> dense2(relu(dense1(X))) (..., ffn_num_outputs).
class PositionWiseFFN : public UnaryModule {
 public:
  PositionWiseFFN(int64_t ffn_num_input, int64_t ffn_num_hiddens, int64_t ffn_num_outputs);
  std::string type_name() const override { return "PositionWiseFFN"; }
  Tensor forward(const Tensor& X) override;
  std::shared_ptr<Linear> dense1, dense2;
  std::shared_ptr<ReLU> relu;
};

// Post-norm residual: ln(dropout(Y) + X).
class AddNorm : public Module {
 public:
  AddNorm(int64_t normalized_shape, double dropout);
  std::string type_name() const override { return "AddNorm"; }
  Tensor forward(const Tensor& X, const Tensor& Y);
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<LayerNorm> ln;
};

// d2l's argument list of the blocks (key/query/value sizes are num_hiddens in d2l's use).
// num_heads_kept < num_heads (physical pruning) keeps num_heads_kept heads of size num_hiddens / num_heads
// whose W_o still maps back to num_hiddens.
struct BlockSizes {
  int64_t key_size = 0, query_size = 0, value_size = 0, num_hiddens = 0, norm_shape = 0, ffn_num_input = 0,
          ffn_num_hiddens = 0, num_heads = 0;
  double dropout = 0;
  bool use_bias = false;
};

// d2l's EncoderBlock: Y = addnorm1(X, attention(X, X, X, valid_lens)); addnorm2(Y, ffn(Y)).
class TransformerEncoderBlock : public Module {
 public:
  explicit TransformerEncoderBlock(const BlockSizes& s, int64_t heads_kept = -1);
  std::string type_name() const override { return "TransformerEncoderBlock"; }
  // X: (B, S, N), valid_lens: (B,) -> (B, S, N)
  Tensor forward(const Tensor& X, const Tensor& valid_lens);
  std::shared_ptr<MultiHeadAttention> attention;
  std::shared_ptr<AddNorm> addnorm1, addnorm2;
  std::shared_ptr<PositionWiseFFN> ffn;
};

// d2l's decoder state: the encoder's outputs and valid lengths, and per block the decoder inputs seen
// so far (d2l's state[2][i], the keys and values of the masked self-attention).
struct DecoderState {
  Tensor enc_outputs;              // (B, S, N)
  Tensor enc_valid_lens;           // (B,) or undefined
  std::vector<Tensor> key_values;  // per block: (B, t, N) after t decoded positions; undefined at first
  int64_t steps = 0;               // positions decoded so far (the next one's positional encoding)
};

// d2l's DecoderBlock i: masked self-attention over the inputs so far (attention1, addnorm1), attention over
// the encoder's outputs with their valid_lens (attention2, addnorm2), ffn (addnorm3).
class TransformerDecoderBlock : public Module {
 public:
  TransformerDecoderBlock(const BlockSizes& s, int64_t i, int64_t self_heads_kept = -1, int64_t cross_heads_kept = -1);
  std::string type_name() const override { return "TransformerDecoderBlock"; }
  // X: (B, T, N) the next T positions; state.key_values[i] grows by them -> (B, T, N)
  Tensor forward(const Tensor& X, DecoderState& state);
  int64_t i;
  std::shared_ptr<MultiHeadAttention> attention1, attention2;
  std::shared_ptr<AddNorm> addnorm1, addnorm2, addnorm3;
  std::shared_ptr<PositionWiseFFN> ffn;
};

// An nn.Sequential of blocks named "block0", "block1", ... as d2l registers them (add_module).
class Blocks : public Module {
 public:
  std::string type_name() const override { return "Sequential"; }
  template <typename M>
  std::shared_ptr<M> add(std::shared_ptr<M> block) {
    items_.push_back(block);
    return register_module("block" + std::to_string(items_.size() - 1), std::move(block));
  }
  size_t size() const { return items_.size(); }
  template <typename M>
  std::shared_ptr<M> at(size_t i) const {
    HL_CHECK(i < items_.size(), "Sequential: block ", i, " is out of range for ", items_.size(), " blocks");
    return std::static_pointer_cast<M>(items_[i]);
  }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};

// The encoder-decoder's hyperparameters (d2l's names) and, after physical pruning, the original head
// indices every attention module keeps.
struct TransformerConfig {
  int64_t src_vocab_size = 0, tgt_vocab_size = 0;
  int64_t num_hiddens = 32, ffn_num_hiddens = 64, num_heads = 4, num_layers = 2;
  double dropout = 0.1;
  bool use_bias = false;
  int64_t max_len = 1000;  // the positional encoding's table: the longest source or target
  // Per layer, the heads kept (empty: all) of the encoder's, the decoder's self- and the cross-attention.
  std::vector<std::vector<int64_t>> kept_encoder, kept_decoder, kept_cross;

  int64_t head_size() const { return num_heads ? num_hiddens / num_heads : 0; }
  BlockSizes block_sizes() const;
  double num_parameters() const;   // of EncoderDecoder(*this), computed without building it
  void validate() const;           // clear errors naming the key
  nlohmann::json to_json() const;  // includes "arch": "encoder-decoder"
  static TransformerConfig from_json(const nlohmann::json& j);  // validates
};

// d2l's TransformerEncoder: X (B, S) ids -> blocks(pos_encoding(embedding(X) * sqrt(N))) (B, S, N).
class TransformerEncoder : public Module {
 public:
  explicit TransformerEncoder(const TransformerConfig& c);
  std::string type_name() const override { return "TransformerEncoder"; }
  Tensor forward(const Tensor& X, const Tensor& valid_lens);
  int64_t num_hiddens;
  std::shared_ptr<Embedding> embedding;
  std::shared_ptr<PositionalEncoding> pos_encoding;
  std::shared_ptr<Blocks> blks;
};

// d2l's TransformerDecoder: X (B, T) ids -> dense(blocks(pos_encoding(embedding(X) * sqrt(N)))) (B, T, V).
class TransformerDecoder : public Module {
 public:
  explicit TransformerDecoder(const TransformerConfig& c);
  std::string type_name() const override { return "TransformerDecoder"; }
  DecoderState init_state(const Tensor& enc_outputs, const Tensor& enc_valid_lens) const;
  // The next X.size(1) positions after state.steps; state is updated (teacher forcing: all at once).
  Tensor forward(const Tensor& X, DecoderState& state);
  int64_t num_hiddens, num_layers;
  std::shared_ptr<Embedding> embedding;
  std::shared_ptr<PositionalEncoding> pos_encoding;
  std::shared_ptr<Blocks> blks;
  std::shared_ptr<Linear> dense;
};

// The family's face to the registry (io/families.h): sections with "arch": "encoder-decoder".
const ModelFamily& encoder_decoder_family();

class EncoderDecoder : public Model {
 public:
  explicit EncoderDecoder(const TransformerConfig& c);
  std::string type_name() const override { return "EncoderDecoder"; }
  // enc_X: (B, S) ids, dec_X: (B, T) ids, enc_valid_lens: (B,) -> logits (B, T, tgt_vocab_size)
  Tensor forward(const Tensor& enc_X, const Tensor& dec_X, const Tensor& enc_valid_lens);
  Tensor logits(const ModelInputs& in) override { return forward(in.source, in.tokens, in.source_valid_lens); }
  nlohmann::json config_json() const override { return cfg_.to_json(); }
  // kept: per module in attention()'s order (encoder layers, decoder self-attention, cross-attention).
  nlohmann::json pruned_config(const std::vector<std::vector<int64_t>>& kept) const override;
  const TransformerConfig& config() const { return cfg_; }

  int64_t attention_count() const override { return 3 * cfg_.num_layers; }
  MultiHead& multi_head(int64_t i) const override { return attention(i); }
  HeadControl& head_control(int64_t i) override { return attention(i).heads; }
  int64_t heads_at(int64_t i) const override { return attention(i).num_heads; }
  int64_t full_heads() const override { return cfg_.num_heads; }
  int64_t head_size_at(int64_t) const override { return cfg_.head_size(); }
  std::string attention_label(int64_t i) const override;
  std::string attention_kind(int64_t i) const override;
  int64_t attention_layer(int64_t i) const override { return i % cfg_.num_layers; }
  int64_t original_head(int64_t i, int64_t h) const override;
  void keep_attention_weights(bool on) override;
  Tensor attention_weights(int64_t i) const override { return attention(i).attention_weights; }
  EncoderDecoder* as_encoder_decoder() override { return this; }
  // Module i of attention_count(): encoder layer i, decoder self-attention L + i, cross-attention 2L + i.
  MultiHeadAttention& attention(int64_t i) const;
  // The kept-heads list of module i in the config (empty: all heads).
  const std::vector<std::vector<int64_t>>& kept_lists(int64_t i) const;

  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<TransformerDecoder> decoder;

 private:
  TransformerConfig cfg_;
};

// Greedy decoding as d2l's predict_seq2seq, batched: encode once, then one position at a time from bos,
// reusing the decoder state, until every row produced eos or max_steps tokens. Returns each row's
// tokens without bos and without eos. Eval mode, no gradients; the mode is restored.
// src: (B, S) ids, src_valid_lens: (B,).
std::vector<std::vector<int64_t>> greedy_decode(EncoderDecoder& model, const Tensor& src, const Tensor& src_valid_lens,
                                                int64_t bos_id, int64_t eos_id, int64_t max_steps);

}  // namespace headlab::nn
