// headlab heads on prompt pairs (analysis/prompt_pairs.h), as one call that the command and the Python
// module make: every head's zero and mean ablation, resample ablation (the corrupted prompt's output:
// activation patching's noising), denoising, both at each position when asked, direct logit attribution
// along answer - wrong, and head types on the clean prompts, all on the normalised metric of the circuit
// analyses (1: clean, 0: corrupted) through one CircuitPatcher (analysis/circuit.h). Under MPI the ranks
// share the prompt rows and hold the same figures.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "analysis/circuit.h"
#include "analysis/head_scores.h"
#include "analysis/table.h"

namespace headlab::analysis {

struct PairHeadsOptions {
  uint64_t seed = 1;  // the random tokens of the induction score
  bool by_position = false;
  int64_t stored_rows = 0;  // CircuitOptions::stored_rows
  bool kv_groups = false;   // also each key/value group's keys and values patched (headlab heads --by kv-group)
  std::shared_ptr<train::Collectives> collectives;  // null: this process alone
  std::string checkpoint, source;  // the model's path and where the pairs came from, for the text and report
};
struct PairHeads {
  LogitDifference baseline;
  std::vector<int64_t> heads;                       // the graph's head nodes, layer-major
  std::vector<std::string> names;                   // "L1H3"
  NodeAblation ablation;                            // [head]: metric with the head zeroed / set to its mean
  ActivationPatching patching;                      // [head]: noising (the resample ablation) and denoising
  DirectLogitAttribution dla;                       // [node]
  HeadTypes types;                                  // on the clean prompts
  Batch clean;                                      // the clean prompts as evaluation data (the explorer reads row 0)
  Table table;                                      // a row per head, layer order
  KeyValuePatching key_values;                      // when kv_groups
  Table kv_table;                                   // a row per key/value group, when kv_groups
  HeadMatrix mean, resample, denoising, dla_heads;  // per (layer, head), for the pictures
  double ablation_seconds = 0, patching_seconds = 0;
  int64_t forwards = 0;
};
// `say` receives the terminal's text: the run and its metric, then the 12 heads with the largest effects.
PairHeads heads_on_pairs(nn::DecoderModel& model, const PromptPairs& pairs, const PairHeadsOptions& options = {},
                         const Say& say = {});
// heads.csv, heads_by_position.csv (when by position), kv_groups.csv (when kv_groups), report.md, ablation.png,
// patching.png, dla.png and attention.html into `out`; returns what it wrote.
std::vector<std::string> write_pair_heads_files(const std::string& out, nn::DecoderModel& model,
                                                const tasks::Task& task, const PromptPairs& pairs,
                                                const PairHeadsOptions& options, const PairHeads& r);

}  // namespace headlab::analysis
