// Scaled-dot-product attention as one op: softmax(scale * q k^T, masked) (dropped out) @ v. The fused
// kernels (the CPU: any head size; CUDA: up to 256) save q, k, v, the output and one log-sum-exp per
// query row, O(B*H*T), instead of the (B, H, Tq, Tk) scores, weights and dropout mask of the composite
// path (matmul, causal_softmax / masked_softmax, dropout, matmul), which runs otherwise (see
// set_fused_attention) and stays the reference the fused kernels are tested against.
// Grouped-query attention: k and v may have fewer heads than q (Hkv dividing H); query head h reads key/value
// head h / (H / Hkv). Kernels that read them grouped (has_grouped_attention) never repeat them.
// B = batch, H = heads, Hkv = key/value heads, Tq = queries, Tk = keys, D = q/k head size, Dv = v head size.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/internal.h"

namespace headlab {

namespace {

struct AttnShape {
  int64_t B, H, Tq, Tk, D, Dv;
  int64_t Hkv;  // key/value heads: H, or a divisor of it (grouped-query)
  bool heads;   // 4-D inputs (B, H, T, *); 3-D ones (B, T, *) run as H = 1
};

AttnShape check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                          double dropout_p) {
  const char* op = "scaled_dot_product_attention";
  for (const Tensor* t : {&q, &k, &v}) {
    detail::check_defined(op, *t);
    detail::check_floating(op, *t);
  }
  check_same_device(op, q, k);
  check_same_device(op, q, v);
  detail::check_same_dtype(op, q, k);
  detail::check_same_dtype(op, q, v);
  HL_CHECK((q.dim() == 3 || q.dim() == 4) && k.dim() == q.dim() && v.dim() == q.dim(), op,
           ": expected q, k, v of shape (B, H, T, D) or (B, T, D), got ", shape_str(q.shape()), ", ",
           shape_str(k.shape()), ", ", shape_str(v.shape()));
  const bool heads = q.dim() == 4;
  const int64_t B = q.size(0), H = heads ? q.size(1) : 1;
  const int64_t Hkv = heads ? k.size(1) : 1;
  for (const Tensor* t : {&k, &v})
    HL_CHECK(t->size(0) == B && (!heads || (t->size(1) == Hkv && Hkv > 0 && H % Hkv == 0) || (H == 0 && Hkv == 0)), op,
             ": batch and head dims differ: q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ",
             shape_str(v.shape()), " (k and v need the same heads, which must divide q's)");
  HL_CHECK(q.size(-1) == k.size(-1), op, ": q ", shape_str(q.shape()), " and k ", shape_str(k.shape()),
           " must have the same head size");
  HL_CHECK(k.size(-2) == v.size(-2), op, ": k ", shape_str(k.shape()), " and v ", shape_str(v.shape()),
           " must have the same number of keys");
  HL_CHECK(dropout_p >= 0 && dropout_p <= 1, op, ": dropout probability must be in [0, 1], got ", dropout_p);
  const AttnShape s{B, H, q.size(-2), k.size(-2), q.size(-1), v.size(-1), Hkv, heads};
  if (mask.kind == AttentionMask::Kind::causal)
    HL_CHECK(s.Tq == s.Tk, op, ": a causal mask needs as many queries as keys, got ", s.Tq, " and ", s.Tk);
  HL_CHECK(mask.window >= 0, op, ": the attention window must be >= 0 keys, got ", mask.window);
  if (mask.kind == AttentionMask::Kind::lengths) {
    const Tensor& vl = mask.valid_lens;
    detail::check_index_tensor(op, vl, "valid_lens");
    check_same_device(op, q, vl);
    HL_CHECK((vl.dim() == 1 && vl.size(0) == B) || (vl.dim() == 2 && vl.size(0) == B && vl.size(1) == s.Tq), op,
             ": valid_lens must have shape [", B, "] or [", B, ", ", s.Tq, "], got ", shape_str(vl.shape()));
    for (int64_t len : vl.to_vector<int64_t>())
      HL_CHECK(len >= 0 && len <= s.Tk, op, ": valid length ", len, " is out of range for ", s.Tk,
               " keys (expected 0..", s.Tk, ")");
  }
  return s;
}

// t with a unit-stride last dim (the kernels' one layout requirement), detached.
Tensor unit_last(const Tensor& t) {
  const Tensor d = t.detach();
  return d.size(-1) <= 1 || d.stride(-1) == 1 ? d : contiguous(d);
}

template <typename View = AttnOperand>
View attn_view(const Tensor& t, bool heads) {
  return heads ? View{t.raw_data(), t.stride(0), t.stride(1), t.stride(2)}
               : View{t.raw_data(), t.stride(0), 0, t.stride(1)};
}

// A new (B, H, T, C) result laid out as (B, T, H, C): the layout the multi-head modules' projections
// have, so that merging the heads back (and the projections' backward) are views, not copies.
Tensor empty_result(const AttnShape& s, int64_t T, int64_t C, const Tensor& like) {
  if (!s.heads) return Tensor::empty({s.B, T, C}, like.dtype(), like.device());
  return Tensor::empty({s.B, T, s.H, C}, like.dtype(), like.device()).transpose(1, 2);
}

}  // namespace

