// The fused causal multi-head attention (one W_query/W_key/W_value), whose forward carries the decoder's
// hook points and key/value cache; the conversions between the causal forms (every form through the
// per-head wrapper of causal_attention.cpp) and the table of forms.
// B = batch, T = tokens, H = heads, D = head size, C = d_in.
#include <algorithm>
#include <array>
#include <cmath>

#include "nn/attention.h"
#include "nn/attention_internal.h"
#include "nn/causal_attention_internal.h"

namespace headlab::nn {

using namespace detail;

// ---- CausalMultiHeadAttention (fused) ----
namespace {

CausalAttentionSizes book_sizes(int64_t din, int64_t dout, int64_t ctx, double p, int64_t H, bool bias, int64_t hd) {
  if (hd < 0) {
    HL_CHECK(H > 0 && dout % H == 0, "CausalMultiHeadAttention: d_out ", dout, " must be divisible by num_heads ", H);
    hd = dout / H;
  }
  return {.d_in = din,
          .d_out = dout,
          .context_length = ctx,
          .num_heads = H,
          .head_dim = hd,
          .dropout = p,
          .qkv_bias = bias,
          .out_bias = true,
          .rotary = {}};
}

}  // namespace

CausalMultiHeadAttention::CausalMultiHeadAttention(int64_t din, int64_t dout, int64_t ctx, double p, int64_t H,
                                                   bool bias, int64_t hd)
    : CausalMultiHeadAttention(book_sizes(din, dout, ctx, p, H, bias, hd)) {}

CausalMultiHeadAttention::CausalMultiHeadAttention(const CausalAttentionSizes& s)
    : d_in(s.d_in),
      d_out(s.d_out),
      context_length(s.context_length),
      num_heads(s.num_heads),
      head_dim(s.head_dim),
      num_kv_heads(s.kv_heads()),
      dropout_p(s.dropout),
      qkv_bias(s.qkv_bias),
      rotary(s.rotary),
      qk_norm(s.qk_norm),
      qk_norm_eps(s.qk_norm_eps),
      qk_norm_offset(s.qk_norm_offset),
      window(s.window),
      scale(s.scale),
      softcap(s.softcap),
      causal(s.causal) {
  const char* who = "CausalMultiHeadAttention";
  HL_CHECK(window >= 0, who, ": the window must be >= 0 keys, got ", window);
  HL_CHECK(context_length > 0, who, ": context_length must be positive, got ", context_length);
  HL_CHECK(
      num_kv_heads >= 0 && (num_heads == 0 ? num_kv_heads == 0 : num_kv_heads > 0 && num_heads % num_kv_heads == 0),
      who, ": num_kv_heads ", num_kv_heads, " must divide num_heads ", num_heads);
  check_rotary(who, rotary, head_dim);
  const int64_t inner = num_heads * head_dim, kv = num_kv_heads * head_dim;
  W_query = register_module("W_query", std::make_shared<Linear>(d_in, inner, qkv_bias));
  W_key = register_module("W_key", std::make_shared<Linear>(d_in, kv, qkv_bias));
  W_value = register_module("W_value", std::make_shared<Linear>(d_in, kv, qkv_bias));
  out_proj = register_module("out_proj", std::make_shared<Linear>(inner, d_out, s.out_bias));
  if (qk_norm != QkNorm::none) {  // Hugging Face's order: after o_proj
    const bool whole = qk_norm == QkNorm::whole;
    q_norm =
        register_module("q_norm", std::make_shared<RMSNorm>(whole ? inner : head_dim, qk_norm_eps, qk_norm_offset));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(whole ? kv : head_dim, qk_norm_eps, qk_norm_offset));
  }
  dropout = register_module("dropout", std::make_shared<Dropout>(dropout_p));
}

std::shared_ptr<CausalMultiHeadAttention> CausalMultiHeadAttention::create(const CausalAttentionSizes& s) {
  return std::make_shared<CausalMultiHeadAttention>(s);
}

double CausalMultiHeadAttention::parameter_count(const CausalAttentionSizes& s) {
  const int64_t inner = s.num_heads * s.head_dim, kv = s.kv_heads() * s.head_dim;
  const double norms = s.qk_norm == QkNorm::whole      ? static_cast<double>(inner + kv)
                       : s.qk_norm == QkNorm::per_head ? 2.0 * static_cast<double>(s.head_dim)
                                                       : 0.0;
  return linear_parameters(s.d_in, inner, s.qkv_bias) + 2 * linear_parameters(s.d_in, kv, s.qkv_bias) +
         linear_parameters(inner, s.d_out, s.out_bias) + norms;
}

