// The decoder built from its parts, its one forward (the block's maths with its hook points, the model's
// pieces around the blocks), incremental decoding, and each head's weights as TransformerLens exposes them.
#include "nn/decoder.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

// present false: a norm the family leaves out at that place (OLMo-2's before attention and MLP).
std::shared_ptr<Norm> make_norm(const DecoderConfig& c, bool present = true) {
  if (c.norm == NormKind::none || !present) return std::make_shared<IdentityNorm>(c.emb_dim);
  if (c.norm == NormKind::rms_norm) return std::make_shared<RMSNorm>(c.emb_dim, c.norm_eps, c.norm_weight_offset);
  return std::make_shared<LayerNorm>(c.emb_dim, c.norm_eps,
                                     c.book_norm_names ? LayerNorm::Style::Book : LayerNorm::Style::Torch);
}

std::shared_ptr<Mlp> make_mlp(const DecoderConfig& c) {
  if (c.gated_mlp()) return std::make_shared<GatedFeedForward>(c.emb_dim, c.mlp_width(), c.mlp == MlpKind::geglu);
  if (c.mlp == MlpKind::relu) return std::make_shared<FeedForward>(c.emb_dim, c.mlp_width(), std::make_shared<ReLU>());
  return std::make_shared<FeedForward>(c.emb_dim, c.mlp_width(), c.mlp == MlpKind::gelu_tanh);
}

}  // namespace

// ---- the block ----
DecoderBlock::DecoderBlock(const DecoderConfig& cfg, int64_t layer)
    : parallel(cfg.parallel_residual), post_ln(cfg.post_ln) {
  att = register_module("att", make_causal_attention(cfg.attention, cfg.attention_sizes(layer)));
  if (!cfg.attn_only) ff = register_module("ff", make_mlp(cfg));
  norm1 = register_module("norm1", make_norm(cfg, cfg.pre_norms));
  if (!cfg.attn_only) norm2 = register_module("norm2", make_norm(cfg, cfg.pre_norms));
  if (cfg.post_norms) norm1_post = register_module("norm1_post", make_norm(cfg));
  if (cfg.post_norms && !cfg.attn_only) norm2_post = register_module("norm2_post", make_norm(cfg));
  drop_shortcut = register_module("drop_shortcut", std::make_shared<Dropout>(cfg.drop_rate));
}

namespace {

// A part's output y through its post norm, where the block has one.
Tensor post_normed(Norm* post, HookPoint point, const HookSite& site, const Tensor& y) {
  return post == nullptr ? y : site(point, post->forward(y));
}

}  // namespace

Tensor DecoderBlock::forward(const Tensor& x_in, const HookSite& site, KVCache* cache, const Tensor& valid_lens) {
  const Tensor x = site(HookPoint::resid_pre, x_in);
  Dropout& drop = *drop_shortcut;
  if (post_ln) {  // the norms after the adds; the MLP reads the normed sum, the block returns the next one
    const Tensor attn_out = site(HookPoint::attn_out, drop.forward(attend(x, site, cache, valid_lens)));
    const Tensor mid = site(HookPoint::resid_mid, add(x, attn_out));
    const Tensor normed = site(HookPoint::ln1_normalized, ln1().forward(site(HookPoint::mlp_in, mid)));
    const Tensor mlp_out = site(HookPoint::mlp_out, drop.forward(mlp()->forward(normed, site)));
    const Tensor post = site(HookPoint::resid_post, add(normed, mlp_out));
    return site(HookPoint::ln2_normalized, ln2()->forward(post));
  }
  const auto attn_branch = [&] {
    return drop.forward(
        post_normed(ln1_post(), HookPoint::ln1_post_normalized, site, attend(x, site, cache, valid_lens)));
  };
  const auto mlp_branch = [&](const Tensor& stream) {
    return drop.forward(post_normed(ln2_post(), HookPoint::ln2_post_normalized, site, feed(stream, site)));
  };
  const Tensor attn_out = site(HookPoint::attn_out, attn_branch());
  if (mlp() == nullptr) return site(HookPoint::resid_post, add(x, attn_out));
  if (parallel_residual()) {
    const Tensor mlp_out = site(HookPoint::mlp_out, mlp_branch(x));
    return site(HookPoint::resid_post, add(add(x, attn_out), mlp_out));
  }
  const Tensor mid = site(HookPoint::resid_mid, add(x, attn_out));
  const Tensor mlp_out = site(HookPoint::mlp_out, mlp_branch(mid));
  return site(HookPoint::resid_post, add(mid, mlp_out));
}

