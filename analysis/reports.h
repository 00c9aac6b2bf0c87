// The analyses' results as tables (table.h), each built once and then printed to the terminal and
// written to report.md or a CSV file from the same object: headlab ablate's and headlab heads'.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/composition.h"
#include "analysis/finetune.h"
#include "analysis/head_scores.h"
#include "analysis/heads.h"
#include "analysis/l0_gates.h"
#include "analysis/logit_attribution.h"
#include "analysis/patching.h"
#include "analysis/pruning.h"
#include "analysis/report.h"
#include "analysis/stats.h"
#include "analysis/table.h"

namespace headlab::analysis {

// Every head by importance (descending): rank, head, importance, raw mean |dL/dgate|, then for zero,
// mean and resample ablation the change of loss, token accuracy (and exact match) from unpruned.
Table importance_table(const AblationResult& a, const nn::Model& model);
// The pruning curve: step, heads_pruned, fraction_pruned, loss, token_accuracy[, exact_match]
// [, finetuned_loss, finetuned_token_accuracy[, finetuned_exact_match]], removed. pruning.csv is its CSV.
Table pruning_table(const PruningCurve& c, const nn::Model& model, const std::string& title = "");
// One row per L0 penalty: penalty, heads closed, the metric, loss, which heads.
Table l0_table(const L0Result& l0, Metric metric, const nn::Model& model, const std::string& title = "");
// Michel et al.'s Table 2: per layer and kind of attention, the best head, the metric with only it kept,
// and the change from unpruned; `mean_change` gets "encoder self-attention -0.012; ..." (the kinds' means).
Table best_head_table(const nn::Model& model, const AblationResult& a, const std::vector<BestHeadOnly>& best,
                      Metric metric, std::string* mean_change = nullptr, const std::string& title = "");

// ---- headlab ablate's prose ----
// Spearman correlation of a head's importance (normalised or raw) with the loss increase of zeroing it.
double agreement(const AblationResult& a, bool normalized);
// "ablation (auto: 8 heads <= 64)" when the criterion was chosen automatically, else its name.
std::string criterion_text(const PruningCurve& curve, bool automatic);
// Why the gradient scores should not be trusted on this model, or "".
std::string gradient_warning(const AblationResult& a);
// Whether the heads that cost nothing alone can go together: "4 heads cost nothing alone (L0H0 L1H0
// L1H1 L1H3); pruned together they are not free: exact_match stays within 1% of unpruned for 3 of
// them (4: 0.863)".
std::string free_heads_text(const AblationResult& a, const PruningCurve& curve, const nn::Model& model);
// "loss 0.1234  token accuracy 0.9876[  exact match 0.9]".
std::string scores_line(const Scores& s);

// The pruned checkpoint headlab ablate wrote (--prune, --prune-to-metric), held against the gated model.
struct PrunedModelReport {
  bool done = false;
  std::string path;
  int64_t removed = 0, params_before = 0, params_after = 0;
  std::string kept;  // the heads it keeps, by original index
  std::optional<FinetuneResult> finetuned;
  double max_diff = 0;  // max |logits(pruned) - logits(gated)|
  Scores gated, scores;
  TimeStats time_before, time_after;
  int64_t B = 0, T = 0;
};
// The tables of one run, built once: printed as the run goes and written to report.md.
struct AblationTables {
  Table importance, pruning, best_head;
  std::optional<Table> l0;
  std::string best_head_mean;  // best_head_table's mean_change
};
// What headlab ablate was asked and found.
struct AblationReport {
  std::string checkpoint, task, model_description;
  std::optional<int64_t> checkpoint_step;
  std::string kept_before;  // the heads kept when the checkpoint was pruned before; "" when whole
  std::string criterion;    // criterion_text
  double step_fraction = 0.1, sweep_seconds = 0, stop_below = 0;
  int64_t l0_steps = 0, finetune_steps = 0;
  bool finetune_curve = false;
  AblationResult ablation;
  PruningCurve curve;
  std::optional<L0Result> l0;
  AblationTables tables;
  PrunedModelReport pruned;
};
// report.md: a summary, the heads by importance, L0 gates, the pruning curve, the best head of each
// layer, the pruned model.
std::string ablation_report_md(const nn::Model& model, const EvalSet& data, const AblationReport& r);

// ---- headlab heads ----
// What every analysis of headlab heads found.
struct HeadsFindings {
  AblationResult ablation;
  LogitAttribution dla;
  PatchingResult patching;
  HeadTypes types;
  std::string corruption;  // how the corrupted inputs were made
  // Ablation again on repeated random tokens (repeated_tokens_set): what copying from the context needs.
  AblationResult repeated;
  int64_t repeated_rows = 0, repeated_half = 0;
  std::vector<CompositionScore> composition;  // empty for one layer
  double seconds_ablation = 0, seconds_dla = 0, seconds_patching = 0, seconds_types = 0, seconds_repeated = 0;
};
// The same as a value per head ([layer][model-local head]; NaN where a result has no such head).
struct HeadsScores {
  HeadMatrix zero, mean, resample;  // ablation: loss increase
  HeadMatrix noising, denoising;    // patching: fraction of the gap
  HeadMatrix dla;                   // vs the mean logit
  HeadMatrix previous, first, separator, entropy, entropy_normalized, induction, duplicate;
  HeadMatrix repeated_zero, repeated_mean;  // ablation on repeated random tokens: loss increase
  std::vector<std::vector<std::string>> labels;
};
HeadsScores heads_scores(const nn::GPTModel& model, const HeadsFindings& f);
// heads.csv's columns after the ablation's: dla_logit_vs_mean, dla_logit, patch_noising, patch_denoising,
// the head-type scores, repeated_zero_delta_loss, repeated_mean_delta_loss, label.
std::vector<HeadColumn> heads_csv_columns(const HeadsFindings& f, const HeadsScores& s);
// One row per head (layer order): head, zero dloss, resample, DLA, noising, denoising, type.
Table heads_summary_table(const nn::GPTModel& model, const HeadsScores& s);
struct HeadsRun {
  std::string checkpoint, task;
  bool by_position = false;
};
// Lines naming each induction head's strongest K-composition partner (induction_pairs).
std::string induction_pairs_text(const HeadTypes& types, const std::vector<CompositionScore>& comp);
// report.md of headlab heads: the run, then a section per analysis with its table.
std::string heads_report_md(const nn::GPTModel& model, const EvalSet& data, const HeadsRun& run, const HeadsFindings& f,
                            const HeadsScores& s);
// A head column per score, heads in `order` ((layer, model-local head)), values signed to 3 decimals.
Table head_value_table(const nn::GPTModel& model, const std::vector<std::pair<int64_t, int64_t>>& order,
                       const std::vector<std::pair<std::string, HeadMatrix>>& columns);
// Heads sorted by |value| descending (stable: layer order among equals).
std::vector<std::pair<int64_t, int64_t>> by_magnitude(const HeadMatrix& v);
// The head-type scores and label of every head.
Table head_types_table(const HeadTypes& types);
// Denoising by position: a row per head, a column per position.
Table denoising_by_position_table(const PatchingResult& p, int64_t T);

}  // namespace headlab::analysis
