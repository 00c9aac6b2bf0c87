// Optimizer steps call the backend's fused update kernels; see backends/backend.h for the formulas.
#include "optim/optim.h"

#include <algorithm>
#include <cmath>

#include "backends/backend.h"
#include "base/json_fields.h"

namespace headlab::optim {

OptimizerKind parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::sgd;
  if (name == "adam") return OptimizerKind::adam;
  if (name == "adamw") return OptimizerKind::adamw;
  HL_FAIL("optimizer: expected 'sgd', 'adam' or 'adamw', got '", name, "'");
}

const char* optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adam: return "adam";
    case OptimizerKind::adamw: return "adamw";
  }
  return "?";
}

OptimizerOptions OptimizerOptions::defaults(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  if (kind == OptimizerKind::adamw) o.weight_decay = 0.01;
  if (kind == OptimizerKind::sgd) o.lr = 0.1;
  return o;
}

nlohmann::json OptimizerOptions::to_json() const {
  return {{"kind", optimizer_kind_name(kind)}, {"lr", lr}, {"momentum", momentum}, {"dampening", dampening},
          {"nesterov", nesterov}, {"beta1", beta1}, {"beta2", beta2}, {"eps", eps}, {"weight_decay", weight_decay}};
}

OptimizerOptions OptimizerOptions::from_json(const nlohmann::json& j) {
  HL_CHECK(j.is_object(), "optimizer: expected a JSON object, got ", j.type_name());
  std::string kind = "adamw";
  read_json_field(j, "kind", kind, "optimizer");
  OptimizerOptions o = defaults(parse_optimizer_kind(kind));
  read_json_field(j, "lr", o.lr, "optimizer");
  read_json_field(j, "momentum", o.momentum, "optimizer");
  read_json_field(j, "dampening", o.dampening, "optimizer");
  read_json_field(j, "nesterov", o.nesterov, "optimizer");
  read_json_field(j, "beta1", o.beta1, "optimizer");
  read_json_field(j, "beta2", o.beta2, "optimizer");
  read_json_field(j, "eps", o.eps, "optimizer");
  read_json_field(j, "weight_decay", o.weight_decay, "optimizer");
  return o;
}

Optimizer::Optimizer(NamedTensors params, OptimizerOptions opts) : opts_(std::move(opts)) {
  HL_CHECK(opts_.lr >= 0, "optimizer: learning rate must be >= 0, got ", opts_.lr);
  HL_CHECK(opts_.momentum >= 0, "optimizer: momentum must be >= 0, got ", opts_.momentum);
  HL_CHECK(!opts_.nesterov || (opts_.momentum > 0 && opts_.dampening == 0),
           "optimizer: nesterov momentum requires momentum > 0 and dampening 0");
  HL_CHECK(opts_.beta1 >= 0 && opts_.beta1 < 1 && opts_.beta2 >= 0 && opts_.beta2 < 1,
           "optimizer: betas must be in [0, 1), got (", opts_.beta1, ", ", opts_.beta2, ")");
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
      be.sgd_step(s.param.dtype(), s.param.raw_data(), gc.raw_data(), s.momentum.defined() ? s.momentum.raw_data() : nullptr,
                  s.param.numel(), opts_.lr, opts_.momentum, opts_.dampening, opts_.weight_decay, opts_.nesterov,
                  s.step == 1);
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
           mine.size(), " for a ", optimizer_kind_name(opts_.kind), " optimizer over ", slots_.size(), " parameters");
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

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  HL_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive, got ", max_norm);
  const double norm = grad_norm(params);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    NoGradGuard no_grad;
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) g.copy_(mul(g, coef));
    }
  }
  return norm;
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "constant") return ScheduleKind::constant;
  if (name == "cosine") return ScheduleKind::cosine;
  if (name == "step") return ScheduleKind::step;
  HL_FAIL("lr schedule: expected 'constant', 'cosine' or 'step', got '", name, "'");
}

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::constant: return "constant";
    case ScheduleKind::cosine: return "cosine";
    case ScheduleKind::step: return "step";
  }
  return "?";
}

double LRSchedule::at(int64_t t) const {
  if (kind == ScheduleKind::constant) return lr;
  if (kind == ScheduleKind::step) return lr * std::pow(gamma, static_cast<double>(t / std::max<int64_t>(step_size, 1)));
  if (t < warmup) return lr * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const double span = static_cast<double>(std::max<int64_t>(total - warmup, 1));
  const double progress = std::min(1.0, static_cast<double>(t - warmup) / span);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

nlohmann::json LRSchedule::to_json() const {
  return {{"kind", schedule_kind_name(kind)}, {"lr", lr}, {"min_lr", min_lr}, {"warmup", warmup},
          {"total", total}, {"step_size", step_size}, {"gamma", gamma}};
}

LRSchedule LRSchedule::from_json(const nlohmann::json& j) {
  HL_CHECK(j.is_object(), "schedule: expected a JSON object, got ", j.type_name());
  LRSchedule s;
  std::string kind = schedule_kind_name(s.kind);
  read_json_field(j, "kind", kind, "schedule");
  s.kind = parse_schedule_kind(kind);
  read_json_field(j, "lr", s.lr, "schedule");
  read_json_field(j, "min_lr", s.min_lr, "schedule");
  read_json_field(j, "warmup", s.warmup, "schedule");
  read_json_field(j, "total", s.total, "schedule");
  read_json_field(j, "step_size", s.step_size, "schedule");
  read_json_field(j, "gamma", s.gamma, "schedule");
  return s;
}

}  // namespace headlab::optim