// ln1 and the attention. Queries, keys or values whose input is hooked read the stream per head
// (B, T, H, C), as the hook leaves it; a hook that hands the broadcast stream back untouched costs
// nothing more than the plain path. Per-head inputs are normalised head-major, (H, B, T, C), the layout
// the attention's per-head projections read in place. Without a norm before it (none; post-LN, whose ln1 comes
// after the add) the attention reads the stream itself.
Tensor DecoderBlock::attend(const Tensor& x, const HookSite& site, KVCache* cache, const Tensor& valid_lens) {
  Norm* ln = post_ln || ln1().identity() ? nullptr : &ln1();
  AttentionInput in;
  bool all_split = true;
  const std::pair<HookPoint, Tensor*> inputs[] = {
      {HookPoint::q_input, &in.q}, {HookPoint::k_input, &in.k}, {HookPoint::v_input, &in.v}};
  for (const auto& [point, slot] : inputs) {
    if (!site.wants(point)) {
      all_split = false;
      continue;
    }
    const int64_t H = point == HookPoint::q_input ? attention().head_count() : attention().kv_head_count();
    // A copy of x, so that a hook writing into what it is given cannot change the stream.
    const Tensor stream = clone(x).unsqueeze(2).expand({x.size(0), x.size(1), H, x.size(2)});
    const uint64_t version = stream.version();
    const Tensor given = site.hooks->at({point, site.layer}, stream);
    if (given.impl_ptr() == stream.impl_ptr() && given.version() == version) {  // neither replaced nor written
      all_split = false;
      continue;
    }
    HL_CHECK(given.shape() == stream.shape(), "decoder: the hook at '", hook_name({point, site.layer}), "' returned ",
             shape_str(given.shape()), "; the per-head input is ", shape_str(stream.shape()));
    *slot = ln ? ln->forward(given.permute({2, 0, 1, 3})).permute({1, 2, 0, 3}) : given;
  }
  if (!all_split) in.x = ln ? site(HookPoint::ln1_normalized, ln->forward(x)) : x;
  in.valid_lens = valid_lens;
  return attention().forward(in, site, cache);
}

// ln2 and the MLP on the stream they read.
Tensor DecoderBlock::feed(const Tensor& stream, const HookSite& site) {
  const Tensor in = site(HookPoint::mlp_in, stream);
  if (ln2()->identity()) return mlp()->forward(in, site);
  return mlp()->forward(site(HookPoint::ln2_normalized, ln2()->forward(in)), site);
}

// ---- the model ----
DecoderModel::DecoderModel(const DecoderConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  shape_ = {.vocab_size = cfg.vocab_size,
            .context_length = cfg.context_length,
            .d_model = cfg.emb_dim,
            .n_layers = cfg.n_layers,
            .out_vocab_size = cfg.output_vocab(),
            .n_heads = cfg.n_heads,
            .has_mlp = !cfg.attn_only,
            .normalized = cfg.norm != NormKind::none,
            .learned_positions = cfg.learned_positions,
            .rotary = cfg.rotary_size() > 0,
            .parallel_residual = cfg.parallel_residual,
            .pre_norms = cfg.pre_norms && cfg.norm != NormKind::none,
            .post_norms = cfg.post_norms && cfg.norm != NormKind::none,
            .causal = cfg.causal,
            .post_ln = cfg.post_ln,
            .kept_heads = cfg.kept_heads};
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.emb_dim));
  if (cfg.learned_positions)
    pos_emb = register_module("pos_emb", std::make_shared<Embedding>(cfg.context_length, cfg.emb_dim));
  if (cfg.type_vocab_size > 0)
    type_emb = register_module("type_emb", std::make_shared<Embedding>(cfg.type_vocab_size, cfg.emb_dim));
  if (cfg.embed_norm) emb_norm = register_module("emb_norm", make_norm(cfg_));
  drop_emb = register_module("drop_emb", std::make_shared<Dropout>(cfg.drop_rate));
  trf_blocks = register_module("trf_blocks", std::make_shared<Sequential>());
  for (int64_t l = 0; l < cfg.n_layers; ++l) trf_blocks->push_back(std::make_shared<DecoderBlock>(cfg_, l));
  final_norm = register_module("final_norm", make_norm(cfg_, !cfg.post_ln));
  if (cfg.mlm_head) {
    mlm_dense = register_module("mlm_dense", std::make_shared<Linear>(cfg.emb_dim, cfg.emb_dim));
    mlm_norm = register_module("mlm_norm", make_norm(cfg_));
  }
  {
    std::optional<SkipInit> tied;  // a tied head's own weight is dropped at once: skip drawing it
    if (cfg.tie_embeddings) tied.emplace();
    out_head = register_module("out_head", std::make_shared<Linear>(cfg.emb_dim, cfg.output_vocab(), cfg.unembed_bias));
  }
  if (cfg.tie_embeddings) out_head->tie_weight(tok_emb->weight);
  if (cfg.tie_embeddings && out_head->bias.defined()) {  // SkipInit drew nothing; BERT's decoder bias starts at zero
    const NoGradGuard no_grad;
    out_head->bias.detach().fill_(0.0);
  }
}