Tensor CausalMultiHeadAttention::forward(const Tensor& x, const Tensor& gates) {
  return run(AttentionInput{x, {}, {}, {}, {}}, gates, HookSite{}, nullptr);
}

Tensor CausalMultiHeadAttention::forward(const AttentionInput& in, const HookSite& site, KVCache* cache) {
  return run(in, Tensor(), site, cache);
}

namespace {

// Queries, keys or values (B, T, H, D): the stream x (B, T, C) through proj (H*D, C), or with per-head
// inputs xs (B, T, H, C) each head's own through its rows of proj (a GEMM per head; xs laid out head-major,
// as the decoder block makes them, is read in place).
Tensor project(const Tensor& xs, const Tensor& x, Linear& proj, int64_t H, int64_t D) {
  if (!xs.defined()) return proj.forward(x).view({x.size(0), x.size(1), H, D});
  const int64_t B = xs.size(0), T = xs.size(1), C = xs.size(3);
  Tensor y = matmul(xs.permute({2, 0, 1, 3}).reshape({H, B * T, C}), proj.weight.view({H, D, C}).transpose(1, 2));
  if (proj.bias.defined()) y = add(y, proj.bias.view({H, 1, D}));
  return y.view({H, B, T, D}).permute({1, 2, 0, 3});
}

// Queries or keys (B, T, H, D) through their q/k norm: over each head's D, or over all H*D (whole) at once.
Tensor normalize_qk(RMSNorm* norm, QkNorm kind, const Tensor& x) {
  if (norm == nullptr) return x;
  if (kind == QkNorm::per_head) return norm->forward(x);
  return norm->forward(x.reshape({x.size(0), x.size(1), x.size(2) * x.size(3)})).view(x.shape());
}

// Room in the cache for `needed` positions (B, Hkv, capacity, D): the caller's expected count at first, else doubled
// as decoding goes, up to the context, so that a model whose context is long (131,072 positions in Llama 3) holds
// only what a generation uses.
// `limit`: the context, or for a sliding-window layer about twice its window.
void grow(KVCache& cache, int64_t needed, int64_t limit, const std::array<int64_t, 3>& bhd, const Tensor& like) {
  const int64_t filled = cache.length - cache.start, have = filled > 0 ? cache.keys.size(2) : 0;
  const int64_t first = have == 0 && cache.expected > 0 ? cache.expected : 2 * have;  // the caller's count, once
  const int64_t capacity = std::max(needed, std::min(limit, std::max({first, int64_t{64}})));
  const Shape shape{bhd[0], bhd[1], capacity, bhd[2]};
  Tensor keys = Tensor::empty(shape, like.dtype(), like.device()),
         values = Tensor::empty(shape, like.dtype(), like.device());
  if (filled > 0) {
    keys.narrow(2, 0, filled).copy_(cache.keys.narrow(2, 0, filled));
    values.narrow(2, 0, filled).copy_(cache.values.narrow(2, 0, filled));
  }
  cache.keys = keys, cache.values = values;
}

// A sliding-window layer's cache without the positions no new query can see: all but the last window - 1 (moved
// to the front; start advances past the rest).
void drop_unseen(KVCache& cache, int64_t window) {
  const int64_t filled = cache.length - cache.start, keep = window - 1, drop = filled - keep;
  if (drop <= 0) return;
  for (Tensor* t : {&cache.keys, &cache.values}) {
    const Tensor kept = clone(t->narrow(2, drop, keep));  // the ranges may overlap
    t->narrow(2, 0, keep).copy_(kept);
  }
  cache.start += drop;
}

// Which cached keys the T new queries see: a prefill into an empty cache is causal within itself, one new token
// sees every cached position, and a later chunk of a prefill sees the cache and itself causally (query i: the
// first past + i + 1 keys).
AttentionMask cached_mask(int64_t past, int64_t B, int64_t T, const Tensor& like) {
  if (past == 0) return AttentionMask::causal();
  if (T == 1) return AttentionMask::none();
  std::vector<int64_t> lengths(static_cast<size_t>(B * T));
  for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = past + static_cast<int64_t>(i) % T + 1;
  return AttentionMask::lengths(tensor(lengths, {B, T}).to(like.device()));
}

// The input that gives the batch and token counts: x, or the first per-head input.
const Tensor& any_input(const AttentionInput& in) {
  return in.x.defined() ? in.x : in.q.defined() ? in.q : in.k.defined() ? in.k : in.v;
}

void check_attention_input(const char* who, const AttentionInput& in, int64_t d_in, int64_t H, int64_t Hkv,
                           int64_t context) {
  if (in.x.defined() || !in.q.defined() || !in.k.defined() || !in.v.defined())
    check_causal_input(who, in.x, d_in, context);
  const Tensor& first = any_input(in);
  HL_CHECK(first.dim() >= 2, who, ": the input must have a batch and a token dimension, got ",
           shape_str(first.shape()));
  const int64_t B = first.size(0), T = first.size(1);
  HL_CHECK(T <= context, who, ": ", T, " tokens exceed context_length ", context);
  for (const Tensor* xs : {&in.q, &in.k, &in.v}) {
    const int64_t heads = xs == &in.q ? H : Hkv;
    if (xs->defined())
      HL_CHECK(xs->shape() == Shape({B, T, heads, d_in}), who, ": per-head inputs must have shape [", B, ", ", T, ", ",
               heads, ", ", d_in, "], got ", shape_str(xs->shape()));
  }
}

}  // namespace

