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

// The matrix part of t: (..., R, C) as BLAS sees it, or nothing when it needs a copy.
bool matrix_layout(const Tensor& t, GemmOperand& op) {
  const int64_t R = t.size(-2), C = t.size(-1);
  int64_t sr = t.stride(-2), sc = t.stride(-1);
  if (C == 1) sc = 1;  // size-1 dims have meaningless strides
  if (R == 1) sr = std::max<int64_t>(C, 1);
  if (sc == 1 && sr >= std::max<int64_t>(C, 1)) {
    op.trans = false;
    op.ld = sr;
    return true;
  }
  if (sr == 1 && sc >= std::max<int64_t>(R, 1)) {
    op.trans = true;
    op.ld = sc;
    return true;
  }
  return false;
}

// out[b] = a[b] @ b[b] for expanded operands a: (batch..., M, K), b: (batch..., K, N) and a
// contiguous out. Batch dims are merged where all three operands allow; the last merged run goes
// to one strided-batched GEMM and any outer runs are looped over (e.g. (B, H) heads split from a
// (B, T, H*D) projection: batched over H, looped over B, with no copies).
void batched_gemm(const Tensor& out, const Tensor& a_in, const Tensor& b_in, const Shape& batch) {
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  GemmOperand A{a_in}, B{b_in};
  if (!matrix_layout(A.t, A)) {
    A.t = contiguous(a_in);
    matrix_layout(A.t, A);
  }
  if (!matrix_layout(B.t, B)) {
    B.t = contiguous(b_in);
    matrix_layout(B.t, B);
  }
  Backend& be = backend_of(out);
  const int64_t nb = static_cast<int64_t>(batch.size());
  // Merge batch dims (outer to inner) into runs of (size, stride_a, stride_b, stride_out).
  struct Run {
    int64_t size, sa, sb, so;
  };
  std::vector<Run> runs;
  for (int64_t d = 0; d < nb; ++d) {
    if (batch[d] == 1) continue;
    const Run r{batch[d], A.t.stride(d), B.t.stride(d), out.stride(d)};
    if (!runs.empty() && runs.back().sa == r.sa * r.size && runs.back().sb == r.sb * r.size &&
        runs.back().so == r.so * r.size) {
      runs.back() = Run{runs.back().size * r.size, r.sa, r.sb, r.so};
    } else {
      runs.push_back(r);
    }
  }
  if (runs.empty()) runs.push_back(Run{1, 0, 0, 0});
  const Run inner = runs.back();
  // b shared by the whole batch and a's rows back to back: one (batch*M, K) @ (K, N) GEMM.
  if (runs.size() == 1 && inner.size > 1 && inner.sb == 0 && !A.trans && inner.sa == M * A.ld) {
    be.gemm(out.dtype(), false, B.trans, inner.size * M, N, K, 1.0, A.t.raw_data(), A.ld, 0, B.t.raw_data(), B.ld, 0,
            0.0, out.raw_data(), N, 0, 1);
    return;
  }
  int64_t outer_count = 1;
  for (size_t i = 0; i + 1 < runs.size(); ++i) outer_count *= runs[i].size;
  const size_t esize = dtype_size(out.dtype());
  for (int64_t o = 0; o < outer_count; ++o) {
    int64_t rem = o, oa = 0, ob = 0, oo = 0;
    for (size_t i = runs.size() - 1; i-- > 0;) {
      const int64_t idx = rem % runs[i].size;
      rem /= runs[i].size;
      oa += idx * runs[i].sa;
      ob += idx * runs[i].sb;
      oo += idx * runs[i].so;
    }
    be.gemm(out.dtype(), A.trans, B.trans, M, N, K, 1.0, static_cast<const char*>(A.t.raw_data()) + oa * esize, A.ld,
            inner.sa, static_cast<const char*>(B.t.raw_data()) + ob * esize, B.ld, inner.sb, 0.0,
            static_cast<char*>(out.raw_data()) + oo * esize, N, inner.so, inner.size);
  }
}

// A single 2-D operand for linear().
GemmOperand gemm_operand(const Tensor& t) {
  GemmOperand op{t};
  if (!matrix_layout(t, op)) {
    op.t = contiguous(t);
    matrix_layout(op.t, op);
  }
  return op;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  const OpScope scope("matmul");
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
  for (size_t i = 1; i <= std::min(batch_a.size(), batch_b.size()); ++i) {  // here to name the full shapes
    const int64_t da = batch_a[batch_a.size() - i], db = batch_b[batch_b.size() - i];
    HL_CHECK(da == db || da == 1 || db == 1, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             " cannot be broadcast in their batch dims (", da, " vs ", db, ")");
  }
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
    batched_gemm(out, ae, bex, batch);
  }
  record("matmul", out, {a, b}, {a, b}, [](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &a = s[0], &b = s[1];
    if (g.needs(0)) g.acc(0, matmul(dout, b.mT()));  // dA = dOut @ B^T  (..., M, K)
    if (g.needs(1)) g.acc(1, matmul(a.mT(), dout));  // dB = A^T @ dOut  (..., K, N)
  });
  return out;
}

