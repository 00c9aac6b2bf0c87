// Iterative pruning of attention heads (Michel et al. 2019, section 4).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Iterative pruning: mask the least important step_fraction of the remaining heads (at least one),
// recompute importance over the heads left, repeat. Importance is
// - Criterion::ablation: what masking the head on top of the heads already pruned costs, measured:
//   the metric lost first, the loss increase breaking ties (exact match moves in steps of one row).
//   One evaluation per remaining head and step.
// - Criterion::gradient: the gate-gradient score above (Michel et al.'s): one backward pass per step,
//   but noise where the loss is near zero (a trained toy model) and the gradients with it.
// - Criterion::l0: the order learned gates close the heads in (analysis/l0_gates.h; PruneOptions::l0_rank),
//   fixed, not recomputed.
// - Criterion::automatic: ablation up to kAblationCriterionMaxHeads heads, gradient beyond.
// Every attention module ("layer") keeps at least one head, so the pruned model stays a model of the
// same depth (the library's Linear has no zero-width form). Works on any nn::Model; the ablation
// criterion runs batched on a GPT and one pass per head otherwise. Stops once the metric falls below stop_below (after
// recording that step), unless fewer than min_pruned heads are pruned yet, or when no head can be
// pruned any more.
enum class Criterion { automatic, ablation, gradient, l0 };
constexpr int64_t kAblationCriterionMaxHeads = 64;
constexpr auto enum_table(Criterion) {  // enum_name, parse_enum (base/enum_names.h)
  return std::to_array<EnumName<Criterion>>({{Criterion::automatic, "auto"},
                                             {Criterion::ablation, "ablation"},
                                             {Criterion::gradient, "gradient"},
                                             {Criterion::l0, "l0"}});
}
// The criterion `c` means for a model of total_heads heads (automatic resolved).
Criterion resolve_criterion(Criterion c, int64_t total_heads);

struct PruneOptions {
  double step_fraction = 0.1;
  Criterion criterion = Criterion::automatic;
  Metric metric = Metric::exact_match;
  double stop_below = 0;   // absolute metric value
  int64_t min_pruned = 0;  // keep going until at least this many heads are masked
  HeadMatrix l0_rank;      // Criterion::l0: L0Result::rank
};
struct PruneStep {
  int64_t pruned = 0;                                // heads masked after this step
  double fraction = 0;                               // pruned / all heads
  std::vector<std::pair<int64_t, int64_t>> removed;  // (layer, head) masked in this step, least important first
  Scores scores;
  std::optional<Scores> finetuned;  // after fine-tuning the model pruned this far (analysis/finetune.h), when asked
};
struct PruningCurve {
  Metric metric = Metric::exact_match;
  Criterion criterion = Criterion::ablation;  // the one used (never automatic)
  int64_t total_heads = 0;
  std::vector<PruneStep> steps;                    // steps[0]: nothing pruned
  std::vector<std::pair<int64_t, int64_t>> order;  // every masked (layer, head), in pruning order
};
PruningCurve iterative_pruning(nn::Model& model, const EvalSet& data, const PruneOptions& options);

// Heads whose zero ablation alone costs (nearly) nothing: at most kFreeHeadCost of the metric and of
// the loss. At most all but one head per layer (the most expensive of a layer stays), as pruning
// allows. (layer, model-local head), cheapest first. Together such heads need not be free.
constexpr double kFreeHeadCost = 1e-3;
std::vector<std::pair<int64_t, int64_t>> free_heads(const AblationResult& a, Metric metric);

// Heads per layer left after removing the first k heads of `order` (sorted model-local indices).
std::vector<std::vector<int64_t>> kept_after(const nn::Model& model,
                                             const std::vector<std::pair<int64_t, int64_t>>& order, int64_t k);
// `keep` as physical pruning can honour it: under grouped-query attention a key/value group serves all its
// query heads, so a group stays whole while any of its heads stays (other models: keep as it is).
std::vector<std::vector<int64_t>> whole_kv_groups(const nn::Model& model, std::vector<std::vector<int64_t>> keep);
// The gates that mask every head not in `keep` (1 kept, 0 pruned).
HeadMatrix gates_keeping(const nn::Model& model, const std::vector<std::vector<int64_t>>& keep);
// How many heads to prune (from the curve) to keep the metric at or above `target`: the last step
// whose metric is >= target.
int64_t prune_count_for_metric(const PruningCurve& curve, double target);

// Michel et al.'s Table 2, for every attention module ("layer"): the scores with only its best head kept
// (every other head of that module masked, the rest of the model whole). Best: the highest metric, the
// lower loss breaking ties. One evaluation per head.
struct BestHeadOnly {
  int64_t layer = 0, best_head = 0;  // model-local head
  Scores scores;
};
std::vector<BestHeadOnly> best_head_only(nn::Model& model, const EvalSet& data, Metric metric);

}  // namespace headlab::analysis
