// The attention family. Scores are scaled inside the fused softmax kernels (masked or causal), so
// no mask tensor is materialised; the maths is exactly that of the books' code. Where nobody asks
// for the attention weights, the causal modules (and DotProductAttention on request) run the fused
// scaled_dot_product_attention op instead, which never materialises the (.., Q, K) weights.
// Head surgery copies weights into new modules: pruning keeps rows (projections) and columns (output
// projection) of the kept heads; the causal forms all convert through the per-head wrapper.
// B = batch, Q = queries, K = keys, T = tokens, H = heads, D = head size.
#include "nn/attention.h"

#include <cmath>

namespace headlab::nn {

namespace {

void check_rank3(const char* who, const Tensor& t, const char* name) {
  HL_CHECK(t.defined(), who, ": ", name, " is undefined");
  HL_CHECK(t.dim() == 3, who, ": ", name, " must be 3-D (batch, length, features), got shape ", shape_str(t.shape()));
}

// queries (B, Q, *), keys (B, K, *), values (B, K, *), valid_lens (B,) or (B, Q).
void check_qkv(const char* who, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& valid_lens) {
  check_rank3(who, q, "queries");
  check_rank3(who, k, "keys");
  check_rank3(who, v, "values");
  HL_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0), who, ": batch sizes differ: queries ",
           shape_str(q.shape()), ", keys ", shape_str(k.shape()), ", values ", shape_str(v.shape()));
  HL_CHECK(k.size(1) == v.size(1), who, ": keys ", shape_str(k.shape()), " and values ", shape_str(v.shape()),
           " must have the same length");
  if (!valid_lens.defined()) return;
  HL_CHECK(valid_lens.dtype() == DType::i64, who, ": valid_lens must be int64, got ", dtype_name(valid_lens.dtype()));
  const bool ok = (valid_lens.dim() == 1 && valid_lens.size(0) == q.size(0)) ||
                  (valid_lens.dim() == 2 && valid_lens.size(0) == q.size(0) && valid_lens.size(1) == q.size(1));
  HL_CHECK(ok, who, ": valid_lens must have shape [", q.size(0), "] or [", q.size(0), ", ", q.size(1), "], got ",
           shape_str(valid_lens.shape()));
  // Checked here too (masked_softmax checks it again) so that the error names the module.
  const int64_t K = k.size(1);
  for (int64_t len : valid_lens.to_vector<int64_t>())
    HL_CHECK(len >= 0 && len <= K, who, ": valid length ", len, " is out of range for ", K, " keys (expected 0..", K,
             ")");
}

void check_given_context(const char* who, const Tensor& given, int64_t B, int64_t H, int64_t T, int64_t D) {
  HL_CHECK(given.shape() == Shape({B, H, T, D}), who, ": the given head contexts must have shape [", B, ", ", H, ", ",
           T, ", ", D, "], got ", shape_str(given.shape()));
}

// The shape HeadControl gates of rank r must have for a context (B, H, T, D).
Shape gate_shape(int64_t rank, int64_t B, int64_t H, int64_t T) {
  return rank == 1 ? Shape{H} : rank == 2 ? Shape{B, H} : Shape{B, H, T};
}
Shape offset_shape(int64_t rank, int64_t B, int64_t H, int64_t T, int64_t D) {
  return rank == 2 ? Shape{H, D} : rank == 3 ? Shape{B, H, D} : Shape{B, H, T, D};
}

void check_control(const char* who, const Tensor& gates, const Tensor& offsets, int64_t B, int64_t H, int64_t T,
                   int64_t D) {
  if (gates.defined())
    HL_CHECK(gates.dim() >= 1 && gates.dim() <= 3 && gates.shape() == gate_shape(gates.dim(), B, H, T), who,
             ": head gates must have shape [", H, "], [", B, ", ", H, "] or [", B, ", ", H, ", ", T, "], got ",
             shape_str(gates.shape()));
  if (offsets.defined())
    HL_CHECK(offsets.dim() >= 2 && offsets.dim() <= 4 && offsets.shape() == offset_shape(offsets.dim(), B, H, T, D),
             who, ": head offsets must have shape [", H, ", ", D, "], [", B, ", ", H, ", ", D, "] or [", B, ", ", H,
             ", ", T, ", ", D, "], got ", shape_str(offsets.shape()));
}

