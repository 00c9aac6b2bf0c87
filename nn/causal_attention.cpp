// The causal forms of multi-head attention ("Build a LLM from Scratch" ch. 3), one module per head: the
// single head and the per-head wrapper, through which every form converts, with what the fused form
// (causal_attention_fused.cpp) shares: the input check and rotary (causal_attention_internal.h).
// Head surgery copies weights into new modules: pruning keeps rows (projections) and columns (output
// projection) of the kept heads.
// B = batch, T = tokens, H = heads, D = head size, C = d_in.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "nn/attention.h"
#include "nn/attention_internal.h"
#include "nn/causal_attention_internal.h"

namespace headlab::nn {

using namespace detail;

namespace {

// cos and sin (n, R/2) of a rotary embedding for positions [0, n), n >= needed: computed once per (R, theta,
// scaling, dtype, device) in the process, extended by doubling as longer inputs come, and shared by every layer and
// model that asks.
std::pair<Tensor, Tensor> rotary_table(const Rotary& r, int64_t needed, DType dtype, Device device) {
  using Key = std::tuple<int64_t, double, DType, std::string, RopeScalingKind, double, double, double, int64_t>;
  static std::mutex mutex;
  static std::map<Key, std::pair<Tensor, Tensor>> tables;
  const RopeScaling& s = r.scaling;
  const Key key{r.dims,
                r.theta,
                dtype,
                device.str(),
                s.kind,
                s.factor,
                s.low_freq_factor,
                s.high_freq_factor,
                s.original_context};
  const std::lock_guard<std::mutex> lock(mutex);
  std::pair<Tensor, Tensor>& table = tables[key];
  if (!table.first.defined() || table.first.size(0) < needed) {
    const NoGradGuard no_grad;
    const int64_t have = table.first.defined() ? table.first.size(0) : 0;
    table = rotary_angles(0, std::max({needed, 2 * have, int64_t{256}}), r.dims, r.theta, dtype, device, r.scaling);
  }
  return table;
}

}  // namespace

namespace detail {

void check_causal_input(const char* who, const Tensor& x, int64_t d_in, int64_t context_length) {
  HL_CHECK(x.defined() && x.dim() == 3, who, ": expected x of shape (batch, tokens, ", d_in, "), got ",
           x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  HL_CHECK(x.size(2) == d_in, who, ": expected x of shape (batch, tokens, ", d_in, "), got ", shape_str(x.shape()));
  HL_CHECK(x.size(1) <= context_length, who, ": ", x.size(1), " tokens exceed context_length ", context_length);
}

// Rotary dims fit a head of head_dim: even, at most head_dim.
void check_rotary(const char* who, const Rotary& r, int64_t head_dim) {
  HL_CHECK(r.dims >= 0 && r.dims % 2 == 0 && r.dims <= head_dim, who, ": rotary dims ", r.dims,
           " must be even and at most head_dim ", head_dim);
}

// Queries or keys (B, T, H, D) at positions [offset, offset + T) rotated, through `point`.
Tensor rotate(const Tensor& x, const Rotary& r, int64_t offset, HookPoint point, const HookSite& site) {
  const int64_t T = x.size(1);
  const auto [c, s] = rotary_table(r, offset + T, x.dtype(), x.device());
  return site(point, rotary_embedding(x, c.narrow(0, offset, T), s.narrow(0, offset, T), r.interleaved));
}

}  // namespace detail

// ---- CausalAttention ----
CausalAttention::CausalAttention(int64_t din, int64_t dout, int64_t ctx, double p, bool qkv_bias)
    : CausalAttention(din, dout, ctx, p, qkv_bias, Rotary{}) {}

CausalAttention::CausalAttention(int64_t din, int64_t dout, int64_t ctx, double p, bool qkv_bias, const Rotary& r,
                                 std::shared_ptr<Linear> shared_key, std::shared_ptr<Linear> shared_value)
    : CausalAttention(din, dout, ctx, p, qkv_bias, r,
                      Shared{.key = std::move(shared_key), .value = std::move(shared_value)}) {}

CausalAttention::CausalAttention(int64_t din, int64_t dout, int64_t ctx, double p, bool qkv_bias, const Rotary& r,
                                 const Shared& shared)
    : d_in(din),
      d_out(dout),
      context_length(ctx),
      rotary(r),
      window(shared.window),
      scale(shared.scale > 0 ? shared.scale : 1.0 / std::sqrt(static_cast<double>(dout))),
      softcap(shared.softcap),
      causal(shared.causal) {
  const char* who = "CausalAttention";
  HL_CHECK(ctx > 0, who, ": context_length must be positive, got ", ctx);
  HL_CHECK(window >= 0, who, ": the window must be >= 0 keys, got ", window);
  check_rotary(who, r, dout);
  for (const auto& [name, m] : {std::pair{"W_key", &shared.key}, std::pair{"W_value", &shared.value}})
    if (*m)
      HL_CHECK((*m)->in_features == din && (*m)->out_features == dout && (*m)->bias.defined() == qkv_bias, who,
               ": the shared ", name, " must be Linear(", din, ", ", dout, ", bias=", qkv_bias, "), got Linear(",
               (*m)->in_features, ", ", (*m)->out_features, ", bias=", (*m)->bias.defined(), ")");
  W_query = register_module("W_query", std::make_shared<Linear>(din, dout, qkv_bias));
  W_key = register_module("W_key", shared.key ? shared.key : std::make_shared<Linear>(din, dout, qkv_bias));
  W_value = register_module("W_value", shared.value ? shared.value : std::make_shared<Linear>(din, dout, qkv_bias));
  HL_CHECK(!shared.q_norm == !shared.k_norm, who, ": q/k norms come as a pair");
  if (shared.q_norm) {
    HL_CHECK(shared.q_norm->dim == dout && shared.k_norm->dim == dout, who, ": the q/k norms must be RMSNorm(", dout,
             "), got RMSNorm(", shared.q_norm->dim, ") and RMSNorm(", shared.k_norm->dim, ")");
    q_norm = register_module("q_norm", shared.q_norm);
    k_norm = register_module("k_norm", shared.k_norm);
  }
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

double CausalAttention::parameter_count(int64_t din, int64_t dout, bool qkv_bias) {
  return 3 * linear_parameters(din, dout, qkv_bias);  // W_query, W_key, W_value
}

Tensor CausalAttention::forward(const Tensor& x) {
  check_causal_input("CausalAttention", x, d_in, context_length);
  Tensor keys = W_key->forward(x), queries = W_query->forward(x);  // (B, T, d_out)
  const Tensor values = W_value->forward(x);
  if (q_norm) queries = q_norm->forward(queries), keys = k_norm->forward(keys);  // one head: over its d_out
  if (rotary.dims > 0) {  // as one head of (B, T, 1, d_out), at positions [0, T)
    const int64_t B = x.size(0), T = x.size(1);
    queries = rotate(queries.view({B, T, 1, d_out}), rotary, 0, HookPoint::rot_q, HookSite{}).reshape({B, T, d_out});
    keys = rotate(keys.view({B, T, 1, d_out}), rotary, 0, HookPoint::rot_k, HookSite{}).reshape({B, T, d_out});
  }
  const AttentionMask mask = causal ? AttentionMask::causal().within(window) : AttentionMask::none();
  if (!keep_attention_weights)
    return scaled_dot_product_attention(queries, keys, values, mask, dropout->p, dropout->is_training(),
                                        default_generator(), scale, softcap);
  const Tensor scores = matmul(queries, keys.mT());  // (B, T, T)
  const Tensor weights = attention_softmax(scores, mask, scale, softcap);
  attention_weights = weights.detach();
  return matmul(dropout->forward(weights), values);
}

// ---- MultiHeadAttentionWrapper ----
namespace {

// The book's wrapper as sizes: multi-head, out_proj (with a bias) to out_dim or num_heads * d_out.
CausalAttentionSizes book_wrapper_sizes(int64_t din, int64_t dout, int64_t ctx, double p, int64_t H, bool bias,
                                        int64_t out_dim) {
  return {.d_in = din,
          .d_out = out_dim < 0 ? H * dout : out_dim,
          .context_length = ctx,
          .num_heads = H,
          .head_dim = dout,
          .num_kv_heads = 0,
          .dropout = p,
          .qkv_bias = bias,
          .out_bias = true,
          .rotary = {}};
}

}  // namespace

MultiHeadAttentionWrapper::MultiHeadAttentionWrapper(int64_t din, int64_t dout, int64_t ctx, double p, int64_t H,
                                                     bool bias, bool with_out_proj, int64_t out_dim)
    : MultiHeadAttentionWrapper(book_wrapper_sizes(din, dout, ctx, p, H, bias, out_dim), with_out_proj) {}

MultiHeadAttentionWrapper::MultiHeadAttentionWrapper(const CausalAttentionSizes& s, bool with_out_proj)
    : d_in(s.d_in),
      d_out(s.head_dim),
      context_length(s.context_length),
      num_heads(s.num_heads),
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
  const char* who = "MultiHeadAttentionWrapper";
  HL_CHECK(num_heads >= 0, who, ": num_heads must be >= 0, got ", num_heads);
  HL_CHECK(num_heads == 0 ? num_kv_heads == 0 : num_kv_heads > 0 && num_heads % num_kv_heads == 0, who,
           ": num_kv_heads ", num_kv_heads, " must divide num_heads ", num_heads);
  check_rotary(who, rotary, d_out);
  HL_CHECK(qk_norm != QkNorm::whole, who,
           ": q/k norms over the whole projection (OLMo-2's) mix the heads, which "
           "separate heads cannot hold; use the fused form");
  std::shared_ptr<RMSNorm> q_norm, k_norm;  // per head: one pair every head shares, as the fused form's
  if (qk_norm == QkNorm::per_head)
    q_norm = std::make_shared<RMSNorm>(d_out, qk_norm_eps, qk_norm_offset),
    k_norm = std::make_shared<RMSNorm>(d_out, qk_norm_eps, qk_norm_offset);
  heads = register_module("heads", std::make_shared<ModuleList>());
  const int64_t G = group_size();
  std::shared_ptr<CausalAttention> first;  // the group's first head: it owns W_key and W_value, the others share them
  for (int64_t h = 0; h < num_heads; ++h) {
    const bool shares = h % G != 0;
    auto head = std::make_shared<CausalAttention>(d_in, d_out, context_length, dropout_p, qkv_bias, rotary,
                                                  CausalAttention::Shared{.key = shares ? first->W_key : nullptr,
                                                                          .value = shares ? first->W_value : nullptr,
                                                                          .q_norm = q_norm,
                                                                          .k_norm = k_norm,
                                                                          .window = window,
                                                                          .scale = scale,
                                                                          .softcap = softcap,
                                                                          .causal = causal});
    if (!shares) first = head;
    heads->push_back(head);
  }
  if (with_out_proj)
    out_proj = register_module("out_proj", std::make_shared<Linear>(num_heads * d_out, s.d_out, s.out_bias));
}

std::shared_ptr<MultiHeadAttentionWrapper> MultiHeadAttentionWrapper::create(const CausalAttentionSizes& s) {
  return std::make_shared<MultiHeadAttentionWrapper>(s, true);
}

double MultiHeadAttentionWrapper::parameter_count(const CausalAttentionSizes& s) {
  // W_query per head, W_key and W_value per key/value group, out_proj
  return static_cast<double>(s.num_heads + 2 * s.kv_heads()) * linear_parameters(s.d_in, s.head_dim, s.qkv_bias) +
         linear_parameters(s.num_heads * s.head_dim, s.d_out, s.out_bias) +
         (s.qk_norm == QkNorm::per_head ? 2.0 * static_cast<double>(s.head_dim) : 0.0);
}

CausalAttentionSizes MultiHeadAttentionWrapper::sizes() const {
  return {.d_in = d_in,
          .d_out = out_proj ? out_proj->out_features : num_heads * d_out,
          .context_length = context_length,
          .num_heads = num_heads,
          .head_dim = d_out,
          .num_kv_heads = num_kv_heads,
          .dropout = dropout_p,
          .qkv_bias = qkv_bias,
          .out_bias = !out_proj || out_proj->bias.defined(),
          .rotary = rotary,
          .qk_norm = qk_norm,
          .qk_norm_eps = qk_norm_eps,
          .qk_norm_offset = qk_norm_offset,
          .window = window,
          .scale = scale,
          .softcap = softcap,
          .causal = causal};
}

std::shared_ptr<MultiHeadAttentionWrapper> MultiHeadAttentionWrapper::merge_heads(const MultiHeadAttentionWrapper& w) {
  return w.split_heads();
}

std::vector<int64_t> MultiHeadAttentionWrapper::all_heads() const {
  std::vector<int64_t> all(static_cast<size_t>(num_heads));
  for (int64_t h = 0; h < num_heads; ++h) all[static_cast<size_t>(h)] = h;
  return all;
}

std::shared_ptr<MultiHeadAttentionWrapper> MultiHeadAttentionWrapper::split_heads() const {
  HL_CHECK(num_heads > 0, "MultiHeadAttentionWrapper: the wrapper has no heads");
  auto w = select_heads(all_heads());
  w->head_control = head_control;  // the same heads: the same control tensors, as a conversion shares them
  return w;
}

namespace {

// Values of src into dst, two modules of one structure (the same names and shapes).
void copy_parameters(Module& dst, const Module& src) {
  const NamedTensors from = src.named_parameters();
  NoGradGuard no_grad;
  for (auto& [name, t] : dst.named_parameters()) {
    auto it = find_named(from, name);
    HL_CHECK(it != from.end(), dst.type_name(), ": parameter ", name, " is missing from the copied module");
    t.detach().copy_(it->second);
  }
}

// Under grouped-query attention (groups of G heads) a selection keeps whole groups: a group's keys and values
// serve all its heads, so pruning removes a group's W_key/W_value rows or none of them.
void check_whole_groups(const std::vector<int64_t>& keep, int64_t H, int64_t G) {
  for (size_t i = 0; i < keep.size();) {
    const int64_t g = keep[i] / G;
    std::string kept;
    size_t j = i;
    for (; j < keep.size() && keep[j] / G == g; ++j) kept += (kept.empty() ? "" : ", ") + std::to_string(keep[j]);
    HL_CHECK(static_cast<int64_t>(j - i) == G, "MultiHeadAttentionWrapper: grouped-query attention (", H,
             " heads in key/value groups of ", G, ") prunes whole groups only; the selection keeps head(s) ", kept,
             " of group ", g, " (heads ", g * G, "-", g * G + G - 1, ")");
    i = j;
  }
}

}  // namespace

std::shared_ptr<MultiHeadAttentionWrapper> MultiHeadAttentionWrapper::select_heads(
    const std::vector<int64_t>& keep) const {
  check_head_selection(keep, num_heads, "MultiHeadAttentionWrapper", "the module");
  const int64_t G = group_size(), n = static_cast<int64_t>(keep.size());
  if (G > 1) check_whole_groups(keep, num_heads, G);
  CausalAttentionSizes s = sizes();
  s.num_heads = n, s.num_kv_heads = n / G;
  auto w = std::make_shared<MultiHeadAttentionWrapper>(s, out_proj != nullptr);
  like(*w, *this);
  for (int64_t i = 0; i < n; ++i)  // a group's shared W_key/W_value are copied once per head: the same values
    copy_parameters(*w->heads->at<CausalAttention>(static_cast<size_t>(i)),
                    *heads->at<CausalAttention>(static_cast<size_t>(keep[static_cast<size_t>(i)])));
  if (out_proj) {
    NoGradGuard no_grad;
    const Tensor cols = head_rows(keep, d_out, out_proj->weight.device());
    w->out_proj->weight.detach().copy_(index_select(out_proj->weight, 1, cols));  // (out, n*D) of (out, H*D)
    if (out_proj->bias.defined()) w->out_proj->bias.detach().copy_(out_proj->bias);
  }
  w->keep_attention_weights(heads->at<CausalAttention>(0)->keep_attention_weights);
  w->head_control = head_control.select_heads(keep);
  return w;
}

void MultiHeadAttentionWrapper::keep_attention_weights(bool on) {
  for (size_t h = 0; h < heads->size(); ++h) heads->at<CausalAttention>(h)->keep_attention_weights = on;
}

Tensor MultiHeadAttentionWrapper::last_attention_weights() const {
  std::vector<Tensor> ws;
  for (size_t h = 0; h < heads->size(); ++h) ws.push_back(heads->at<CausalAttention>(h)->attention_weights);
  return ws.empty() || !ws[0].defined() ? Tensor() : stack(ws, 1);
}

Tensor MultiHeadAttentionWrapper::forward(const Tensor& x, const Tensor& gates_arg) {
  const char* who = "MultiHeadAttentionWrapper";
  check_causal_input(who, x, d_in, context_length);
  const int64_t B = x.size(0), T = x.size(1), H = num_heads, D = d_out;
  const Tensor gates = gates_arg.defined() ? gates_arg : head_control.gates;
  const Tensor& offsets = head_control.offsets;
  check_control(who, gates, offsets, B, H, T, D);
  // Head h's slice of the (B, H, T, D)-shaped views, as (B, T, D)-broadcastable tensors.
  const Tensor g4 = gates.defined() ? gates_4d(gates, B, H, T) : Tensor();
  const Tensor o4 = offsets.defined() ? offsets_4d(offsets, B, H, D) : Tensor();
  const Tensor& given = head_control.given_context;
  if (given.defined()) check_given_context(who, given, B, H, T, D);
  std::vector<Tensor> outs, kept;
  for (int64_t h = 0; h < H; ++h) {
    Tensor o = given.defined() ? given.select(1, h)  // (B, T, d_out)
                               : heads->at<CausalAttention>(static_cast<size_t>(h))->forward(x);
    if (head_control.keep_context) kept.push_back(o.detach());
    if (g4.defined()) o = mul(o, g4.select(1, h).to(o.dtype()));
    if (o4.defined()) o = add(o, o4.select(1, h).to(o.dtype()));
    outs.push_back(o);
  }
  if (head_control.keep_context && !kept.empty()) head_control.context = stack(kept, 1);  // (B, H, T, d_out)
  Tensor out = outs.empty() ? zeros({B, T, 0}, x.dtype(), x.device()) : cat(outs, -1);
  return out_proj ? out_proj->forward(out) : out;
}

Tensor MultiHeadAttentionWrapper::forward(const AttentionInput& in, const HookSite& site, KVCache* cache) {
  const bool hooked =
      site.wants_any({HookPoint::q, HookPoint::k, HookPoint::v, HookPoint::pattern, HookPoint::z, HookPoint::result});
  if (num_heads == 0 || (!hooked && !in.split() && !cache && !in.valid_lens.defined())) return forward(in.x, Tensor());
  // Hook points, per-head inputs and the cache: the fused form's forward on a copy of the weights (the
  // same function of the input), its head control the wrapper's own.
  const std::shared_ptr<CausalMultiHead> fused = nn::merge_heads(*this, AttentionForm::fused);
  const Tensor out = fused->forward(in, site, cache);
  head_control.context = fused->control().context;
  return out;
}

HeadWeights MultiHeadAttentionWrapper::head_weights() const {
  HL_CHECK(num_heads > 0, "MultiHeadAttentionWrapper: the wrapper has no heads");
  const Tensor& any = heads->at<CausalAttention>(0)->W_query->weight;
  HeadWeights w;
  const auto stacked = [&](auto pick) {  // (H, ...) from each head's (d_out, ...)
    std::vector<Tensor> per_head;
    for (size_t h = 0; h < heads->size(); ++h) per_head.push_back(pick(*heads->at<CausalAttention>(h)).detach());
    return stack(per_head, 0);
  };
  w.W_Q = stacked([](const CausalAttention& a) { return a.W_query->weight; }).transpose(1, 2);  // (H, d_in, D)
  w.W_K = stacked([](const CausalAttention& a) { return a.W_key->weight; }).transpose(1, 2);
  w.W_V = stacked([](const CausalAttention& a) { return a.W_value->weight; }).transpose(1, 2);
  if (qkv_bias) {
    w.b_Q = stacked([](const CausalAttention& a) { return a.W_query->bias; });
    w.b_K = stacked([](const CausalAttention& a) { return a.W_key->bias; });
    w.b_V = stacked([](const CausalAttention& a) { return a.W_value->bias; });
  }
  if (out_proj) {
    const int64_t C = out_proj->out_features;
    w.W_O = out_proj->weight.detach().view({C, num_heads, d_out}).permute({1, 2, 0});  // (H, D, C)
    if (out_proj->bias.defined()) w.b_O = out_proj->bias.detach();
  } else {  // concatenation alone: head h writes its own columns
    w.W_O = zeros({num_heads, d_out, num_heads * d_out}, any.dtype(), any.device());
    const Tensor id = eye(d_out, any.dtype(), any.device());
    for (int64_t h = 0; h < num_heads; ++h) w.W_O.select(0, h).narrow(1, h * d_out, d_out).copy_(id);
  }
  return w;
}

}  // namespace headlab::nn