namespace {

// out (rows, out_f) = x @ weight^T + bias with weight stored narrower than float32 (bfloat16:
// nn::to_bfloat16_weights; q8_0, q4_k blocks: nn::to_quantized_weights): float32 in and out, the weight widened as
// the backend reads it. Inference only: nothing is recorded.
Tensor linear_with_stored_weight(const Tensor& x2, const Tensor& weight, const Tensor& bias, const Shape& out_shape) {
  const char* kind = dtype_name(weight.dtype());
  HL_CHECK(x2.dtype() == DType::f32, "linear: a ", kind, " weight takes a float32 input, got ", dtype_name(x2.dtype()));
  HL_CHECK(!grad_enabled() || !(x2.requires_grad() || (bias.defined() && bias.requires_grad())), "linear: a ", kind,
           " weight is for inference (no gradient goes through it); run without gradients (NoGradGuard)");
  Tensor out = Tensor::empty(out_shape, DType::f32, x2.device());
  if (out.numel() == 0) return out;
  const Tensor xc = contiguous(x2.detach()), w = contiguous(weight.detach()),
               b = bias.defined() ? contiguous(bias.detach()) : Tensor();
  HL_CHECK(backend_of(x2).linear_stored(weight.dtype(), out.raw_data(), xc.raw_data(), xc.size(1), w.raw_data(),
                                        b.defined() ? b.raw_data() : nullptr, xc.size(0), w.size(0), xc.size(1)),
           "linear: ", kind, " weights are not supported on ", x2.device().str(), " yet (load the model in float32)");
  return out;
}

// x: (..., in), weight: (out, in), bias: (out) -> (..., out). Where `gelu` is given and the backend writes
// GELU of the output in the same pass, *gelu holds it (recorded as gelu records it); else it stays undefined.
Tensor linear_and_maybe_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor* gelu, bool tanh_gelu) {
  const OpScope scope("linear");
  detail::check_floating("linear", x);
  const bool stored_weight =
      weight.defined() && (weight.dtype() == DType::bf16 || is_block_quantized(weight.dtype()));
  if (!stored_weight) detail::check_floating("linear", weight);
  check_same_device("linear", x, weight);
  if (!stored_weight) detail::check_same_dtype("linear", x, weight);
  HL_CHECK(weight.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got shape ",
           shape_str(weight.shape()));
  // in features: a block type's row holds dtype_block weights an element
  const int64_t in_f = weight.size(1) * dtype_block(weight.dtype()), out_f = weight.size(0);
  HL_CHECK(x.dim() >= 1 && x.size(-1) == in_f, "linear: input of shape ", shape_str(x.shape()),
           " does not match weight of shape ", shape_str(weight.shape()), " (expected last dim ", in_f, ")");
  // rows from the leading dims, not numel / in_f: with in_features == 0 there are still rows (of bias)
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  if (bias.defined()) {
    check_same_device("linear", x, bias);
    detail::check_same_dtype("linear", x, bias);
    HL_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear: bias must have shape [", out_f, "], got ",
             shape_str(bias.shape()));
  }
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  if (stored_weight) return linear_with_stored_weight(reshape(x, {rows, in_f}), weight, bias, out_shape);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  if (out.numel() > 0) {
    const Tensor x2 = reshape(x.detach(), {rows, in_f});
    const GemmOperand X = gemm_operand(x2), W = gemm_operand(weight.detach());
    Backend& be = backend_of(x);
    // With a bias: one kernel where the backend has one for these sizes (CUDA's for decoding's few rows,
    // libxsmm's on the CPU, which can apply GELU too), else the bias copied into out and a GEMM adding to it.
    const bool one_kernel = bias.defined() && !X.trans && !W.trans && W.ld == in_f && bias.stride(0) == 1;
    bool done = false;
    if (one_kernel && gelu) {
      Tensor post = Tensor::empty(out_shape, x.dtype(), x.device());
      done = be.linear_gelu_rows(x.dtype(), out.raw_data(), post.raw_data(), X.t.raw_data(), X.ld, W.t.raw_data(),
                                 bias.raw_data(), rows, out_f, in_f, tanh_gelu);
      if (done) *gelu = post;
    }
    if (!done && one_kernel)
      done = be.linear_rows(x.dtype(), out.raw_data(), X.t.raw_data(), X.ld, W.t.raw_data(), bias.raw_data(), rows,
                            out_f, in_f);
    if (!done) {
      const Tensor out2 = out.as_strided_raw({rows, out_f}, {out_f, 1}, 0);
      if (bias.defined())
        detail::copy_into(out2, bias.as_strided_raw({rows, out_f}, {0, bias.stride(0)}, bias.offset()));
      be.gemm(x.dtype(), X.trans, !W.trans, rows, out_f, in_f, 1.0, X.t.raw_data(), X.ld, 0, W.t.raw_data(), W.ld, 0,
              bias.defined() ? 1.0 : 0.0, out.raw_data(), out_f, 0, 1);
    }
  }
  record("linear", out, {x, weight, bias}, {x, weight}, [rows, in_f, out_f](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &x = s[0], &weight = s[1];
    const Tensor d2 = reshape(dout, {rows, out_f});
    if (g.needs(0)) g.acc(0, reshape(matmul(d2, weight), x.shape()));     // (rows, in)
    if (g.needs(1)) g.acc(1, matmul(d2.mT(), reshape(x, {rows, in_f})));  // (out, in)
    if (g.needs(2)) g.acc(2, sum(d2, {0}));                               // (out)
  });
  if (gelu && gelu->defined()) detail::record_unary("gelu", tanh_gelu ? UnaryOp::gelu_tanh : UnaryOp::gelu, *gelu, out);
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_and_maybe_gelu(x, weight, bias, nullptr, false);
}

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, bool tanh_approximation) {
  Tensor post;
  Tensor pre = linear_and_maybe_gelu(x, weight, bias, &post, tanh_approximation);
  if (!post.defined()) post = gelu(pre, tanh_approximation);
  return {pre, post};
}

}  // namespace headlab
