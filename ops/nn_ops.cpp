// Neural-network ops with fused kernels: softmax (plain, masked by valid lengths, causal),
// log_softmax, dropout, layer_norm, rms_norm, cross_entropy; and the composites silu, rotary_embedding
// and mse_loss.
#include <cmath>
#include <numbers>

#include "ops/internal.h"

namespace headlab {

namespace {

// y = softmax(scale * x) over the last dim of x, rows masked as `mask` says. lengths: per row.
Tensor softmax_last(const char* op, const Tensor& x, double scale, SoftmaxMask mask, const Tensor& lengths,
                    int64_t q_len) {
  const OpScope scope(op);
  detail::check_floating(op, x);
  HL_CHECK(x.dim() >= 1, op, ": expected at least 1 dimension");
  const Tensor xc = contiguous(x.detach());
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (y.numel())
    backend_of(x).softmax_forward(x.dtype(), y.raw_data(), xc.raw_data(), rows, cols, scale, mask,
                                  lengths.defined() ? lengths.data<int64_t>() : nullptr, q_len);
  record(op, y, {x}, {y}, [rows, cols, scale](const Tensor& dout, Saved s, Grads& g) {
    const Tensor& ys = s[0];  // the output: softmax's derivative is computed from it
    const Tensor dy = contiguous(dout);
    Tensor dx = Tensor::empty(ys.shape(), ys.dtype(), ys.device());
    if (dx.numel())
      backend_of(ys).softmax_backward(ys.dtype(), dx.raw_data(), dy.raw_data(), ys.raw_data(), rows, cols, scale);
    g.acc(0, dx);
  });
  return y;
}

Tensor log_softmax_last(const Tensor& x) {
  const OpScope scope("log_softmax");
  const Tensor xc = contiguous(x.detach());
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (y.numel()) backend_of(x).log_softmax_forward(x.dtype(), y.raw_data(), xc.raw_data(), rows, cols);
  record("log_softmax", y, {x}, {y}, [rows, cols](const Tensor& dout, Saved s, Grads& g) {
    const Tensor& ys = s[0];  // the output
    const Tensor dy = contiguous(dout);
    Tensor dx = Tensor::empty(ys.shape(), ys.dtype(), ys.device());
    if (dx.numel())
      backend_of(ys).log_softmax_backward(ys.dtype(), dx.raw_data(), dy.raw_data(), ys.raw_data(), rows, cols);
    g.acc(0, dx);
  });
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t d) {
  detail::check_floating("softmax", x);
  if (x.dim() == 0) return softmax_last("softmax", reshape(x, {1}), 1.0, SoftmaxMask::none, Tensor(), 1).reshape({});
  const int64_t w = detail::wrap_dim("softmax", d, x.dim());
  if (w == x.dim() - 1) return softmax_last("softmax", x, 1.0, SoftmaxMask::none, Tensor(), 1);
  return transpose(softmax_last("softmax", transpose(x, w, -1), 1.0, SoftmaxMask::none, Tensor(), 1), w, -1);
}

Tensor log_softmax(const Tensor& x, int64_t d) {
  detail::check_floating("log_softmax", x);
  if (x.dim() == 0) return log_softmax_last(reshape(x, {1})).reshape({});
  const int64_t w = detail::wrap_dim("log_softmax", d, x.dim());
  if (w == x.dim() - 1) return log_softmax_last(x);
  return transpose(log_softmax_last(transpose(x, w, -1)), w, -1);
}

Tensor masked_softmax(const Tensor& scores, const Tensor& valid_lens, double scale) {
  detail::check_floating("masked_softmax", scores);
  HL_CHECK(scores.dim() >= 2, "masked_softmax: expected scores of shape (..., queries, keys), got ",
           shape_str(scores.shape()));
  if (!valid_lens.defined()) return softmax_last("masked_softmax", scores, scale, SoftmaxMask::none, Tensor(), 1);
  detail::check_index_tensor("masked_softmax", valid_lens, "valid_lens");
  check_same_device("masked_softmax", scores, valid_lens);
  const int64_t Q = scores.size(-2), K = scores.size(-1);
  const int64_t rows = scores.numel() / std::max<int64_t>(K, 1), batch = rows / std::max<int64_t>(Q, 1);
  const int64_t lead = scores.size(0);
  // valid_lens is (B,) with one length per batch entry, or (B, Q) with one per query row.
  Tensor lengths;
  const bool per_batch = valid_lens.dim() == 1 && valid_lens.numel() == batch;
  const bool per_row = valid_lens.dim() == 2 && valid_lens.numel() == rows && valid_lens.size(0) == lead &&
                       valid_lens.size(1) * lead == rows;
  HL_CHECK(per_batch || per_row, "masked_softmax: valid_lens of shape ", shape_str(valid_lens.shape()),
           " does not match scores of shape ", shape_str(scores.shape()), "; expected [", batch, "] or [", lead, ", ",
           rows / std::max<int64_t>(lead, 1), "]");
  lengths = per_batch ? repeat_interleave(valid_lens, Q, 0) : contiguous(reshape(valid_lens, {-1}));
  for (int64_t v : lengths.to_vector<int64_t>())
    HL_CHECK(v >= 0 && v <= K, "masked_softmax: valid length ", v, " is out of range for ", K, " keys (expected 0..", K,
             ")");
  return softmax_last("masked_softmax", scores, scale, SoftmaxMask::lengths, lengths, Q);
}

Tensor causal_softmax(const Tensor& scores, double scale) {
  detail::check_floating("causal_softmax", scores);
  HL_CHECK(scores.dim() >= 2 && scores.size(-1) == scores.size(-2),
           "causal_softmax: expected square scores of shape (..., T, T), got ", shape_str(scores.shape()));
  return softmax_last("causal_softmax", scores, scale, SoftmaxMask::causal, Tensor(), scores.size(-2));
}

Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  const OpScope scope("dropout");
  detail::check_floating("dropout", x);
  HL_CHECK(p >= 0 && p <= 1, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  const Tensor xc = contiguous(x.detach());
  const uint64_t seed = gen.seed(), offset = gen.reserve(x.numel());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (out.numel()) backend_of(x).dropout(x.dtype(), out.raw_data(), xc.raw_data(), x.numel(), p, seed, offset);
  // The counter-based generator replays the same mask from (seed, offset): backward reads no tensor
  // values, so nothing is saved and in-place edits of x or out after the forward are harmless.
  record("dropout", out, {x}, {}, [p, seed, offset](const Tensor& dout, Saved, Grads& g) {
    const Tensor dy = contiguous(dout);
    Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
    if (dx.numel()) backend_of(dy).dropout(dy.dtype(), dx.raw_data(), dy.raw_data(), dy.numel(), p, seed, offset);
    g.acc(0, dx);
  });
  return out;
}

// x: (..., C), weight/bias: (C) or undefined
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const OpScope scope("layer_norm");
  detail::check_floating("layer_norm", x);
  HL_CHECK(x.dim() >= 1, "layer_norm: expected at least 1 dimension");
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  for (const Tensor* p : {&weight, &bias})
    if (p->defined()) {
      check_same_device("layer_norm", x, *p);
      detail::check_same_dtype("layer_norm", x, *p);
      HL_CHECK(p->dim() == 1 && p->size(0) == C, "layer_norm: weight and bias must have shape [", C, "], got ",
               shape_str(p->shape()));
    }
  const Tensor xc = contiguous(x.detach());
  const Tensor wc = weight.defined() ? contiguous(weight.detach()) : Tensor();
  const Tensor bc = bias.defined() ? contiguous(bias.detach()) : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, x.dtype(), x.device()), rstd = Tensor::empty({rows}, x.dtype(), x.device());
  if (y.numel())
    backend_of(x).layernorm_forward(x.dtype(), y.raw_data(), mean.raw_data(), rstd.raw_data(), xc.raw_data(),
                                    wc.defined() ? wc.raw_data() : nullptr, bc.defined() ? bc.raw_data() : nullptr,
                                    rows, C, eps);
  // saved: x and weight as the kernel reads them (xc / wc alias x / weight when those were
  // contiguous, so an edit of x or weight is caught; a private copy cannot be edited), and the
  // per-row statistics.
  record("layer_norm", y, {x, weight, bias}, {xc, wc, mean, rstd}, [rows, C](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &xc = s[0], &wc = s[1], &mean = s[2], &rstd = s[3];
    const Tensor dy = contiguous(dout);
    Tensor dx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
    // dweight / dbias only when wanted: the kernel skips the column sums for a null pointer.
    Tensor dw = g.needs(1) ? Tensor::empty({C}, xc.dtype(), xc.device()) : Tensor();
    Tensor db = g.needs(2) ? Tensor::empty({C}, xc.dtype(), xc.device()) : Tensor();
    if (dx.numel())
      backend_of(xc).layernorm_backward(xc.dtype(), dx.raw_data(), dw.defined() ? dw.raw_data() : nullptr,
                                        db.defined() ? db.raw_data() : nullptr, dy.raw_data(), xc.raw_data(),
                                        mean.raw_data(), rstd.raw_data(), wc.defined() ? wc.raw_data() : nullptr, rows,
                                        C);
    else {
      if (dw.defined()) dw = zeros({C}, xc.dtype(), xc.device());
      if (db.defined()) db = zeros({C}, xc.dtype(), xc.device());
    }
    g.acc(0, dx);
    if (dw.defined()) g.acc(1, dw);
    if (db.defined()) g.acc(2, db);
  });
  return y;
}

