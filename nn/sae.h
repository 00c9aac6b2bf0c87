// Sparse autoencoders (SAEs) and transcoders over a model's activations, with SAELens's parameter names and shapes
// (W_enc (d_in, d_sae), W_dec (d_sae, d_in), b_enc, b_dec, threshold) and maths:
//   pre   = (x - b_dec [apply_b_dec_to_input]) @ W_enc + b_enc        (..., d_sae)
//   f     = relu(pre)                 relu (SAELens "standard")
//           relu(the k largest of pre), the rest 0                      topk (Gao et al. 2024)
//           relu(pre) where pre > threshold, else 0                     jumprelu (Rajamanoharan et al. 2024)
//   x_hat = f @ W_dec + b_dec                                          (..., d_out)
// A transcoder is the same maps from one hook point to another (an MLP's input to its output): d_out may differ from
// d_in, and b_dec is the output's bias. The training losses (the trainer adds Adam and the schedule: train/sae.h):
//   relu:     ||x_hat - y||^2 + l1 * sum_i f_i ||W_dec[i]||      (Anthropic's April 2024 update: decoder-norm-weighted)
//   topk:     ||x_hat - y||^2 + aux * AuxK (the dead latents' k_aux largest reconstruct the error)
//   jumprelu: ||x_hat - y||^2 + l0 * sum_i [pre_i > threshold_i]  (the threshold learned by the straight-through rule)
// each term summed over features and averaged over rows. The TopK SAE encodes and decodes sparsely (ops/sparse.cpp):
// its decoder reads k of d_sae rows a row and its gradients touch only those.
#pragma once
#include <string>

#include "base/enum_names.h"
#include "nn/module.h"

namespace headlab::nn {

enum class SaeArch { relu, topk, jumprelu };
constexpr auto enum_table(SaeArch) {  // SAELens's architecture names; "standard" is relu's
  return std::to_array<EnumName<SaeArch>>(
      {{SaeArch::relu, "relu"}, {SaeArch::topk, "topk"}, {SaeArch::jumprelu, "jumprelu"}, {SaeArch::relu, "standard"}});
}

struct SaeConfig {
  int64_t d_in = 0, d_sae = 0;
  int64_t d_out = 0;  // the reconstruction's width: d_in for an SAE, the target's for a transcoder (0: d_in)
  SaeArch arch = SaeArch::relu;
  int64_t k = 0;  // topk: features kept a row
  bool apply_b_dec_to_input = true;
  int64_t out_width() const { return d_out ? d_out : d_in; }
  void validate() const;  // sizes > 0, k in [1, d_sae] for topk, b_dec on the input only where d_out == d_in
};

// A row block's codes: dense features (R, d_sae), or for topk also its (R, k) values and indices.
struct SaeCodes {
  Tensor pre;      // (R, d_sae) pre-activations; undefined on topk's sparse path
  Tensor values;   // topk: (R, k), relu'd, largest first
  Tensor indices;  // topk: (R, k) int64
  Tensor dense;    // (R, d_sae); built on request for topk (dense())
};

// What a training step minimises and reports (each a scalar tensor; aux undefined where it does not apply).
struct SaeLoss {
  Tensor total, mse, sparsity, aux;
  Tensor x_hat;  // (R, d_out), detached
  SaeCodes codes;
};

struct SaeLossOptions {
  double l1 = 5.0;           // relu
  double l0 = 1.0;           // jumprelu
  double bandwidth = 0.001;  // jumprelu's straight-through window (SAELens's default)
  double aux = 1.0 / 32;     // topk: AuxK's coefficient (Gao et al.'s; SAELens takes 1)
  int64_t k_aux = 0;         // topk: dead latents kept for AuxK (0: d_in / 2)
  Tensor dead;               // topk: int64 indices of the dead latents (empty: no AuxK term)
  Tensor log_threshold;      // jumprelu in training: the learned log threshold (undefined: the module's)
};

class SparseAutoencoder : public Module {
 public:
  explicit SparseAutoencoder(const SaeConfig& config);
  std::string type_name() const override { return "SparseAutoencoder"; }
  std::string extra_repr() const override;

  // x: (..., d_in) -> dense features (..., d_sae), as SAELens's encode.
  Tensor encode(const Tensor& x);
  // f: (..., d_sae) -> (..., d_out)
  Tensor decode(const Tensor& f);
  Tensor forward(const Tensor& x) { return decode(encode(x)); }
  // x: (R, d_in) -> the codes the training path uses (topk's stay sparse); jumprelu's threshold (default the
  // module's) with the straight-through window `bandwidth`.
  SaeCodes encode_rows(const Tensor& x, const Tensor& threshold = Tensor(), double bandwidth = 0.001);
  Tensor decode_rows(const SaeCodes& codes);
  // x: (R, d_in), target: (R, d_out) (x for an SAE) -> the loss of `config().arch`.
  SaeLoss loss(const Tensor& x, const Tensor& target, const SaeLossOptions& opts);

  // W_dec's rows scaled to unit norm (TopK's constraint, Gao et al.), in place, without gradient.
  void normalize_decoder();
  // ||W_dec[i]|| (d_sae)
  Tensor decoder_norms() const;

  const SaeConfig& config() const { return config_; }
  Tensor W_enc, W_dec, b_enc, b_dec, threshold;  // threshold: jumprelu only

 private:
  Tensor input_of(const Tensor& x) const;  // x - b_dec where apply_b_dec_to_input
  SaeConfig config_;
};

// f (R, d_sae) from topk's codes.
Tensor dense_codes(const SaeCodes& codes, int64_t d_sae);

}  // namespace headlab::nn
