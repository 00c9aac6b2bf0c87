// Heads watched while a model trains (Olsson et al. 2022 watched induction heads form this way): at each
// observation, every head's previous-token, induction and duplicate-token scores (head_types, on
// fixed validation rows and repeated random tokens) and the model's in-context-learning score, the mean
// loss at a late position minus that at an early one (early = T/10, late = T - 1 - T/50: Olsson's tokens
// 50 and 500 of 512, scaled to the context; negative when later tokens are predicted better).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "analysis/head_scores.h"

namespace headlab::analysis {

struct HeadsAtStep {
  int64_t step = 0;
  std::vector<HeadTypeScores> heads;              // layer-major
  double loss_early = 0, loss_late = 0, icl = 0;  // NaN where the positions carry no target (tasks)
};

// Positions of the in-context-learning score for rows of T tokens: {early, late}.
std::pair<int64_t, int64_t> icl_positions(int64_t T);
// The model's mean loss at position `early` and at `late` over the data's rows, and late - early.
HeadsAtStep icl_score(nn::GPTModel& model, const EvalSet& data, int64_t early, int64_t late);

class HeadsOverTime {
 public:
  // rows: validation rows of T tokens the scores average over (drawn once, on the first observation).
  explicit HeadsOverTime(int64_t rows = 8) : rows_(rows) {}
  void observe(nn::GPTModel& model, const tasks::Task& task, int64_t T, int64_t step);
  const std::vector<HeadsAtStep>& history() const { return history_; }
  // step,layer,head,previous_token,induction,duplicate_token,icl_score: a row per head per observation.
  std::string csv() const;
  // One line per head of its induction score over the steps, beside the ICL score's line.
  void save_png(const std::string& path) const;

 private:
  int64_t rows_;
  std::optional<EvalSet> data_;
  std::vector<HeadsAtStep> history_;
};

}  // namespace headlab::analysis
