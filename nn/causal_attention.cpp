// The causal forms of multi-head attention ("Build a LLM from Scratch" ch. 3): the single head, the
// per-head wrapper, the fused module whose forward carries the decoder's hook points and key/value cache,
// the conversions between the forms (every form through the per-head wrapper) and the table of forms.
// Head surgery copies weights into new modules: pruning keeps rows (projections) and columns (output
// projection) of the kept heads.
// B = batch, T = tokens, H = heads, D = head size, C = d_in.
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "nn/attention.h"
#include "nn/attention_internal.h"

namespace headlab::nn {

using namespace detail;

namespace {

void check_causal_input(const char* who, const Tensor& x, int64_t d_in, int64_t context_length) {
  HL_CHECK(x.defined() && x.dim() == 3, who, ": expected x of shape (batch, tokens, ", d_in, "), got ",
           x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  HL_CHECK(x.size(2) == d_in, who, ": expected x of shape (batch, tokens, ", d_in, "), got ", shape_str(x.shape()));
  HL_CHECK(x.size(1) <= context_length, who, ": ", x.size(1), " tokens exceed context_length ", context_length);
}

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

// Rotary dims fit a head of head_dim: even, at most head_dim.
void check_rotary(const char* who, const Rotary& r, int64_t head_dim) {
  HL_CHECK(r.dims >= 0 && r.dims % 2 == 0 && r.dims <= head_dim, who, ": rotary dims ", r.dims,
           " must be even and at most head_dim ", head_dim);
}

// cos and sin (n, R/2) of a rotary embedding for positions [0, n), n >= needed: computed once per (R, theta,
// dtype, device) in the process, extended by doubling as longer inputs come, and shared by every layer and
// model that asks.
std::pair<Tensor, Tensor> rotary_table(const Rotary& r, int64_t needed, DType dtype, Device device) {
  using Key = std::tuple<int64_t, double, DType, std::string>;
  static std::mutex mutex;
  static std::map<Key, std::pair<Tensor, Tensor>> tables;
  const Key key{r.dims, r.theta, dtype, device.str()};
  const std::lock_guard<std::mutex> lock(mutex);
  std::pair<Tensor, Tensor>& table = tables[key];
  if (!table.first.defined() || table.first.size(0) < needed) {
    const NoGradGuard no_grad;
    const int64_t have = table.first.defined() ? table.first.size(0) : 0;
    table = rotary_angles(0, std::max({needed, 2 * have, int64_t{256}}), r.dims, r.theta, dtype, device);
  }
  return table;
}

// Queries or keys (B, T, H, D) at positions [offset, offset + T) rotated, through `point`.
Tensor rotate(const Tensor& x, const Rotary& r, int64_t offset, HookPoint point, const HookSite& site) {
  const int64_t T = x.size(1);
  const auto [c, s] = rotary_table(r, offset + T, x.dtype(), x.device());
  return site(point, rotary_embedding(x, c.narrow(0, offset, T), s.narrow(0, offset, T), r.interleaved));
}

}  // namespace

// ---- CausalAttention ----
CausalAttention::CausalAttention(int64_t din, int64_t dout, int64_t ctx, double p, bool qkv_bias)
    : CausalAttention(din, dout, ctx, p, qkv_bias, Rotary{}) {}

CausalAttention::CausalAttention(int64_t din, int64_t dout, int64_t ctx, double p, bool qkv_bias, const Rotary& r,
                                 std::shared_ptr<Linear> shared_key, std::shared_ptr<Linear> shared_value)
    : d_in(din), d_out(dout), context_length(ctx), rotary(r) {
  const char* who = "CausalAttention";
  HL_CHECK(ctx > 0, who, ": context_length must be positive, got ", ctx);
  check_rotary(who, r, dout);
  for (const auto& [name, m] : {std::pair{"W_key", &shared_key}, std::pair{"W_value", &shared_value}})
    if (*m)
      HL_CHECK((*m)->in_features == din && (*m)->out_features == dout && (*m)->bias.defined() == qkv_bias, who,
               ": the shared ", name, " must be Linear(", din, ", ", dout, ", bias=", qkv_bias, "), got Linear(",
               (*m)->in_features, ", ", (*m)->out_features, ", bias=", (*m)->bias.defined(), ")");
  W_query = register_module("W_query", std::make_shared<Linear>(din, dout, qkv_bias));
  W_key = register_module("W_key", shared_key ? shared_key : std::make_shared<Linear>(din, dout, qkv_bias));
  W_value = register_module("W_value", shared_value ? shared_value : std::make_shared<Linear>(din, dout, qkv_bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

double CausalAttention::parameter_count(int64_t din, int64_t dout, bool qkv_bias) {
  return 3 * linear_parameters(din, dout, qkv_bias);  // W_query, W_key, W_value
}

Tensor CausalAttention::forward(const Tensor& x) {
  check_causal_input("CausalAttention", x, d_in, context_length);
  Tensor keys = W_key->forward(x), queries = W_query->forward(x);  // (B, T, d_out)
  const Tensor values = W_value->forward(x);
  if (rotary.dims > 0) {  // as one head of (B, T, 1, d_out), at positions [0, T)
    const int64_t B = x.size(0), T = x.size(1);
    queries = rotate(queries.view({B, T, 1, d_out}), rotary, 0, HookPoint::rot_q, HookSite{}).reshape({B, T, d_out});
    keys = rotate(keys.view({B, T, 1, d_out}), rotary, 0, HookPoint::rot_k, HookSite{}).reshape({B, T, d_out});
  }
  if (!keep_attention_weights)
    return scaled_dot_product_attention(queries, keys, values, AttentionMask::causal(), dropout->p,
                                        dropout->is_training());
  const Tensor scores = matmul(queries, keys.mT());  // (B, T, T)
  const Tensor weights = causal_softmax(scores, 1.0 / std::sqrt(static_cast<double>(d_out)));
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
      rotary(s.rotary) {
  const char* who = "MultiHeadAttentionWrapper";
  HL_CHECK(num_heads >= 0, who, ": num_heads must be >= 0, got ", num_heads);
  HL_CHECK(num_heads == 0 ? num_kv_heads == 0 : num_kv_heads > 0 && num_heads % num_kv_heads == 0, who,
           ": num_kv_heads ", num_kv_heads, " must divide num_heads ", num_heads);
  check_rotary(who, rotary, d_out);
  heads = register_module("heads", std::make_shared<ModuleList>());
  const int64_t G = group_size();
  std::shared_ptr<CausalAttention> first;  // the group's first head: it owns W_key and W_value, the others share them
  for (int64_t h = 0; h < num_heads; ++h) {
    const bool shares = h % G != 0;
    auto head = std::make_shared<CausalAttention>(d_in, d_out, context_length, dropout_p, qkv_bias, rotary,
                                                  shares ? first->W_key : nullptr, shares ? first->W_value : nullptr);
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
         linear_parameters(s.num_heads * s.head_dim, s.d_out, s.out_bias);
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
          .rotary = rotary};
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
  if (num_heads == 0 || (!hooked && !in.split() && !cache)) return forward(in.x, Tensor());
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
      rotary(s.rotary) {
  const char* who = "CausalMultiHeadAttention";
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
  dropout = register_module("dropout", std::make_shared<Dropout>(dropout_p));
}

std::shared_ptr<CausalMultiHeadAttention> CausalMultiHeadAttention::create(const CausalAttentionSizes& s) {
  return std::make_shared<CausalMultiHeadAttention>(s);
}

double CausalMultiHeadAttention::parameter_count(const CausalAttentionSizes& s) {
  const int64_t inner = s.num_heads * s.head_dim, kv = s.kv_heads() * s.head_dim;
  return linear_parameters(s.d_in, inner, s.qkv_bias) + 2 * linear_parameters(s.d_in, kv, s.qkv_bias) +
         linear_parameters(inner, s.d_out, s.out_bias);
}

Tensor CausalMultiHeadAttention::forward(const Tensor& x, const Tensor& gates) {
  return run(AttentionInput{x, {}, {}, {}}, gates, HookSite{}, nullptr);
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

// Room in the cache for `needed` positions (B, Hkv, capacity, D): the caller's expected count at first, else doubled
// as decoding goes, up to the context, so that a model whose context is long (131,072 positions in Llama 3) holds
// only what a generation uses.
void grow(KVCache& cache, int64_t needed, int64_t context, const std::array<int64_t, 3>& bhd, const Tensor& like) {
  const int64_t have = cache.length > 0 ? cache.keys.size(2) : 0;
  const int64_t first = have == 0 && cache.expected > 0 ? cache.expected : 2 * have;  // the caller's count, once
  const int64_t capacity = std::min(context, std::max({needed, first, int64_t{64}}));
  const Shape shape{bhd[0], bhd[1], capacity, bhd[2]};
  Tensor keys = Tensor::empty(shape, like.dtype(), like.device()),
         values = Tensor::empty(shape, like.dtype(), like.device());
  if (cache.length > 0) {
    keys.narrow(2, 0, cache.length).copy_(cache.keys.narrow(2, 0, cache.length));
    values.narrow(2, 0, cache.length).copy_(cache.values.narrow(2, 0, cache.length));
  }
  cache.keys = keys, cache.values = values;
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
  Tensor ctx;  // (B, H, T, D)
  if (head_control.given_context.defined()) {
    check_given_context(who, head_control.given_context, B, H, T, D);
    ctx = head_control.given_context;
  } else {
    Tensor q = site(HookPoint::q, project(in.q, in.x, *W_query, H, D));  // (B, T, H, D)
    Tensor k = site(HookPoint::k, project(in.k, in.x, *W_key, Hkv, D));  // (B, T, Hkv, D)
    const Tensor v = site(HookPoint::v, project(in.v, in.x, *W_value, Hkv, D));
    const int64_t past = cache ? cache->length : 0;
    if (rotary.dims > 0) {
      q = rotate(q, rotary, past, HookPoint::rot_q, site);
      k = rotate(k, rotary, past, HookPoint::rot_k, site);
    }
    if (cache) {
      HL_CHECK(!in.split(), who, ": per-head inputs do not decode with a cache");
      HL_CHECK(past + T <= context_length, who, ": ", past, " cached + ", T, " new tokens exceed context_length ",
               context_length);
      if (past == 0 || past + T > cache->keys.size(2)) grow(*cache, past + T, context_length, {B, Hkv, D}, first);
      HL_CHECK(cache->keys.size(0) == B, who, ": the cache holds ", cache->keys.size(0), " rows, the input ", B);
      cache->keys.narrow(2, past, T).copy_(k.transpose(1, 2));
      cache->values.narrow(2, past, T).copy_(v.transpose(1, 2));
      cache->length = past + T;
      ctx = scaled_dot_product_attention(q.transpose(1, 2), cache->keys.narrow(2, 0, past + T),
                                         cache->values.narrow(2, 0, past + T), cached_mask(past, B, T, first));
    } else if (keep_weights || site.wants(HookPoint::pattern)) {  // the weights wanted: materialised anyway
      const Tensor scores = matmul(q.transpose(1, 2), repeat_kv(k.transpose(1, 2), H).mT());  // (B, H, T, T)
      const Tensor pattern = site(HookPoint::pattern, causal_softmax(scores, 1.0 / std::sqrt(static_cast<double>(D))));
      if (keep_weights) attention_weights = pattern.detach();
      ctx = matmul(dropout->forward(pattern), repeat_kv(v.transpose(1, 2), H));
    } else {  // fused: reads the strided views directly, saves O(B*H*T) for backward
      ctx = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         AttentionMask::causal(), dropout->p, dropout->is_training());
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
                               .rotary = rotary};
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