namespace {
std::atomic<FusedAttention> g_fused_attention{FusedAttention::automatic};
}  // namespace

void set_fused_attention(FusedAttention when) { g_fused_attention.store(when, std::memory_order_relaxed); }
FusedAttention fused_attention() { return g_fused_attention.load(std::memory_order_relaxed); }

std::atomic<bool> g_deterministic_attention{false};
void set_deterministic_attention(bool on) { g_deterministic_attention.store(on, std::memory_order_relaxed); }
bool deterministic_attention() { return g_deterministic_attention.load(std::memory_order_relaxed); }

Tensor repeat_kv(const Tensor& t, int64_t H) {
  HL_CHECK(t.dim() == 4 && t.size(1) > 0 && H % t.size(1) == 0, "repeat_kv: expected (B, Hkv, T, C) with Hkv dividing ",
           H, ", got ", shape_str(t.shape()));
  const int64_t Hkv = t.size(1);
  if (Hkv == H) return t;
  return t.unsqueeze(2)
      .expand({t.size(0), Hkv, H / Hkv, t.size(2), t.size(3)})
      .reshape({t.size(0), H, t.size(2), t.size(3)});
}

AttentionMask AttentionMask::lengths(const Tensor& valid_lens) {
  return valid_lens.defined() ? AttentionMask{Kind::lengths, valid_lens} : AttentionMask{};
}

Tensor scaled_dot_product_attention_composite(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const AttentionMask& mask, double dropout_p, bool training,
                                              Generator& gen, std::optional<double> scale, double softcap) {
  const OpScope scope("scaled_dot_product_attention");
  const AttnShape s = check_attention(q, k, v, mask, dropout_p);
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  if (s.heads && s.Hkv != s.H)  // the reference repeats the shared keys and values
    return scaled_dot_product_attention_composite(q, repeat_kv(k, s.H), repeat_kv(v, s.H), mask, dropout_p, training,
                                                  gen, scale, softcap);
  const Tensor weights = attention_softmax(matmul(q, k.mT()), mask, sc, softcap);  // (B, H, Tq, Tk)
  return matmul(dropout(weights, dropout_p, training, gen), v);           // (B, H, Tq, Dv)
}