// One function for training, inference, decoding and analysis: a branch per optional part, so that the
// plain forward runs the fused attention kernel on strided views and computes nothing for hooks.
Tensor CausalMultiHeadAttention::run(const AttentionInput& in, const Tensor& gates, const HookSite& site,
                                     KVCache* cache) {
  const char* who = cache ? "CausalMultiHeadAttention (cached)" : "CausalMultiHeadAttention";
  check_attention_input(who, in, d_in, num_heads, num_kv_heads, context_length);
  const Tensor& first = any_input(in);
  const int64_t B = first.size(0), T = first.size(1), H = num_heads, Hkv = num_kv_heads, D = head_dim;
  if (const Tensor& lens = in.valid_lens; lens.defined())
    HL_CHECK(!causal && lens.dtype() == DType::i64 && lens.shape() == Shape({B}), who,
             causal ? ": padding lengths apply to bidirectional attention only (a causal row never sees what follows)"
                    : ": padding lengths must be int64 of shape [batch] = [" + std::to_string(B) + "], got " +
                          dtype_name(lens.dtype()) + " " + shape_str(lens.shape()));
  Tensor ctx;  // (B, H, T, D)
  if (head_control.given_context.defined()) {
    check_given_context(who, head_control.given_context, B, H, T, D);
    ctx = head_control.given_context;
  } else {
    Tensor q = site(HookPoint::q, project(in.q, in.x, *W_query, H, D));  // (B, T, H, D)
    Tensor k = site(HookPoint::k, project(in.k, in.x, *W_key, Hkv, D));  // (B, T, Hkv, D)
    q = normalize_qk(q_norm.get(), qk_norm, q);
    k = normalize_qk(k_norm.get(), qk_norm, k);
    const Tensor v = site(HookPoint::v, project(in.v, in.x, *W_value, Hkv, D));
    const int64_t past = cache ? cache->length : 0;
    if (rotary.dims > 0) {
      q = rotate(q, rotary, past, HookPoint::rot_q, site);
      k = rotate(k, rotary, past, HookPoint::rot_k, site);
    }
    const double factor = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
    // Which keys the queries see without a cache: causal (within the window), or all but a row's padding.
    const AttentionMask mask = causal ? AttentionMask::causal().within(window) : AttentionMask::lengths(in.valid_lens);
    if (cache) {
      HL_CHECK(causal, who, ": bidirectional attention (an encoder's) does not decode with a cache");
      HL_CHECK(!in.split(), who, ": per-head inputs do not decode with a cache");
      HL_CHECK(past + T <= context_length, who, ": ", past, " cached + ", T, " new tokens exceed context_length ",
               context_length);
      if (past == 0) cache->start = 0;
      if (past == 0 || past - cache->start + T > cache->keys.size(2)) {
        if (window > 0 && past > 0) drop_unseen(*cache, window);
        const int64_t limit = window > 0 ? std::min(context_length, 2 * window) : context_length;
        if (past == 0 || past - cache->start + T > cache->keys.size(2))
          grow(*cache, past - cache->start + T, limit, {B, Hkv, D}, first);
      }
      HL_CHECK(cache->keys.size(0) == B, who, ": the cache holds ", cache->keys.size(0), " rows, the input ", B);
      const int64_t filled = past - cache->start;  // slots before the new positions
      cache->keys.narrow(2, filled, T).copy_(k.transpose(1, 2));
      cache->values.narrow(2, filled, T).copy_(v.transpose(1, 2));
      cache->length = past + T;
      // One new token sees the last `window` slots at most: a narrower range, no mask (the fused decoding kernel).
      const int64_t from = T == 1 && window > 0 ? std::max<int64_t>(0, filled + 1 - window) : 0;
      ctx = scaled_dot_product_attention(q.transpose(1, 2), cache->keys.narrow(2, from, filled + T - from),
                                         cache->values.narrow(2, from, filled + T - from),
                                         cached_mask(filled - from, B, T, first).within(T == 1 ? 0 : window), 0.0,
                                         false, default_generator(), factor, softcap);
    } else if (keep_weights || site.wants(HookPoint::pattern)) {  // the weights wanted: materialised anyway
      const Tensor scores = matmul(q.transpose(1, 2), repeat_kv(k.transpose(1, 2), H).mT());  // (B, H, T, T)
      const Tensor pattern = site(HookPoint::pattern, attention_softmax(scores, mask, factor, softcap));
      if (keep_weights) attention_weights = pattern.detach();
      ctx = matmul(dropout->forward(pattern), repeat_kv(v.transpose(1, 2), H));
    } else {  // fused: reads the strided views directly, saves O(B*H*T) for backward
      ctx = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, dropout->p,
                                         dropout->is_training(), default_generator(), factor, softcap);
    }
  }
  ctx = apply_head_control(who, ctx, head_control, gates);
  const Tensor z = site(HookPoint::z, ctx.transpose(1, 2));                                // (B, T, H, D)
  if (!site.wants(HookPoint::result)) return out_proj->forward(z.reshape({B, T, H * D}));  // (B, T, d_out)
  // Each head's share of the output: z_h W_O[h] (H GEMMs), then their sum and out_proj's bias.
  const Tensor W_O = out_proj->weight.view({d_out, H, D}).permute({1, 2, 0});           // (H, D, d_out)
  const Tensor per_head = matmul(z.permute({2, 0, 1, 3}).reshape({H, B * T, D}), W_O);  // (H, BT, d_out)
  const Tensor result = site(HookPoint::result, per_head.view({H, B, T, d_out}).permute({1, 2, 0, 3}));
  Tensor out = result.permute({2, 0, 1, 3}).sum({0});  // (B, T, d_out)
  if (out_proj->bias.defined()) out = add(out, out_proj->bias);
  return out;
}

