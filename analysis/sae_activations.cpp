// Sparse autoencoders on a model (analysis/sae_activations.h): the hook stream, training, SAELens's evals.
#include "analysis/sae_activations.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "analysis/hooked_run.h"
#include "backends/backend.h"
#include "base/json_text.h"
#include "base/sizes.h"
#include "io/atomic_file.h"

namespace headlab::analysis {

namespace {

// Batch `index` of the task's split as (B, T) token ids and (B T) targets on the model's device.
std::pair<Tensor, Tensor> text_batch(const loader::Loaded& in, tasks::Split split, uint64_t index, int64_t B,
                                     int64_t T) {
  const tasks::Batch b = in.task->batch(split, index, B, T);
  const Device device = in.model->device();
  return {tensor(b.inputs, {B, T}, device), tensor(b.targets, {B * T}, device)};
}

// An activation (B, T, ...) as float32 CPU rows (B T, the rest).
Tensor as_rows(const Tensor& a) {
  return contiguous(to_dtype(to_device(reshape(a, {a.size(0) * a.size(1), -1}), kCPU), DType::f32));
}

}  // namespace

HookActivations::HookActivations(const loader::Loaded& in, std::vector<std::string> hooks, tasks::Split split,
                                 int64_t B, int64_t T, int64_t max_tokens)
    : in_(in), hooks_(std::move(hooks)), split_(split), B_(B), T_(T), max_tokens_(max_tokens) {
  HL_CHECK(!hooks_.empty(), "sae: no hook point named (--hook NAME)");
  pending_ = forward_rows();  // the first forward tells the widths
}

Tensor HookActivations::forward_rows() {
  const NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  struct Clock {  // the forward's time, however it ends
    std::chrono::steady_clock::time_point t0;
    double& total;
    ~Clock() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } clock{t0, forward_seconds_};
  nn::DecoderModel& model = in_.decoder("sae");
  const auto [tokens, targets] = text_batch(in_, split_, batch_++, B_, T_);
  const HookedRun run = run_hooked(model, tokens, std::set<std::string>(hooks_.begin(), hooks_.end()));
  std::vector<Tensor> parts;
  for (const std::string& h : hooks_) parts.push_back(as_rows(run.cache.at(h)));
  if (widths_.empty()) {
    for (const Tensor& p : parts) widths_.push_back(p.size(1)), width_ += p.size(1);
  }
  return parts.size() == 1 ? parts[0] : contiguous(cat(parts, 1));
}

Tensor HookActivations::next(int64_t max_rows) {
  const int64_t left = max_tokens_ - given_;
  if (left <= 0) return Tensor::empty({0, width_});
  if (pending_at_ == pending_.size(0)) pending_ = forward_rows(), pending_at_ = 0;
  const int64_t n = std::min({max_rows, left, pending_.size(0) - pending_at_});
  const Tensor out = narrow(pending_, 0, pending_at_, n);
  pending_at_ += n, given_ += n;
  return out;
}

namespace {

// Every row a source gives, as one (N, width) matrix (the held-out rows: a stated, small number).
Tensor drain(train::ActivationSource& source, int64_t rows) {
  std::vector<Tensor> parts;
  for (Tensor r; (r = source.next(rows)).size(0) > 0;) parts.push_back(contiguous(r));
  return parts.size() == 1 ? parts[0] : contiguous(cat(parts, 0));
}

SaeHeldOut held_out(nn::SparseAutoencoder& sae, const Tensor& x, const Tensor& y) {
  const NoGradGuard no_grad;
  const Tensor f = sae.encode(x);
  const Tensor err = sub(y, sae.decode(f)), dev = sub(y, mean(y, {0}, true));
  const double sq_err = sum(mul(err, err)).item<double>(), n = static_cast<double>(x.size(0));
  const double active = sum(to_dtype(gt(f, scalar_tensor(0.0, f.dtype(), f.device())), DType::f64)).item<double>();
  return {1.0 - sq_err / sum(mul(dev, dev)).item<double>(), sq_err / n, active / n};
}

}  // namespace

void HookActivations::resume_at(int64_t batches, int64_t rows_given) {
  HL_CHECK(batches >= 1 && rows_given >= 0,
           "sae train: a checkpoint's stream position must be after a batch, got "
           "batch ",
           batches, " and ", rows_given, " rows");
  batch_ = static_cast<uint64_t>(batches), given_ = rows_given;
  pending_ = forward_rows(), pending_at_ = 0;
}

namespace {

constexpr const char* kCheckpoint = "checkpoint";

nlohmann::json target_json(const SaeTarget& t, const nn::SaeConfig& c) {
  return {{"name", t.name()}, {"in", t.in},     {"out", t.out},    {"arch", enum_name(c.arch)},
          {"k", c.k},         {"d_in", c.d_in}, {"d_sae", c.d_sae}};
}

// out/checkpoint, replaced whole: each SAE's folder and trainer state, state.json.
void write_checkpoint(const std::string& out, const std::string& model_name, const SaeTrainArgs& args,
                      const std::vector<std::unique_ptr<nn::SparseAutoencoder>>& saes,
                      const std::vector<std::unique_ptr<train::SaeTrainer>>& trainers, const HookActivations& source,
                      const SaeTrainReport& report) {
  for (size_t i = 0; i < saes.size(); ++i)  // a diverged SAE never replaces the last good checkpoint
    for (const auto& [name, p] : saes[i]->named_parameters()) {
      const Tensor c = contiguous(to_device(p.detach(), kCPU));
      HL_CHECK(backend_of(c).all_finite(c.dtype(), c.raw_data(), c.numel()), "sae train: the SAE on ",
               args.targets[i].name(), " holds a NaN or an infinity in ", name, " at step ", report.steps,
               "; the last checkpoint is kept: lower --lr and --resume");
    }
  io::AtomicFolder folder(out + "/" + kCheckpoint, "sae train");
  nlohmann::json state = {{"step", report.steps},
                          {"tokens", report.tokens},
                          {"stream_batches", source.batches_read()},
                          {"stream_rows", source.rows_given()},
                          {"targets", nlohmann::json::array()}};
  for (size_t i = 0; i < saes.size(); ++i) {
    const SaeTarget& t = args.targets[i];
    const std::string dir = folder.temp_path() + "/" + t.name();
    io::write_sae_folder(dir, *saes[i], io::SaeOrigin{model_name, t.in, -1, args.context, t.out});
    const train::SaeTrainerState ts = trainers[i]->state();
    io::write_sae_trainer_tensors(dir + "/trainer.safetensors", ts.tensors);
    nlohmann::json j = target_json(t, saes[i]->config());
    j["trainer_tokens"] = ts.tokens, j["last_fired"] = ts.last_fired;
    for (const auto& [name, steps] : ts.steps) j["adam_steps"][name] = steps;
    state["targets"].push_back(j);
  }
  io::write_file_atomic(folder.temp_path() + "/state.json", state.dump() + "\n", "sae train");
  folder.commit();
}

// A checkpoint's state.json, read whole (the trainers' tensors are trainer.safetensors'), or the error naming it and
// what is wrong.
struct ResumePoint {
  int64_t step = 0, tokens = 0, stream_batches = 0, stream_rows = 0;
  std::vector<nlohmann::json> targets;           // target_json's fields, as saved
  std::vector<train::SaeTrainerState> trainers;  // without their tensors
};

ResumePoint read_resume_point(const std::string& path) {
  HL_CHECK(std::filesystem::exists(path), "sae train --resume: ", path,
           " does not exist (sae train writes it every --checkpoint-every steps)");
  const nlohmann::json j = parse_json_text(read_whole_file(path, WholeFile::config, "sae checkpoint"), path);
  ResumePoint r;
  try {
    r.step = j.at("step").get<int64_t>(), r.tokens = j.at("tokens").get<int64_t>();
    r.stream_batches = j.at("stream_batches").get<int64_t>(), r.stream_rows = j.at("stream_rows").get<int64_t>();
    for (const nlohmann::json& t : j.at("targets")) {
      train::SaeTrainerState s;
      for (const auto& [name, steps] : t.at("adam_steps").items()) s.steps.emplace_back(name, steps.get<int64_t>());
      s.last_fired = t.at("last_fired").get<std::vector<int64_t>>();
      s.tokens = t.at("trainer_tokens").get<int64_t>();
      r.targets.push_back(t), r.trainers.push_back(std::move(s));
    }
  } catch (const nlohmann::json::exception& e) {
    HL_FAIL(path, ": not a checkpoint sae train wrote (", e.what(), ")");
  }
  HL_CHECK(r.step >= 1 && r.tokens >= 1 && r.tokens <= r.stream_rows && r.stream_batches >= 1, path, ": its step (",
           r.step, "), tokens (", r.tokens, ") and stream position (", r.stream_rows, " rows, ", r.stream_batches,
           " batches) are not a run's");
  return r;
}

}  // namespace

SaeTrainReport train_saes(const loader::Loaded& in, const std::string& model_name, const SaeTrainArgs& args,
                          const std::function<void(const std::string&)>& progress) {
  HL_CHECK(!args.targets.empty(), "sae train: nothing to train (--hook NAME or --transcoder IN:OUT)");
  // every hook a target reads, once, in the order first named: one forward's rows give them side by side
  std::vector<std::string> hooks;
  const auto hook_index = [&](const std::string& h) {
    const auto at = std::find(hooks.begin(), hooks.end(), h);
    if (at != hooks.end()) return static_cast<size_t>(at - hooks.begin());
    hooks.push_back(h);
    return hooks.size() - 1;
  };
  std::vector<std::pair<size_t, size_t>> reads;  // each target's input and output hook
  for (const SaeTarget& t : args.targets) {
    const size_t i = hook_index(t.in);
    reads.emplace_back(i, t.transcoder() ? hook_index(t.out) : i);
  }
  const int64_t T = args.context;
  HookActivations source(in, hooks, tasks::Split::train, args.rows_per_forward, T, args.training_tokens);
  train::ShuffledBuffer buffer(source, args.buffer_rows, args.seed);
  std::vector<int64_t> offsets;  // each hook's first column
  for (int64_t w = 0, o = 0; w < static_cast<int64_t>(hooks.size()); o += source.widths()[static_cast<size_t>(w++)])
    offsets.push_back(o);
  const Device device = in.model->device();
  const auto columns = [&](const Tensor& rows, size_t hook) {
    return contiguous(to_device(narrow(rows, 1, offsets[hook], source.widths()[hook]), device));
  };
  std::vector<std::unique_ptr<nn::SparseAutoencoder>> saes;
  std::vector<std::unique_ptr<train::SaeTrainer>> trainers;
  const std::string checkpoint = args.out + "/" + kCheckpoint;
  ResumePoint resumed;
  if (args.resume) {
    resumed = read_resume_point(checkpoint + "/state.json");
    HL_CHECK(resumed.targets.size() == args.targets.size(), checkpoint, "/state.json: it trains ",
             resumed.targets.size(), " SAE(s), this run names ", args.targets.size());
  }
  for (size_t i = 0; i < args.targets.size(); ++i) {
    nn::SaeConfig c;
    c.d_in = source.widths()[reads[i].first], c.d_sae = args.expansion * c.d_in, c.arch = args.arch, c.k = args.k;
    if (args.targets[i].transcoder()) c.d_out = source.widths()[reads[i].second], c.apply_b_dec_to_input = false;
    train::SaeTrainOptions options = args.options;
    if (!args.resume) {
      manual_seed(args.seed + i);
      saes.push_back(std::make_unique<nn::SparseAutoencoder>(c));
    } else {
      const nlohmann::json& saved = resumed.targets[i];
      const nlohmann::json want = target_json(args.targets[i], c);
      for (const char* field : {"name", "arch", "k", "d_in", "d_sae"})
        HL_CHECK(saved.value(field, nlohmann::json()) == want[field], checkpoint, "/state.json: its SAE ", i + 1, "'s ",
                 field, " is ", saved.value(field, nlohmann::json()).dump(), ", this run's is ", want[field].dump(),
                 " (--resume goes on with the same SAEs)");
      saes.push_back(io::read_sae_folder(checkpoint + "/" + args.targets[i].name()).sae);
      options.init_threshold.reset();  // the checkpoint's thresholds
    }
    saes.back()->to(device);
    trainers.push_back(std::make_unique<train::SaeTrainer>(*saes.back(), options));
  }
  // the held-out rows, read once from the val split
  HookActivations val_source(in, hooks, tasks::Split::val, args.rows_per_forward, T, args.eval_tokens);
  const Tensor val = drain(val_source, args.eval_tokens);
  const auto evaluate = [&](size_t i) {
    return held_out(*saes[i], columns(val, reads[i].first), columns(val, reads[i].second));
  };

  SaeTrainReport report;
  report.last.resize(saes.size());
  if (args.resume) {
    for (size_t i = 0; i < saes.size(); ++i) {
      const std::string file = checkpoint + "/" + args.targets[i].name() + "/trainer.safetensors";
      train::SaeTrainerState& ts = resumed.trainers[i];
      ts.tensors = io::read_sae_trainer_tensors(file);
      trainers[i]->load_state(ts, file);
    }
    report.steps = resumed.step, report.tokens = resumed.tokens;
    const int64_t rows = resumed.stream_rows;
    HL_CHECK(rows < args.training_tokens, "sae train --resume: the checkpoint read ", rows,
             " activations already; give --training-tokens above that to go on");
    report.dropped = rows - report.tokens, report.resumed_tokens = report.tokens;
    source.resume_at(resumed.stream_batches, rows);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto seconds = [&t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  for (Tensor batch; (batch = buffer.next_batch(args.batch_size)).defined();) {
    if (report.steps == 0 &&
        !args.resume)  // b_dec from the first batch's targets, as SAELens's init looks at its first activations
      for (size_t i = 0; i < saes.size(); ++i)
        trainers[i]->init_b_dec(columns(batch, reads[i].second), args.b_dec_init);
    const auto step_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < saes.size(); ++i) {
      report.last[i] = trainers[i]->step(columns(batch, reads[i].first), columns(batch, reads[i].second));
      HL_CHECK(std::isfinite(report.last[i].loss), "sae train: the SAE on ", args.targets[i].name(),
               " diverged at step ", report.steps + 1, " (loss ", report.last[i].loss,
               "); nothing was written: lower --lr");
    }
    report.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    ++report.steps;
    report.tokens += batch.size(0);
    if (report.steps % args.log_every == 0) {
      const double s = seconds(), rate = static_cast<double>(report.tokens - report.resumed_tokens) / s;
      std::ostringstream line;
      line << "step " << report.steps << ", " << report.tokens << " tokens ("
           << static_cast<int>(100.0 * static_cast<double>(report.tokens) / static_cast<double>(args.training_tokens))
           << "%, " << static_cast<int64_t>(rate) << " tokens/s, "
           << static_cast<int64_t>(static_cast<double>(args.training_tokens - report.tokens) / rate) << " s left)";
      for (size_t i = 0; i < saes.size(); ++i) {
        const train::SaeStepStats& st = report.last[i];
        line << " | " << args.targets[i].name() << ": loss " << st.loss << ", explained variance "
             << st.explained_variance << ", L0 " << st.l0 << ", dead " << st.dead;
      }
      progress(line.str());
    }
    if (args.checkpoint_every > 0 && report.steps % args.checkpoint_every == 0) {
      write_checkpoint(args.out, model_name, args, saes, trainers, source, report);
      progress("checkpoint at step " + std::to_string(report.steps) + ": " + checkpoint);
    }
    if (args.eval_every > 0 && report.steps % args.eval_every == 0) {
      std::ostringstream line;
      line << "held-out at step " << report.steps << " (" << val.size(0) << " rows of the val split)";
      for (size_t i = 0; i < saes.size(); ++i) {
        const SaeHeldOut h = evaluate(i);
        line << " | " << args.targets[i].name() << ": explained variance " << h.explained_variance << ", mse " << h.mse
             << ", L0 " << h.l0;
      }
      progress(line.str());
    }
  }
  HL_CHECK(report.steps > 0, "sae train: no activations were read (--training-tokens ", args.training_tokens, ")");
  report.seconds = seconds();
  report.forward_seconds = source.forward_seconds();
  for (size_t i = 0; i < saes.size(); ++i) {
    report.held_out.push_back(evaluate(i));
    const SaeTarget& t = args.targets[i];
    io::SaeOrigin origin{model_name, t.in, -1, T, t.out};
    const std::string folder = args.out + "/" + t.name();
    saes[i]->to(kCPU);
    io::write_sae_folder(folder, *saes[i], origin);
    report.folders.push_back(folder);
  }
  return report;
}

namespace {

// KL(p || q) a token, from log-probabilities (N, V).
double mean_kl(const Tensor& logp, const Tensor& logq) {
  return mean(sum(mul(exp(logp), sub(logp, logq)), {-1})).item<double>();
}

}  // namespace

SaeEvalReport evaluate_sae(const loader::Loaded& in, nn::SparseAutoencoder& sae, const io::SaeOrigin& origin,
                           int64_t batches, int64_t B, int64_t T) {
  const NoGradGuard no_grad;
  nn::DecoderModel& model = in.decoder("sae eval");
  const std::string& reads = origin.hook_name;
  const std::string& hook = origin.transcoder() ? origin.hook_name_out : reads;  // what it reconstructs
  const nn::SaeConfig& c = sae.config();
  SaeEvalReport r;
  r.hook = hook, r.d_sae = c.d_sae;
  std::vector<double> fired(static_cast<size_t>(r.d_sae), 0.0);
  double sq_err = 0, sq_dev = 0, l0 = 0, l1 = 0, ce_clean = 0, ce_sae = 0, ce_abl = 0, kl_sae = 0, kl_abl = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const auto [tokens, targets] = text_batch(in, tasks::Split::val, static_cast<uint64_t>(b), B, T);
    const HookedRun clean = run_hooked(model, tokens, {reads, hook});
    const auto rows = [&](const std::string& name, int64_t width, const char* field) {
      const Tensor a = clean.cache.at(name);
      HL_CHECK(a.numel() / (B * T) == width, "sae eval: ", name, "'s activations are ", a.numel() / (B * T),
               " wide a token, the SAE's ", field, " is ", width);
      return reshape(a, {B * T, width});
    };
    const Tensor act = clean.cache.at(hook);
    const Tensor x = rows(reads, c.d_in, "d_in"), y = origin.transcoder() ? rows(hook, c.out_width(), "d_out") : x;
    const Tensor f = sae.encode(x);
    const Tensor x_hat = sae.decode(f);
    const Tensor err = sub(y, x_hat), dev = sub(y, mean(y, {0}, true));
    sq_err += sum(mul(err, err)).item<double>();
    sq_dev += sum(mul(dev, dev)).item<double>();
    const Tensor active = to_dtype(gt(f, scalar_tensor(0.0, f.dtype(), f.device())), DType::f64);
    l0 += sum(active).item<double>();
    l1 += sum(to_dtype(f, DType::f64)).item<double>();
    const std::vector<double> per_feature = to_device(sum(active, {0}), kCPU).to_vector<double>();
    for (size_t i = 0; i < fired.size(); ++i) fired[i] += per_feature[i];

    const Tensor spliced = reshape(x_hat, act.shape());
    const auto replace_with = [](Tensor t) { return [t](const std::string&, const Tensor&) { return t; }; };
    const HookedRun with_sae = run_hooked(model, tokens, {}, {{hook, replace_with(spliced)}});
    const HookedRun ablated = run_hooked(model, tokens, {}, {{hook, replace_with(zeros_like(act))}});
    const int64_t V = clean.logits.size(-1);
    const auto flat = [V](const Tensor& logits) { return reshape(logits, {-1, V}); };
    ce_clean += cross_entropy(flat(clean.logits), targets).item<double>();
    ce_sae += cross_entropy(flat(with_sae.logits), targets).item<double>();
    ce_abl += cross_entropy(flat(ablated.logits), targets).item<double>();
    const Tensor lp = log_softmax(flat(clean.logits), -1);
    kl_sae += mean_kl(lp, log_softmax(flat(with_sae.logits), -1));
    kl_abl += mean_kl(lp, log_softmax(flat(ablated.logits), -1));
  }
  const double n = static_cast<double>(batches * B * T), nb = static_cast<double>(batches);
  r.tokens = batches * B * T;
  r.explained_variance = 1.0 - sq_err / sq_dev;
  r.mse = sq_err / n;
  r.l0 = l0 / n, r.l1 = l1 / n;
  r.ce_loss_without_sae = ce_clean / nb, r.ce_loss_with_sae = ce_sae / nb, r.ce_loss_with_ablation = ce_abl / nb;
  r.ce_loss_score = (r.ce_loss_with_ablation - r.ce_loss_with_sae) / (r.ce_loss_with_ablation - r.ce_loss_without_sae);
  r.kl_div_with_sae = kl_sae / nb, r.kl_div_with_ablation = kl_abl / nb;
  r.kl_div_score = (r.kl_div_with_ablation - r.kl_div_with_sae) / r.kl_div_with_ablation;
  for (double c : fired) {
    r.dead_features += c == 0;
    r.dense_features += c > 0.1 * n;
  }
  return r;
}

}  // namespace headlab::analysis
