// Head analysis of models and checkpoints (decoders; the encoder-decoder where it applies): zero and mean ablation of
// every head, the head-importance scores of Michel, Levy & Neubig (2019, "Are Sixteen Heads Really Better than One?"),
// iterative pruning by those scores, physical pruning (a smaller checkpoint without the pruned heads), and the
// wrapper-vs-fused attention measurements behind `headlab compare`. Everything computes; nothing prints.
// L = layers, H = heads of a layer, D = head size, B = batch, T = tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/enum_names.h"
#include "nn/decoder.h"
#include "tasks/task.h"
#include "train/evaluate.h"

namespace headlab::analysis {

using tasks::Batch;
using tasks::Split;
using tasks::Task;

// ------------------------------------------------------------------------------------------------
// Evaluation data and scores

// The batches an analysis measures on, drawn once so that every ablation sees the same tokens.
struct EvalSet {
  std::vector<Batch> batches;
  bool has_exact_match = false;  // task data (whole answers), not chars
  int64_t tokens() const;        // scored targets over all batches
};
// Batches 0..n-1 of the task's `split` stream, each (batch_size, T).
EvalSet make_eval_set(const Task& task, int64_t batches, int64_t batch_size, int64_t T, Split split = Split::val);

using train::Scores;  // teacher-forced scores over an EvalSet

// The metric pruning watches (higher is better).
enum class Metric { exact_match, token_accuracy };
// enum_name, parse_enum (base/enum_names.h); "exact", "accuracy" and "token" are aliases.
constexpr auto enum_table(Metric) {
  return std::to_array<EnumName<Metric>>({{Metric::exact_match, "exact_match"},
                                          {Metric::token_accuracy, "token_accuracy"},
                                          {Metric::exact_match, "exact"},
                                          {Metric::token_accuracy, "accuracy"},
                                          {Metric::token_accuracy, "token"}});
}
double metric_value(const Scores& s, Metric m);
void check_metric(const EvalSet& data, Metric m);  // metric_value's refusal, before any score is computed
Metric default_metric(const EvalSet& data);        // exact match for tasks, token accuracy for chars

// A value per head: [layer][head], heads in the model's order (for a pruned model, its kept heads).
using HeadMatrix = std::vector<std::vector<double>>;
HeadMatrix head_matrix(const nn::Model& model, double fill);
int64_t count_heads(const HeadMatrix& m);

// Scores with each head's context c_h replaced by gates[l][h] * c_h + offsets[l][h] (HeadControl).
// gates empty: all ones; offsets empty or an undefined entry: none; offsets[l] is (H_l, D).
// The model's own head controls are restored afterwards, also when this throws.
Scores evaluate_heads(nn::Model& model, const EvalSet& data, const HeadMatrix& gates = {},
                      const std::vector<Tensor>& offsets = {});

// Every head's mean context over the data (all rows and positions): per layer (H_l, D), model dtype.
std::vector<Tensor> mean_head_contexts(nn::Model& model, const EvalSet& data);

// ------------------------------------------------------------------------------------------------
// Importance (Michel et al. 2019): I_h = E_x |dL/dxi_h| where xi are the head gates. One backward per
// batch through gates that require grad (functional grad(), parameters untouched); |grad| of each
// batch's mean loss is averaged over the batches. normalized: each layer's scores divided by their
// l2 norm, as in the paper, so that layers compare. Heads whose gate is 0 (already pruned) are left
// out of the normalisation and get NaN there.
struct Importance {
  HeadMatrix raw, normalized;
};
Importance head_importance(nn::Model& model, const EvalSet& data, const HeadMatrix& gates = {});

// ------------------------------------------------------------------------------------------------
// Many head interventions in one batched pass. An intervention replaces one head's context c_h (at
// every position, or at one) by 0 (zero ablation), by its mean over the data (mean ablation), or by
// its context on other inputs (patch: activation patching from the source batches; resample
// ablation is a patch from other rows of the same data). Every data batch is repeated once per
// intervention and the copies run as one forward (chunked to a memory budget), each copy with its
// own row of gates and offsets (HeadControl's (B, H, T) and (B, H, T, D) forms), so that a sweep
// over all heads costs a few large GEMMs instead of a pass per head.
enum class Ablation { zero, mean, patch };
struct HeadIntervention {
  int64_t layer = -1, head = -1;  // layer -1: no intervention (the model under base_gates)
  Ablation kind = Ablation::zero;
  int64_t position = -1;  // -1: every position
};
struct InterventionOptions {
  HeadMatrix base_gates;                       // in every copy (heads already pruned); empty: ones
  const std::vector<Batch>* source = nullptr;  // patch: per data batch, the batch whose contexts go in
  std::vector<Tensor> means;                   // mean: per layer (H_l, D); empty: mean_head_contexts
  int64_t max_copies = 0;                      // copies per forward; 0: as many as ~64 MB of activations allow
};
// Scores per intervention, in the order given. The model's head controls are restored afterwards.
std::vector<Scores> evaluate_interventions(nn::DecoderModel& model, const EvalSet& data,
                                           const std::vector<HeadIntervention>& interventions,
                                           const InterventionOptions& options = {});
// The data's batches with every row's inputs and targets taken from the next row (the last from the
// first): resample ablation's source, other inputs of the same distribution.
std::vector<Batch> rotated_rows(const EvalSet& data);

// ------------------------------------------------------------------------------------------------
// Ablation of every head, one at a time: zero (gate 0), mean (gate 0, offset = the head's mean
// context) and resample (the head's context from another row), all in one batched pass.
struct HeadAblation {
  int64_t layer = 0, head = 0, original_head = 0;
  double importance = 0, importance_raw = 0;  // at full gates
  Scores zero, mean, resample;                // scores with the head ablated
};
struct AblationResult {
  Scores base;
  Importance importance;
  std::vector<HeadAblation> heads;  // layer-major
};
AblationResult ablate_heads(nn::Model& model, const EvalSet& data);

// Max |a - b| over the logits of the data's batches (inputs only), model a against model b with
// gates_a applied to a.
double max_logit_difference(nn::Model& a, const HeadMatrix& gates_a, nn::Model& b, const EvalSet& data);

}  // namespace headlab::analysis