HeadWeights CausalMultiHeadAttention::head_weights() const {
  const int64_t H = num_heads, D = head_dim;
  HeadWeights w;
  // heads: H, or num_kv_heads for the keys and values, repeated to one per query head (TransformerLens's
  // W_K and W_V of a grouped-query model; views where nothing repeats).
  const auto per_head = [&](const Linear& proj, int64_t heads, Tensor& W, Tensor& b) {
    W = proj.weight.detach().view({heads, D, d_in}).transpose(1, 2);  // (heads, d_in, D)
    if (proj.bias.defined()) b = proj.bias.detach().view({heads, D});
    if (heads == H) return;
    std::vector<int64_t> group_of(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) group_of[static_cast<size_t>(h)] = h / (H / heads);
    const Tensor index = tensor(group_of, {H}, W.device());
    W = index_select(W, 0, index);
    if (b.defined()) b = index_select(b, 0, index);
  };
  per_head(*W_query, H, w.W_Q, w.b_Q);
  per_head(*W_key, num_kv_heads, w.W_K, w.b_K);
  per_head(*W_value, num_kv_heads, w.W_V, w.b_V);
  w.W_O = out_proj->weight.detach().view({d_out, H, D}).permute({1, 2, 0});  // (H, D, d_out)
  if (out_proj->bias.defined()) w.b_O = out_proj->bias.detach();
  return w;
}

