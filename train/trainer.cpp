// The training loop. Each step: batch `data_index` of the train stream -> forward -> cross entropy
// on answer tokens -> backward -> clip -> optimizer step. Everything that decides the next step
// (parameters, optimizer state, generator (seed, offset), data index, step) is in the checkpoint,
// so a resumed run continues bit for bit. The run's files and checkpoints: trainer_files.cpp; data
// parallelism's collectives: trainer_parallel.cpp.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>

#include "backends/backend.h"
#include "io/folder_lock.h"
#include "io/temp_files.h"
#include "train/memory.h"
#include "train/progress.h"
#include "train/trainer_internal.h"

namespace headlab::train {

namespace fs = std::filesystem;

std::atomic<bool>& stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

namespace {

void on_sigint(int) {
  if (stop_requested().exchange(true)) _exit(130);  // a second Ctrl-C stops at once
}

std::string fixed(double v, int precision) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

// The median of the last (up to) 50 logged train losses.
double median_of_recent(const std::vector<io::MetricRow>& logged) {
  const size_t n = std::min<size_t>(logged.size(), 50);
  std::vector<double> v;
  for (size_t i = logged.size() - n; i < logged.size(); ++i) v.push_back(logged[i].train_loss);
  std::sort(v.begin(), v.end());
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string loss_spike(double loss, const std::vector<io::MetricRow>& logged, int64_t step, int64_t warmup,
                       int64_t vocab_size) {
  if (step <= warmup || logged.size() < 3 || !std::isfinite(loss)) return "";
  const double median = median_of_recent(logged);
  const double uniform = std::log(static_cast<double>(std::max<int64_t>(vocab_size, 2)));
  if (!(loss > 10 * median && loss > uniform)) return "";
  return "loss " + fmt_value(loss) + ", more than 10 x the median " + fmt_value(median) + " of the last " +
         std::to_string(std::min<size_t>(logged.size(), 50)) + " logged train losses and more than ln(vocab) " +
         fixed(uniform, 3) + ", a uniform guess's";
}

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

Trainer::Trainer(TrainOptions opts) : opts_(std::move(opts)) {
  if (!opts_.comm) opts_.comm = single_process();
  if (opts_.comm->rank() != 0) opts_.quiet = true;  // rank 0 speaks for the run
  opts_.config.run.validate();
  HL_CHECK(opts_.config.optimizer.lr > 0, "train: --lr must be positive, got ", opts_.config.optimizer.lr);
  latest_ = (fs::path(opts_.out) / "checkpoint.h5").string();
}

void check_training_fits(const RunConfig& config, const std::string& who) {
  const RunSettings& run = config.run;
  const int64_t T = config.batch_tokens();
  MemoryEstimate need;
  std::string advice;
  if (!Device::parse(run.device).is_cuda()) {
    const optim::OptimizerOptions& o = config.optimizer;
    const int slots = o.kind == optim::OptimizerKind::sgd ? (o.momentum != 0 ? 1 : 0) : 2;
    need = estimate_memory(config.model, run.batch_size, T, true, slots);
    const nn::ModelOptions m = config.family().model.options(config.model);
    advice = "lower --emb-dim (now " + std::to_string(m.emb_dim) + "), --n-layers (" + std::to_string(m.n_layers) +
             "), --batch-size (" + std::to_string(run.batch_size) + "), the context length (" + std::to_string(T) +
             ") or ";
  }
  need.data = estimate_batches_memory(run.eval_batches, run.batch_size, T);
  check_memory_fits(need, who, advice + "--eval-batches (now " + std::to_string(run.eval_batches) + ")");
}

// The run's configuration (fresh, or the checkpoint's on --resume), model, optimizer and state.
std::unique_ptr<Trainer::Session> Trainer::start() {
  auto s = std::make_unique<Session>();
  // (mpirun hands rank 0 a pseudo-terminal whatever its own output is: data-parallel runs log lines)
  s->progress = Progress(opts_.quiet, opts_.comm->processes() == 1 && isatty(STDOUT_FILENO), opts_.log_every);
  io::Checkpoint resumed;
  std::string changes;  // what --resume changed, said once every check passed
  if (opts_.resume) {
    HL_CHECK(fs::exists(latest_), "train: --resume was given but '", latest_, "' does not exist");
    resumed = io::load_checkpoint(latest_);
    HL_CHECK(resumed.has_optimizer && resumed.has_trainer, "checkpoint '", latest_,
             "': has no optimizer or trainer state, so it cannot be resumed");
    s->config = resume_config(config_of(resumed, latest_), latest_, opts_.config, opts_.model, opts_.told, changes);
  } else {
    s->config = resolve(opts_.model, opts_.config, opts_.init.empty() ? nlohmann::json() : opts_.init_model);
  }
  const int64_t B = s->config.run.batch_size, ranks = opts_.comm->size();
  HL_CHECK(B % ranks == 0, "train: --batch-size ", B, " does not split evenly over ", ranks,
           " ranks; use a multiple of ", ranks);
  const Device device = Device::parse(s->config.run.device);
  backend_for(device);  // fails early and clearly when the device is unavailable
  check_training_fits(s->config, "train");
  s->task = s->config.make_task();
  manual_seed(s->config.run.seed);
  s->model = s->config.make_model();
  if (opts_.observer.every > 0 && opts_.observer.check) opts_.observer.check(*s->model, s->config.batch_tokens());
  if (opts_.resume)
    s->model->load_parameters(resumed.model, "checkpoint '" + latest_ + "'");
  else if (!opts_.init.empty())
    s->model->load_parameters(opts_.init, "train: the initial parameters");
  s->model->to(device);
  s->model->train();
  s->opt = std::make_unique<optim::Optimizer>(s->model->named_parameters(), s->config.optimizer);
  if (opts_.resume) {
    s->opt->load_state(resumed.optimizer_state, resumed.optimizer_steps, "checkpoint '" + latest_ + "'");
    s->state = resumed.trainer;
    s->good_checkpoint_step = s->state.step;
    default_generator().set_state(s->state.rng_seed, s->state.rng_offset);
  }
  s->params = s->model->parameters();
  s->first_step = s->state.step;
  if (!changes.empty()) s->progress.line("resume: changed " + changes);
  return s;
}

// The error that ends a diverged run: what happened at which step, what is kept, what to try.
void Trainer::diverged(const Session& s, int64_t step, const std::string& what, bool nonfinite) const {
  const RunConfig& c = s.config;
  std::ostringstream os;
  os << "train: step " << step << " diverged: " << what << ". Nothing was saved for it; ";
  if (s.good_checkpoint_step >= 0)
    os << "'" << latest_ << "' (the last good checkpoint, step " << s.good_checkpoint_step << ") is untouched";
  else
    os << "no checkpoint of this run had been written yet";
  os << ". Try a lower --lr (now " << c.optimizer.lr << ")" << (nonfinite ? ", " : " or ");
  os << (c.run.grad_clip > 0 ? "a lower --grad-clip (now " + fixed(c.run.grad_clip, 2) + ")"
                             : std::string("--grad-clip 1"));
  if (nonfinite) os << ", or --skip-nonfinite to skip such steps";
  HL_FAIL(os.str());
}

// A finite loss and gradient can still step a parameter to inf, or grow it without bound: checked
// before anything is evaluated or written, so a model with a NaN, an inf or a parameter past
// kMaxParameter is never logged as a result or saved. (A copy of every parameter to the host: done at
// the evaluation and save steps only, not every step.)
void Trainer::check_parameters(const Session& s) const {
  for (const auto& [name, p] : s.model->named_parameters()) {
    if (!p.all_finite())
      diverged(s, s.state.step, "parameter '" + name + "' holds NaN or inf after the optimizer step");
    const Tensor host = p.detach().to(kCPU).to(DType::f32).contiguous();
    const float* v = host.data<float>();
    double largest = 0;
    for (int64_t i = 0; i < host.numel(); ++i) largest = std::max(largest, static_cast<double>(std::fabs(v[i])));
    if (largest > kMaxParameter)
      diverged(s, s.state.step,
               "parameter '" + name + "' holds a value of magnitude " + fmt_value(largest) + ", more than " +
                   fmt_value(kMaxParameter),
               false);
  }
}

void Trainer::evaluate_and_log(Session& s, double lr) {
  const RunSettings& run = s.config.run;
  // Every rank scores its share of the batches (rank 0 alone took the others' time at every evaluation); rank 0
  // logs them.
  const Scores ev =
      evaluate(*s.model, *s.task, run.eval_batches, run.batch_size, s.config.batch_tokens(), opts_.comm.get());
  if (opts_.comm->rank() != 0) return;
  const io::MetricRow row{s.state.step,
                          s.window_loss / static_cast<double>(s.window_steps),
                          ev.loss,
                          ev.token_accuracy,
                          ev.has_exact_match ? ev.exact_match : 0.0,
                          lr,
                          s.last_norm,
                          s.rate};
  s.state.metrics.push_back(row);
  write_metrics_csv((fs::path(opts_.out) / "metrics.csv").string(), s.state.metrics);
  s.wrote_metrics = true;
  std::ostringstream os;
  os << "eval step " << s.state.step << ": train loss " << fixed(row.train_loss, 4) << "  val loss "
     << fixed(ev.loss, 4) << "  token accuracy " << fixed(ev.token_accuracy, 3);
  if (ev.has_exact_match) os << "  exact match " << fixed(ev.exact_match, 3);
  s.progress.line(os.str());
  s.window_loss = 0;
  s.window_steps = 0;
  s.window_tokens = 0;
  s.window_start = std::chrono::steady_clock::now();
}

TrainResult Trainer::run() {
  Collectives& comm = *opts_.comm;
  const bool writer = comm.rank() == 0;  // rank 0 alone logs and writes files
  io::FolderLock lock;                   // rank 0's, on the output folder, until the run ends
  if (writer) {
    std::vector<std::string> removed;
    lock = io::open_output_folder(opts_.out, "train", &removed);
    for (const std::string& f : removed)
      if (!opts_.quiet) std::cout << "removed " << f << ", a temporary file left by a writer that no longer runs\n";
    if (!opts_.resume) refuse_another_run();
  }
  const std::unique_ptr<Session> session = start();
  const int threads = data_parallel_threads(*session);
  if (writer && !opts_.resume) remove_another_run();  // --overwrite: only once every check passed
  if (threads == 1) return train(*session);
  TrainResult result;
  run_on_threads(threads, opts_.comm, [&](const std::shared_ptr<Collectives>& rank) {
    TrainOptions mine = opts_;
    mine.comm = rank;
    Trainer trainer(std::move(mine));
    if (rank->rank() % threads == 0) {  // the calling thread: this process's first rank, its session
      result = trainer.train(*session);
      return;
    }
    std::unique_ptr<Session> own;
    {
      static std::mutex starting;  // one at a time: HDF5 (a resumed checkpoint) is not thread-safe
      const std::lock_guard<std::mutex> one(starting);
      own = trainer.start();
    }
    trainer.train(*own);
  });
  return result;
}

TrainResult Trainer::train(Session& s) {
  Collectives& comm = *opts_.comm;
  const bool writer = comm.rank() == 0;
  const RunSettings& run = s.config.run;
  const int64_t steps = run.steps, B = run.batch_size, T = s.config.batch_tokens(), ranks = comm.size();
  check_ranks_agree(s);
  s.progress.line("headlab train: task " + s.task->name() + ", " + s.config.describe_model() + ", " +
                  std::to_string(s.model->num_parameters()) + " parameters, device " + s.model->device().str());
  if (ranks > 1)
    s.progress.line("data parallel: " + std::to_string(ranks) + " ranks (" + comm.name() + "), " +
                    std::to_string(B / ranks) + " of the " + std::to_string(B) + " rows of every batch each");
  if (opts_.resume) s.progress.line("resuming from " + latest_ + " at step " + std::to_string(s.state.step));
  TrainResult result;
  result.checkpoint = latest_;
  if (s.state.step >= steps) {
    s.progress.line("already at step " + std::to_string(s.state.step) + " of " + std::to_string(steps) +
                    "; nothing to do");
    result.steps_done = s.state.step;
    if (writer) result.final_eval = evaluate(*s.model, *s.task, run.eval_batches, B, T);
    return result;
  }

  using clock = std::chrono::steady_clock;
  const auto run_start = clock::now();
  const double elapsed_before = s.state.elapsed_seconds;
  const auto observe = [&] {
    if (!writer || opts_.observer.every <= 0 || !opts_.observer.call) return;
    const auto t0 = clock::now();
    s.model->eval();
    {
      const NoGradGuard no_grad;
      opts_.observer.call(*s.model, *s.task, T, s.state.step);
    }
    s.model->train();
    result.observer_seconds += std::chrono::duration<double>(clock::now() - t0).count();
  };
  observe();
  if (ranks > 1) {  // some rank saw a signal before the first step
    double seen = stop_requested() ? 1.0 : 0.0;
    comm.allreduce_sum(&seen, 1);
    s.stop_agreed = seen > 0;
  }
  while (s.state.step < steps) {
    if (ranks == 1 ? stop_requested().load() : s.stop_agreed) {
      result.interrupted = true;
      break;
    }
    const double lr = s.config.schedule.at(s.state.step);
    step(s, lr);
    const double window_s = std::chrono::duration<double>(clock::now() - s.window_start).count();
    s.rate = window_s > 0 ? static_cast<double>(s.window_tokens) / window_s : 0;
    s.progress.step(s.state.step, s.first_step, steps, std::chrono::duration<double>(clock::now() - run_start).count(),
                    s.window_loss / static_cast<double>(s.window_steps), lr, s.last_norm, s.rate);
    const bool eval = s.state.step % run.eval_every == 0 || s.state.step == steps;
    if (eval || s.state.step % run.save_every == 0) check_parameters(s);
    if (eval) check_ranks_agree(s);
    if (eval) evaluate_and_log(s, lr);
    s.state.elapsed_seconds = elapsed_before + std::chrono::duration<double>(clock::now() - run_start).count();
    if (writer && (s.state.step % run.save_every == 0 || s.state.step == steps)) save(s);
    if (s.state.step % std::max<int64_t>(opts_.observer.every, 1) == 0 || s.state.step == steps) observe();
  }
  s.progress.finish();
  if (result.interrupted && writer) {
    save(s);
    s.progress.line("interrupted: saved " + latest_ + " at step " + std::to_string(s.state.step) +
                    "; continue with --resume");
  }
  result.steps_done = s.state.step;
  result.seconds = std::chrono::duration<double>(clock::now() - run_start).count();
  result.tokens_per_s = result.seconds > 0 ? static_cast<double>(s.tokens_trained) / result.seconds : 0;
  finish(s, result);
  return result;
}

void Trainer::step(Session& s, double lr) {
  Collectives& comm = *opts_.comm;
  const RunSettings& run = s.config.run;
  const int64_t B = run.batch_size, T = s.config.batch_tokens(), ranks = comm.size(), rows = B / ranks;
  s.opt->set_lr(lr);
  const tasks::Batch b = s.task->batch(tasks::Split::train, s.state.data_index, B, T);  // the global batch
  // Data parallelism: this rank's rows, with the dropout masks they get in the whole batch.
  const bool sharded = ranks > 1;
  const int64_t first_row = comm.rank() * rows;
  tasks::Batch shard;
  if (sharded) shard = b.rows(first_row, rows);
  const tasks::Batch& mine = sharded ? shard : b;
  if (sharded) default_generator().set_row_shard(first_row, rows, B);
  const Tensor tgt = tensor(mine.targets, {mine.B * b.T}).to(s.model->device());
  const Tensor logits = s.model->logits(model_inputs(mine, s.model->device())).reshape({mine.B * b.T, -1});  // (B T, V)
  // The mean cross entropy over scored targets: for seq2seq batches the valid target tokens, the loss
  // d2l's MaskedSoftmaxCELoss reports (its per-row sums over num_tokens). A rank takes the sum over its
  // scored targets divided by the whole batch's count, so the ranks' gradients sum to the mean's.
  const Tensor loss = sharded ? cross_entropy(logits, tgt, kIgnoreIndex, Reduction::sum) *
                                    (1.0 / static_cast<double>(std::max<int64_t>(b.scored_targets(), 1)))
                              : cross_entropy(logits, tgt, kIgnoreIndex);
  loss.backward();
  double loss_value = loss.item<double>();
  double norm = 0;
  if (sharded) {
    default_generator().set_row_shard(0, 0, 0);
    std::vector<float> extra{static_cast<float>(loss_value), stop_requested() ? 1.0f : 0.0f};
    norm = all_reduce_gradients(s, extra);
    loss_value = extra[0];
    s.stop_agreed = extra[1] > 0;
  } else {
    norm = optim::grad_norm(s.params);
  }
  if (run.grad_clip > 0) optim::clip_grads_with_norm(s.params, run.grad_clip, norm);
  // The non-finite policy: stop, or skip the step (its batch consumed, its parameters unchanged).
  if (!std::isfinite(loss_value) || !std::isfinite(norm)) {
    const std::string what = "loss " + fmt_value(loss_value) + ", gradient norm " + fmt_value(norm);
    if (!run.skip_nonfinite) diverged(s, s.state.step + 1, what);
    if (++s.skipped_in_a_row > run.max_skipped_steps)
      diverged(s, s.state.step + 1,
               what + " (" + std::to_string(s.skipped_in_a_row) +
                   " such steps in a row, more than --max-skipped-steps " + std::to_string(run.max_skipped_steps) +
                   ")");
    ++s.skipped_total;
    s.progress.line("step " + std::to_string(s.state.step + 1) + ": " + what + ": skipped (" +
                    std::to_string(s.skipped_in_a_row) + " in a row)");
  } else {
    const std::string spike =
        loss_spike(loss_value, s.state.metrics, s.state.step + 1, s.config.schedule.warmup, s.task->vocab_size());
    if (!spike.empty()) diverged(s, s.state.step + 1, spike, false);
    s.skipped_in_a_row = 0;
    s.last_norm = norm;
    s.opt->step();
    s.window_loss += loss_value;
    ++s.window_steps;
  }
  s.opt->zero_grad();
  ++s.state.step;
  ++s.state.data_index;
  s.window_tokens += b.B * b.T;
  s.tokens_trained += b.B * b.T;
}

void Trainer::finish(Session& s, TrainResult& result) const {
  const bool writer = opts_.comm->rank() == 0;
  const RunSettings& run = s.config.run;
  if (writer && s.state.metrics.empty()) {  // (rank 0 reports the run)
    result.final_eval = evaluate(*s.model, *s.task, run.eval_batches, run.batch_size, s.config.batch_tokens());
  } else if (writer) {
    const io::MetricRow& m = s.state.metrics.back();
    result.final_eval.loss = m.val_loss;
    result.final_eval.token_accuracy = m.val_accuracy;
    result.final_eval.has_exact_match = s.task->end_id() >= 0;
    result.final_eval.exact_match =
        result.final_eval.has_exact_match ? m.val_exact_match : result.final_eval.exact_match;
  }
  std::ostringstream os;
  if (s.skipped_total > 0) os << "skipped " << s.skipped_total << " steps whose loss or gradient norm was not finite\n";
  os << "trained " << s.state.step - s.first_step << " steps in " << fixed(result.seconds, 1) << " s ("
     << fixed(result.tokens_per_s / 1000.0, 1) << "k tok/s)\n";
  if (result.observer_seconds > 0)
    os << "watching the model (--track-heads) took " << fixed(result.observer_seconds, 1) << " s of them ("
       << fixed(100 * result.observer_seconds / std::max(result.seconds, 1e-9), 1) << "%)\n";
  if (opts_.comm->size() > 1)
    os << "data parallel: rank 0 spent " << fixed(s.allreduce_seconds, 2) << " s ("
       << fixed(100 * s.allreduce_seconds / std::max(result.seconds, 1e-9), 1)
       << "%) in the gradient allreduce, waiting for the slowest rank included\n";
  const std::string metrics = (fs::path(opts_.out) / "metrics.csv").string();
  if (s.wrote_checkpoint)
    os << "wrote " << latest_ << " (history: checkpoint-<step>.h5, last " << run.keep_last << " kept)"
       << (s.wrote_metrics ? " and " + metrics : std::string());
  else if (s.wrote_metrics)
    os << "wrote " << metrics << "; no checkpoint (no step reached --save-every " << run.save_every << ")";
  else
    os << "wrote no checkpoint and no metrics (no step reached --save-every " << run.save_every << " or --eval-every "
       << run.eval_every << ")";
  s.progress.line(os.str());
}

}  // namespace headlab::train
