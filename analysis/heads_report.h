// headlab heads on a model's task data, as one call that the command and C++ programs make: every head's
// zero, mean and resample ablation, direct logit attribution, activation patching (a corruption the task
// makes, or other rows of the data), head types, ablation on repeated random tokens and composition
// scores; then a value per head, the terminal's table, report.md, heads.csv and the pictures. (On prompt
// pairs: analysis/heads_pairs.h.)
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "analysis/composition.h"
#include "analysis/files.h"
#include "analysis/head_scores.h"
#include "analysis/heads.h"
#include "analysis/logit_attribution.h"
#include "analysis/patching.h"
#include "analysis/table.h"
#include "loader/load.h"

namespace headlab::analysis {

// What every analysis of headlab heads found.
struct HeadsFindings {
  AblationResult ablation;
  LogitAttribution dla;  // NaN everywhere where the model has none (post-LN: BertBlock's; dla_computed false)
  bool dla_computed = true;
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
  HeadMatrix previous, first, separator, self, next, entropy, entropy_normalized, induction, duplicate;
  HeadMatrix repeated_zero, repeated_mean;  // ablation on repeated random tokens: loss increase
  std::vector<std::vector<std::string>> labels;
};
HeadsScores heads_scores(const nn::DecoderModel& model, const HeadsFindings& f);
// heads.csv's columns after the ablation's: dla_logit_vs_mean, dla_logit, patch_noising, patch_denoising,
// the head-type scores, repeated_zero_delta_loss, repeated_mean_delta_loss, label.
std::vector<HeadColumn> heads_csv_columns(const HeadsFindings& f, const HeadsScores& s);
// One row per head (layer order): head, zero dloss, resample, DLA, noising, denoising, type.
Table heads_summary_table(const nn::DecoderModel& model, const HeadsScores& s);
struct HeadsRun {
  std::string checkpoint, task;
  bool by_position = false;
};
// Lines naming each induction head's strongest K-composition partner (induction_pairs).
std::string induction_pairs_text(const HeadTypes& types, const std::vector<CompositionScore>& comp);
// report.md of headlab heads: the run, then a section per analysis with its table.
std::string heads_report_md(const nn::DecoderModel& model, const EvalSet& data, const HeadsRun& run,
                            const HeadsFindings& f, const HeadsScores& s);
// A head column per score, heads in `order` ((layer, model-local head)), values signed to 3 decimals.
Table head_value_table(const nn::DecoderModel& model, const std::vector<std::pair<int64_t, int64_t>>& order,
                       const std::vector<std::pair<std::string, HeadMatrix>>& columns);
// Heads sorted by |value| descending (stable: layer order among equals).
std::vector<std::pair<int64_t, int64_t>> by_magnitude(const HeadMatrix& v);
// The head-type scores and label of every head.
Table head_types_table(const HeadTypes& types);
// Denoising by position: a row per head, a column per position.
Table denoising_by_position_table(const PatchingResult& p, int64_t T);

struct HeadsOptions {
  std::string checkpoint;  // the model's path, for the report
  uint64_t seed = 1;       // which prompt digit the task's corruption changes; the repeated random tokens
  bool by_position = false;
};
// Every analysis of the model `in` loaded (a decoder) on `data`, its task's batches.
HeadsFindings find_heads(const loader::Loaded& in, const EvalSet& data, const HeadsOptions& options);
// What find_heads needs of the model and the rows (head types' refusals), for a caller to check before its first line.
void check_find_heads(const loader::Loaded& in, const EvalSet& data);
// What the command prints: the summary table, DLA and patching notes, composition, repeated tokens.
std::string heads_text(const nn::DecoderModel& model, const HeadsFindings& f, const HeadsScores& s);
// heads.csv, report.md, dla.png, patching.png, types.png, ablation.png, attention.html and (two layers or
// more) composition.csv and .png into `out`; returns what it wrote, for the closing line.
std::vector<std::string> write_heads_files(const std::string& out, const loader::Loaded& in, const EvalSet& data,
                                           const HeadsOptions& options, const HeadsFindings& f, const HeadsScores& s);

}  // namespace headlab::analysis
