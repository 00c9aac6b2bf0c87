// Training sparse autoencoders (train/sae.h): the sources, the shuffled buffer and the trainer's step.
#include "train/sae.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace headlab::train {

MatrixSource::MatrixSource(Tensor rows) : rows_(contiguous(to_dtype(rows.detach(), DType::f32))) {
  HL_CHECK(rows_.dim() == 2, "sae: activation rows must be 2-D (rows, width), got shape ", shape_str(rows_.shape()));
}

Tensor MatrixSource::next(int64_t max_rows) {
  const int64_t n = std::min(max_rows, rows_.size(0) - at_);
  const Tensor out = narrow(rows_, 0, at_, n);
  at_ += n;
  return out;
}

ShuffledBuffer::ShuffledBuffer(ActivationSource& source, int64_t capacity, uint64_t seed)
    : source_(source), capacity_(capacity), rng_(seed) {
  HL_CHECK(capacity > 0, "sae: the activation buffer must hold at least one row, got ", capacity);
  rows_.resize(static_cast<size_t>(capacity * source.width()));
}

void ShuffledBuffer::refill() {
  const int64_t w = source_.width();
  while (!exhausted_ && count_ < capacity_) {
    const Tensor got = contiguous(to_dtype(source_.next(capacity_ - count_), DType::f32));
    if (!got.defined() || got.size(0) == 0) {
      exhausted_ = true;
      break;
    }
    HL_CHECK(got.dim() == 2 && got.size(1) == w, "sae: the activation source gave rows of shape ",
             shape_str(got.shape()), ", expected (rows, ", w, ")");
    std::memcpy(rows_.data() + count_ * w, got.data<float>(), sizeof(float) * static_cast<size_t>(got.numel()));
    count_ += got.size(0);
  }
}

Tensor ShuffledBuffer::next_batch(int64_t rows) {
  if (count_ < capacity_ / 2 || count_ < rows) refill();
  const int64_t n = std::min(rows, count_), w = source_.width();
  if (n == 0) return Tensor();
  Tensor out = Tensor::empty({n, w}, DType::f32, kCPU);
  float* o = out.data<float>();
  // n rows drawn without replacement; each taken row's place filled by the buffer's last row
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pick = std::uniform_int_distribution<int64_t>(0, count_ - 1)(rng_);
    std::memcpy(o + i * w, rows_.data() + pick * w, sizeof(float) * static_cast<size_t>(w));
    --count_;
    if (pick != count_)
      std::memcpy(rows_.data() + pick * w, rows_.data() + count_ * w, sizeof(float) * static_cast<size_t>(w));
  }
  return out;
}

optim::OptimizerOptions SaeTrainOptions::adam_defaults() {
  optim::OptimizerOptions o = optim::OptimizerOptions::defaults(optim::OptimizerKind::adam);
  o.lr = 3e-4;
  return o;
}

Tensor geometric_median(const Tensor& rows, int64_t max_iterations, double tolerance) {
  const NoGradGuard no_grad;
  const Tensor x = to_dtype(rows, DType::f64);
  Tensor y = mean(x, {0});
  for (int64_t it = 0; it < max_iterations; ++it) {
    const Tensor d = sub(x, y);
    // weights 1 / distance, a row at the median itself weighed as if 1e-12 away
    const Tensor w = 1.0 / (maximum(sqrt(sum(mul(d, d), {1}, true)), scalar_tensor(1e-12, DType::f64)));
    const Tensor next = div(sum(mul(w, x), {0}), sum(w));
    const Tensor step = sub(next, y);
    const double moved = std::sqrt(sum(mul(step, step)).item<double>());
    const double scale = std::sqrt(sum(mul(next, next)).item<double>());
    y = next;
    if (moved <= tolerance * std::max(1.0, scale)) break;
  }
  return to_dtype(y, rows.dtype());
}

SaeTrainer::SaeTrainer(nn::SparseAutoencoder& sae, const SaeTrainOptions& opts)
    : sae_(sae), opts_(opts), last_fired_(static_cast<size_t>(sae.config().d_sae), 0) {
  NamedTensors params = sae_.named_parameters();
  if (sae_.config().arch == nn::SaeArch::jumprelu) {
    if (opts_.init_threshold) {
      HL_CHECK(*opts_.init_threshold > 0,
               "sae: jumprelu's initial threshold must be > 0 (it is learned as its log), "
               "got ",
               *opts_.init_threshold);
      const NoGradGuard no_grad;
      sae_.threshold.fill_(*opts_.init_threshold);
    }
    std::erase_if(params, [](const auto& p) { return p.first == "threshold"; });
    log_threshold_ = log(sae_.threshold.detach()).requires_grad_();
    params.emplace_back("log_threshold", log_threshold_);
  }
  optimizer_ = std::make_unique<optim::Optimizer>(std::move(params), opts_.adam);
}