// Gates and offsets as views that broadcast against the context (B, H, T, D).
Tensor gates_4d(const Tensor& g, int64_t B, int64_t H, int64_t T) {
  return g.dim() == 1 ? g.view({1, H, 1, 1}) : g.dim() == 2 ? g.view({B, H, 1, 1}) : g.view({B, H, T, 1});
}
Tensor offsets_4d(const Tensor& o, int64_t B, int64_t H, int64_t D) {
  return o.dim() == 2 ? o.view({1, H, 1, D}) : o.dim() == 3 ? o.view({B, H, 1, D}) : o;
}

// ctx: (B, H, T, D) -> gates * ctx + offsets; keeps the ungated context if asked.
Tensor apply_head_control(const char* who, const Tensor& ctx, HeadControl& hc, const Tensor& gates_arg) {
  const int64_t B = ctx.size(0), H = ctx.size(1), T = ctx.size(2), D = ctx.size(3);
  if (hc.keep_context) hc.context = ctx.detach();
  const Tensor gates = gates_arg.defined() ? gates_arg : hc.gates;
  check_control(who, gates, hc.offsets, B, H, T, D);
  Tensor out = ctx;
  if (gates.defined()) out = mul(out, gates_4d(gates.to(ctx.dtype()), B, H, T));
  if (hc.offsets.defined()) out = add(out, offsets_4d(hc.offsets.to(ctx.dtype()), B, H, D));
  return out;
}

// d2l's transpose_qkv: (B, n, H*D) -> (B*H, n, D)
Tensor transpose_qkv(const Tensor& X, int64_t H) {
  const int64_t B = X.size(0), n = X.size(1);
  return X.reshape({B, n, H, -1}).permute({0, 2, 1, 3}).reshape({B * H, n, -1});
}

// d2l's transpose_output: (B*H, n, D) -> (B, n, H*D)
Tensor transpose_output(const Tensor& X, int64_t H) {
  const int64_t n = X.size(1);
  return X.reshape({-1, H, n, X.size(2)}).permute({0, 2, 1, 3}).reshape({X.size(0) / H, n, -1});
}

