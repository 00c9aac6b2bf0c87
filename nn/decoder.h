// The decoder-only language model, every family's: embeddings into a residual stream, blocks that read the
// stream through a norm and add their attention's and MLP's outputs to it, a final norm and the unembedding,
// built from a DecoderConfig of parts (nn/decoder_config.h) under the book's state_dict names (tok_emb,
// pos_emb, trf_blocks.N.{att, ff, norm1, norm2}, final_norm, out_head). Evaluation, generation, export, the
// key/value cache, head surgery, every analysis and the Python module see this one class: one forward, with
// TransformerLens's hook points (nn/hooks.h); each head's weights as TransformerLens exposes them (W_Q, W_K,
// W_V, W_O and biases, the norm folded in on request); the final norm frozen for direct logit attribution.
// B = batch, T = tokens, C = d_model, V = the logits' width (out_vocab_size), L = layers, H = heads, D = head size.
#pragma once
#include <optional>
#include <vector>

#include "nn/decoder_config.h"
#include "nn/model.h"

namespace headlab::nn {

// A decoder's sizes as analyses read them, whatever the family's config calls them.
struct DecoderShape {
  int64_t vocab_size = 0, context_length = 0, d_model = 0, n_layers = 0;  // vocab_size: the token ids it reads
  int64_t out_vocab_size = 0;      // the logits' width: the tokens it predicts (TransformerLens's d_vocab_out)
  int64_t n_heads = 0;             // per layer before any pruning
  bool has_mlp = true;             // false: attention-only blocks
  bool normalized = true;          // false: no norms (identities, without the ln*.hook_normalized points)
  bool learned_positions = true;   // a position embedding added to the token embedding (hook_pos_embed)
  bool rotary = false;             // queries and keys rotated by position (attn.hook_rot_q, hook_rot_k)
  bool parallel_residual = false;  // attention and MLP both read the block's input (no hook_resid_mid)
  bool pre_norms = true;           // false: ln1 and ln2 are identities, the norms only after (OLMo-2)
  bool post_norms = false;  // attention's and MLP's outputs normed before the stream adds them (ln1_post, ln2_post)
  bool causal = true;       // false: bidirectional attention (an encoder: BERT)
  bool post_ln = false;     // ln1 and ln2 after the residual adds (BERT): the stream is renormed at every block
  // After physical pruning, the original head indices each layer keeps (empty: every head).
  std::vector<std::vector<int64_t>> kept_heads;
};

// One pre-norm block around the residual stream x (B, T, C):
//   sequential (GPT-2, LLaMA): x += drop(attn(ln1(x))); x += drop(mlp(ln2(x)))
//   parallel (GPT-NeoX):       x += drop(attn(ln1(x))) + drop(mlp(ln2(x)))  (both read the block's input)
//   attention only:            x += drop(attn(ln1(x)))
// With post norms each output is normed before the stream adds it, x += drop(ln1_post(attn(ln1(x)))) (Gemma 2
// and 3's four norms a block; OLMo-2's, whose ln1 and ln2 are identities).
// The hook points resid_pre, q/k/v_input (per-head inputs, where hooked), ln1.hook_normalized, the attention's
// own, ln1_post.hook_normalized, attn_out, resid_mid, mlp_in, ln2.hook_normalized, the MLP's,
// ln2_post.hook_normalized, mlp_out and resid_post. A norm that is an identity (NormKind::none; no pre norms)
// has, as in TransformerLens, no hook point.
// post_ln (BERT's, the original Transformer's): the norms after the adds, the stream renormed at every block,
//   x = ln1(x + drop(attn(x))); x = ln2(x + drop(mlp(x))), with TransformerLens's BertBlock's points: resid_mid and
//   resid_post before their norms, ln1.hook_normalized and ln2.hook_normalized (the block's output) after.
// Its parts in the book's registration order: att, ff, norm1, norm2, norm1_post, norm2_post, drop_shortcut.
class DecoderBlock : public UnaryModule {
 public:
  DecoderBlock(const DecoderConfig& cfg, int64_t layer);
  std::string type_name() const override { return "TransformerBlock"; }
  Tensor forward(const Tensor& x) override { return forward(x, HookSite{}); }
  // cache: incremental decoding (CausalMultiHead::forward), then without hooks. valid_lens (B,): the tokens of
  // each row before its padding, which bidirectional attention hides (AttentionInput::valid_lens).
  Tensor forward(const Tensor& x, const HookSite& site, KVCache* cache = nullptr, const Tensor& valid_lens = {});
  CausalMultiHead& attention() const { return *att; }
  Norm& ln1() const { return *norm1; }
  Norm* ln2() const { return norm2.get(); }  // null in an attention-only block
  Mlp* mlp() const { return ff.get(); }      // null in an attention-only block
  Norm* ln1_post() const { return norm1_post.get(); }  // null without post norms
  Norm* ln2_post() const { return norm2_post.get(); }  // null without post norms or an MLP
  bool parallel_residual() const { return parallel; }

