// Sparse autoencoders on a model: activations streamed from its hook points for training (train/sae.h), the
// `headlab sae train` run (one forward pass feeds every SAE asked for, one a hook), and the evaluation SAELens's evals
// name (`headlab sae eval`): reconstruction, sparsity, and what splicing the SAE into the forward costs the model.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "io/sae_files.h"
#include "loader/load.h"
#include "train/sae.h"

namespace headlab::analysis {

// Rows of activations at hook points, batch after batch of text windows of the task's split: each forward pass
// gives B x T rows, the hooks' activations flattened after (B, T) (hook_z: heads x head size, SAELens's layout) and
// side by side, in the order of `hooks`. Ends after `max_tokens` rows.
class HookActivations : public train::ActivationSource {
 public:
  HookActivations(const loader::Loaded& in, std::vector<std::string> hooks, tasks::Split split, int64_t B, int64_t T,
                  int64_t max_tokens);
  int64_t width() const override { return width_; }
  const std::vector<int64_t>& widths() const { return widths_; }  // each hook's
  Tensor next(int64_t max_rows) override;
  // Where the stream stands (a checkpoint's), and a stream started there: the next forward is batch `batches`.
  int64_t batches_read() const { return static_cast<int64_t>(batch_); }
  int64_t rows_given() const { return given_; }
  double forward_seconds() const { return forward_seconds_; }  // in the model's forward passes so far
  void resume_at(int64_t batches, int64_t rows_given);

 private:
  Tensor forward_rows();  // the next batch's (B T, width)
  const loader::Loaded& in_;
  std::vector<std::string> hooks_;
  tasks::Split split_;
  int64_t B_, T_, max_tokens_, given_ = 0, width_ = 0;
  uint64_t batch_ = 0;
  std::vector<int64_t> widths_;
  Tensor pending_;  // rows of the last forward not yet handed out
  int64_t pending_at_ = 0;
  double forward_seconds_ = 0;
};

// One dictionary to train: an SAE reads and reconstructs `in`; a transcoder reads `in` and reconstructs `out` (an
// MLP's input, blocks.L.ln2.hook_normalized, to its output, blocks.L.hook_mlp_out).
struct SaeTarget {
  std::string in, out;  // out empty: an SAE
  bool transcoder() const { return !out.empty(); }
  std::string name() const { return transcoder() ? in + "_to_" + out : in; }  // its folder's
};

// An SAE's reconstruction of rows it did not train on (the val split's).
struct SaeHeldOut {
  double explained_variance = 0, mse = 0, l0 = 0;
};

struct SaeTrainArgs {
  std::vector<SaeTarget> targets;  // every one from the same forward passes
  nn::SaeArch arch = nn::SaeArch::topk;
  int64_t k = 32, expansion = 16;
  int64_t training_tokens = 1'000'000, batch_size = 4096, buffer_rows = 262144;
  int64_t rows_per_forward = 8, context = 0;  // sequences of `context` tokens a forward (0: the model's)
  int64_t log_every = 50;
  int64_t eval_every = 0;      // steps between held-out evaluations (0: only at the end)
  int64_t eval_tokens = 4096;  // the held-out rows (val split), read once
  int64_t checkpoint_every = 0;  // steps between checkpoints in out/checkpoint (0: none)
  bool resume = false;           // go on from out/checkpoint (its targets and sizes must be these)
  train::BdecInit b_dec_init = train::BdecInit::geometric_median;
  train::SaeTrainOptions options;
  uint64_t seed = 0;
  std::string out;  // one SAELens folder a target, out/<SaeTarget::name()>
};

struct SaeTrainReport {
  std::vector<std::string> folders;
  std::vector<train::SaeStepStats> last;  // each SAE's last step
  std::vector<SaeHeldOut> held_out;       // each SAE at the end, on args.eval_tokens held-out rows
  int64_t tokens = 0, steps = 0;  // steps and tokens of the whole run, a resumed one's before the checkpoint too
  int64_t dropped = 0;            // resumed: activations in the buffer at the checkpoint, not trained on
  int64_t resumed_tokens = 0;     // resumed: the tokens trained on before (what `seconds` does not cover)
  double seconds = 0;             // this run's training loop, of which:
  double forward_seconds = 0;     //   the model's forward passes (they do not overlap the steps)
  double step_seconds = 0;        //   the SAEs' steps
};

// Trains every target from one stream of forward passes (train split), writing each as a SAELens folder;
// `progress` gets a line every log_every steps and the held-out evaluation's every eval_every. Every
// checkpoint_every steps out/checkpoint is replaced whole (io::AtomicFolder): each SAE's SAELens folder with its
// trainer's state (trainer.safetensors: Adam's moments) and state.json (steps, tokens, the stream's place, each
// latent's last firing). A resumed run reads it and goes on from the next forward pass; the rows the shuffling
// buffer held then are not trained on (at most buffer_rows), so it is not bitwise the run that was not stopped.
SaeTrainReport train_saes(const loader::Loaded& in, const std::string& model_name, const SaeTrainArgs& args,
                          const std::function<void(const std::string&)>& progress);

// SAELens's evals of one SAE at its hook, or of a transcoder at the hook it reconstructs (its splice replaces that
// hook with its output), over `batches` validation batches of B x T (the val split).
struct SaeEvalReport {
  std::string hook;  // the hook spliced: an SAE's, a transcoder's hook_name_out
  int64_t tokens = 0;
  double explained_variance = 0;  // 1 - sum ||x - x_hat||^2 / sum ||x - mean x||^2 (SAELens's intended formula)
  double mse = 0;                 // per token: ||x - x_hat||^2, averaged over tokens
  double l0 = 0, l1 = 0;          // active features a token; their sum a token
  double ce_loss_without_sae = 0, ce_loss_with_sae = 0, ce_loss_with_ablation = 0, ce_loss_score = 0;
  double kl_div_with_sae = 0, kl_div_with_ablation = 0, kl_div_score = 0;  // KL(clean || spliced) a token
  int64_t dead_features = 0;                                               // active on no token
  int64_t dense_features = 0;                                              // active on more than 10% of tokens
  int64_t d_sae = 0;
};
SaeEvalReport evaluate_sae(const loader::Loaded& in, nn::SparseAutoencoder& sae, const io::SaeOrigin& origin,
                           int64_t batches, int64_t B, int64_t T);

}  // namespace headlab::analysis