namespace {

// Whether a window hides any key from any row: some row sees more than `window` keys without it.
bool window_binds(const AttentionMask& mask, int64_t Tk) { return mask.window > 0 && mask.window < Tk; }

// True at the keys a window hides, (B or 1, 1, Tq, Tk) bool: row i's keys before (its last visible key + 1 - w).
Tensor hidden_by_window(const AttentionMask& mask, int64_t B, int64_t Tq, int64_t Tk, Device device) {
  std::vector<int64_t> ends;  // each row's visible keys end (exclusive), per batch row where lengths differ
  if (mask.kind == AttentionMask::Kind::lengths) {
    const std::vector<int64_t> vl = mask.valid_lens.to_vector<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Tq; ++i)
        ends.push_back(vl[static_cast<size_t>(mask.valid_lens.dim() == 1 ? b : b * Tq + i)]);
  } else {
    for (int64_t i = 0; i < Tq; ++i) ends.push_back(mask.kind == AttentionMask::Kind::causal ? i + 1 : Tk);
  }
  const int64_t rows = static_cast<int64_t>(ends.size()) / Tq;
  for (int64_t& e : ends) e = std::max<int64_t>(0, e - mask.window);  // the first visible key
  const Tensor first = tensor(ends, {rows, 1, Tq, 1}).to(device);
  return lt(arange(0, static_cast<double>(Tk), 1, DType::i64, device).view({1, 1, 1, Tk}), first);
}

}  // namespace