// ---- conversion: every causal form to and from per-head form ----
std::shared_ptr<CausalMultiHead> CausalMultiHead::prune_heads(const std::vector<int64_t>& keep) const {
  check_head_selection(keep, head_count(), type_name(), "the module");  // before the split, naming this module
  const auto* fused = dynamic_cast<const CausalMultiHeadAttention*>(this);
  HL_CHECK(!fused || fused->qk_norm != QkNorm::whole || static_cast<int64_t>(keep.size()) == head_count(),
           "prune: q/k norms over the whole projections (OLMo-2's) normalise every head's queries and keys together, "
           "so removing a head would change the others'; physical pruning is not supported (gating heads off is)");
  return merge_heads(*split_heads()->select_heads(keep), form());
}

std::shared_ptr<CausalMultiHeadAttention> CausalMultiHeadAttention::merge_heads(const MultiHeadAttentionWrapper& w) {
  const int64_t H = w.num_heads, G = w.group_size();
  HL_CHECK(H > 0, "wrapper_to_fused: the wrapper has no heads");
  auto f = std::make_shared<CausalMultiHeadAttention>(w.sizes());  // no out_proj: an identity with a zero bias
  like(*f, w);
  NoGradGuard no_grad;
  // Rows of every `step`-th head stacked: each query head's (step 1), each key/value group's first head's (step G).
  auto stack_rows = [&](int64_t step, auto pick) {
    std::vector<Tensor> parts;
    for (int64_t h = 0; h < H; h += step) parts.push_back(pick(*w.heads->at<CausalAttention>(static_cast<size_t>(h))));
    return cat(parts, 0);
  };
  f->W_query->weight.detach().copy_(stack_rows(1, [](CausalAttention& a) { return a.W_query->weight; }));
  f->W_key->weight.detach().copy_(stack_rows(G, [](CausalAttention& a) { return a.W_key->weight; }));
  f->W_value->weight.detach().copy_(stack_rows(G, [](CausalAttention& a) { return a.W_value->weight; }));
  if (w.qkv_bias) {
    f->W_query->bias.detach().copy_(stack_rows(1, [](CausalAttention& a) { return a.W_query->bias; }));
    f->W_key->bias.detach().copy_(stack_rows(G, [](CausalAttention& a) { return a.W_key->bias; }));
    f->W_value->bias.detach().copy_(stack_rows(G, [](CausalAttention& a) { return a.W_value->bias; }));
  }
  if (f->q_norm) {  // one per-head norm all the wrapper's heads share
    const CausalAttention& head = *w.heads->at<CausalAttention>(0);
    f->q_norm->weight.detach().copy_(head.q_norm->weight);
    f->k_norm->weight.detach().copy_(head.k_norm->weight);
  }
  if (w.out_proj) {
    f->out_proj->weight.detach().copy_(w.out_proj->weight);
    if (w.out_proj->bias.defined()) f->out_proj->bias.detach().copy_(w.out_proj->bias);
  } else {  // concatenation alone: an identity projection
    f->out_proj->weight.detach().copy_(
        eye(f->out_proj->in_features, f->out_proj->weight.dtype(), f->out_proj->weight.device()));
    f->out_proj->bias.detach().zero_();
  }
  f->keep_weights = w.heads->at<CausalAttention>(0)->keep_attention_weights;
  f->head_control = w.head_control;
  return f;
}

