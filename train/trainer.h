// The training loop: a model of any family on a task, evaluation on the validation stream, metrics.csv,
// progress on the terminal (train/progress.h), checkpoints every N steps (keeping the last K), exact
// resume (train/resume.h), and a checkpoint on Ctrl-C. Deterministic given the seed: the data stream is
// a function of the step.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/enum_names.h"
#include "io/checkpoint.h"
#include "train/collectives.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/resume.h"

namespace headlab::train {

// Called by the writing rank before the first step, every `every` steps and after the last, with the
// model in eval mode and gradients off (back in training mode after), the run's task and its rows' T
// tokens: what watches a model while it trains (headlab train --track-heads). Its time is kept apart
// (TrainResult::observer_seconds); it must not draw from the default generator (dropout's).
struct StepObserver {
  int64_t every = 0;  // 0: never
  std::function<void(nn::Model& model, const tasks::Task& task, int64_t T, int64_t step)> call;
  // What the observer needs of the run (its model, rows of T tokens), checked when the run starts: before the
  // first line, and before --overwrite removes an earlier run.
  std::function<void(const nn::Model& model, int64_t T)> check;
};

// A training step's peak (on the CPU) and the evaluation batches, all held at once, against the available
// memory: fails naming who and the options to lower.
void check_training_fits(const RunConfig& config, const std::string& who);

// How a training step on the CPU uses this process's threads (omp_get_max_threads(), --threads):
// ops: every op splits its work over them; data: each thread computes its rows of every batch, a rank
// of the threads transport (run_on_threads), with single-threaded kernels; automatic: data when the
// batch splits into shares of a multiple of 4 rows and the extra copies of the model (parameters,
// gradients, optimizer state) take at most kMaxReplicaBytes, else ops. Measured (bench/data_parallel.sh,
// docs/data-parallel.md): on the demo's and the chars model data runs 1.67x and 2.21x one thread, ops
// 1.19x and 1.87x.
enum class ThreadUse { automatic, ops, data };
constexpr auto enum_table(ThreadUse) {  // enum_name, parse_enum (base/enum_names.h)
  return std::to_array<EnumName<ThreadUse>>(
      {{ThreadUse::automatic, "auto"}, {ThreadUse::ops, "ops"}, {ThreadUse::data, "data"}});
}
inline constexpr double kMaxReplicaBytes = 1 << 30;

// The files of a run in `dir` (checkpoint.h5, checkpoint-<step>.h5, metrics.csv, heads_over_time.*),
// by name, sorted.
std::vector<std::string> run_files(const std::string& dir);
// The run's checkpoint history in `dir`: (step, path) of every checkpoint-<step>.h5, by step.
std::vector<std::pair<int64_t, std::string>> checkpoint_history(const std::string& dir);

struct TrainOptions {
  nn::ModelOptions model;                    // the model of a fresh run (resolve() makes its section)
  RunConfig config = RunConfig::defaults();  // the rest (resolve() fills in what the task decides)
  std::string out = "runs/reverse";
  bool resume = false;  // continue <out>/checkpoint.h5 up to config.run.steps
  // A fresh run into a folder holding another run's files (run_files) is refused unless overwrite,
  // which removes them first, so that two runs' checkpoint histories and metrics never mix.
  bool overwrite = false;
  int64_t log_every = 50;
  bool quiet = false;  // no progress output (tests)
  // Non-empty: a fresh run starts from these parameters (fine-tuning, e.g. a pruned checkpoint's)
  // instead of a random initialisation, with init_model (the parameters' config section) in place of
  // `model`. Ignored on resume.
  NamedTensors init;
  nlohmann::json init_model;
  // Data parallelism: the ranks this run is spread over (null: a single process). --batch-size stays the
  // global batch; rank r computes rows [r B/N, (r+1) B/N) of every global batch (with the dropout masks
  // those rows get in a single process), gradients are summed over the ranks, every rank steps the same
  // optimizer state, every rank scores its share of the validation batches, and rank 0 alone prints and
  // writes files.
  std::shared_ptr<Collectives> comm;
  ThreadUse thread_use = ThreadUse::automatic;
  // On resume, the command-line options the user gave ("--lr", "--emb-dim"): a given option that fixes
  // the model, the task or the data must agree with the checkpoint (ResumeMismatch otherwise); a given
  // option that may change (learning rate and schedule, cadences, gradient clipping) replaces the
  // checkpoint's, and the run says so. --steps, --device and the --skip-nonfinite settings are always
  // this process's. Empty (a library caller): the checkpoint decides everything else.
  std::vector<std::string> told;
  StepObserver observer;
};

// Divergence without a NaN. A parameter whose magnitude passes kMaxParameter stops the run: the models
// here start at |w| ~ 0.02 and healthy training keeps weights O(1) (weight decay pulls them in), so 1e6
// is five orders of magnitude past any healthy weight, yet 32 orders below float32's overflow: a
// run growing its weights to 1e30 is stopped long before it reaches inf, and never saved.
inline constexpr double kMaxParameter = 1e6;
// A loss spike: once past the warm-up, with at least 3 logged train losses (metrics rows), a step's
// loss above both 10 x the median of the last (up to) 50 logged train losses and ln(vocab_size), the
// loss of a uniform guess (so a near-perfect model's 0.001 -> 0.05 is no divergence). "" when the step
// is fine, otherwise what happened, for the message.
std::string loss_spike(double loss, const std::vector<io::MetricRow>& logged, int64_t step, int64_t warmup,
                       int64_t vocab_size);

struct TrainResult {
  int64_t steps_done = 0;
  bool interrupted = false;
  double seconds = 0, tokens_per_s = 0;
  double observer_seconds = 0;  // in the observer's calls, part of seconds
  Scores final_eval;
  std::string checkpoint;  // path of the latest checkpoint
};

// Set by SIGINT (and SIGTERM, which an MPI launcher sends on Ctrl-C); the loop saves a checkpoint and
// stops at the next step boundary (under MPI: the step after any rank saw the signal, on every rank).
std::atomic<bool>& stop_requested();
void install_sigint_handler();

// Data parallelism's one collective per step: every parameter's gradient (zeros where a rank has none)
// and then `extra` go into one buffer, one allreduce sums it over comm's ranks, and the sums come back
// as the gradients (views of that buffer) and into `extra`. Every rank ends with the same gradients, so
// the same clipping and optimizer step follow. Returns the summed gradients' global L2 norm, taken from
// the buffer in the same pass (clip_grads_with_norm takes it from there).
double allreduce_gradients(Collectives& comm, const std::vector<Tensor>& params, std::vector<float>& extra);

class Trainer {
 public:
  explicit Trainer(TrainOptions opts);
  TrainResult run();

