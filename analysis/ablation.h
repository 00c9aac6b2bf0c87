// headlab ablate as one call, which the command and the Python module make: every head's zero, mean and
// resample ablation and importance (analysis/heads.h), the pruning curve (by measured ablation, gradient
// scores or learned L0 gates: analysis/pruning.h, l0_gates.h), Michel et al.'s table of each layer's best
// head alone, fine-tuning of pruned models (analysis/finetune.h), and a physically pruned checkpoint held
// against the gated model; then the run's tables, report.md, CSV files and pictures. Any model family:
// a decoder's sweep runs batched, the encoder-decoder's one pass per head.
#pragma once
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "analysis/finetune.h"
#include "analysis/heads.h"
#include "analysis/l0_gates.h"
#include "analysis/pruning.h"
#include "analysis/stats.h"
#include "analysis/table.h"
#include "loader/load.h"

namespace headlab::analysis {

struct AblateOptions {
  std::string checkpoint;        // the model's path, for the report and the pruned checkpoint's record
  std::string out;               // where pruned.h5 and the fine-tuned runs go
  std::optional<Metric> metric;  // default: exact match for tasks, token accuracy for chars
  Criterion criterion = Criterion::automatic;
  double threshold = 0.9;                 // stop pruning below this fraction of the unpruned metric
  double step = 0.1;                      // fraction of the remaining heads pruned per step
  double prune_to_metric = std::nan("");  // write pruned.h5 pruned as far as the metric stays >= this
  int64_t prune = -1;                     // write pruned.h5 without the K least important heads (-1: not asked)
  bool full_curve = false;                // continue the curve until every layer has one head left
  int64_t l0_steps = 200;
  std::vector<double> l0_penalties = L0Options{}.penalties;
  int64_t finetune = 0;         // fine-tuning steps of the pruned model (0: none)
  double finetune_lr = 0;       // 0: the run's own
  bool finetune_curve = false;  // fine-tune the model pruned at every step of the curve too
  std::string device = "cpu";   // of the fine-tuning runs
  int64_t repeats = 20;         // timed forward passes for the pruned model's speed-up
};

// The pruned checkpoint an ablation wrote (--prune, --prune-to-metric), held against the gated model.
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
  Metric metric = Metric::exact_match;
  double step_fraction = 0.1, sweep_seconds = 0, stop_below = 0, curve_stop = 0;
  int64_t l0_steps = 0, finetune_steps = 0;
  bool finetune_curve = false;
  AblationResult ablation;
  PruningCurve curve;
  std::optional<L0Result> l0;
  std::vector<BestHeadOnly> best;
  AblationTables tables;
  PrunedModelReport pruned;
};

// Runs it all on `data` (the model's task's batches); `say` receives the terminal's text as it is found.
// Writes only what the options ask to be written (pruned.h5, fine-tuned runs, under options.out).
AblationReport run_ablation(const loader::Loaded& in, const EvalSet& data, const AblateOptions& options,
                            const Say& say = {});
// heads.csv, pruning.csv, report.md, importance.png, ablation.png, pruning.png and attention.html into `out`; returns
// what it wrote, for the closing line.
std::vector<std::string> write_ablation_files(const std::string& out, const loader::Loaded& in, const EvalSet& data,
                                              const AblationReport& r);

// ---- the run's tables and prose (ablation_tables.cpp) ----
// Every head, most important first (heads_ranked): rank, head, importance, raw mean |dL/dgate|, then for zero,
// mean and resample ablation the change of loss, token accuracy (and exact match) from unpruned.
Table importance_table(const AblationResult& a, const nn::Model& model);
// The pruning curve: step, heads_pruned, fraction_pruned, loss, token_accuracy[, exact_match]
// [, finetuned_loss, finetuned_token_accuracy[, finetuned_exact_match]], removed. pruning.csv is its CSV.
Table pruning_table(const PruningCurve& c, const nn::Model& model, const std::string& title = "");
// pruning.csv: step,heads_pruned,fraction_pruned,loss,token_accuracy[,exact_match],removed
void save_pruning_csv(const std::string& path, const PruningCurve& c, const nn::Model& model);
// One row per L0 penalty: penalty, heads closed, the metric, loss, which heads.
Table l0_table(const L0Result& l0, Metric metric, const nn::Model& model, const std::string& title = "");
// Michel et al.'s Table 2: per layer and kind of attention, the best head, the metric with only it kept,
// and the change from unpruned; `mean_change` gets "encoder self-attention -0.012; ..." (the kinds' means).
Table best_head_table(const nn::Model& model, const AblationResult& a, const std::vector<BestHeadOnly>& best,
                      Metric metric, std::string* mean_change = nullptr, const std::string& title = "");
// Spearman correlation of a head's importance (normalised or raw) with the loss increase of zeroing it.
double agreement(const AblationResult& a, bool normalized);
// "ablation (auto: 8 heads <= 64)" when the criterion was chosen automatically, else its name.
std::string criterion_text(const PruningCurve& curve, bool automatic);
// Why the gradient scores should not be trusted on this model, or "".
std::string gradient_warning(const AblationResult& a);
// The report ranks heads (headline, table, importance.png) by the measure it trusts: the gradient
// importance where gradient_warning is silent, else zero ablation's measured loss increase.
bool gradient_reliable(const AblationResult& a);
std::vector<const HeadAblation*> heads_ranked(const AblationResult& a);  // most important first
std::string ranking_text(const AblationResult& a);                       // that measure, in words
// Whether the heads that cost nothing alone can go together: "4 heads cost nothing alone (L0H0 L1H0
// L1H1 L1H3); pruned together they are not free: exact_match stays within 1% of unpruned for 3 of
// them (4: 0.863)".
std::string free_heads_text(const AblationResult& a, const PruningCurve& curve, const nn::Model& model);
// "loss 0.1234  token accuracy 0.9876[  exact match 0.9]".
std::string scores_line(const Scores& s);
// report.md: a summary, the heads by importance, L0 gates, the pruning curve, the best head of each
// layer, the pruned model.
std::string ablation_report_md(const nn::Model& model, const EvalSet& data, const AblationReport& r);

}  // namespace headlab::analysis