// x: (..., C), weight: (C) or undefined
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  const OpScope scope("rms_norm");
  detail::check_floating("rms_norm", x);
  HL_CHECK(x.dim() >= 1, "rms_norm: expected at least 1 dimension");
  HL_CHECK(eps >= 0 && std::isfinite(eps), "rms_norm: eps must be finite and >= 0, got ", eps);
  const int64_t C = x.size(-1), rows = C ? x.numel() / C : 0;
  if (weight.defined()) {
    check_same_device("rms_norm", x, weight);
    detail::check_same_dtype("rms_norm", x, weight);
    HL_CHECK(weight.dim() == 1 && weight.size(0) == C, "rms_norm: weight must have shape [", C, "], got ",
             shape_str(weight.shape()));
  }
  if (!backend_of(x).has_rms_norm()) return rms_norm_composite(x, weight, eps);
  const Tensor xc = contiguous(x.detach());
  const Tensor wc = weight.defined() ? contiguous(weight.detach()) : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, x.dtype(), x.device());
  if (y.numel())
    backend_of(x).rmsnorm_forward(x.dtype(), y.raw_data(), rstd.raw_data(), xc.raw_data(),
                                  wc.defined() ? wc.raw_data() : nullptr, rows, C, eps);
  // saved: x and weight as the kernel read them (aliases where they were contiguous, so edits are caught) and
  // the per-row 1 / rms.
  record("rms_norm", y, {x, weight}, {xc, wc, rstd}, [rows, C](const Tensor& dout, Saved s, Grads& g) {
    const Tensor &xc = s[0], &wc = s[1], &rstd = s[2];
    const Tensor dy = contiguous(dout);
    Tensor dx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
    Tensor dw = g.needs(1) ? zeros({C}, xc.dtype(), xc.device()) : Tensor();
    if (dx.numel())
      backend_of(xc).rmsnorm_backward(xc.dtype(), dx.raw_data(), dw.defined() ? dw.raw_data() : nullptr, dy.raw_data(),
                                      xc.raw_data(), rstd.raw_data(), wc.defined() ? wc.raw_data() : nullptr, rows, C);
    g.acc(0, dx);
    if (dw.defined()) g.acc(1, dw);
  });
  return y;
}