void SaeTrainer::init_b_dec(const Tensor& sample, BdecInit how) {
  HL_CHECK(sample.dim() == 2 && sample.size(1) == sae_.b_dec.size(0) && sample.size(0) > 0,
           "sae: b_dec's initial sample must be (rows, ", sae_.b_dec.size(0), "), got shape ",
           shape_str(sample.shape()));
  const NoGradGuard no_grad;
  switch (how) {
    case BdecInit::mean:
      sae_.b_dec.copy_(mean(sample, {0}));
      break;
    case BdecInit::geometric_median:
      sae_.b_dec.copy_(geometric_median(sample));
      break;
    case BdecInit::zeros:
      sae_.b_dec.copy_(zeros_like(sae_.b_dec));
      break;
  }
}

Tensor SaeTrainer::dead_latents() const {
  std::vector<int64_t> dead;
  for (size_t i = 0; i < last_fired_.size(); ++i)
    if (tokens_ - last_fired_[i] >= opts_.dead_after) dead.push_back(static_cast<int64_t>(i));
  return tensor(dead, {static_cast<int64_t>(dead.size())});
}

int64_t SaeTrainer::never_fired() const { return std::count(last_fired_.begin(), last_fired_.end(), int64_t{0}); }

void SaeTrainer::count_firing(const nn::SaeCodes& codes, int64_t rows) {
  tokens_ += rows;
  if (codes.indices.defined()) {
    const Tensor idx = contiguous(to_device(codes.indices, kCPU)),
                 val = contiguous(to_device(codes.values.detach(), kCPU));
    const int64_t* i = idx.data<int64_t>();
    const Tensor v32 = to_dtype(val, DType::f32);
    const float* v = v32.data<float>();
    for (int64_t p = 0; p < idx.numel(); ++p)
      if (v[p] > 0) last_fired_[static_cast<size_t>(i[p])] = tokens_;
    return;
  }
  const Tensor fired = contiguous(to_device(to_dtype(amax(codes.dense.detach(), {0}), DType::f32), kCPU));
  const float* f = fired.data<float>();
  for (size_t e = 0; e < last_fired_.size(); ++e)
    if (f[e] > 0) last_fired_[e] = tokens_;
}

SaeTrainerState SaeTrainer::state() const {
  SaeTrainerState s{optimizer_->state(), optimizer_->steps(), last_fired_, tokens_};
  if (log_threshold_.defined()) s.tensors.emplace_back("log_threshold", log_threshold_.detach());
  return s;
}

void SaeTrainer::load_state(const SaeTrainerState& state, const std::string& source) {
  NamedTensors adam;
  Tensor log_threshold;
  for (const auto& [name, t] : state.tensors) {
    if (name == "log_threshold")
      log_threshold = t;
    else
      adam.emplace_back(name, t);
  }
  HL_CHECK(state.last_fired.size() == last_fired_.size(), source, ": 'last_fired' must hold one count a latent (",
           last_fired_.size(), "), got ", state.last_fired.size());
  HL_CHECK(log_threshold.defined() == log_threshold_.defined(), source, ": 'log_threshold' ",
           log_threshold_.defined() ? "is missing (a jumprelu SAE's)" : "is there, but the SAE is not jumprelu");
  optimizer_->load_state(adam, state.steps, source);
  const NoGradGuard no_grad;
  if (log_threshold.defined()) {
    HL_CHECK(log_threshold.shape() == log_threshold_.shape(), source, ": 'log_threshold' has shape ",
             shape_str(log_threshold.shape()), ", expected ", shape_str(log_threshold_.shape()));
    log_threshold_.copy_(to_device(to_dtype(log_threshold, log_threshold_.dtype()), log_threshold_.device()));
    sae_.threshold.copy_(exp(log_threshold_));
  }
  last_fired_ = state.last_fired;
  tokens_ = state.tokens;
}

SaeStepStats SaeTrainer::step(const Tensor& x, const Tensor& target) {
  nn::SaeLossOptions lo = opts_.loss;
  const bool topk = sae_.config().arch == nn::SaeArch::topk;
  if (topk) lo.dead = to_device(dead_latents(), sae_.W_dec.device());
  lo.log_threshold = log_threshold_;
  optimizer_->zero_grad();
  const nn::SaeLoss l = sae_.loss(x, target, lo);
  l.total.backward();
  optimizer_->step();
  {
    const NoGradGuard no_grad;
    if (topk) sae_.normalize_decoder();
    if (log_threshold_.defined()) sae_.threshold.copy_(exp(log_threshold_));
  }
  count_firing(l.codes, x.size(0));

  SaeStepStats s;
  s.loss = l.total.item<double>();
  s.mse = l.mse.item<double>();
  if (l.sparsity.defined()) s.sparsity = l.sparsity.item<double>();
  if (l.aux.defined()) s.aux = l.aux.item<double>();
  {
    const NoGradGuard no_grad;
    const Tensor err = sub(target, l.x_hat), centred = sub(target, mean(target, {0}, true));
    s.explained_variance = 1.0 - sum(mul(err, err)).item<double>() / sum(mul(centred, centred)).item<double>();
    const Tensor active = topk ? l.codes.values : l.codes.dense;
    s.l0 = sum(to_dtype(gt(active.detach(), scalar_tensor(0.0, active.dtype(), active.device())), DType::f64))
               .item<double>() /
           static_cast<double>(x.size(0));
  }
  s.dead = dead_latents().numel();
  return s;
}

}  // namespace headlab::train