  std::shared_ptr<CausalMultiHead> att;
  std::shared_ptr<Mlp> ff;
  std::shared_ptr<Norm> norm1, norm2, norm1_post, norm2_post;
  std::shared_ptr<Dropout> drop_shortcut;
  bool parallel = false;
  bool post_ln = false;

 private:
  Tensor attend(const Tensor& x, const HookSite& site, KVCache* cache, const Tensor& valid_lens);
  Tensor feed(const Tensor& stream, const HookSite& site);
};

class DecoderModel : public Model {
 public:
  explicit DecoderModel(const DecoderConfig& cfg);
  std::string type_name() const override;  // the family's: GPTModel, Llama, GPTNeoX
  nlohmann::json config_json() const override { return cfg_.to_json(); }
  nlohmann::json pruned_config(const std::vector<std::vector<int64_t>>& kept) const override;
  const DecoderConfig& config() const { return cfg_; }

  // ---- the forward: logits = unembed(run_blocks(embed(idx), 0, L)) ----
  Tensor logits(const ModelInputs& in) override { return forward(in.tokens, nullptr, in.valid_lens); }
  // idx: (B, T) int64 -> logits (B, T, V); hooks: what runs at the hook points (null: nothing). valid_lens (B,)
  // int64 in [1, T]: each row's tokens before its padding, which a bidirectional model's attention hides (an
  // encoder's attention_mask); a causal row never sees what follows it, so there it is only checked.
  Tensor forward(const Tensor& idx, Hooks* hooks = nullptr, const Tensor& valid_lens = {});
  Tensor operator()(const Tensor& idx) { return forward(idx); }
  // (B, T) int64 at positions [offset, offset + T) -> the stream entering block 0 (B, T, C):
  // drop_emb(tok_emb(idx) (hook_embed) [+ pos_emb(arange(offset, offset + T)) (hook_pos_embed)]
  // [+ type_emb's type 0]), through emb_norm (embed.ln.hook_normalized) where the family has one (BERT).
  Tensor embed(const Tensor& idx, int64_t offset = 0, Hooks* hooks = nullptr);
  // The stream entering block `first` (B, T, C) -> the stream after block `last - 1`.
  Tensor run_blocks(const Tensor& x, int64_t first, int64_t last, Hooks* hooks = nullptr,
                    const Tensor& valid_lens = {});
  // The stream after the last block -> logits (B, T, V): the final norm, then the unembedding.
  Tensor unembed(const Tensor& x, Hooks* hooks = nullptr);
  // What the unembedding reads (B, T, C): ln_final.hook_normalized, x itself without norms (no hook point, as
  // TransformerLens); with a masked-LM head its transform after, mlm_norm(gelu(mlm_dense(.))) (its hook point
  // mlm_head.ln.hook_normalized), which is not linear: direct logit attribution refuses such a model.
  Tensor normalize_final(const Tensor& x, Hooks* hooks = nullptr);
  Tensor unembed_normalized(const Tensor& y);  // y W_U + b_U (B, T, V), soft-capped where logit_softcap
  // y W_U + b_U before the soft-cap: what direct logit attribution splits (the cap, monotone, is applied after).
  Tensor unembed_uncapped(const Tensor& y) { return lm_head().forward(y); }

  // ---- incremental decoding (nn/generate.h) ----
  // idx (B, T) are the tokens after the caches' positions (a prompt, then one token a step); one cache per
  // layer. Returns the logits of the last position only, (B, V): the unembedding's GEMM runs on one row, not
  // T. chunk > 0 runs the tokens through the blocks that many at a time (each chunk attends to the cache and
  // causally to itself), so a long prompt's activations take chunk rows, not T: the same logits.
  // Every layer's attention form must have a cache (supports_kv_cache).
  bool supports_kv_cache() const;
  Tensor forward_cached(const Tensor& idx, std::vector<KVCache>& caches, int64_t chunk = 0);