std::string DecoderModel::type_name() const { return cfg_.family->model_name(); }

nlohmann::json DecoderModel::pruned_config(const std::vector<std::vector<int64_t>>& kept) const {
  DecoderConfig c = cfg_;
  c.kept_heads = kept;
  c.validate();
  return c.to_json();
}

nlohmann::json DecoderModel::converted_config(AttentionForm form) const {
  DecoderConfig c = cfg_;
  c.attention = form;
  c.validate();
  return c.to_json();
}

Tensor DecoderModel::embed(const Tensor& idx, int64_t offset, Hooks* hooks) {
  check_token_ids(idx, offset);
  const HookSite site{hooks, -1};
  Tensor tok = tok_emb->forward(idx);  // (B, T, C)
  // Gemma's sqrt(C) in float32, as its normalizer (a tensor in the stream's dtype)
  if (cfg_.embed_scale) tok = mul(tok, static_cast<double>(std::sqrt(static_cast<float>(cfg_.emb_dim))));
  Tensor x = site(HookPoint::embed, tok);
  if (pos_emb) {
    const int64_t B = idx.size(0), T = idx.size(1);
    Tensor pos = pos_emb->forward(
        arange(static_cast<double>(offset), static_cast<double>(offset + T), 1, DType::i64, idx.device()));  // (T, C)
    if (site.wants(HookPoint::pos_embed))
      pos = site(HookPoint::pos_embed, pos.unsqueeze(0).expand({B, T, cfg_.emb_dim}));
    x = add(x, pos);
  }
  if (type_emb) x = add(x, type_emb->weight.select(0, 0));  // segment A's type at every token
  if (emb_norm) x = site(HookPoint::embed_normalized, emb_norm->forward(x));
  return drop_emb->forward(x);
}

std::shared_ptr<DecoderBlock> DecoderModel::block(int64_t layer) const {
  HL_CHECK(layer >= 0 && layer < cfg_.n_layers, type_name(), ": layer ", layer, " is out of range for ", cfg_.n_layers,
           " layers");
  return trf_blocks->at<DecoderBlock>(static_cast<size_t>(layer));
}

Tensor DecoderModel::forward(const Tensor& idx, Hooks* hooks, const Tensor& valid_lens) {
  if (valid_lens.defined()) check_valid_lens(idx, valid_lens);
  const Tensor lens = cfg_.causal ? Tensor() : valid_lens;
  return unembed(run_blocks(embed(idx, 0, hooks), 0, n_layers(), hooks, lens), hooks);
}

Tensor DecoderModel::run_blocks(const Tensor& x_in, int64_t first, int64_t last, Hooks* hooks,
                                const Tensor& valid_lens) {
  HL_CHECK(first >= 0 && first <= last && last <= n_layers(), type_name(), ": blocks [", first, ", ", last,
           ") are out of range for ", n_layers(), " layers");
  Tensor x = x_in;
  for (int64_t l = first; l < last; ++l) x = decoder_block(l).forward(x, HookSite{hooks, l}, nullptr, valid_lens);
  return x;
}

Tensor DecoderModel::normalize_final(const Tensor& x, Hooks* hooks) {
  const HookSite site{hooks, -1};
  const Tensor y = ln_final().identity() ? x : site(HookPoint::ln_final_normalized, ln_final().forward(x));
  if (!mlm_dense) return y;
  return site(HookPoint::mlm_normalized, mlm_norm->forward(gelu(mlm_dense->forward(y), false)));  // BERT's exact GELU
}

