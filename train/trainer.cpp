// The training loop. Each step: batch `data_index` of the train stream -> forward -> cross entropy
// on answer tokens -> backward -> clip -> optimizer step. Everything that decides the next step
// (parameters, optimizer state, generator (seed, offset), data index, step) is in the checkpoint,
// so a resumed run continues bit for bit.
#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <regex>
#include <sstream>

#include "backends/backend.h"
#include "io/atomic_file.h"
#include "io/folder_lock.h"
#include "io/temp_files.h"
#include "train/memory.h"

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

std::string fmt(double v, int precision = 4) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

// A value that may be huge or not finite: "nan", "inf", "1.94457e+15", "2.6972".
std::string fmt_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

std::string fmt_rate(double tokens_per_s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << tokens_per_s / 1000.0 << "k tok/s";
  return os.str();
}

std::string fmt_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 60)
    os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else
    os << t << "s";
  return os.str();
}

void write_metrics_csv(const std::string& path, const std::vector<io::MetricRow>& rows) {
  std::ostringstream os;
  os << "step,train_loss,val_loss,val_accuracy,val_exact_match,lr,grad_norm,tokens_per_s\n";
  os << std::setprecision(8);
  for (const io::MetricRow& m : rows)
    os << m.step << ',' << m.train_loss << ',' << m.val_loss << ',' << m.val_accuracy << ',' << m.val_exact_match << ','
       << m.lr << ',' << m.grad_norm << ',' << m.tokens_per_s << '\n';
  io::write_file_atomic(path, os.str(), "train");
}

// Removes checkpoint-<step>.h5 files beyond the newest `keep`.
void prune_history(const std::string& dir, int64_t keep) {
  static const std::regex pattern(R"(checkpoint-(\d+)\.h5)");
  std::vector<std::pair<int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, pattern)) found.emplace_back(std::stoll(m[1].str()), e.path());
  }
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 0)) < found.size(); ++i) {
    std::error_code ec;
    fs::remove(found[i].second, ec);
  }
}

// What --resume compares: a command-line option and its value in a config. The model options are read
// where the checkpoint's architecture keeps them (train's command line fills both places).
struct ResumeSetting {
  const char* option;
  std::string (*value)(const RunConfig& c, Arch arch);
  void (*apply)(RunConfig& to, const RunConfig& from);  // null: fixed by the checkpoint
};

template <typename T>
std::string str(T v) {
  std::ostringstream os;
  os << std::setprecision(8) << v;
  return os.str();
}

std::string text_file(const RunConfig& c, Arch) {
  return fs::absolute(c.task.options.text_path).lexically_normal().string();
}