Tensor attention_softmax(const Tensor& scores_in, const AttentionMask& mask, double sc, double softcap) {
  const bool heads = scores_in.dim() == 4;
  HL_CHECK(scores_in.dim() == 3 || heads, "attention_softmax: expected scores (B, H, Tq, Tk) or (B, Tq, Tk), got ",
           shape_str(scores_in.shape()));
  HL_CHECK(softcap >= 0 && std::isfinite(softcap), "attention_softmax: softcap must be finite and >= 0, got ", softcap);
  const int64_t B = scores_in.size(0), H = heads ? scores_in.size(1) : 1, Tq = scores_in.size(-2),
                Tk = scores_in.size(-1);
  Tensor scores = scores_in;
  if (softcap > 0) {  // cap * tanh(sc * s / cap), then the softmax at scale 1
    scores = mul(tanh(mul(scores, sc / softcap)), softcap);
    sc = 1.0;
  }
  if (window_binds(mask, Tk)) {
    const Tensor hidden = hidden_by_window(mask, B, Tq, Tk, scores.device());
    scores = masked_fill(scores, heads ? hidden : hidden.squeeze(1), -std::numeric_limits<double>::infinity());
  }
  if (mask.kind == AttentionMask::Kind::causal) return causal_softmax(scores, sc);
  if (mask.kind == AttentionMask::Kind::lengths && heads) {
    // masked_softmax reads (..., Tq, Tk) scores as rows of B*H: one length per (b, h) or per (b, h*Tq + i).
    const Tensor& vl = mask.valid_lens;
    const Tensor lens =
        vl.dim() == 1 ? repeat_interleave(vl, H, 0) : vl.unsqueeze(1).expand({B, H, Tq}).reshape({B, H * Tq});
    return masked_softmax(scores, lens, sc);
  }
  return masked_softmax(scores, mask.kind == AttentionMask::Kind::lengths ? mask.valid_lens : Tensor(), sc);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionMask& mask,
                                    double dropout_p, bool training, Generator& gen, std::optional<double> scale,
                                    double softcap) {
  const OpScope scope("scaled_dot_product_attention");
  const AttnShape s = check_attention(q, k, v, mask, dropout_p);
  Backend& be = backend_of(q);
  const FusedAttention when = fused_attention();
  const bool backward = grad_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const bool fused =
      when != FusedAttention::never && be.has_fused_attention(s.D, s.Dv) &&
      (when == FusedAttention::always ||
       be.fused_attention_is_faster(q.dtype(), s.Tq, s.Tk, s.D, s.Dv, training && dropout_p > 0, backward));
  // A window that hides keys runs the composite path (the fused kernels see a row's keys up to its end only), as
  // soft-capped scores do (the kernels have no tanh).
  if (!fused || window_binds(mask, s.Tk) || softcap > 0)
    return scaled_dot_product_attention_composite(q, k, v, mask, dropout_p, training, gen, scale, softcap);
  if (s.heads && s.Hkv != s.H && !be.has_grouped_attention())
    return scaled_dot_product_attention(q, repeat_kv(k, s.H), repeat_kv(v, s.H), mask, dropout_p, training, gen, scale);
  AttnParams a;
  a.group = s.heads && s.Hkv ? s.H / s.Hkv : 1;
  a.deterministic = deterministic_attention();
  a.B = s.B, a.H = s.H, a.Tq = s.Tq, a.Tk = s.Tk, a.D = s.D, a.Dv = s.Dv;
  a.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  a.mask = mask.kind == AttentionMask::Kind::causal    ? SoftmaxMask::causal
           : mask.kind == AttentionMask::Kind::lengths ? SoftmaxMask::lengths
                                                       : SoftmaxMask::none;
  // Per-row lengths (B*H*Tq): a few bytes per query, rebuilt in backward from the same tensor.
  Tensor lengths;
  if (a.mask == SoftmaxMask::lengths) {
    const Tensor& vl = mask.valid_lens;
    lengths = contiguous(vl.dim() == 1 ? vl.view({s.B, 1, 1}).expand({s.B, s.H, s.Tq})
                                       : vl.view({s.B, 1, s.Tq}).expand({s.B, s.H, s.Tq}));
    a.lengths = lengths.data<int64_t>();
  }
  if (training && dropout_p > 0) {  // the same counters the dropout op would reserve for the weights
    a.dropout_p = dropout_p;
    a.seed = gen.seed();
    a.offset = gen.reserve(s.B * s.H * s.Tq * s.Tk);
  }
  const Tensor qc = unit_last(q), kc = unit_last(k), vc = unit_last(v);
  // No queries or no keys: nothing for a kernel to do (an output row with no key to see is zeros, as the kernels
  // write it; every gradient is zero), and a launch over zero rows is not something every backend accepts.
  const bool work = s.B * s.H > 0 && s.Tq > 0 && s.Tk > 0;
  Tensor out = empty_result(s, s.Tq, s.Dv, q);
  Tensor lse = Tensor::empty({s.B, s.H, s.Tq}, q.dtype(), q.device());
  if (!work) out.zero_();
  if (work)
    be.attention_forward(q.dtype(), attn_view<AttnResult>(out, s.heads), lse.raw_data(), attn_view(qc, s.heads),
                         attn_view(kc, s.heads), attn_view(vc, s.heads), a);
  // saved: q, k, v as the kernel read them (aliases of the inputs when their last dim was already
  // contiguous, so an in-place edit is caught), the output, the per-row log-sum-exp, and the lengths.
  a.lengths = nullptr;
  record("scaled_dot_product_attention", out, {q, k, v}, {qc, kc, vc, out, lse, lengths},
         [s, a, work](const Tensor& dout, Saved sv, Grads& g) {
           const Tensor &qs = sv[0], &ks = sv[1], &vs = sv[2], &os = sv[3], &ls = sv[4], &lens = sv[5];
           AttnParams p = a;
           if (lens.defined()) p.lengths = lens.data<int64_t>();
           const Tensor dy = unit_last(dout);
           // dk and dv per query head, then summed over each group (B, Hkv, G, Tk, *) -> (B, Hkv, Tk, *).
           Tensor dq = empty_result(s, s.Tq, s.D, qs), dk = empty_result(s, s.Tk, s.D, qs),
                  dv = empty_result(s, s.Tk, s.Dv, qs);
           if (!work) dq.zero_(), dk.zero_(), dv.zero_();
           if (work)
             backend_of(qs).attention_backward(qs.dtype(), attn_view<AttnResult>(dq, s.heads),
                                               attn_view<AttnResult>(dk, s.heads), attn_view<AttnResult>(dv, s.heads),
                                               attn_view(dy, s.heads), attn_view(qs, s.heads), attn_view(ks, s.heads),
                                               attn_view(vs, s.heads), attn_view(os, s.heads), ls.raw_data(), p);
           if (g.needs(0)) g.acc(0, dq);
           const auto grouped = [&](const Tensor& d) {
             if (s.Hkv == s.H) return d;
             return d.reshape({s.B, s.Hkv, s.H / s.Hkv, d.size(2), d.size(3)}).sum({2});
           };
           if (g.needs(1)) g.acc(1, grouped(dk));
           if (g.needs(2)) g.acc(2, grouped(dv));
         });
  return out;
}

}  // namespace headlab
