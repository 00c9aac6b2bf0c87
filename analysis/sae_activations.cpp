// Sparse autoencoders on a model (analysis/sae_activations.h): the hook stream, training, SAELens's evals.
#include "analysis/sae_activations.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "analysis/hooked_run.h"

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

SaeTrainReport train_saes(const loader::Loaded& in, const std::string& model_name, const SaeTrainArgs& args,
                          const std::function<void(const std::string&)>& progress) {
  const int64_t T = args.context;
  HookActivations source(in, args.hooks, tasks::Split::train, args.rows_per_forward, T, args.training_tokens);
  train::ShuffledBuffer buffer(source, args.buffer_rows, args.seed);
  std::vector<std::unique_ptr<nn::SparseAutoencoder>> saes;
  std::vector<std::unique_ptr<train::SaeTrainer>> trainers;
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (size_t i = 0; i < args.hooks.size(); ++i) {
    nn::SaeConfig c;
    c.d_in = source.widths()[i], c.d_sae = args.expansion * c.d_in, c.arch = args.arch, c.k = args.k;
    manual_seed(args.seed + i);
    saes.push_back(std::make_unique<nn::SparseAutoencoder>(c));
    saes.back()->to(in.model->device());
    trainers.push_back(std::make_unique<train::SaeTrainer>(*saes.back(), args.options));
    offsets.push_back(offset);
    offset += c.d_in;
  }
  const auto columns = [&](const Tensor& batch, size_t i) {
    return contiguous(to_device(narrow(batch, 1, offsets[i], saes[i]->config().d_in), in.model->device()));
  };
  SaeTrainReport report;
  report.last.resize(saes.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (Tensor batch; (batch = buffer.next_batch(args.batch_size)).defined();) {
    if (report.steps == 0)  // b_dec from the first batch, as SAELens's init looks at its first activations
      for (size_t i = 0; i < saes.size(); ++i) trainers[i]->init_b_dec(columns(batch, i), args.b_dec_init);
    for (size_t i = 0; i < saes.size(); ++i) {
      const Tensor x = columns(batch, i);
      report.last[i] = trainers[i]->step(x, x);
      HL_CHECK(std::isfinite(report.last[i].loss), "sae train: the SAE on ", args.hooks[i], " diverged at step ",
               report.steps + 1, " (loss ", report.last[i].loss, "); nothing was written: lower --lr");
    }
    ++report.steps;
    report.tokens += batch.size(0);
    if (report.steps % args.log_every == 0) {
      std::ostringstream line;
      line << "step " << report.steps << ", " << report.tokens << " tokens";
      for (size_t i = 0; i < saes.size(); ++i) {
        const train::SaeStepStats& s = report.last[i];
        line << " | " << args.hooks[i] << ": loss " << s.loss << ", explained variance " << s.explained_variance
             << ", L0 " << s.l0 << ", dead " << s.dead;
      }
      progress(line.str());
    }
  }
  HL_CHECK(report.steps > 0, "sae train: no activations were read (--training-tokens ", args.training_tokens, ")");
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < saes.size(); ++i) {
    io::SaeOrigin origin{model_name, args.hooks[i], -1, T};
    const std::string folder = args.out + "/" + args.hooks[i];
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

SaeEvalReport evaluate_sae(const loader::Loaded& in, nn::SparseAutoencoder& sae, const std::string& hook,
                           int64_t batches, int64_t B, int64_t T) {
  const NoGradGuard no_grad;
  nn::DecoderModel& model = in.decoder("sae eval");
  SaeEvalReport r;
  r.hook = hook, r.d_sae = sae.config().d_sae;
  std::vector<double> fired(static_cast<size_t>(r.d_sae), 0.0);
  double sq_err = 0, sq_dev = 0, l0 = 0, l1 = 0, ce_clean = 0, ce_sae = 0, ce_abl = 0, kl_sae = 0, kl_abl = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const auto [tokens, targets] = text_batch(in, tasks::Split::val, static_cast<uint64_t>(b), B, T);
    const HookedRun clean = run_hooked(model, tokens, {hook});
    const Tensor act = clean.cache.at(hook);
    HL_CHECK(act.numel() / (B * T) == sae.config().d_in, "sae eval: ", hook, "'s activations are ",
             act.numel() / (B * T), " wide a token, the SAE's d_in is ", sae.config().d_in);
    const Tensor x = reshape(act, {B * T, sae.config().d_in});
    const Tensor f = sae.encode(x);
    const Tensor x_hat = sae.decode(f);
    const Tensor err = sub(x, x_hat), dev = sub(x, mean(x, {0}, true));
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

FeatureHeads feature_head_shares(const nn::DecoderModel& model, const nn::SparseAutoencoder& sae, int64_t layer) {
  const NoGradGuard no_grad;
  const nn::HeadWeights w = model.head_weights(layer, false, DType::f64);
  const int64_t H = w.W_O.size(0), D = w.W_O.size(1), d_sae = sae.config().d_sae;
  HL_CHECK(sae.config().d_in == H * D, "sae: an SAE on blocks.", layer, ".attn.hook_z reads ", H, " heads x ", D, " = ",
           H * D, " values a token; this one's d_in is ", sae.config().d_in);
  // (H, d_sae, D) @ (H, D, C) -> each head's part of each feature's output direction, (H, d_sae, C)
  const Tensor blocks = permute(reshape(to_dtype(sae.W_dec.detach(), DType::f64), {d_sae, H, D}), {1, 0, 2});
  const Tensor parts = matmul(blocks, to_device(w.W_O, blocks.device()));
  const Tensor out = sum(parts, {0});                  // (d_sae, C)
  const Tensor norms = sqrt(sum(mul(out, out), {1}));  // (d_sae)
  const Tensor unit = div(out, unsqueeze(maximum(norms, scalar_tensor(1e-300, DType::f64, norms.device())), 1));
  const Tensor shares = sum(mul(parts, unsqueeze(unit, 0)), {2});  // (H, d_sae)
  return {contiguous(transpose(shares, 0, 1)), norms};
}

}  // namespace headlab::analysis