  // ---- structure ----
  const DecoderShape& shape() const { return shape_; }
  int64_t n_layers() const { return shape_.n_layers; }
  std::shared_ptr<DecoderBlock> block(int64_t layer) const;  // errors name the layer
  DecoderBlock& decoder_block(int64_t layer) const { return *block(layer); }
  CausalMultiHead& attention(int64_t layer) const { return decoder_block(layer).attention(); }
  Norm& ln_final() const { return *final_norm; }
  Linear& lm_head() const { return *out_head; }
  // Every hook point of the model, in the order its forward reaches them. split_inputs: with the points
  // a plain forward does not stop at (hook_q_input, hook_k_input, hook_v_input, hook_mlp_in), which
  // TransformerLens lists only when use_split_qkv_input / use_hook_mlp_in are set.
  std::vector<HookKey> hook_points(bool split_inputs = false) const;

  // ---- weights as TransformerLens exposes them (detached) ----
  // Layer `layer`'s heads; fold_norm: ln1's weight multiplied into W_Q, W_K, W_V and its bias carried
  // into b_Q, b_K, b_V (TransformerLens's fold_ln), so that a head reads the normalised-but-unscaled stream
  // (without norms, nothing to fold: the weights as they are); with post norms, ln1_post's gain multiplied into
  // W_O and b_O, so that a head writes what the stream adds up to each token's scale.
  // dtype: the weights in that dtype, converted before the fold (an analysis in float64 folds in float64).
  HeadWeights head_weights(int64_t layer, bool fold_norm = false, std::optional<DType> dtype = std::nullopt) const;
  Tensor W_U() const;  // (C, V)
  Tensor b_U() const;  // (V); undefined without a bias (unembed_bias)
  // The final norm frozen at the stream x (..., C) it normalises: direct logit attribution's linear map (the
  // identity without norms).
  FrozenNorm freeze_final_norm(const Tensor& x) const { return freeze(ln_final(), x); }

  // ---- the config of a converted model (surgery) ----
  nlohmann::json converted_config(AttentionForm form) const;  // the same weights in another form

  // ---- nn::Model: the blocks' attentions are the modules, "L0", "L1", ... ----
  int64_t attention_count() const override { return shape_.n_layers; }
  MultiHead& multi_head(int64_t i) const override { return attention(i); }
  HeadControl& head_control(int64_t i) override { return attention(i).control(); }
  int64_t heads_at(int64_t i) const override { return attention(i).head_count(); }
  int64_t full_heads() const override { return shape_.n_heads; }
  int64_t head_size_at(int64_t i) const override { return attention(i).head_size(); }
  std::string attention_label(int64_t i) const override { return std::string("L").append(std::to_string(i)); }
  std::string attention_kind(int64_t) const override { return "self"; }
  int64_t attention_layer(int64_t i) const override { return i; }
  int64_t original_head(int64_t i, int64_t h) const override;
  void keep_attention_weights(bool on) override;
  Tensor attention_weights(int64_t i) const override { return attention(i).last_attention_weights(); }
  using Model::as_decoder;
  DecoderModel* as_decoder() override { return this; }

  std::shared_ptr<Embedding> tok_emb, pos_emb;  // pos_emb null without learned positions
  std::shared_ptr<Embedding> type_emb;          // null without token types
  std::shared_ptr<Norm> emb_norm;               // null without an embedding norm
  std::shared_ptr<Dropout> drop_emb;
  std::shared_ptr<Sequential> trf_blocks;
  std::shared_ptr<Norm> final_norm;   // an identity in a post-LN model, whose blocks end in a norm
  std::shared_ptr<Linear> mlm_dense;  // null without a masked-LM head
  std::shared_ptr<Norm> mlm_norm;
  std::shared_ptr<Linear> out_head;

 private:
  // embed's checks: idx (B, T) int64 at positions [offset, offset + T) within the context.
  void check_token_ids(const Tensor& idx, int64_t offset) const;
  void check_valid_lens(const Tensor& idx, const Tensor& lens) const;  // forward's: (B,) int64 in [1, T]

  DecoderConfig cfg_;
  DecoderShape shape_;
};

}  // namespace headlab::nn
