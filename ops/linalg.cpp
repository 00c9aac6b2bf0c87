// matmul (1-D, 2-D, batched N-D with broadcast batch dims) and linear, both straight to BLAS:
// a transposed operand is passed as a BLAS transpose, not copied; a batch that broadcasts one
// operand is folded into a single large GEMM when the layout allows.
#include "ops/internal.h"

namespace headlab {

namespace {

// How one operand of a GEMM reaches BLAS: (rows, cols) matrices at a batch stride.
struct GemmOperand {
  Tensor t;  // the tensor whose memory is read (maybe a contiguous copy)
  bool trans = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// t: (batch..., R, C), already expanded to the common batch shape. Returns its BLAS description,
// copying only when no (trans, ld, single batch stride) layout exists.
GemmOperand gemm_operand(const Tensor& t_in) {
  Tensor t = t_in;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int64_t nd = t.dim(), R = t.size(-2), C = t.size(-1);
    int64_t sr = t.stride(-2), sc = t.stride(-1);
    if (C == 1) sc = 1;                       // size-1 dims have meaningless strides
    if (R == 1) sr = std::max<int64_t>(C, sc == 1 ? C : 1);
    GemmOperand op{t};
    bool ok = false;
    if (sc == 1 && sr >= std::max<int64_t>(C, 1)) { op.trans = false; op.ld = sr; ok = true; }
    else if (sr == 1 && sc >= std::max<int64_t>(R, 1)) { op.trans = true; op.ld = sc; ok = true; }
    else if (R == 1 && C == 1) { op.trans = false; op.ld = 1; ok = true; }
    // The batch dims must collapse to one stride.
    int64_t bstride = 0, expect = -1;
    for (int64_t d = nd - 3; d >= 0 && ok; --d) {
      if (t.size(d) == 1) continue;
      if (expect == -1) { bstride = t.stride(d); expect = bstride * t.size(d); continue; }
      if (t.stride(d) != expect) ok = false;
      else expect = t.stride(d) * t.size(d);
    }
    if (ok) { op.batch_stride = bstride; return op; }
    t = contiguous(t_in);
  }
  HL_FAIL("matmul: internal error, no GEMM layout for a contiguous operand");
}

// out[b] = a[b] @ b[b] for expanded operands a: (batch..., M, K), b: (batch..., K, N).
void batched_gemm(const Tensor& out, const Tensor& a, const Tensor& b, int64_t batch) {
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  GemmOperand A = gemm_operand(a), B = gemm_operand(b);
  Backend& be = backend_of(out);
  // b shared by the whole batch and a's rows laid out back to back: one (batch*M, K) @ (K, N) GEMM.
  if (batch > 1 && B.batch_stride == 0 && !A.trans && A.batch_stride == M * A.ld) {
    be.gemm(out.dtype(), false, B.trans, batch * M, N, K, 1.0, A.t.raw_data(), A.ld, 0, B.t.raw_data(), B.ld, 0, 0.0,
            out.raw_data(), N, 0, 1);
    return;
  }
  be.gemm(out.dtype(), A.trans, B.trans, M, N, K, 1.0, A.t.raw_data(), A.ld, A.batch_stride, B.t.raw_data(), B.ld,
          B.batch_stride, 0.0, out.raw_data(), N, M * N, batch);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  detail::check_floating("matmul", a);
  detail::check_floating("matmul", b);
  check_same_device("matmul", a, b);
  detail::check_same_dtype("matmul", a, b);
  HL_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  // 1-D operands: promote to matrices, multiply, then drop the added dim (as torch.matmul does).
  if (a.dim() == 1 || b.dim() == 1) {
    const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a;
    const Tensor b2 = b.dim() == 1 ? unsqueeze(b, -1) : b;
    HL_CHECK(a2.size(-1) == b2.size(-2), "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             " cannot be multiplied (", a2.size(-1), " != ", b2.size(-2), ")");
    Tensor out = matmul(a2, b2);
    if (b.dim() == 1) out = squeeze(out, -1);
    if (a.dim() == 1) out = squeeze(out, a.dim() == 1 && b.dim() == 1 ? -1 : -2);
    return out;
  }
  HL_CHECK(a.size(-1) == b.size(-2), "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           " cannot be multiplied (", a.size(-1), " != ", b.size(-2), ")");
  const Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch = detail::broadcast_shapes("matmul", batch_a, batch_b);
  const int64_t M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Shape sa = batch, sb = batch, so = batch;
  sa.insert(sa.end(), {M, K});
  sb.insert(sb.end(), {K, N});
  so.insert(so.end(), {M, N});
  Tensor out = Tensor::empty(so, a.dtype(), a.device());
  if (out.numel() > 0) {
    const Tensor ae = a.as_strided_raw(sa, detail::broadcast_strides(a, sa), a.offset());
    const Tensor bex = b.as_strided_raw(sb, detail::broadcast_strides(b, sb), b.offset());
    batched_gemm(out, ae, bex, shape_numel(batch));
  }
  record("matmul", out, {a, b},
         [a, b](const Tensor& dout, Grads& g) {
           if (g.needs(a)) g.acc(a, matmul(dout, b.mT()));  // dA = dOut @ B^T  (..., M, K)
           if (g.needs(b)) g.acc(b, matmul(a.mT(), dout));  // dB = A^T @ dOut  (..., K, N)
         },
         {a, b});
  return out;
}

// x: (..., in), weight: (out, in), bias: (out) -> (..., out)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_floating("linear", x);
  detail::check_floating("linear", weight);
  check_same_device("linear", x, weight);
  detail::check_same_dtype("linear", x, weight);
  HL_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape ",
           shape_str(weight.shape()));
  HL_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input of shape ", shape_str(x.shape()),
           " does not match weight of shape ", shape_str(weight.shape()), " (expected last dim ", weight.size(1), ")");
  const int64_t in_f = weight.size(1), out_f = weight.size(0), rows = x.numel() / std::max<int64_t>(in_f, 1);
  if (bias.defined()) {
    check_same_device("linear", x, bias);
    detail::check_same_dtype("linear", x, bias);
    HL_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear: bias must have shape [", out_f, "], got ",
             shape_str(bias.shape()));
  }
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    const Tensor x2 = reshape(x.detach(), {rows, in_f});
    const Tensor out2 = out.as_strided_raw({rows, out_f}, {out_f, 1}, 0);
    if (bias.defined()) detail::copy_into(out2, bias.as_strided_raw({rows, out_f}, {0, bias.stride(0)}, bias.offset()));
    const GemmOperand X = gemm_operand(x2), W = gemm_operand(weight.detach());
    backend_of(x).gemm(x.dtype(), X.trans, !W.trans, rows, out_f, in_f, 1.0, X.t.raw_data(), X.ld, 0,
                       W.t.raw_data(), W.ld, 0, bias.defined() ? 1.0 : 0.0, out.raw_data(), out_f, 0, 1);
  }
  record("linear", out, {x, weight, bias},
         [x, weight, bias, rows, in_f, out_f](const Tensor& dout, Grads& g) {
           const Tensor d2 = reshape(dout, {rows, out_f});
           if (g.needs(x)) g.acc(x, reshape(matmul(d2, weight), x.shape()));               // (rows, in)
           if (g.needs(weight)) g.acc(weight, matmul(d2.mT(), reshape(x, {rows, in_f})));  // (out, in)
           if (g.needs(bias)) g.acc(bias, sum(d2, {0}));                                   // (out)
         },
         {x, weight});
  return out;
}

}  // namespace headlab
