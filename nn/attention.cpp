// d2l's attention modules (DotProductAttention, AdditiveAttention, MultiHeadAttention), the head control
// every multi-head module applies, and the helpers head surgery shares (attention_internal.h). Scores are
// scaled inside the fused softmax kernels (masked or causal), so no mask tensor is materialised; the
// maths is exactly that of d2l's code. Where nobody asks for the attention weights, DotProductAttention
// (on request) runs the fused scaled_dot_product_attention op instead, which never materialises the
// (.., Q, K) weights.
// B = batch, Q = queries, K = keys, T = tokens, H = heads, D = head size.
#include "nn/attention.h"

#include <cmath>

#include "nn/attention_internal.h"

namespace headlab::nn {

namespace {

// The shape HeadControl gates of rank r must have for a context (B, H, T, D).
Shape gate_shape(int64_t rank, int64_t B, int64_t H, int64_t T) {
  return rank == 1 ? Shape{H} : rank == 2 ? Shape{B, H} : Shape{B, H, T};
}
Shape offset_shape(int64_t rank, int64_t B, int64_t H, int64_t T, int64_t D) {
  return rank == 2 ? Shape{H, D} : rank == 3 ? Shape{B, H, D} : Shape{B, H, T, D};
}

}  // namespace

namespace detail {

void check_given_context(const char* who, const Tensor& given, int64_t B, int64_t H, int64_t T, int64_t D) {
  HL_CHECK(given.shape() == Shape({B, H, T, D}), who, ": the given head contexts must have shape [", B, ", ", H, ", ",
           T, ", ", D, "], got ", shape_str(given.shape()));
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

Tensor gates_4d(const Tensor& g, int64_t B, int64_t H, int64_t T) {
  return g.dim() == 1 ? g.view({1, H, 1, 1}) : g.dim() == 2 ? g.view({B, H, 1, 1}) : g.view({B, H, T, 1});
}

Tensor offsets_4d(const Tensor& o, int64_t B, int64_t H, int64_t D) {
  return o.dim() == 2 ? o.view({1, H, 1, D}) : o.dim() == 3 ? o.view({B, H, 1, D}) : o;
}

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

Tensor head_rows(const std::vector<int64_t>& keep, int64_t D, Device device) {
  std::vector<int64_t> rows;
  for (int64_t h : keep)
    for (int64_t i = 0; i < D; ++i) rows.push_back(h * D + i);
  return tensor(rows, {static_cast<int64_t>(rows.size())}, device);
}

void like(Module& dst, const Module& src) {
  const NamedTensors params = src.named_parameters();
  if (!params.empty()) dst.to(params.front().second.dtype());
  dst.to(src.device());
  dst.train(src.is_training());
}

double linear_parameters(int64_t in, int64_t out, bool bias) {
  return static_cast<double>(in) * static_cast<double>(out) + (bias ? static_cast<double>(out) : 0.0);
}

}  // namespace detail

using namespace detail;

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

}  // namespace headlab::nn
