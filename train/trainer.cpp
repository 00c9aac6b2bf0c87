// The training loop. Each step: batch `data_index` of the train stream -> forward -> cross entropy
// on answer tokens -> backward -> clip -> optimizer step. Everything that decides the next step
// (parameters, optimizer state, generator (seed, offset), data index, step) is in the checkpoint,
// so a resumed run continues bit for bit.
#include "train/trainer.h"

#include "backends/backend.h"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <regex>
#include <sstream>

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

std::string fmt_rate(double tokens_per_s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << tokens_per_s / 1000.0 << "k tok/s";
  return os.str();
}

std::string fmt_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 60) os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else os << t << "s";
  return os.str();
}

// Writes text to path atomically (temp file + rename), so a reader never sees half a file.
void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    HL_CHECK(f.good(), "train: cannot write '", tmp, "'");
    f << text;
    HL_CHECK(f.good(), "train: writing '", tmp, "' failed");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  HL_CHECK(!ec, "train: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

void write_metrics_csv(const std::string& path, const std::vector<MetricRow>& rows) {
  std::ostringstream os;
  os << "step,train_loss,val_loss,val_accuracy,val_exact_match,lr,grad_norm,tokens_per_s\n";
  os << std::setprecision(8);
  for (const MetricRow& m : rows)
    os << m.step << ',' << m.train_loss << ',' << m.val_loss << ',' << m.val_accuracy << ',' << m.val_exact_match
       << ',' << m.lr << ',' << m.grad_norm << ',' << m.tokens_per_s << '\n';
  write_file_atomically(path, os.str());
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

std::pair<Tensor, Tensor> batch_tensors(const Batch& b, Device device) {
  return {tensor(b.inputs, {b.B, b.T}).to(device), tensor(b.targets, {b.B, b.T}).to(device)};
}

}  // namespace

void install_sigint_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
}

std::unique_ptr<Task> task_from_config(const nlohmann::json& config, const std::string& text_override) {
  HL_CHECK(config.contains("task") && config["task"].contains("name"), "config: the 'task' section is missing");
  const std::string name = config["task"]["name"].get<std::string>();
  std::map<std::string, std::string> opts_map;
  if (config["task"].contains("options")) opts_map = config["task"]["options"].get<std::map<std::string, std::string>>();
  TaskOptions opts = options_from_map(opts_map);
  if (config.contains("tokenizer") && config["tokenizer"].contains("vocab"))
    opts.vocabulary = config["tokenizer"]["vocab"].get<std::vector<std::string>>();
  if (!text_override.empty()) opts.text_path = text_override;
  return make_task(name, opts);
}

EvalResult evaluate(nn::GPTModel& model, const Task& task, int64_t batches, int64_t batch_size, int64_t T) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  const Device device = model.device();
  const int64_t V = model.config().vocab_size;
  double loss_sum = 0;
  int64_t tokens = 0;
  Metrics total;
  for (int64_t i = 0; i < batches; ++i) {
    const Batch b = task.batch(Split::val, static_cast<uint64_t>(i), batch_size, T);
    auto [idx, tgt] = batch_tensors(b, device);
    const Tensor logits = model.forward(idx);  // (B, T, V)
    loss_sum += cross_entropy(logits.reshape({-1, V}), tgt.reshape({-1}), kIgnoreIndex, Reduction::sum).item<double>();
    total += score(b, argmax(logits, -1).to_vector<int64_t>());
  }
  model.train(was_training);
  tokens = total.tokens;
  EvalResult r;
  r.tokens = tokens;
  r.loss = tokens ? loss_sum / static_cast<double>(tokens) : 0.0;
  r.token_accuracy = total.token_accuracy;
  r.has_exact_match = total.has_exact_match;
  r.exact_match = total.has_exact_match ? total.exact_match : 0.0;
  return r;
}