Tensor rms_norm_composite(const Tensor& x, const Tensor& weight, double eps) {
  const Tensor y = mul(x, rsqrt(add(mean(mul(x, x), {-1}, true), eps)));
  return weight.defined() ? mul(y, weight) : y;
}

Tensor silu(const Tensor& x) { return mul(x, sigmoid(x)); }

std::vector<double> rotary_frequencies(int64_t R, double theta, const RopeScaling& scaling) {
  HL_CHECK(R > 0 && R % 2 == 0, "rotary_angles: the rotated dims must be even and positive, got ", R);
  HL_CHECK(theta > 1 && std::isfinite(theta), "rotary_angles: theta must be finite and > 1, got ", theta);
  const RopeScaling& s = scaling;
  HL_CHECK(s.kind == RopeScalingKind::none || (s.factor > 0 && std::isfinite(s.factor)),
           "rotary_angles: the rope scaling factor must be positive, got ", s.factor);
  HL_CHECK(s.kind != RopeScalingKind::llama3 ||
               (s.original_context > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor),
           "rotary_angles: llama3 rope scaling needs original_max_position_embeddings > 0 and high_freq_factor > ",
           "low_freq_factor > 0, got ", s.original_context, ", ", s.high_freq_factor, " and ", s.low_freq_factor);
  std::vector<double> freq(static_cast<size_t>(R / 2));
  for (size_t i = 0; i < freq.size(); ++i) {
    const double f = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(R));
    if (s.kind == RopeScalingKind::linear) {
      freq[i] = f / s.factor;
    } else if (s.kind == RopeScalingKind::llama3) {  // transformers' _compute_llama3_parameters
      const double wavelength = 2 * std::numbers::pi / f, old = static_cast<double>(s.original_context);
      const double smooth = (old / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      freq[i] = wavelength < old / s.high_freq_factor  ? f
                : wavelength > old / s.low_freq_factor ? f / s.factor
                                                       : (1 - smooth) * f / s.factor + smooth * f;
    } else {
      freq[i] = f;
    }
  }
  return freq;
}