const std::vector<ResumeSetting>& resume_settings() {
  using A = Arch;
  static const std::vector<ResumeSetting> settings = {
      // the model
      {"--arch", [](const RunConfig& c, A) { return std::string(enum_name(c.arch)); }, nullptr},
      {"--attention", [](const RunConfig& c, A) { return std::string(enum_name(c.model.attention)); }, nullptr},
      {"--emb-dim", [](const RunConfig& c, A a) { return str(a == A::gpt ? c.model.emb_dim : c.seq2seq.num_hiddens); },
       nullptr},
      {"--ffn-hiddens", [](const RunConfig& c, A) { return str(c.seq2seq.ffn_num_hiddens); }, nullptr},
      {"--n-heads", [](const RunConfig& c, A a) { return str(a == A::gpt ? c.model.n_heads : c.seq2seq.num_heads); },
       nullptr},
      {"--n-layers", [](const RunConfig& c, A a) { return str(a == A::gpt ? c.model.n_layers : c.seq2seq.num_layers); },
       nullptr},
      {"--context-length", [](const RunConfig& c, A) { return str(c.model.context_length); }, nullptr},
      {"--drop-rate", [](const RunConfig& c, A a) { return str(a == A::gpt ? c.model.drop_rate : c.seq2seq.dropout); },
       nullptr},
      {"--qkv-bias", [](const RunConfig& c, A a) { return str(a == A::gpt ? c.model.qkv_bias : c.seq2seq.use_bias); },
       nullptr},
      {"--attn-only", [](const RunConfig& c, A) { return str(c.model.attn_only); }, nullptr},
      // the task and the data
      {"--task", [](const RunConfig& c, A) { return c.task.name; }, nullptr},
      {"--max-number", [](const RunConfig& c, A) { return str(c.task.options.max_number); }, nullptr},
      {"--text", text_file, nullptr},
      {"--min-len", [](const RunConfig& c, A) { return str(c.task.options.min_len); }, nullptr},
      {"--max-len", [](const RunConfig& c, A) { return str(c.task.options.max_len); }, nullptr},
      {"--digits", [](const RunConfig& c, A) { return str(c.task.options.n_digits); }, nullptr},
      {"--seed", [](const RunConfig& c, A) { return str(c.run.seed); }, nullptr},
      {"--batch-size", [](const RunConfig& c, A) { return str(c.run.batch_size); }, nullptr},
      {"--optimizer", [](const RunConfig& c, A) { return std::string(enum_name(c.optimizer.kind)); }, nullptr},
      // what may change
      {"--lr", [](const RunConfig& c, A) { return str(c.optimizer.lr); },
       [](RunConfig& to, const RunConfig& from) { to.optimizer.lr = to.schedule.lr = from.optimizer.lr; }},
      {"--min-lr", [](const RunConfig& c, A) { return str(c.schedule.min_lr); },
       [](RunConfig& to, const RunConfig& from) { to.schedule.min_lr = from.schedule.min_lr; }},
      {"--warmup", [](const RunConfig& c, A) { return str(c.schedule.warmup); },
       [](RunConfig& to, const RunConfig& from) { to.schedule.warmup = from.schedule.warmup; }},
      {"--schedule", [](const RunConfig& c, A) { return std::string(enum_name(c.schedule.kind)); },
       [](RunConfig& to, const RunConfig& from) { to.schedule.kind = from.schedule.kind; }},
      {"--weight-decay", [](const RunConfig& c, A) { return str(c.optimizer.weight_decay); },
       [](RunConfig& to, const RunConfig& from) { to.optimizer.weight_decay = from.optimizer.weight_decay; }},
      {"--grad-clip", [](const RunConfig& c, A) { return str(c.run.grad_clip); },
       [](RunConfig& to, const RunConfig& from) { to.run.grad_clip = from.run.grad_clip; }},
      {"--eval-every", [](const RunConfig& c, A) { return str(c.run.eval_every); },
       [](RunConfig& to, const RunConfig& from) { to.run.eval_every = from.run.eval_every; }},
      {"--eval-batches", [](const RunConfig& c, A) { return str(c.run.eval_batches); },
       [](RunConfig& to, const RunConfig& from) { to.run.eval_batches = from.run.eval_batches; }},
      {"--save-every", [](const RunConfig& c, A) { return str(c.run.save_every); },
       [](RunConfig& to, const RunConfig& from) { to.run.save_every = from.run.save_every; }},
      {"--keep-last", [](const RunConfig& c, A) { return str(c.run.keep_last); },
       [](RunConfig& to, const RunConfig& from) { to.run.keep_last = from.run.keep_last; }},
      // always this process's, given or not
      {"--steps", [](const RunConfig& c, A) { return str(c.run.steps); },
       [](RunConfig& to, const RunConfig& from) { to.run.steps = to.schedule.total = from.run.steps; }},
      {"--device", [](const RunConfig& c, A) { return c.run.device; },
       [](RunConfig& to, const RunConfig& from) { to.run.device = from.run.device; }},
      {"--skip-nonfinite", [](const RunConfig& c, A) { return str(c.run.skip_nonfinite); },
       [](RunConfig& to, const RunConfig& from) { to.run.skip_nonfinite = from.run.skip_nonfinite; }},
      {"--max-skipped-steps", [](const RunConfig& c, A) { return str(c.run.max_skipped_steps); },
       [](RunConfig& to, const RunConfig& from) { to.run.max_skipped_steps = from.run.max_skipped_steps; }},
  };
  return settings;
}