Tensor DecoderModel::unembed_normalized(const Tensor& y) {
  const Tensor logits = unembed_uncapped(y);
  const double cap = cfg_.logit_softcap;  // Gemma 2's final_logit_softcapping: cap * tanh(logits / cap)
  return cap > 0 ? mul(tanh(mul(logits, 1.0 / cap)), cap) : logits;
}

Tensor DecoderModel::unembed(const Tensor& x, Hooks* hooks) { return unembed_normalized(normalize_final(x, hooks)); }

bool DecoderModel::supports_kv_cache() const {
  for (int64_t l = 0; l < n_layers(); ++l)
    if (!attention(l).supports_kv_cache()) return false;
  return true;
}

Tensor DecoderModel::forward_cached(const Tensor& idx, std::vector<KVCache>& caches, int64_t chunk) {
  HL_CHECK(static_cast<int64_t>(caches.size()) == n_layers(), type_name(), ": ", caches.size(),
           " key/value caches for ", n_layers(), " layers");
  HL_CHECK(chunk >= 0, type_name(), ": the prefill chunk must be >= 0 tokens, got ", chunk);
  HL_CHECK(idx.defined() && idx.dim() == 2 && idx.size(1) > 0, type_name(),
           ": expected token ids of shape (batch, tokens) with tokens > 0, got ", shape_str(idx.shape()));
  const int64_t T = idx.size(1), past = caches.front().length;
  HL_CHECK(past + T <= shape_.context_length, type_name(), ": ", T, " tokens after ", past,
           " cached exceed context_length ", shape_.context_length);  // before any chunk joins the cache
  // Chunks of equal size (at most `chunk`), so that every chunk's activations reuse the same freed blocks.
  const int64_t pieces = chunk > 0 ? (T + chunk - 1) / chunk : 1, step = (T + pieces - 1) / pieces;
  Tensor x;  // (B, n, C): the last chunk's stream after the last block
  for (int64_t start = 0; start < T; start += step) {
    const int64_t n = std::min(step, T - start);
    x = embed(idx.narrow(1, start, n), caches.front().length);
    for (int64_t l = 0; l < n_layers(); ++l)
      x = decoder_block(l).forward(x, HookSite{}, &caches[static_cast<size_t>(l)]);
  }
  return unembed(x.narrow(1, x.size(1) - 1, 1)).select(1, 0);  // (B, V)
}

HeadWeights DecoderModel::head_weights(int64_t layer, bool fold_norm, std::optional<DType> dtype) const {
  HeadWeights w = attention(layer).head_weights();
  const auto as = [&](const Tensor& t) { return dtype && t.defined() ? t.to(*dtype) : t; };
  if (dtype)
    for (Tensor* t : {&w.W_Q, &w.W_K, &w.W_V, &w.W_O, &w.b_Q, &w.b_K, &w.b_V, &w.b_O}) *t = as(*t);
  if (const Norm* post = decoder_block(layer).ln1_post(); fold_norm && post != nullptr) {
    // The post norm's gain on what the heads write (its per-token scale, a scalar, stays out: scores that
    // normalise, as composition's, are exact)
    const Tensor g = as(post->gain().detach());
    w.W_O = mul(w.W_O, g.view({1, 1, -1}));
    if (w.b_O.defined()) w.b_O = mul(w.b_O, g);
  }
  const Norm& ln = decoder_block(layer).ln1();
  if (!fold_norm || ln.identity() || shape_.post_ln) return w;   // post-LN: the heads read the stream as it is
  const Tensor gamma = as(ln.gain().detach()).view({1, -1, 1});  // (1, C, 1): scales every head's reads
  const Tensor beta = ln.bias.defined() ? as(ln.bias.detach()).view({1, -1, 1}) : Tensor();
  for (const auto& [W, b] : {std::pair{&w.W_Q, &w.b_Q}, std::pair{&w.W_K, &w.b_K}, std::pair{&w.W_V, &w.b_V}}) {
    if (beta.defined()) {
      const Tensor carried = mul(*W, beta).sum({1});  // (H, D): beta W
      *b = b->defined() ? add(*b, carried) : carried;
    }
    *W = mul(*W, gamma);
  }
  return w;
}

