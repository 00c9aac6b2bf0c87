// Internal to analysis/: saving, setting and restoring every attention module's HeadControl (gates, offsets,
// kept contexts) and the train/eval mode around a measurement, so that an analysis never leaves a model
// altered.
#pragma once
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis::detail {

inline DType model_dtype(const nn::Model& m) { return m.parameters().front().dtype(); }

// The model in eval mode for a scope, and back in its mode after.
class EvalMode {
 public:
  explicit EvalMode(nn::Module& m) : m_(m), training_(m.is_training()) { m.eval(); }
  ~EvalMode() { m_.train(training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  nn::Module& m_;
  bool training_;
};

// Saves every layer's HeadControl and restores it (and clears kept contexts) on scope exit.
class ControlGuard {
 public:
  explicit ControlGuard(nn::Model& m) : m_(m), training_(m.is_training()) {
    for (int64_t l = 0; l < m.attention_count(); ++l) saved_.push_back(m.head_control(l));
  }
  ~ControlGuard() {
    for (int64_t l = 0; l < m_.attention_count(); ++l) {
      m_.head_control(l) = saved_[static_cast<size_t>(l)];
      m_.head_control(l).context = Tensor();
    }
    m_.train(training_);
  }
  ControlGuard(const ControlGuard&) = delete;
  ControlGuard& operator=(const ControlGuard&) = delete;

 private:
  nn::Model& m_;
  bool training_;
  std::vector<nn::HeadControl> saved_;
};

// Throws unless gates is empty or lists every head of every layer.
void check_matrix(const char* who, const nn::Model& m, const HeadMatrix& gates);
// Installs gates (may be empty: none) and offsets on the model's layers; contexts are not kept.
void set_controls(nn::Model& m, const HeadMatrix& gates, const std::vector<Tensor>& offsets);

}  // namespace headlab::analysis::detail