bool always_applied(const std::string& option) {
  return option == "--steps" || option == "--device" || option == "--skip-nonfinite" || option == "--max-skipped-steps";
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
         fmt(uniform, 3) + ", a uniform guess's";
}

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct Trainer::Session {
  RunConfig config;
  std::unique_ptr<tasks::Task> task;
  std::shared_ptr<nn::Model> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::vector<Tensor> params;
  io::TrainerState state;
  int64_t first_step = 0;  // the step this process started from
  // The window of steps since the last evaluation, for the logged train loss and tokens/s.
  double window_loss = 0, last_norm = 0, rate = 0;
  int64_t window_steps = 0, window_tokens = 0, tokens_trained = 0;  // (tokens: decoder positions)
  std::chrono::steady_clock::time_point window_start = std::chrono::steady_clock::now();
  int64_t skipped_in_a_row = 0, skipped_total = 0;
  // What this process has written: the step of the checkpoint it saved or resumed from (-1: none), and
  // whether metrics.csv was written; the closing messages claim no more.
  int64_t good_checkpoint_step = -1;
  bool wrote_checkpoint = false, wrote_metrics = false;
  double allreduce_seconds = 0;  // in the allreduce, waiting for the slowest rank included
};

Trainer::Trainer(TrainOptions opts) : opts_(std::move(opts)) {
  if (!opts_.comm) opts_.comm = single_process();
  if (opts_.comm->rank() != 0) opts_.quiet = true;  // rank 0 speaks for the run
  opts_.config.run.validate();
  HL_CHECK(opts_.config.optimizer.lr > 0, "train: --lr must be positive, got ", opts_.config.optimizer.lr);
  latest_ = (fs::path(opts_.out) / "checkpoint.h5").string();
}

void Trainer::log(const std::string& line) const {
  if (!opts_.quiet) std::cout << line << std::endl;
}

// The run's configuration (fresh, or the checkpoint's on --resume), model, optimizer and state.
std::unique_ptr<Trainer::Session> Trainer::start() {
  auto s = std::make_unique<Session>();
  io::Checkpoint resumed;
  if (opts_.resume) {
    HL_CHECK(fs::exists(latest_), "train: --resume was given but '", latest_, "' does not exist");
    resumed = io::load_checkpoint(latest_);
    HL_CHECK(resumed.has_optimizer && resumed.has_trainer, "checkpoint '", latest_,
             "': has no optimizer or trainer state, so it cannot be resumed");
    s->config = config_of(resumed, latest_);
    apply_resume_options(*s);
  } else {
    s->config = resolve(opts_.config);
  }
  const Device device = Device::parse(s->config.run.device);
  backend_for(device);  // fails early and clearly when the device is unavailable
  {
    // A training step's peak (a GPT on the CPU; the toy encoder-decoders are far smaller), and the
    // evaluation batches, which are all held at once.
    const RunSettings& run = s->config.run;
    MemoryEstimate need;
    std::string advice;
    if (!device.is_cuda() && s->config.arch == Arch::gpt) {
      const nn::GPTConfig& m = s->config.model;
      const optim::OptimizerOptions& o = s->config.optimizer;
      const int slots = o.kind == optim::OptimizerKind::sgd ? (o.momentum != 0 ? 1 : 0) : 2;
      need = estimate_memory(m, run.batch_size, true, slots);
      advice = "lower --emb-dim (now " + std::to_string(m.emb_dim) + "), --n-layers (" + std::to_string(m.n_layers) +
               "), --batch-size (" + std::to_string(run.batch_size) + "), the context length (" +
               std::to_string(m.context_length) + ") or ";
    }
    need.data = estimate_batches_memory(run.eval_batches, run.batch_size, s->config.batch_tokens());
    check_memory_fits(need, "train", advice + "--eval-batches (now " + std::to_string(run.eval_batches) + ")");
  }
  s->task = s->config.make_task();
  manual_seed(s->config.run.seed);
  s->model = s->config.make_model();
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
  return s;
}