Tensor DecoderModel::W_U() const { return lm_head().weight.detach().mT(); }

Tensor DecoderModel::b_U() const {
  const Tensor& b = lm_head().bias;
  return b.defined() ? b.detach() : Tensor();
}

std::vector<HookKey> DecoderModel::hook_points(bool split_inputs) const {
  using P = HookPoint;
  std::vector<HookKey> keys{{P::embed, -1}};
  if (shape_.learned_positions) keys.push_back({P::pos_embed, -1});
  if (emb_norm) keys.push_back({P::embed_normalized, -1});
  for (int64_t l = 0; l < n_layers(); ++l) {
    std::vector<P> points{P::resid_pre};
    if (split_inputs) points.insert(points.end(), {P::q_input, P::k_input, P::v_input});
    const bool before = shape_.pre_norms && !shape_.post_ln;  // post-LN (BertBlock): ln1, ln2 after the adds
    if (before) points.push_back(P::ln1_normalized);
    if (attention(l).head_count() > 0) {
      points.insert(points.end(), {P::q, P::k, P::v});
      if (shape_.rotary) points.insert(points.end(), {P::rot_q, P::rot_k});
      points.insert(points.end(), {P::pattern, P::z, P::result});
    }
    if (shape_.post_norms) points.push_back(P::ln1_post_normalized);
    points.push_back(P::attn_out);
    if (shape_.has_mlp) {
      if (!shape_.parallel_residual) points.push_back(P::resid_mid);
      if (split_inputs) points.push_back(P::mlp_in);
      if (shape_.post_ln) points.push_back(P::ln1_normalized);
      if (before) points.push_back(P::ln2_normalized);
      points.insert(points.end(), {P::mlp_pre, P::mlp_post});
      if (shape_.post_norms) points.push_back(P::ln2_post_normalized);
      points.push_back(P::mlp_out);
    }
    points.push_back(P::resid_post);
    if (shape_.post_ln) points.push_back(P::ln2_normalized);  // the block's output
    for (P p : points) keys.push_back({p, l});
  }
  if (shape_.normalized && !shape_.post_ln) keys.push_back({P::ln_final_normalized, -1});
  if (mlm_dense) keys.push_back({P::mlm_normalized, -1});
  return keys;
}

int64_t DecoderModel::original_head(int64_t i, int64_t h) const {
  const std::vector<std::vector<int64_t>>& kept = shape_.kept_heads;
  return kept.empty() ? h : kept.at(static_cast<size_t>(i)).at(static_cast<size_t>(h));
}

void DecoderModel::keep_attention_weights(bool on) {
  for (int64_t l = 0; l < n_layers(); ++l) attention(l).keep_attention_weights(on);
}

void DecoderModel::check_valid_lens(const Tensor& idx, const Tensor& lens) const {
  const std::string who = type_name();
  check_token_ids(idx, 0);
  HL_CHECK(lens.dtype() == DType::i64 && lens.shape() == Shape({idx.size(0)}), who,
           ": valid lengths must be int64 of shape [batch] = [", idx.size(0), "], got ", dtype_name(lens.dtype()), " ",
           shape_str(lens.shape()));
  const Tensor host = lens.to(kCPU).contiguous();
  const int64_t* n = host.data<int64_t>();
  for (int64_t b = 0; b < lens.numel(); ++b)
    HL_CHECK(n[b] >= 1 && n[b] <= idx.size(1), who, ": row ", b, "'s valid length must be in [1, ", idx.size(1),
             "] (its tokens), got ", n[b]);
}

void DecoderModel::check_token_ids(const Tensor& idx, int64_t offset) const {
  const std::string who = type_name();
  HL_CHECK(idx.defined() && idx.dim() == 2, who, ": expected token ids of shape (batch, tokens), got ",
           idx.defined() ? shape_str(idx.shape()) : std::string("(undefined)"));
  HL_CHECK(idx.dtype() == DType::i64, who, ": token ids must be int64, got ", dtype_name(idx.dtype()));
  HL_CHECK(offset >= 0 && offset + idx.size(1) <= shape_.context_length, who, ": ", idx.size(1), " tokens",
           offset ? " after " + std::to_string(offset) : std::string(), " exceed context_length ",
           shape_.context_length);
}

}  // namespace headlab::nn