void check_causal_input(const char* who, const Tensor& x, int64_t d_in, int64_t context_length) {
  HL_CHECK(x.defined() && x.dim() == 3, who, ": expected x of shape (batch, tokens, ", d_in, "), got ",
           x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  HL_CHECK(x.size(2) == d_in, who, ": expected x of shape (batch, tokens, ", d_in, "), got ", shape_str(x.shape()));
  HL_CHECK(x.size(1) <= context_length, who, ": ", x.size(1), " tokens exceed context_length ", context_length);
}

// Rows [h*D, (h+1)*D) of every kept head h, as an index tensor: the heads' rows of a (H*D, in)
// projection, or their columns of an (out, H*D) output projection.
Tensor head_rows(const std::vector<int64_t>& keep, int64_t D, Device device) {
  std::vector<int64_t> rows;
  for (int64_t h : keep)
    for (int64_t i = 0; i < D; ++i) rows.push_back(h * D + i);
  return tensor(rows, {static_cast<int64_t>(rows.size())}, device);
}

// A freshly built module made to match `src`: its dtype (from its first parameter), device and mode.
void like(Module& dst, const Module& src) {
  const NamedTensors params = src.named_parameters();
  if (!params.empty()) dst.to(params.front().second.dtype());
  dst.to(src.device());
  dst.train(src.is_training());
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

// What Linear(in, out, bias) holds.
double linear_parameters(int64_t in, int64_t out, bool bias) {
  return static_cast<double>(in) * static_cast<double>(out) + (bias ? static_cast<double>(out) : 0.0);
}

}  // namespace

// ---- head control and head selection ----
HeadControl HeadControl::select_heads(const std::vector<int64_t>& keep) const {
  auto pick = [&](const Tensor& t, int64_t head_dim) {
    if (!t.defined()) return t;
    Tensor out;
    {
      NoGradGuard no_grad;
      out = index_select(t, head_dim, tensor(keep, {static_cast<int64_t>(keep.size())}, t.device()));
    }
    if (t.requires_grad()) out.requires_grad_();
    return out;
  };
  HeadControl c;
  if (gates.defined()) c.gates = pick(gates, gates.dim() == 1 ? 0 : 1);          // (H), (B, H), (B, H, T)
  if (offsets.defined()) c.offsets = pick(offsets, offsets.dim() == 2 ? 0 : 1);  // (H, D), (B, H, [T,] D)
  c.keep_context = keep_context;
  c.context = pick(context, 1);              // (B, H, T, D)
  c.given_context = pick(given_context, 1);  // (B, H, T, D)
  return c;
}

void check_head_selection(const std::vector<int64_t>& keep, int64_t H, const std::string& who,
                          const std::string& subject) {
  HL_CHECK(!keep.empty(), who, ": ", subject, " must keep at least one head");
  for (size_t i = 0; i < keep.size(); ++i) {
    HL_CHECK(keep[i] >= 0 && keep[i] < H, who, ": ", subject, " has no head ", keep[i], " (it has ", H, ")");
    HL_CHECK(i == 0 || keep[i] > keep[i - 1], who, ": the heads kept in ", subject, " must be sorted and distinct");
  }
}

// ---- DotProductAttention ----
DotProductAttention::DotProductAttention(double p) {
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

Tensor DotProductAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                    const Tensor& valid_lens) {
  check_qkv("DotProductAttention", queries, keys, values, valid_lens);
  HL_CHECK(queries.size(2) == keys.size(2), "DotProductAttention: queries ", shape_str(queries.shape()), " and keys ",
           shape_str(keys.shape()), " must have the same feature size");
  const double d = static_cast<double>(queries.size(2));
  if (!keep_attention_weights) {
    attention_weights = Tensor();
    return scaled_dot_product_attention(queries, keys, values, AttentionMask::lengths(valid_lens), dropout->p,
                                        dropout->is_training());  // (B, Q, v)
  }
  const Tensor scores = matmul(queries, keys.mT());  // (B, Q, K)
  const Tensor weights = headlab::masked_softmax(scores, valid_lens, 1.0 / std::sqrt(d));
  attention_weights = weights.detach();
  return matmul(dropout->forward(weights), values);  // (B, Q, v)
}

// ---- AdditiveAttention ----
AdditiveAttention::AdditiveAttention(int64_t key_size, int64_t query_size, int64_t num_hiddens, double p) {
  W_k = register_module("W_k", std::make_shared<Linear>(key_size, num_hiddens, false));
  W_q = register_module("W_q", std::make_shared<Linear>(query_size, num_hiddens, false));
  w_v = register_module("w_v", std::make_shared<Linear>(num_hiddens, 1, false));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

Tensor AdditiveAttention::forward(const Tensor& queries_in, const Tensor& keys_in, const Tensor& values,
                                  const Tensor& valid_lens) {
  check_qkv("AdditiveAttention", queries_in, keys_in, values, valid_lens);
  HL_CHECK(queries_in.size(2) == W_q->in_features, "AdditiveAttention: queries must have ", W_q->in_features,
           " features, got shape ", shape_str(queries_in.shape()));
  HL_CHECK(keys_in.size(2) == W_k->in_features, "AdditiveAttention: keys must have ", W_k->in_features,
           " features, got shape ", shape_str(keys_in.shape()));
  const Tensor queries = W_q->forward(queries_in), keys = W_k->forward(keys_in);  // (B, Q, h), (B, K, h)
  const Tensor features = tanh(add(queries.unsqueeze(2), keys.unsqueeze(1)));     // (B, Q, K, h)
  const Tensor scores = w_v->forward(features).squeeze(-1);                       // (B, Q, K)
  const Tensor weights = headlab::masked_softmax(scores, valid_lens, 1.0);
  attention_weights = weights.detach();
  return matmul(dropout->forward(weights), values);
}

// ---- MultiHeadAttention (d2l) ----
MultiHeadAttention::MultiHeadAttention(int64_t key_size, int64_t query_size, int64_t value_size, int64_t hiddens,
                                       int64_t H, double p, bool bias, int64_t out_size)
    : num_heads(H), num_hiddens(hiddens) {
  HL_CHECK(H > 0 && hiddens % H == 0, "MultiHeadAttention: num_hiddens ", hiddens,
           " must be a positive multiple of num_heads ", H);
  attention = register_module("attention", std::make_shared<DotProductAttention>(p));
  W_q = register_module("W_q", std::make_shared<Linear>(query_size, hiddens, bias));
  W_k = register_module("W_k", std::make_shared<Linear>(key_size, hiddens, bias));
  W_v = register_module("W_v", std::make_shared<Linear>(value_size, hiddens, bias));
  W_o = register_module("W_o", std::make_shared<Linear>(hiddens, out_size < 0 ? hiddens : out_size, bias));
}

double MultiHeadAttention::parameter_count(int64_t key_size, int64_t query_size, int64_t value_size, int64_t hiddens,
                                           bool bias, int64_t out_size) {
  return linear_parameters(query_size, hiddens, bias) + linear_parameters(key_size, hiddens, bias) +
         linear_parameters(value_size, hiddens, bias) +
         linear_parameters(hiddens, out_size < 0 ? hiddens : out_size, bias);
}

std::shared_ptr<MultiHeadAttention> MultiHeadAttention::prune_heads(const std::vector<int64_t>& keep) const {
  check_head_selection(keep, num_heads, "MultiHeadAttention", "the module");
  const int64_t n = static_cast<int64_t>(keep.size()), D = head_size();
  const bool bias = W_q->bias.defined();
  auto m = std::make_shared<MultiHeadAttention>(W_k->in_features, W_q->in_features, W_v->in_features, n * D, n,
                                                attention->dropout->p, bias, W_o->out_features);
  like(*m, *this);
  NoGradGuard no_grad;
  const Tensor rows = head_rows(keep, D, W_q->weight.device());
  for (const auto& [dst, src] : {std::pair{m->W_q, W_q}, std::pair{m->W_k, W_k}, std::pair{m->W_v, W_v}}) {
    dst->weight.detach().copy_(index_select(src->weight, 0, rows));  // (n*D, in) of (H*D, in)
    if (bias) dst->bias.detach().copy_(index_select(src->bias, 0, rows));
  }
  m->W_o->weight.detach().copy_(index_select(W_o->weight, 1, rows));  // (out, n*D) of (out, H*D)
  if (bias) m->W_o->bias.detach().copy_(W_o->bias);
  m->attention->keep_attention_weights = attention->keep_attention_weights;
  m->heads = heads.select_heads(keep);
  return m;
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& keys, const Tensor& values,
                                   const Tensor& valid_lens, const Tensor& gates) {
  const char* who = "MultiHeadAttention";
  check_qkv(who, queries, keys, values, valid_lens);
  HL_CHECK(queries.size(2) == W_q->in_features, who, ": queries must have ", W_q->in_features, " features, got shape ",
           shape_str(queries.shape()));
  HL_CHECK(keys.size(2) == W_k->in_features, who, ": keys must have ", W_k->in_features, " features, got shape ",
           shape_str(keys.shape()));
  HL_CHECK(values.size(2) == W_v->in_features, who, ": values must have ", W_v->in_features, " features, got shape ",
           shape_str(values.shape()));
  const int64_t B = queries.size(0), Q = queries.size(1), K = keys.size(1), H = num_heads;
  const Tensor q = transpose_qkv(W_q->forward(queries), H);  // (B*H, Q, D)
  const Tensor k = transpose_qkv(W_k->forward(keys), H);     // (B*H, K, D)
  const Tensor v = transpose_qkv(W_v->forward(values), H);   // (B*H, K, D)
  // As d2l: each batch entry's valid_lens repeated for its heads.
  const Tensor vl = valid_lens.defined() ? repeat_interleave(valid_lens, H, 0) : Tensor();
  const Tensor out = attention->forward(q, k, v, vl);  // (B*H, Q, D)
  const Tensor& w = attention->attention_weights;
  attention_weights = w.defined() ? w.view({B, H, Q, K}) : Tensor();
  const Tensor ctx = apply_head_control(who, out.view({B, H, Q, -1}), heads, gates);
  return W_o->forward(transpose_output(ctx.reshape({B * H, Q, -1}), H));  // (B, Q, num_hiddens)
}

// ---- CausalAttention ----
CausalAttention::CausalAttention(int64_t din, int64_t dout, int64_t ctx, double p, bool qkv_bias)
    : d_in(din), d_out(dout), context_length(ctx) {
  HL_CHECK(ctx > 0, "CausalAttention: context_length must be positive, got ", ctx);
  W_query = register_module("W_query", std::make_shared<Linear>(din, dout, qkv_bias));
  W_key = register_module("W_key", std::make_shared<Linear>(din, dout, qkv_bias));
  W_value = register_module("W_value", std::make_shared<Linear>(din, dout, qkv_bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

double CausalAttention::parameter_count(int64_t din, int64_t dout, bool qkv_bias) {
  return 3 * linear_parameters(din, dout, qkv_bias);  // W_query, W_key, W_value
}

Tensor CausalAttention::forward(const Tensor& x) {
  check_causal_input("CausalAttention", x, d_in, context_length);
  const Tensor keys = W_key->forward(x), queries = W_query->forward(x), values = W_value->forward(x);  // (B, T, d_out)
  if (!keep_attention_weights)
    return scaled_dot_product_attention(queries, keys, values, AttentionMask::causal(), dropout->p,
                                        dropout->is_training());
  const Tensor scores = matmul(queries, keys.mT());  // (B, T, T)
  const Tensor weights = causal_softmax(scores, 1.0 / std::sqrt(static_cast<double>(d_out)));
  attention_weights = weights.detach();
  return matmul(dropout->forward(weights), values);
}

// ---- MultiHeadAttentionWrapper ----
MultiHeadAttentionWrapper::MultiHeadAttentionWrapper(int64_t din, int64_t dout, int64_t ctx, double p, int64_t H,
                                                     bool bias, bool with_out_proj, int64_t out_dim)
    : d_in(din), d_out(dout), context_length(ctx), num_heads(H), dropout_p(p), qkv_bias(bias) {
  HL_CHECK(H >= 0, "MultiHeadAttentionWrapper: num_heads must be >= 0, got ", H);
  heads = register_module("heads", std::make_shared<ModuleList>());
  for (int64_t h = 0; h < H; ++h) heads->push_back(std::make_shared<CausalAttention>(din, dout, ctx, p, bias));
  if (with_out_proj)
    out_proj = register_module("out_proj", std::make_shared<Linear>(H * dout, out_dim < 0 ? H * dout : out_dim));
}

std::shared_ptr<MultiHeadAttentionWrapper> MultiHeadAttentionWrapper::create(const CausalAttentionSizes& s) {
  return std::make_shared<MultiHeadAttentionWrapper>(s.d_in, s.head_dim, s.context_length, s.dropout, s.num_heads,
                                                     s.qkv_bias, true, s.d_out);
}

double MultiHeadAttentionWrapper::parameter_count(const CausalAttentionSizes& s) {
  return static_cast<double>(s.num_heads) * CausalAttention::parameter_count(s.d_in, s.head_dim, s.qkv_bias) +
         linear_parameters(s.num_heads * s.head_dim, s.d_out, true);  // heads, out_proj
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

std::shared_ptr<MultiHeadAttentionWrapper> MultiHeadAttentionWrapper::select_heads(
    const std::vector<int64_t>& keep) const {
  check_head_selection(keep, num_heads, "MultiHeadAttentionWrapper", "the module");
  const int64_t n = static_cast<int64_t>(keep.size());
  auto w = std::make_shared<MultiHeadAttentionWrapper>(d_in, d_out, context_length, dropout_p, n, qkv_bias,
                                                       out_proj != nullptr, out_proj ? out_proj->out_features : -1);
  like(*w, *this);
  for (int64_t i = 0; i < n; ++i)
    copy_parameters(*w->heads->at<CausalAttention>(static_cast<size_t>(i)),
                    *heads->at<CausalAttention>(static_cast<size_t>(keep[static_cast<size_t>(i)])));
  if (out_proj) {
    NoGradGuard no_grad;
    const Tensor cols = head_rows(keep, d_out, out_proj->weight.device());
    w->out_proj->weight.detach().copy_(index_select(out_proj->weight, 1, cols));  // (out, n*D) of (out, H*D)
    w->out_proj->bias.detach().copy_(out_proj->bias);
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

// ---- CausalMultiHeadAttention (fused) ----
CausalMultiHeadAttention::CausalMultiHeadAttention(int64_t din, int64_t dout, int64_t ctx, double p, int64_t H,
                                                   bool bias, int64_t hd)
    : d_in(din), d_out(dout), context_length(ctx), num_heads(H), dropout_p(p), qkv_bias(bias) {
  if (hd < 0) {
    HL_CHECK(H > 0 && dout % H == 0, "CausalMultiHeadAttention: d_out ", dout, " must be divisible by num_heads ", H);
    hd = dout / H;
  }
  HL_CHECK(ctx > 0, "CausalMultiHeadAttention: context_length must be positive, got ", ctx);
  head_dim = hd;
  const int64_t inner = H * hd;
  W_query = register_module("W_query", std::make_shared<Linear>(din, inner, bias));
  W_key = register_module("W_key", std::make_shared<Linear>(din, inner, bias));
  W_value = register_module("W_value", std::make_shared<Linear>(din, inner, bias));
  out_proj = register_module("out_proj", std::make_shared<Linear>(inner, dout));
  dropout = register_module("dropout", std::make_shared<Dropout>(p));
}

std::shared_ptr<CausalMultiHeadAttention> CausalMultiHeadAttention::create(const CausalAttentionSizes& s) {
  return std::make_shared<CausalMultiHeadAttention>(s.d_in, s.d_out, s.context_length, s.dropout, s.num_heads,
                                                    s.qkv_bias, s.head_dim);
}

double CausalMultiHeadAttention::parameter_count(const CausalAttentionSizes& s) {
  const int64_t inner = s.num_heads * s.head_dim;
  return 3 * linear_parameters(s.d_in, inner, s.qkv_bias) + linear_parameters(inner, s.d_out, true);
}

Tensor CausalMultiHeadAttention::forward(const Tensor& x, const Tensor& gates) {
  const char* who = "CausalMultiHeadAttention";
  check_causal_input(who, x, d_in, context_length);
  const int64_t B = x.size(0), T = x.size(1), H = num_heads, D = head_dim;
  Tensor ctx;  // (B, H, T, D)
  if (head_control.given_context.defined()) {
    check_given_context(who, head_control.given_context, B, H, T, D);
    ctx = head_control.given_context;
  } else if (keep_weights) {  // analysis wants the weights: the composite path materialises them anyway
    const auto [queries, keys, values] = project_qkv(x);
    const Tensor scores = matmul(queries, keys.mT());  // (B, H, T, T)
    const Tensor weights = causal_softmax(scores, 1.0 / std::sqrt(static_cast<double>(D)));
    attention_weights = weights.detach();
    ctx = matmul(dropout->forward(weights), values);
  } else {  // fused: reads the strided views directly, saves O(B*H*T) for backward
    const auto [queries, keys, values] = project_qkv(x);
    ctx = scaled_dot_product_attention(queries, keys, values, AttentionMask::causal(), dropout->p,
                                       dropout->is_training());
  }
  ctx = apply_head_control(who, ctx, head_control, gates);
  return out_proj->forward(ctx.transpose(1, 2).reshape({B, T, H * D}));  // (B, T, d_out)
}

Tensor CausalMultiHead::forward_cached(const Tensor&, KVCache&) {
  HL_FAIL(type_name(), ": no key/value cache for this attention form; check supports_kv_cache()");
}

Tensor CausalMultiHeadAttention::forward_cached(const Tensor& x, KVCache& cache) {
  const char* who = "CausalMultiHeadAttention (cached)";
  HL_CHECK(x.defined() && x.dim() == 3 && x.size(2) == d_in, who, ": expected x of shape (batch, tokens, ", d_in,
           "), got ", x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  const int64_t B = x.size(0), T = x.size(1), H = num_heads, D = head_dim, past = cache.length;
  HL_CHECK(past == 0 || T == 1, who, ": after the prefill the cache takes one token a step, got ", T);
  HL_CHECK(past + T <= context_length, who, ": ", past, " cached + ", T, " new tokens exceed context_length ",
           context_length);
  if (past == 0) {
    cache.keys = Tensor::empty({B, H, context_length, D}, x.dtype(), x.device());
    cache.values = Tensor::empty({B, H, context_length, D}, x.dtype(), x.device());
  }
  HL_CHECK(cache.keys.size(0) == B, who, ": the cache holds ", cache.keys.size(0), " rows, the input ", B);
  const auto [queries, keys, values] = project_qkv(x);  // (B, H, T, D)
  cache.keys.narrow(2, past, T).copy_(keys);
  cache.values.narrow(2, past, T).copy_(values);
  cache.length = past + T;
  // A prefill is causal within itself; a new token sees every cached position.
  Tensor ctx =
      scaled_dot_product_attention(queries, cache.keys.narrow(2, 0, past + T), cache.values.narrow(2, 0, past + T),
                                   past == 0 ? AttentionMask::causal() : AttentionMask::none());
  ctx = apply_head_control(who, ctx, head_control, Tensor());
  return out_proj->forward(ctx.transpose(1, 2).reshape({B, T, H * D}));  // (B, T, d_out)
}

// x (B, T, d_in) -> queries, keys, values (B, H, T, D): views of the projections, no copies; matmul
// batches over H and loops over B.
std::tuple<Tensor, Tensor, Tensor> CausalMultiHeadAttention::project_qkv(const Tensor& x) const {
  const int64_t B = x.size(0), T = x.size(1), H = num_heads, D = head_dim;
  auto heads = [&](Linear& proj) { return proj.forward(x).view({B, T, H, D}).transpose(1, 2); };
  return {heads(*W_query), heads(*W_key), heads(*W_value)};
}

// ---- conversion: every causal form to and from per-head form ----
std::shared_ptr<CausalMultiHead> CausalMultiHead::prune_heads(const std::vector<int64_t>& keep) const {
  check_head_selection(keep, head_count(), type_name(), "the module");  // before the split, naming this module
  return merge_heads(*split_heads()->select_heads(keep), form());
}

std::shared_ptr<CausalMultiHeadAttention> CausalMultiHeadAttention::merge_heads(const MultiHeadAttentionWrapper& w) {
  const int64_t H = w.num_heads, D = w.d_out, inner = H * D;
  HL_CHECK(H > 0, "wrapper_to_fused: the wrapper has no heads");
  const int64_t out_dim = w.out_proj ? w.out_proj->out_features : inner;
  auto f = std::make_shared<CausalMultiHeadAttention>(w.d_in, out_dim, w.context_length, w.dropout_p, H, w.qkv_bias, D);
  like(*f, w);
  NoGradGuard no_grad;
  auto stack_rows = [&](auto pick) {
    std::vector<Tensor> parts;
    for (int64_t h = 0; h < H; ++h) parts.push_back(pick(*w.heads->at<CausalAttention>(static_cast<size_t>(h))));
    return cat(parts, 0);
  };
  f->W_query->weight.detach().copy_(stack_rows([](CausalAttention& a) { return a.W_query->weight; }));
  f->W_key->weight.detach().copy_(stack_rows([](CausalAttention& a) { return a.W_key->weight; }));
  f->W_value->weight.detach().copy_(stack_rows([](CausalAttention& a) { return a.W_value->weight; }));
  if (w.qkv_bias) {
    f->W_query->bias.detach().copy_(stack_rows([](CausalAttention& a) { return a.W_query->bias; }));
    f->W_key->bias.detach().copy_(stack_rows([](CausalAttention& a) { return a.W_key->bias; }));
    f->W_value->bias.detach().copy_(stack_rows([](CausalAttention& a) { return a.W_value->bias; }));
  }
  if (w.out_proj) {
    f->out_proj->weight.detach().copy_(w.out_proj->weight);
    f->out_proj->bias.detach().copy_(w.out_proj->bias);
  } else {  // concatenation alone: an identity projection
    f->out_proj->weight.detach().copy_(eye(inner, f->out_proj->weight.dtype(), f->out_proj->weight.device()));
    f->out_proj->bias.detach().zero_();
  }
  f->keep_weights = w.heads->at<CausalAttention>(0)->keep_attention_weights;
  f->head_control = w.head_control;
  return f;
}

std::shared_ptr<MultiHeadAttentionWrapper> CausalMultiHeadAttention::split_heads() const {
  const int64_t H = num_heads, D = head_dim;
  HL_CHECK(H > 0, "fused_to_wrapper: the module has no heads");
  auto w = std::make_shared<MultiHeadAttentionWrapper>(d_in, D, context_length, dropout_p, H, qkv_bias, true, d_out);
  like(*w, *this);
  NoGradGuard no_grad;
  for (int64_t h = 0; h < H; ++h) {
    auto head = w->heads->at<CausalAttention>(static_cast<size_t>(h));
    head->W_query->weight.detach().copy_(W_query->weight.narrow(0, h * D, D));
    head->W_key->weight.detach().copy_(W_key->weight.narrow(0, h * D, D));
    head->W_value->weight.detach().copy_(W_value->weight.narrow(0, h * D, D));
    if (qkv_bias) {
      head->W_query->bias.detach().copy_(W_query->bias.narrow(0, h * D, D));
      head->W_key->bias.detach().copy_(W_key->bias.narrow(0, h * D, D));
      head->W_value->bias.detach().copy_(W_value->bias.narrow(0, h * D, D));
    }
  }
  w->out_proj->weight.detach().copy_(out_proj->weight);
  w->out_proj->bias.detach().copy_(out_proj->bias);
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