// The checkpoint's config, with what this process was told: a told option that fixes the model, task
// or data must agree (every difference in one ResumeMismatch), one that may change replaces the
// checkpoint's; every change is logged.
void Trainer::apply_resume_options(Session& s) const {
  const RunConfig& ours = opts_.config;
  const Arch arch = s.config.arch;
  const auto told = [&](const std::string& option) {
    return std::find(opts_.told.begin(), opts_.told.end(), option) != opts_.told.end();
  };
  std::string differences, changes;
  for (const ResumeSetting& r : resume_settings()) {
    if (!told(r.option) && !always_applied(r.option)) continue;
    if (std::string(r.option) == "--context-length" && ours.model.context_length == 0) continue;  // (the task's need)
    const std::string mine = r.value(ours, arch), theirs = r.value(s.config, arch);
    if (mine == theirs) continue;
    if (!r.apply) {
      differences += std::string(differences.empty() ? "" : "; ") + r.option + " " + mine +
                     " differs from the checkpoint's " + theirs;
      continue;
    }
    r.apply(s.config, ours);
    if (!always_applied(r.option) || told(r.option))
      changes += std::string(changes.empty() ? "" : ", ") + r.option + " " + mine + " (was " + theirs + ")";
  }
  if (!differences.empty())
    throw ResumeMismatch("train --resume: " + differences + ". These are fixed by '" + latest_ +
                         "'; leave them out to continue it, or train a new run into another --out");
  s.config.run.validate();
  if (!changes.empty()) log("resume: changed " + changes);
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
  os << (c.run.grad_clip > 0 ? "a lower --grad-clip (now " + fmt(c.run.grad_clip, 2) + ")"
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

// Writes checkpoint-<step>.h5 and checkpoint.h5 and drops numbered ones beyond keep_last.
std::string Trainer::save(Session& s) const {
  check_parameters(s);
  io::Checkpoint ck;
  ck.config = s.config.to_json();
  ck.tokenizer = s.config.tokenizer_files();
  ck.model = io::snapshot_parameters(*s.model);
  ck.has_optimizer = true;
  ck.optimizer = s.opt->options();
  for (auto& [name, t] : s.opt->state()) ck.optimizer_state.emplace_back(name, t.detach().to(kCPU));
  ck.optimizer_steps = s.opt->steps();
  ck.has_trainer = true;
  ck.trainer = s.state;
  ck.trainer.rng_seed = default_generator().seed();
  ck.trainer.rng_offset = default_generator().offset();
  const std::string numbered = (fs::path(opts_.out) / ("checkpoint-" + std::to_string(s.state.step) + ".h5")).string();
  io::save_checkpoint(numbered, ck);
  io::save_checkpoint(latest_, ck);
  s.good_checkpoint_step = s.state.step;
  s.wrote_checkpoint = true;
  prune_history(opts_.out, s.config.run.keep_last);
  return numbered;
}

double allreduce_gradients(Collectives& comm, const std::vector<Tensor>& params, std::vector<float>& extra) {
  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  // A fresh buffer each step, and the sums handed back as views of it: no copy back, and no gradient
  // aliases another tensor (a gradient from backward may be shared with another parameter's).
  const Tensor flat = Tensor::empty({total + static_cast<int64_t>(extra.size())}, DType::f32, kCPU);
  float* data = flat.data<float>();
  int64_t at = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    const int64_t n = p.numel();
    if (g.defined()) {
      HL_CHECK(g.dtype() == DType::f32, "train: data parallelism reduces float32 gradients, got ",
               dtype_name(g.dtype()));
      flat.narrow(0, at, n).view(p.shape()).copy_(g);
    } else {
      std::fill(data + at, data + at + n, 0.0f);
    }
    at += n;
  }
  std::copy(extra.begin(), extra.end(), data + at);
  comm.allreduce_sum(data, flat.numel());
  double squares = 0;  // the norm here, summed in double as grad_norm sums: not several ops per parameter
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < total; ++i) squares += static_cast<double>(data[i]) * data[i];
  at = 0;
  for (const Tensor& p : params) {
    const Tensor sum = flat.narrow(0, at, p.numel()).view(p.shape());
    p.set_grad(p.device() == flat.device() ? sum : sum.to(p.device()));
    at += p.numel();
  }
  std::copy(data + at, data + flat.numel(), extra.begin());
  return std::sqrt(squares);
}

