// Sparse autoencoders: encode, decode and the training losses (nn/sae.h).
#include "nn/sae.h"

#include <algorithm>
#include <sstream>

namespace headlab::nn {

void SaeConfig::validate() const {
  HL_CHECK(d_in > 0 && d_sae > 0 && out_width() > 0, "sae: d_in, d_sae and d_out must be > 0, got ", d_in, ", ", d_sae,
           " and ", out_width());
  if (arch == SaeArch::topk)
    HL_CHECK(k >= 1 && k <= d_sae, "sae: topk's k must be in [1, ", d_sae, "] (d_sae), got ", k);
  HL_CHECK(!apply_b_dec_to_input || out_width() == d_in, "sae: apply_b_dec_to_input needs d_out == d_in (", d_in,
           "), got d_out ", out_width(), " (a transcoder's b_dec is its output's bias)");
}

SparseAutoencoder::SparseAutoencoder(const SaeConfig& config) : config_(config) {
  config_.validate();
  const int64_t d_out = config_.out_width();
  // The peer's and SAELens's start: decoder rows random unit directions, the encoder their transpose.
  Tensor dec = randn({config_.d_sae, d_out});
  dec = div(dec, sqrt(sum(mul(dec, dec), {1}, true)));
  W_dec = register_parameter("W_dec", contiguous(dec));
  W_enc = register_parameter("W_enc", d_out == config_.d_in ? contiguous(W_dec.detach().mT())
                                                            : contiguous(randn({config_.d_in, config_.d_sae}) * 0.01));
  b_enc = register_parameter("b_enc", zeros({config_.d_sae}));
  b_dec = register_parameter("b_dec", zeros({d_out}));
  if (config_.arch == SaeArch::jumprelu) threshold = register_parameter("threshold", full({config_.d_sae}, 0.001));
}

std::string SparseAutoencoder::extra_repr() const {
  std::ostringstream s;
  s << "arch=" << enum_name(config_.arch) << ", d_in=" << config_.d_in << ", d_sae=" << config_.d_sae;
  if (config_.out_width() != config_.d_in) s << ", d_out=" << config_.out_width();
  if (config_.arch == SaeArch::topk) s << ", k=" << config_.k;
  return s.str();
}

Tensor SparseAutoencoder::input_of(const Tensor& x) const { return config_.apply_b_dec_to_input ? sub(x, b_dec) : x; }

SaeCodes SparseAutoencoder::encode_rows(const Tensor& x, const Tensor& theta, double bandwidth) {
  HL_CHECK(x.dim() == 2 && x.size(1) == config_.d_in, "sae encode: expected rows (R, ", config_.d_in,
           ") (d_in), got shape ", shape_str(x.shape()));
  SaeCodes c;
  const Tensor in = input_of(x);
  if (config_.arch == SaeArch::topk) {
    TopK top = topk_matmul(in, W_enc, b_enc, config_.k);
    c.values = top.values;
    c.indices = top.indices;
    return c;
  }
  c.pre = linear(in, W_enc.mT(), b_enc);
  // jumprelu: relu(pre) where pre > threshold, as SAELens; the threshold's estimate windows the raw pre-activations
  c.dense = config_.arch == SaeArch::relu ? relu(c.pre)
                                          : relu(jumprelu(c.pre, theta.defined() ? theta : threshold, bandwidth));
  return c;
}

Tensor dense_codes(const SaeCodes& codes, int64_t d_sae) {
  return codes.dense.defined() ? codes.dense : sparse_to_dense(codes.values, codes.indices, d_sae);
}

Tensor SparseAutoencoder::decode_rows(const SaeCodes& codes) {
  if (codes.dense.defined()) return linear(codes.dense, W_dec.mT(), b_dec);
  return add(sparse_matmul(codes.values, codes.indices, W_dec), b_dec);
}

Tensor SparseAutoencoder::encode(const Tensor& x) {
  HL_CHECK(x.dim() >= 1 && x.size(-1) == config_.d_in, "sae encode: expected (..., ", config_.d_in,
           ") (d_in), got shape ", shape_str(x.shape()));
  Shape shape = x.shape();
  shape.back() = config_.d_sae;
  return reshape(dense_codes(encode_rows(reshape(x, {-1, config_.d_in})), config_.d_sae), shape);
}

Tensor SparseAutoencoder::decode(const Tensor& f) {
  HL_CHECK(f.dim() >= 1 && f.size(-1) == config_.d_sae, "sae decode: expected (..., ", config_.d_sae,
           ") (d_sae), got shape ", shape_str(f.shape()));
  return linear(f, W_dec.mT(), b_dec);
}

Tensor SparseAutoencoder::decoder_norms() const { return sqrt(sum(mul(W_dec, W_dec), {1})); }

void SparseAutoencoder::normalize_decoder() {
  const NoGradGuard no_grad;
  const Tensor unit = div(W_dec, unsqueeze(decoder_norms(), 1));
  W_dec.copy_(unit);
}

namespace {
// Each row's squared error summed over its features, averaged over rows.
Tensor row_squared_error(const Tensor& a, const Tensor& b) {
  const Tensor d = sub(a, b);
  return mean(sum(mul(d, d), {-1}));
}
}  // namespace

SaeLoss SparseAutoencoder::loss(const Tensor& x, const Tensor& target, const SaeLossOptions& opts) {
  HL_CHECK(target.dim() == 2 && target.size(0) == x.size(0) && target.size(1) == config_.out_width(),
           "sae loss: expected a target (", x.size(0), ", ", config_.out_width(), "), got shape ",
           shape_str(target.shape()));
  SaeLoss l;
  const Tensor theta =
      config_.arch == SaeArch::jumprelu && opts.log_threshold.defined() ? exp(opts.log_threshold) : threshold;
  l.codes = encode_rows(x, theta, opts.bandwidth);
  const Tensor x_hat = decode_rows(l.codes);
  l.x_hat = x_hat.detach();
  l.mse = row_squared_error(x_hat, target);
  switch (config_.arch) {
    case SaeArch::relu:
      l.sparsity = mean(sum(mul(l.codes.dense, decoder_norms()), {-1}));
      l.total = add(l.mse, mul(l.sparsity, opts.l1));
      break;
    case SaeArch::jumprelu:
      l.sparsity = mean(sum(threshold_step(l.codes.pre, theta, opts.bandwidth), {-1}));
      l.total = add(l.mse, mul(l.sparsity, opts.l0));
      break;
    case SaeArch::topk: {
      l.total = l.mse;
      const int64_t dead = opts.dead.defined() ? opts.dead.numel() : 0;
      if (dead == 0) break;
      // AuxK (Gao et al. 2024): the k_aux largest of the dead latents reconstruct what the live ones missed
      const int64_t k_aux = std::min(dead, opts.k_aux ? opts.k_aux : config_.d_in / 2);
      const Tensor error = sub(target, l.x_hat);
      const TopK top =
          topk_matmul(input_of(x), index_select(W_enc, 1, opts.dead), index_select(b_enc, 0, opts.dead), k_aux);
      const Tensor error_hat = sparse_matmul(top.values, top.indices, index_select(W_dec, 0, opts.dead));
      // SAELens scales it down while fewer latents are dead than k_aux asks for
      const double scale = std::min(1.0, static_cast<double>(dead) / static_cast<double>(k_aux));
      l.aux = mul(row_squared_error(error_hat, error), scale);
      l.total = add(l.mse, mul(l.aux, opts.aux));
      break;
    }
  }
  return l;
}

}  // namespace headlab::nn
