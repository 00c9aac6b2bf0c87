// Iterative pruning of attention heads (Michel et al. 2019, section 4).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Iterative pruning: mask the least important step_fraction of the remaining heads (at least one),
// recompute importance over the heads left, repeat. Importance is the gradient score above
// (Criterion::gradient, the paper's) or, as a check on it, the loss increase when the head is masked
// on top of the heads already pruned (Criterion::ablation: one evaluation per remaining head and step). Every layer keeps at least one head, so the
// pruned model stays a GPTModel of the same depth (the library's Linear has no zero-width form).
// Stops once the metric falls below stop_below (after recording that step), unless fewer than
// min_pruned heads are pruned yet, or when no head can be pruned any more.
enum class Criterion { gradient, ablation };
Criterion parse_criterion(const std::string& name);  // "gradient" | "ablation"
const char* criterion_name(Criterion c);

struct PruneOptions {
  double step_fraction = 0.1;
  Criterion criterion = Criterion::gradient;
  Metric metric = Metric::exact_match;
  double stop_below = 0;   // absolute metric value
  int64_t min_pruned = 0;  // keep going until at least this many heads are masked
};
struct PruneStep {
  int64_t pruned = 0;                                // heads masked after this step
  double fraction = 0;                               // pruned / all heads
  std::vector<std::pair<int64_t, int64_t>> removed;  // (layer, head) masked in this step, least important first
  Scores scores;
};
struct PruningCurve {
  Metric metric = Metric::exact_match;
  int64_t total_heads = 0;
  std::vector<PruneStep> steps;                    // steps[0]: nothing pruned
  std::vector<std::pair<int64_t, int64_t>> order;  // every masked (layer, head), in pruning order
};
PruningCurve iterative_pruning(nn::GPTModel& model, const EvalSet& data, const PruneOptions& options);

// Heads per layer left after removing the first k heads of `order` (sorted model-local indices).
std::vector<std::vector<int64_t>> kept_after(const nn::GPTModel& model,
                                             const std::vector<std::pair<int64_t, int64_t>>& order, int64_t k);
// The gates that mask every head not in `keep` (1 kept, 0 pruned).
HeadMatrix gates_keeping(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep);
// How many heads to prune (from the curve) to keep the metric at or above `target`: the last step
// whose metric is >= target.
int64_t prune_count_for_metric(const PruningCurve& curve, double target);

}  // namespace headlab::analysis