double Trainer::all_reduce_gradients(Session& s, std::vector<float>& extra) const {
  const auto start = std::chrono::steady_clock::now();
  const double norm = allreduce_gradients(*opts_.comm, s.params, extra);
  s.allreduce_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return norm;
}

// Every rank steps its own copy of the model with the same summed gradients, so the copies stay
// bitwise equal unless something is not deterministic (a rank on another CPU, another OpenBLAS).
// Checked at the start and at every evaluation: a 64-bit FNV-1a hash of the parameters, compared
// with rank 0's.
void Trainer::check_ranks_agree(const Session& s) const {
  Collectives& comm = *opts_.comm;
  if (comm.size() == 1) return;
  uint64_t hash = 1469598103934665603ull;
  for (const Tensor& p : s.params) {
    const Tensor host = p.detach().to(kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    for (size_t i = 0, n = static_cast<size_t>(host.numel()) * dtype_size(host.dtype()); i < n; ++i)
      hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  uint64_t root = hash;
  comm.broadcast(&root, sizeof root, 0);
  double differing = root == hash ? 0.0 : 1.0;
  comm.allreduce_sum(&differing, 1);
  HL_CHECK(differing == 0, "train: data parallelism: at step ", s.state.step, " the parameters of ",
           static_cast<int64_t>(differing), " of ", comm.size(), " ranks differ from rank 0's (", comm.name(),
           "); the ranks must run the same headlab build on the same kind of CPU");
}

void Trainer::evaluate_and_log(Session& s, double lr, bool tty) {
  const RunSettings& run = s.config.run;
  const Scores ev = evaluate(*s.model, *s.task, run.eval_batches, run.batch_size, s.config.batch_tokens());
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
  if (tty) std::cout << "\n";
  std::ostringstream os;
  os << "eval step " << s.state.step << ": train loss " << fmt(row.train_loss) << "  val loss " << fmt(ev.loss)
     << "  token accuracy " << fmt(ev.token_accuracy, 3);
  if (ev.has_exact_match) os << "  exact match " << fmt(ev.exact_match, 3);
  log(os.str());
  s.window_loss = 0;
  s.window_steps = 0;
  s.window_tokens = 0;
  s.window_start = std::chrono::steady_clock::now();
}

TrainResult Trainer::run() {
  Collectives& comm = *opts_.comm;
  const bool writer = comm.rank() == 0;  // rank 0 alone evaluates and writes files
  io::FolderLock lock;                   // rank 0's, on the output folder, until the run ends
  if (writer) {
    std::error_code ec;
    fs::create_directories(opts_.out, ec);
    HL_CHECK(!ec && fs::is_directory(opts_.out), "train: cannot create output folder '", opts_.out,
             "': ", ec ? ec.message() : std::string("not a folder"));
    lock = io::FolderLock(opts_.out, "train");  // before anything in it is touched, the stale temp files included
    for (const std::string& f : io::remove_stale_temp_files(opts_.out))
      log("removed " + f + ", a temporary file left by a writer that no longer runs");
  }
  const std::unique_ptr<Session> session = start();
  const int threads = data_parallel_threads(*session);
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

int Trainer::data_parallel_threads(const Session& s) const {
  const int threads = omp_get_max_threads();
  if (opts_.thread_use == ThreadUse::ops || threads == 1) return 1;
  const RunSettings& run = s.config.run;
  const int64_t ranks = static_cast<int64_t>(opts_.comm->size()) * threads;
  const bool cpu = !s.model->device().is_cuda();
  if (opts_.thread_use == ThreadUse::data) {
    HL_CHECK(cpu, "train: --parallel data splits a batch over CPU threads; this run is on ", s.model->device().str());
    HL_CHECK(run.batch_size % ranks == 0, "train: --parallel data: --batch-size ", run.batch_size,
             " does not split evenly over ", ranks, " threads", opts_.comm->size() > 1 ? " (all ranks)" : "",
             "; use a multiple of ", ranks);
    return threads;
  }
  const int slots = s.config.optimizer.kind == optim::OptimizerKind::sgd ? 1 : 2;
  const double replicas = static_cast<double>(threads - 1) * static_cast<double>(s.model->num_parameters()) *
                          static_cast<double>(sizeof(float) * (2 + slots));
  const bool pays =
      cpu && run.batch_size % ranks == 0 && (run.batch_size / ranks) % 4 == 0 && replicas <= kMaxReplicaBytes;
  return pays ? threads : 1;
}

TrainResult Trainer::train(Session& s) {
  Collectives& comm = *opts_.comm;
  const bool writer = comm.rank() == 0;
  const RunSettings& run = s.config.run;
  const int64_t steps = run.steps, B = run.batch_size, T = s.config.batch_tokens();
  const int64_t ranks = comm.size(), rows = B / ranks, first_row = comm.rank() * rows;
  HL_CHECK(B % ranks == 0, "train: --batch-size ", B, " does not split evenly over ", ranks,
           " ranks; use a multiple of ", ranks);
  check_ranks_agree(s);

  log("headlab train: task " + s.task->name() + ", " + s.config.describe_model() + ", " +
      std::to_string(s.model->num_parameters()) + " parameters, device " + s.model->device().str());
  if (ranks > 1)
    log("data parallel: " + std::to_string(ranks) + " ranks (" + comm.name() + "), " + std::to_string(rows) +
        " of the " + std::to_string(B) + " rows of every batch each");
  if (opts_.resume) log("resuming from " + latest_ + " at step " + std::to_string(s.state.step));
  TrainResult result;
  result.checkpoint = latest_;
  if (s.state.step >= steps) {
    log("already at step " + std::to_string(s.state.step) + " of " + std::to_string(steps) + "; nothing to do");
    result.steps_done = s.state.step;
    if (writer) result.final_eval = evaluate(*s.model, *s.task, run.eval_batches, B, T);
    return result;
  }

  // (mpirun hands rank 0 a pseudo-terminal whatever its own output is: data-parallel runs log lines)
  const bool tty = !opts_.quiet && comm.processes() == 1 && isatty(STDOUT_FILENO);
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
  bool stop_agreed = false;  // data parallelism: some rank saw a signal during the last step (or before the first)
  if (ranks > 1) {
    double seen = stop_requested() ? 1.0 : 0.0;
    comm.allreduce_sum(&seen, 1);
    stop_agreed = seen > 0;
  }
  while (s.state.step < steps) {
    if (ranks == 1 ? stop_requested().load() : stop_agreed) {
      result.interrupted = true;
      break;
    }
    const double lr = s.config.schedule.at(s.state.step);
    s.opt->set_lr(lr);
    const tasks::Batch b = s.task->batch(tasks::Split::train, s.state.data_index, B, T);  // the global batch
    // Data parallelism: this rank's rows, with the dropout masks they get in the whole batch.
    const bool sharded = ranks > 1;
    tasks::Batch shard;
    if (sharded) shard = b.rows(first_row, rows);
    const tasks::Batch& mine = sharded ? shard : b;
    if (sharded) default_generator().set_row_shard(first_row, rows, B);
    const Tensor tgt = tensor(mine.targets, {mine.B * b.T}).to(s.model->device());
    const Tensor logits =
        s.model->logits(model_inputs(mine, s.model->device())).reshape({mine.B * b.T, -1});  // (B T, V)
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
      stop_agreed = extra[1] > 0;
    } else {
      norm = optim::grad_norm(s.params);
    }
    if (run.grad_clip > 0) optim::clip_grads_with_norm(s.params, run.grad_clip, norm);
    if (!std::isfinite(loss_value) || !std::isfinite(norm)) {
      const std::string what = "loss " + fmt_value(loss_value) + ", gradient norm " + fmt_value(norm);
      if (!run.skip_nonfinite) diverged(s, s.state.step + 1, what);
      if (++s.skipped_in_a_row > run.max_skipped_steps)
        diverged(s, s.state.step + 1,
                 what + " (" + std::to_string(s.skipped_in_a_row) +
                     " such steps in a row, more than --max-skipped-steps " + std::to_string(run.max_skipped_steps) +
                     ")");
      ++s.skipped_total;
      if (tty) std::cout << "\n";
      log("step " + std::to_string(s.state.step + 1) + ": " + what + ": skipped (" +
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
    s.opt->zero_grad();  // a skipped step's batch is consumed too; its parameters stay as they were
    ++s.state.step;
    ++s.state.data_index;
    s.window_tokens += b.B * b.T;
    s.tokens_trained += b.B * b.T;

    const double window_s = std::chrono::duration<double>(clock::now() - s.window_start).count();
    s.rate = window_s > 0 ? static_cast<double>(s.window_tokens) / window_s : 0;
    const double done_s = std::chrono::duration<double>(clock::now() - run_start).count();
    const double eta =
        done_s / static_cast<double>(s.state.step - s.first_step) * static_cast<double>(steps - s.state.step);
    const double mean_loss = s.window_loss / static_cast<double>(s.window_steps);
    if (tty) {
      const int width = 24, filled = static_cast<int>(width * s.state.step / steps);
      std::cout << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << s.state.step
                << "/" << steps << "  loss " << fmt(mean_loss) << "  lr " << std::scientific << std::setprecision(1)
                << lr << std::defaultfloat << "  " << fmt_rate(s.rate) << "  ETA " << fmt_duration(eta) << "   "
                << std::flush;
    } else if (!opts_.quiet && (s.state.step % opts_.log_every == 0 || s.state.step == 1)) {
      std::ostringstream os;
      os << "step " << s.state.step << "/" << steps << "  loss " << fmt(mean_loss) << "  lr " << std::scientific
         << std::setprecision(2) << lr << std::defaultfloat << "  grad_norm " << fmt(s.last_norm, 3) << "  "
         << fmt_rate(s.rate) << "  ETA " << fmt_duration(eta);
      log(os.str());
    }
    const bool eval = s.state.step % run.eval_every == 0 || s.state.step == steps;
    if (eval || s.state.step % run.save_every == 0) check_parameters(s);
    if (eval) check_ranks_agree(s);
    if (eval && writer) evaluate_and_log(s, lr, tty);
    s.state.elapsed_seconds = elapsed_before + std::chrono::duration<double>(clock::now() - run_start).count();
    if (writer && (s.state.step % run.save_every == 0 || s.state.step == steps)) save(s);
    if (s.state.step % std::max<int64_t>(opts_.observer.every, 1) == 0 || s.state.step == steps) observe();
  }
  if (tty) std::cout << "\n";
  if (result.interrupted && writer) {
    save(s);
    log("interrupted: saved " + latest_ + " at step " + std::to_string(s.state.step) + "; continue with --resume");
  }
  result.steps_done = s.state.step;
  result.seconds = std::chrono::duration<double>(clock::now() - run_start).count();
  const int64_t trained = s.state.step - s.first_step;
  result.tokens_per_s = result.seconds > 0 ? static_cast<double>(s.tokens_trained) / result.seconds : 0;
  if (writer && s.state.metrics.empty()) {  // (rank 0 reports the run)
    result.final_eval = evaluate(*s.model, *s.task, run.eval_batches, B, T);
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
  os << "trained " << trained << " steps in " << fmt(result.seconds, 1) << " s (" << fmt_rate(result.tokens_per_s)
     << ")\n";
  if (result.observer_seconds > 0)
    os << "watching the model (--track-heads) took " << fmt(result.observer_seconds, 1) << " s of them ("
       << fmt(100 * result.observer_seconds / std::max(result.seconds, 1e-9), 1) << "%)\n";
  if (ranks > 1)
    os << "data parallel: rank 0 spent " << fmt(s.allreduce_seconds, 2) << " s ("
       << fmt(100 * s.allreduce_seconds / std::max(result.seconds, 1e-9), 1)
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
  log(os.str());
  return result;
}

}  // namespace headlab::train