 private:
  struct Session;  // the model, optimizer and state of one run
  std::unique_ptr<Session> start();
  int data_parallel_threads(const Session& s) const;  // 1: no data parallelism over threads (ThreadUse)
  void refuse_another_run() const;                    // a fresh run into a folder holding another, unless --overwrite
  void remove_another_run() const;  // --overwrite: the other run's files, once the run's checks passed
  TrainResult train(Session& s);    // the steps, on this rank
  // One optimizer step on batch data_index: this rank's rows forward and backward, the gradients summed
  // over the ranks, clipped; the step itself unless the non-finite policy skips it (or stops the run).
  void step(Session& s, double lr);
  void finish(Session& s, TrainResult& result) const;  // the final evaluation and the closing summary
  void check_parameters(const Session& s) const;
  std::string save(Session& s) const;
  // nonfinite: a NaN or inf, which --skip-nonfinite could skip (advised only then)
  [[noreturn]] void diverged(const Session& s, int64_t step, const std::string& what, bool nonfinite = true) const;
  void evaluate_and_log(Session& s, double lr);
  // Data parallelism: sums every gradient and `extra` over the ranks; checks the ranks hold one model.
  double all_reduce_gradients(Session& s, std::vector<float>& extra) const;  // the gradients' norm
  void check_ranks_agree(const Session& s) const;
  TrainOptions opts_;
  std::string latest_;  // <out>/checkpoint.h5
};

}  // namespace headlab::train
