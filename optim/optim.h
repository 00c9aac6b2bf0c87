// Optimizers with PyTorch's exact update rules (SGD with momentum/nesterov/weight decay, Adam,
// AdamW), learning-rate schedules, and gradient clipping by global norm. Updates run as fused
// backend kernels over each parameter; state is exposed by name for checkpoints.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "nn/module.h"  // NamedTensors

namespace headlab::optim {

enum class OptimizerKind { sgd, adam, adamw };
constexpr auto enum_table(OptimizerKind) {  // enum_name, parse_enum (base/enum_names.h)
  return std::to_array<EnumName<OptimizerKind>>(
      {{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adam, "adam"}, {OptimizerKind::adamw, "adamw"}});
}

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::adamw;
  double lr = 1e-3;
  double momentum = 0.0, dampening = 0.0;  // sgd
  bool nesterov = false;                   // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // PyTorch defaults: 0 for sgd/adam, 0.01 for adamw
  static OptimizerOptions defaults(OptimizerKind kind);
  void validate() const;  // lr, momentum >= 0, betas in [0, 1), nesterov's needs; Optimizer calls it
  nlohmann::json to_json() const;
  static OptimizerOptions from_json(const nlohmann::json& j);
};

class Optimizer {
 public:
  Optimizer(NamedTensors params, OptimizerOptions opts);
  void step();       // one update of every parameter that has a gradient
  void zero_grad();  // drops gradients (set_to_none, as PyTorch's default)
  double lr() const { return opts_.lr; }
  void set_lr(double lr) { opts_.lr = lr; }
  const OptimizerOptions& options() const { return opts_; }
  // Per-parameter state by name: "<param>/exp_avg", "<param>/exp_avg_sq", "<param>/momentum_buffer",
  // plus per-parameter step counts.
  NamedTensors state() const;
  std::vector<std::pair<std::string, int64_t>> steps() const;
  // Restores state saved by state()/steps(); names and shapes must match (clear error otherwise).
  void load_state(const NamedTensors& state, const std::vector<std::pair<std::string, int64_t>>& steps,
                  const std::string& source);

 private:
  struct Slot {
    std::string name;
    Tensor param, exp_avg, exp_avg_sq, momentum;
    int64_t step = 0;
  };
  std::vector<Slot> slots_;
  OptimizerOptions opts_;
};

// Scales all gradients so their global L2 norm is at most max_norm; returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
double grad_norm(const std::vector<Tensor>& params);
// clip_grad_norm's second half, for a caller that has the norm already (PyTorch's clip_grads_with_norm_):
// scales every gradient by max_norm / (total_norm + 1e-6) where that is below 1.
void clip_grads_with_norm(const std::vector<Tensor>& params, double max_norm, double total_norm);

enum class ScheduleKind { constant, cosine, step };  // cosine: linear warmup, then cosine decay
constexpr auto enum_table(ScheduleKind) {
  return std::to_array<EnumName<ScheduleKind>>(
      {{ScheduleKind::constant, "constant"}, {ScheduleKind::cosine, "cosine"}, {ScheduleKind::step, "step"}});
}

struct LRSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double lr = 1e-3, min_lr = 0.0;
  int64_t warmup = 0, total = 1;
  int64_t step_size = 1000;  // step: lr * gamma^(t / step_size)
  double gamma = 0.5;
  // Learning rate for step t (0-based):
  //   cosine: lr*(t+1)/warmup for t < warmup, then min_lr + (lr-min_lr)/2 * (1 + cos(pi*(t-warmup)/(total-warmup)))
  double at(int64_t t) const;
  nlohmann::json to_json() const;
  static LRSchedule from_json(const nlohmann::json& j);
};

}  // namespace headlab::optim