std::shared_ptr<MultiHeadAttentionWrapper> CausalMultiHeadAttention::split_heads() const {
  const int64_t H = num_heads, D = head_dim, G = H / std::max<int64_t>(num_kv_heads, 1);
  HL_CHECK(H > 0, "fused_to_wrapper: the module has no heads");
  const CausalAttentionSizes s{.d_in = d_in,
                               .d_out = d_out,
                               .context_length = context_length,
                               .num_heads = H,
                               .head_dim = D,
                               .num_kv_heads = num_kv_heads,
                               .dropout = dropout_p,
                               .qkv_bias = qkv_bias,
                               .out_bias = out_proj->bias.defined(),
                               .rotary = rotary,
                               .qk_norm = qk_norm,
                               .qk_norm_eps = qk_norm_eps,
                               .qk_norm_offset = qk_norm_offset,
                               .window = window,
                               .scale = scale,
                               .softcap = softcap,
                               .causal = causal};
  auto w = std::make_shared<MultiHeadAttentionWrapper>(s, true);
  like(*w, *this);
  NoGradGuard no_grad;
  // Head h: its query rows; group g = h / G's key/value rows, once, into the module its heads share.
  const auto copy_rows = [&](Linear& dst, const Linear& src, int64_t row) {
    dst.weight.detach().copy_(src.weight.narrow(0, row * D, D));
    if (qkv_bias) dst.bias.detach().copy_(src.bias.narrow(0, row * D, D));
  };
  for (int64_t h = 0; h < H; ++h) {
    auto head = w->heads->at<CausalAttention>(static_cast<size_t>(h));
    copy_rows(*head->W_query, *W_query, h);
    if (h % G != 0) continue;
    copy_rows(*head->W_key, *W_key, h / G);
    copy_rows(*head->W_value, *W_value, h / G);
  }
  if (q_norm) {  // the heads share the wrapper's one pair
    const CausalAttention& head = *w->heads->at<CausalAttention>(0);
    head.q_norm->weight.detach().copy_(q_norm->weight);
    head.k_norm->weight.detach().copy_(k_norm->weight);
  }
  w->out_proj->weight.detach().copy_(out_proj->weight);
  if (out_proj->bias.defined()) w->out_proj->bias.detach().copy_(out_proj->bias);
  w->keep_attention_weights(keep_weights);
  w->head_control = head_control;
  return w;
}

std::shared_ptr<CausalMultiHeadAttention> wrapper_to_fused(const MultiHeadAttentionWrapper& w) {
  return CausalMultiHeadAttention::merge_heads(w);
}

std::shared_ptr<MultiHeadAttentionWrapper> fused_to_wrapper(const CausalMultiHeadAttention& f) {
  return f.split_heads();
}

// ---- the table of forms ----
namespace {

struct FormEntry {
  AttentionForm form;
  const char* help;
  std::shared_ptr<CausalMultiHead> (*create)(const CausalAttentionSizes&);
  double (*parameter_count)(const CausalAttentionSizes&);
  std::shared_ptr<CausalMultiHead> (*merge_heads)(const MultiHeadAttentionWrapper&);
};

template <typename M>
FormEntry form_entry(AttentionForm form, const char* help) {
  return {form, help, [](const CausalAttentionSizes& s) -> std::shared_ptr<CausalMultiHead> { return M::create(s); },
          &M::parameter_count,
          [](const MultiHeadAttentionWrapper& w) -> std::shared_ptr<CausalMultiHead> { return M::merge_heads(w); }};
}

// One entry per AttentionForm (its name: enum_table in attention.h): how it is built, counted and merged from per-head
// form.
const std::vector<FormEntry>& forms() {
  static const std::vector<FormEntry> table = {
      form_entry<CausalMultiHeadAttention>(AttentionForm::fused, "one W_query/W_key/W_value"),
      form_entry<MultiHeadAttentionWrapper>(AttentionForm::wrapper, "one module per head"),
  };
  return table;
}

const FormEntry& entry(AttentionForm form) {
  for (const FormEntry& e : forms())
    if (e.form == form) return e;
  HL_FAIL("attention: form ", static_cast<int>(form), " is missing from the table of forms");
}

}  // namespace

std::string attention_forms_help() {
  std::string help;
  for (const FormEntry& e : forms())
    help += (help.empty() ? "" : " | ") + std::string(enum_name(e.form)) + " (" + e.help + ")";
  return help;
}

std::shared_ptr<CausalMultiHead> make_causal_attention(AttentionForm form, const CausalAttentionSizes& s) {
  return entry(form).create(s);
}

double causal_attention_parameters(AttentionForm form, const CausalAttentionSizes& s) {
  return entry(form).parameter_count(s);
}

std::shared_ptr<CausalMultiHead> merge_heads(const MultiHeadAttentionWrapper& w, AttentionForm form) {
  return entry(form).merge_heads(w);
}

std::shared_ptr<CausalMultiHead> convert_attention(const CausalMultiHead& m, AttentionForm form) {
  return merge_heads(*m.split_heads(), form);
}

}  // namespace headlab::nn