Trainer::Trainer(TrainOptions opts) : opts_(std::move(opts)) {
  HL_CHECK(opts_.steps > 0, "train: --steps must be positive, got ", opts_.steps);
  HL_CHECK(opts_.batch_size > 0, "train: --batch-size must be positive, got ", opts_.batch_size);
  HL_CHECK(opts_.eval_every > 0 && opts_.save_every > 0 && opts_.eval_batches > 0,
           "train: --eval-every, --save-every and --eval-batches must be positive");
  HL_CHECK(opts_.lr > 0, "train: --lr must be positive, got ", opts_.lr);
}

void Trainer::log(const std::string& line) const {
  if (!opts_.quiet) std::cout << line << std::endl;
}

TrainResult Trainer::run() {
  const Device device = Device::parse(opts_.device);
  backend_for(device);  // fails early and clearly when the device is unavailable
  std::error_code ec;
  fs::create_directories(opts_.out, ec);
  HL_CHECK(!ec && fs::is_directory(opts_.out), "train: cannot create output folder '", opts_.out, "': ",
           ec ? ec.message() : std::string("not a folder"));
  const std::string latest = (fs::path(opts_.out) / "checkpoint.h5").string();

  // ---- the run's configuration: fresh from the options, or the checkpoint's on --resume ----
  Checkpoint resumed;
  nlohmann::json config;
  if (opts_.resume) {
    HL_CHECK(fs::exists(latest), "train: --resume was given but '", latest, "' does not exist");
    resumed = load_checkpoint(latest);
    HL_CHECK(resumed.has_optimizer && resumed.has_trainer, "checkpoint '", latest,
             "': has no optimizer or trainer state, so it cannot be resumed");
    config = resumed.config;
    config["training"]["steps"] = opts_.steps;  // --steps is the total; the rest comes from the run
    if (config["training"].contains("schedule")) config["training"]["schedule"]["total"] = opts_.steps;
  } else {
    TaskOptions topts;
    topts.seed = opts_.seed;
    topts.min_len = opts_.min_len;
    topts.max_len = opts_.max_len;
    topts.n_digits = opts_.n_digits;
    if (!opts_.text.empty()) topts.text_path = opts_.text;
    if (opts_.task == "chars") topts.text_path = fs::absolute(topts.text_path).string();
    const std::unique_ptr<Task> probe = make_task(opts_.task, topts);
    nn::GPTConfig mc;
    mc.vocab_size = probe->vocab_size();
    mc.context_length = opts_.context_length > 0 ? opts_.context_length
                        : opts_.task == "chars"  ? 64
                                                 : probe->required_context_length();
    probe->check_context_length(mc.context_length);
    mc.emb_dim = opts_.emb_dim;
    mc.n_heads = opts_.n_heads;
    mc.n_layers = opts_.n_layers;
    mc.drop_rate = opts_.drop_rate;
    mc.qkv_bias = opts_.qkv_bias;
    mc.attention = opts_.attention;
    mc.validate();
    OptimizerOptions oo = OptimizerOptions::defaults(opts_.optimizer);
    oo.lr = opts_.lr;
    if (opts_.weight_decay >= 0) oo.weight_decay = opts_.weight_decay;
    LRSchedule sched;
    sched.kind = opts_.schedule;
    sched.lr = opts_.lr;
    sched.min_lr = opts_.min_lr;
    sched.warmup = opts_.warmup;
    sched.total = opts_.steps;  // as the run uses it, so the stored schedule gives the logged learning rates
    config = {{"model", mc.to_json()},
              {"tokenizer", {{"type", "char"}, {"vocab", probe->tokenizer().vocab()}}},
              {"task", {{"name", probe->name()}, {"options", options_to_map(probe->name(), topts)}}},
              {"training",
               {{"steps", opts_.steps}, {"batch_size", opts_.batch_size}, {"optimizer", oo.to_json()},
                {"schedule", sched.to_json()}, {"grad_clip", opts_.grad_clip}, {"seed", opts_.seed},
                {"eval_every", opts_.eval_every}, {"eval_batches", opts_.eval_batches},
                {"save_every", opts_.save_every}, {"keep_last", opts_.keep_last}, {"device", opts_.device}}}};
  }
  const nlohmann::json& tr = config["training"];
  const int64_t steps = tr["steps"], B = tr["batch_size"], eval_every = tr["eval_every"],
                eval_batches = tr["eval_batches"], save_every = tr["save_every"], keep_last = tr["keep_last"];
  const double grad_clip = tr["grad_clip"];
  LRSchedule sched = LRSchedule::from_json(tr["schedule"]);
  sched.total = steps;
  const std::unique_ptr<Task> task = task_from_config(config);
  const nn::GPTConfig mc = nn::GPTConfig::from_json(config["model"]);
  const int64_t T = mc.context_length, V = mc.vocab_size;

  // ---- model, optimizer, generator ----
  manual_seed(tr["seed"].get<uint64_t>());
  auto model = std::make_shared<nn::GPTModel>(mc);
  if (opts_.resume) model->load_parameters(resumed.model, "checkpoint '" + latest + "'");
  model->to(device);
  model->train();
  Optimizer opt(model->named_parameters(), OptimizerOptions::from_json(tr["optimizer"]));
  TrainerState state;
  if (opts_.resume) {
    opt.load_state(resumed.optimizer_state, resumed.optimizer_steps, "checkpoint '" + latest + "'");
    state = resumed.trainer;
    default_generator().set_state(state.rng_seed, state.rng_offset);
  }
  const std::vector<Tensor> params = model->parameters();

  auto save = [&](bool final_save) {
    Checkpoint ck;
    ck.config = config;
    ck.model = snapshot_parameters(*model);
    ck.has_optimizer = true;
    ck.optimizer = opt.options();
    for (auto& [name, t] : opt.state()) ck.optimizer_state.emplace_back(name, t.detach().to(kCPU));
    ck.optimizer_steps = opt.steps();
    ck.has_trainer = true;
    ck.trainer = state;
    ck.trainer.rng_seed = default_generator().seed();
    ck.trainer.rng_offset = default_generator().offset();
    const std::string numbered = (fs::path(opts_.out) / ("checkpoint-" + std::to_string(state.step) + ".h5")).string();
    save_checkpoint(numbered, ck);
    save_checkpoint(latest, ck);
    prune_history(opts_.out, keep_last);
    (void)final_save;
    return numbered;
  };

  log("headlab train: task " + task->name() + ", " + mc.attention + " attention, " + std::to_string(mc.n_layers) +
      " layers x " + std::to_string(mc.n_heads) + " heads, emb " + std::to_string(mc.emb_dim) + ", context " +
      std::to_string(T) + ", " + std::to_string(model->num_parameters()) + " parameters, device " + device.str());
  if (opts_.resume) log("resuming from " + latest + " at step " + std::to_string(state.step));
  TrainResult result;
  if (state.step >= steps) {
    log("already at step " + std::to_string(state.step) + " of " + std::to_string(steps) + "; nothing to do");
    result.steps_done = state.step;
    result.final_eval = evaluate(*model, *task, eval_batches, B, T);
    result.checkpoint = latest;
    return result;
  }

  const bool tty = !opts_.quiet && isatty(STDOUT_FILENO);
  using clock = std::chrono::steady_clock;
  double window_loss = 0, last_norm = 0;
  int64_t window_steps = 0, window_tokens = 0;
  auto window_start = clock::now();
  const auto run_start = clock::now();
  const double elapsed_before = state.elapsed_seconds;
  double rate = 0;
  std::string last_checkpoint;

  while (state.step < steps) {
    if (stop_requested()) {
      result.interrupted = true;
      break;
    }
    const double lr = sched.at(state.step);
    opt.set_lr(lr);
    const Batch b = task->batch(Split::train, state.data_index, B, T);
    auto [idx, tgt] = batch_tensors(b, device);
    const Tensor logits = model->forward(idx);                                              // (B, T, V)
    const Tensor loss = cross_entropy(logits.reshape({B * T, V}), tgt.reshape({B * T}), kIgnoreIndex);
    loss.backward();
    last_norm = grad_clip > 0 ? clip_grad_norm(params, grad_clip) : grad_norm(params);
    opt.step();
    opt.zero_grad();
    ++state.step;
    ++state.data_index;
    window_loss += loss.item<double>();
    ++window_steps;
    window_tokens += B * T;

    const double window_s = std::chrono::duration<double>(clock::now() - window_start).count();
    rate = window_s > 0 ? static_cast<double>(window_tokens) / window_s : 0;
    const double done_s = std::chrono::duration<double>(clock::now() - run_start).count();
    const double eta = done_s / static_cast<double>(state.step - resumed.trainer.step) *
                       static_cast<double>(steps - state.step);
    if (tty) {
      const int width = 24, filled = static_cast<int>(width * state.step / steps);
      std::cout << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << state.step << "/"
                << steps << "  loss " << fmt(window_loss / window_steps) << "  lr " << std::scientific
                << std::setprecision(1) << lr << std::defaultfloat << "  " << fmt_rate(rate) << "  ETA "
                << fmt_duration(eta) << "   " << std::flush;
    } else if (!opts_.quiet && (state.step % opts_.log_every == 0 || state.step == 1)) {
      std::ostringstream os;
      os << "step " << state.step << "/" << steps << "  loss " << fmt(window_loss / window_steps) << "  lr "
         << std::scientific << std::setprecision(2) << lr << std::defaultfloat << "  grad_norm " << fmt(last_norm, 3)
         << "  " << fmt_rate(rate) << "  ETA " << fmt_duration(eta);
      log(os.str());
    }
    if (state.step % eval_every == 0 || state.step == steps) {
      const EvalResult ev = evaluate(*model, *task, eval_batches, B, T);
      MetricRow row{state.step, window_loss / window_steps, ev.loss, ev.token_accuracy, ev.exact_match, lr, last_norm,
                    rate};
      state.metrics.push_back(row);
      write_metrics_csv((fs::path(opts_.out) / "metrics.csv").string(), state.metrics);
      if (tty) std::cout << "\n";
      std::ostringstream os;
      os << "eval step " << state.step << ": train loss " << fmt(row.train_loss) << "  val loss " << fmt(ev.loss)
         << "  token accuracy " << fmt(ev.token_accuracy, 3);
      if (ev.has_exact_match) os << "  exact match " << fmt(ev.exact_match, 3);
      log(os.str());
      window_loss = 0;
      window_steps = 0;
      window_tokens = 0;
      window_start = clock::now();
    }
    state.elapsed_seconds = elapsed_before + std::chrono::duration<double>(clock::now() - run_start).count();
    if (state.step % save_every == 0 || state.step == steps) last_checkpoint = save(state.step == steps);
  }
  if (tty) std::cout << "\n";
  if (result.interrupted) {
    last_checkpoint = save(false);
    log("interrupted: saved " + latest + " at step " + std::to_string(state.step) + "; continue with --resume");
  }
  result.steps_done = state.step;
  result.seconds = std::chrono::duration<double>(clock::now() - run_start).count();
  const int64_t trained = state.step - (opts_.resume ? resumed.trainer.step : 0);
  result.tokens_per_s = result.seconds > 0 ? static_cast<double>(trained * B * T) / result.seconds : 0;
  result.final_eval = state.metrics.empty() ? evaluate(*model, *task, eval_batches, B, T)
                                            : EvalResult{state.metrics.back().val_loss, state.metrics.back().val_accuracy,
                                                         state.metrics.back().val_exact_match, task->end_id() >= 0, 0};
  result.checkpoint = latest;
  std::ostringstream os;
  os << "trained " << trained << " steps in " << fmt(result.seconds, 1) << " s (" << fmt_rate(result.tokens_per_s)
     << ")\nwrote " << latest << " (history: checkpoint-<step>.h5, last " << keep_last << " kept) and "
     << (fs::path(opts_.out) / "metrics.csv").string();
  log(os.str());
  return result;
}

}  // namespace headlab::train
