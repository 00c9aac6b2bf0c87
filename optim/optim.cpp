// Optimizer steps call the backend's fused update kernels; see backends/backend.h for the formulas.
#include "optim/optim.h"

#include <algorithm>
#include <cmath>

#include "backends/backend.h"
#include "base/json_fields.h"

namespace headlab::optim {

namespace {

// OptimizerOptions' and LRSchedule's JSON (the checkpoint's training.optimizer / training.schedule).
// Every key is optional: absent ones keep the kind's defaults.
const auto kOptimizerFields = std::tuple{
    field("kind", &OptimizerOptions::kind),
    field("lr", &OptimizerOptions::lr, kNonNegative),
    field("momentum", &OptimizerOptions::momentum, kNonNegative),
    field("dampening", &OptimizerOptions::dampening),
    field("nesterov", &OptimizerOptions::nesterov),
    field("beta1", &OptimizerOptions::beta1, kFraction),
    field("beta2", &OptimizerOptions::beta2, kFraction),
    field("eps", &OptimizerOptions::eps),
    field("weight_decay", &OptimizerOptions::weight_decay),
};
const auto kScheduleFields = std::tuple{
    field("kind", &LRSchedule::kind),     field("lr", &LRSchedule::lr),
    field("min_lr", &LRSchedule::min_lr), field("warmup", &LRSchedule::warmup),
    field("total", &LRSchedule::total),   field("step_size", &LRSchedule::step_size),
    field("gamma", &LRSchedule::gamma),
};

}  // namespace

OptimizerOptions OptimizerOptions::defaults(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  if (kind == OptimizerKind::adamw) o.weight_decay = 0.01;
  if (kind == OptimizerKind::sgd) o.lr = 0.1;
  return o;
}

void OptimizerOptions::validate() const {
  check_fields(*this, kOptimizerFields, "optimizer");
  HL_CHECK(!nesterov || (momentum > 0 && dampening == 0),
           "optimizer: nesterov momentum requires momentum > 0 and dampening 0");
}

nlohmann::json OptimizerOptions::to_json() const { return fields_to_json(*this, kOptimizerFields); }

OptimizerOptions OptimizerOptions::from_json(const nlohmann::json& j) {
  OptimizerOptions kind_only;  // the kind first: it picks the defaults of the keys that are absent
  read_json_field(j, "kind", kind_only.kind, "optimizer");
  OptimizerOptions o = defaults(kind_only.kind);
  fields_from_json(j, o, kOptimizerFields, "optimizer");
  return o;
}

Optimizer::Optimizer(NamedTensors params, OptimizerOptions opts) : opts_(std::move(opts)) {
  opts_.validate();
  for (auto& [name, p] : params) {
    HL_CHECK(is_floating(p.dtype()), "optimizer: parameter ", name, " is not floating point");
    Slot s{name, p, Tensor(), Tensor(), Tensor(), 0};
    if (opts_.kind == OptimizerKind::sgd) {
      if (opts_.momentum != 0) s.momentum = zeros(p.shape(), p.dtype(), p.device());
    } else {
      s.exp_avg = zeros(p.shape(), p.dtype(), p.device());
      s.exp_avg_sq = zeros(p.shape(), p.dtype(), p.device());
    }
    slots_.push_back(std::move(s));
  }
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (Slot& s : slots_) {
    const Tensor g = s.param.grad();
    if (!g.defined()) continue;  // as PyTorch: parameters without gradients keep their state
    HL_CHECK(s.param.is_contiguous(), "optimizer: parameter ", s.name, " is not contiguous");
    const Tensor gc = contiguous(g);
    Backend& be = backend_of(s.param);
    ++s.step;
    if (opts_.kind == OptimizerKind::sgd) {
      be.sgd_step(s.param.dtype(), s.param.raw_data(), gc.raw_data(),
                  s.momentum.defined() ? s.momentum.raw_data() : nullptr, s.param.numel(), opts_.lr, opts_.momentum,
                  opts_.dampening, opts_.weight_decay, opts_.nesterov, s.step == 1);
    } else {
      be.adam_step(s.param.dtype(), s.param.raw_data(), gc.raw_data(), s.exp_avg.raw_data(), s.exp_avg_sq.raw_data(),
                   s.param.numel(), opts_.lr, opts_.beta1, opts_.beta2, opts_.eps, opts_.weight_decay, s.step,
                   opts_.kind == OptimizerKind::adamw);
    }
    s.param.bump_version();
  }
}

void Optimizer::zero_grad() {
  for (Slot& s : slots_) s.param.zero_grad();
}

NamedTensors Optimizer::state() const {
  NamedTensors out;
  for (const Slot& s : slots_) {
    if (s.exp_avg.defined()) out.emplace_back(s.name + "/exp_avg", s.exp_avg);
    if (s.exp_avg_sq.defined()) out.emplace_back(s.name + "/exp_avg_sq", s.exp_avg_sq);
    if (s.momentum.defined()) out.emplace_back(s.name + "/momentum_buffer", s.momentum);
  }
  return out;
}

std::vector<std::pair<std::string, int64_t>> Optimizer::steps() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Slot& s : slots_) out.emplace_back(s.name, s.step);
  return out;
}

void Optimizer::load_state(const NamedTensors& state, const std::vector<std::pair<std::string, int64_t>>& steps,
                           const std::string& source) {
  NamedTensors mine = this->state();
  HL_CHECK(state.size() == mine.size(), source, ": optimizer state holds ", state.size(), " tensors, expected ",
           mine.size(), " for a ", enum_name(opts_.kind), " optimizer over ", slots_.size(), " parameters");
  for (const auto& [name, t] : mine) {
    auto it = find_named(state, name);
    HL_CHECK(it != state.end(), source, ": optimizer state ", name, " is missing");
    HL_CHECK(it->second.shape() == t.shape(), source, ": optimizer state ", name, " has shape ",
             shape_str(it->second.shape()), ", expected ", shape_str(t.shape()));
    Tensor dst = t.detach();
    NoGradGuard no_grad;
    dst.copy_(it->second.to(t.dtype()));
  }
  for (Slot& s : slots_) {
    auto it = find_named(steps, s.name);
    HL_CHECK(it != steps.end(), source, ": optimizer step count for ", s.name, " is missing");
    s.step = it->second;
  }
}

double grad_norm(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  Tensor total;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    const Tensor sq = sum(mul(g, g)).to(DType::f64);
    total = total.defined() ? add(total, sq) : sq;
  }
  return total.defined() ? std::sqrt(total.item<double>()) : 0.0;
}

void clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, double total_norm) {
  HL_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  const double coef = max_norm / (total_norm + 1e-6);
  if (!(coef < 1.0)) return;
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) g.copy_(mul(g, coef));
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = grad_norm(params);
  clip_grads_with_norm(params, max_norm, norm);
  return norm;
}

double LRSchedule::at(int64_t t) const {
  if (kind == ScheduleKind::constant) return lr;
  if (kind == ScheduleKind::step) return lr * std::pow(gamma, static_cast<double>(t / std::max<int64_t>(step_size, 1)));
  if (t < warmup) return lr * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(total - warmup, 1));
  const double progress = std::min(1.0, static_cast<double>(t - warmup) / span);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

nlohmann::json LRSchedule::to_json() const { return fields_to_json(*this, kScheduleFields); }

LRSchedule LRSchedule::from_json(const nlohmann::json& j) {
  LRSchedule s;
  fields_from_json(j, s, kScheduleFields, "schedule");
  return s;
}

}  // namespace headlab::optim