std::pair<Tensor, Tensor> rotary_angles(int64_t offset, int64_t T, int64_t R, double theta, DType dtype, Device device,
                                        const RopeScaling& scaling) {
  const std::vector<double> freq = rotary_frequencies(R, theta, scaling);
  HL_CHECK(offset >= 0 && T >= 0, "rotary_angles: positions [", offset, ", ", offset + T, ") are invalid");
  const int64_t n = R / 2;
  std::vector<double> c(static_cast<size_t>(T * n)), s(c.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t t = 0; t < T; ++t) {
      const double angle = static_cast<double>(offset + t) * freq[static_cast<size_t>(i)];
      c[static_cast<size_t>(t * n + i)] = std::cos(angle);
      s[static_cast<size_t>(t * n + i)] = std::sin(angle);
    }
  }
  return {tensor(c, {T, n}).to(dtype).to(device), tensor(s, {T, n}).to(dtype).to(device)};
}

// Composite: each half of the rotated pairs (B, T, H, R/2) from views, rotated by the broadcast (T, 1, R/2)
// tables, and put back in the layout it came in.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, bool interleaved) {
  const OpScope scope("rotary_embedding");
  detail::check_floating("rotary_embedding", x);
  HL_CHECK(x.dim() == 4, "rotary_embedding: expected x of shape (batch, tokens, heads, head_size), got ",
           shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  HL_CHECK(cos.dim() == 2 && sin.shape() == cos.shape() && cos.size(0) == T && cos.size(1) >= 1 && 2 * cos.size(1) <= D,
           "rotary_embedding: expected cos and sin of shape [", T, ", R/2] with R <= ", D, ", got ",
           shape_str(cos.shape()), " and ", shape_str(sin.shape()));
  detail::check_same_dtype("rotary_embedding", x, cos);
  detail::check_same_dtype("rotary_embedding", x, sin);
  const int64_t R = 2 * cos.size(1), n = R / 2;
  const Tensor rot = R == D ? x : x.narrow(3, 0, R);
  Tensor x1, x2;  // (B, T, H, R/2): the pairs' first and second elements
  if (interleaved) {
    const Tensor pairs = rot.reshape({B, T, H, n, 2});
    x1 = pairs.select(4, 0), x2 = pairs.select(4, 1);
  } else {
    x1 = rot.narrow(3, 0, n), x2 = rot.narrow(3, n, n);
  }
  const Tensor c = cos.view({T, 1, n}), s = sin.view({T, 1, n});
  const Tensor y1 = sub(mul(x1, c), mul(x2, s)), y2 = add(mul(x1, s), mul(x2, c));
  const Tensor y = interleaved ? stack({y1, y2}, 4).view({B, T, H, R}) : cat({y1, y2}, 3);
  return R == D ? y : cat({y, x.narrow(3, R, D - R)}, 3);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Reduction reduction) {
  const OpScope scope("cross_entropy");
  detail::check_floating("cross_entropy", logits);
  detail::check_index_tensor("cross_entropy", targets, "targets");
  check_same_device("cross_entropy", logits, targets);
  HL_CHECK(logits.dim() >= 1, "cross_entropy: logits need a class dimension, got shape ", shape_str(logits.shape()));
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  HL_CHECK(targets.shape() == lead, "cross_entropy: logits of shape ", shape_str(logits.shape()),
           " need targets of shape ", shape_str(lead), ", got ", shape_str(targets.shape()));
  const int64_t C = logits.size(-1), rows = shape_numel(lead);
  const Tensor tc = contiguous(targets);
  int64_t count = 0;
  for (int64_t t : tc.to_vector<int64_t>()) {
    if (t == ignore_index) continue;
    HL_CHECK(t >= 0 && t < C, "cross_entropy: target ", t, " is out of range for ", C, " classes");
    ++count;
  }
  const Tensor xc = contiguous(logits.detach());
  Tensor losses = Tensor::empty(lead, logits.dtype(), logits.device());
  if (rows)
    backend_of(logits).cross_entropy_forward(logits.dtype(), losses.raw_data(), xc.raw_data(), tc.data<int64_t>(), rows,
                                             C, ignore_index);
  Tensor out;
  double scale = 1.0;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    out = sum(losses, {}, false);
    if (reduction == Reduction::mean) {  // over non-ignored targets; none left gives NaN, as in PyTorch
      scale = count ? 1.0 / static_cast<double>(count) : std::nan("");
      out = mul(out, scale).detach();
    }
  }
  out = out.detach();
  const bool per_row = reduction == Reduction::none;
  // saved: the logits and targets as the kernel reads them (aliases of the caller's tensors when
  // those were contiguous, so editing either in place before backward is caught)
  record("cross_entropy", out, {logits}, {xc, tc},
         [rows, C, ignore_index, scale, per_row](const Tensor& dout, Saved s, Grads& g) {
           const Tensor &xc = s[0], &tc = s[1];
           const Tensor dl = contiguous(dout);
           Tensor dx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
           if (rows)
             backend_of(xc).cross_entropy_backward(xc.dtype(), dx.raw_data(), dl.raw_data(), per_row ? 1 : 0, scale,
                                                   xc.raw_data(), tc.data<int64_t>(), rows, C, ignore_index);
           g.acc(0, dx);
         });
  return out;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const OpScope scope("mse_loss");
  detail::check_floating("mse_loss", input);
  detail::check_floating("mse_loss", target);
  HL_CHECK(input.shape() == target.shape(), "mse_loss: input of shape ", shape_str(input.shape()),
           " and target of shape ", shape_str(target.shape()), " differ");
  const Tensor d = sub(input, target);
  const Tensor sq = mul(d, d);
  if (reduction == Reduction::none) return sq;
  return reduction == Reduction::sum ? sum(sq) : mean(sq);
}

}  // namespace headlab
