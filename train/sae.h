// Training sparse autoencoders and transcoders (nn/sae.h) on a stream of activation rows, in bounded memory: a
// shuffled buffer of a stated number of rows (never the corpus), refilled from the stream as it empties; Adam; b_dec
// started at the rows' mean or geometric median; TopK's decoder rows kept at unit norm; dead latents counted by the
// tokens since each last fired (and fed to AuxK).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "nn/sae.h"
#include "optim/optim.h"

namespace headlab::train {

// Rows of activations in the order a model produced them: next() gives (R, width) rows, R <= max_rows, and R == 0
// at the end. A transcoder's source gives its input and target side by side (width d_in + d_out).
class ActivationSource {
 public:
  virtual ~ActivationSource() = default;
  virtual int64_t width() const = 0;
  virtual Tensor next(int64_t max_rows) = 0;
};

// A fixed (N, width) matrix as a source (tests, benchmarks, activations computed elsewhere).
class MatrixSource : public ActivationSource {
 public:
  explicit MatrixSource(Tensor rows);
  int64_t width() const override { return rows_.size(1); }
  Tensor next(int64_t max_rows) override;

 private:
  Tensor rows_;
  int64_t at_ = 0;
};

// A buffer of `capacity` rows filled from a source and handed out in random batches, each row once: when fewer than
// half remain it is topped up from the source, so a batch mixes rows from up to capacity / batch earlier batches'
// worth of the stream (SAELens's mixing buffer). Memory: capacity x width floats.
class ShuffledBuffer {
 public:
  ShuffledBuffer(ActivationSource& source, int64_t capacity, uint64_t seed);
  // (rows, width); fewer rows only at the stream's end; undefined once everything was handed out.
  Tensor next_batch(int64_t rows);
  int64_t capacity() const { return capacity_; }

 private:
  void refill();
  ActivationSource& source_;
  int64_t capacity_, count_ = 0;
  bool exhausted_ = false;
  std::vector<float> rows_;  // capacity x width
  std::mt19937_64 rng_;
};

enum class BdecInit { mean, geometric_median, zeros };
constexpr auto enum_table(BdecInit) {  // SAELens's b_dec_init_method
  return std::to_array<EnumName<BdecInit>>(
      {{BdecInit::mean, "mean"}, {BdecInit::geometric_median, "geometric_median"}, {BdecInit::zeros, "zeros"}});
}

struct SaeTrainOptions {
  nn::SaeLossOptions loss;  // l1, l0, bandwidth, aux, k_aux (dead: the trainer's)
  optim::OptimizerOptions adam = adam_defaults();
  int64_t dead_after = 10'000'000;                 // tokens without firing that make a latent dead (Gao et al.'s 10M)
  std::optional<double> init_threshold;            // jumprelu: every threshold's start (none: the SAE's own)
  static optim::OptimizerOptions adam_defaults();  // Adam, lr 3e-4, betas 0.9 / 0.999 (the peer's and SAELens's)
};

// What one step saw, on its batch.
struct SaeStepStats {
  double loss = 0, mse = 0, sparsity = 0, aux = 0;
  double explained_variance = 0;  // 1 - ||x - x_hat||^2 / ||x - mean(x)||^2 over the batch
  double l0 = 0;                  // features active a row
  int64_t dead = 0;               // latents dead after this step
};

// What a trainer holds beyond its SAE's weights, for a checkpoint to resume from.
struct SaeTrainerState {
  NamedTensors tensors;  // float32: Adam's moments ("<param>/exp_avg", ...), log_threshold
  std::vector<std::pair<std::string, int64_t>> steps;  // Adam's, a parameter
  std::vector<int64_t> last_fired;                     // a latent's: the tokens seen when it last fired
  int64_t tokens = 0;
};

class SaeTrainer {
 public:
  SaeTrainer(nn::SparseAutoencoder& sae, const SaeTrainOptions& opts);
  // b_dec from a sample of target rows (R, d_out).
  void init_b_dec(const Tensor& sample, BdecInit how);
  // One Adam step on rows x (R, d_in) against target (R, d_out) (x itself for an SAE).
  SaeStepStats step(const Tensor& x, const Tensor& target);
  // Latents that fired in no row of the last dead_after tokens (int64, ascending).
  Tensor dead_latents() const;
  int64_t never_fired() const;  // latents that fired in no row since the trainer began
  int64_t tokens_seen() const { return tokens_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  // The state to save beside the SAE's weights, and its restoration into a trainer over an SAE holding the weights
  // saved with it (then steps continue as the saved trainer's would, bitwise); errors name `source`.
  SaeTrainerState state() const;
  void load_state(const SaeTrainerState& state, const std::string& source);

 private:
  void count_firing(const nn::SaeCodes& codes, int64_t rows);
  nn::SparseAutoencoder& sae_;
  SaeTrainOptions opts_;
  Tensor log_threshold_;  // jumprelu: the threshold is learned in log space, as SAELens does
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<int64_t> last_fired_;  // per latent: tokens_ when it last fired
  int64_t tokens_ = 0;
};

// The geometric median of rows (R, D) by Weiszfeld's iterations from their mean (SAELens's b_dec init).
Tensor geometric_median(const Tensor& rows, int64_t max_iterations = 100, double tolerance = 1e-5);

}  // namespace headlab::train
