// Heads watched while a model trains (Olsson et al. 2022 watched induction heads form this way): at each
// observation, every head's previous-token, induction and duplicate-token scores (head_types, on
// fixed validation rows and repeated random tokens) and the model's in-context-learning score, the mean
// loss at a late position minus that at an early one (early = T/10, late = T - 1 - T/50: Olsson's tokens
// 50 and 500 of 512, scaled to the context; negative when later tokens are predicted better).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/head_scores.h"
#include "train/trainer.h"

namespace headlab::analysis {

struct HeadsAtStep {
  int64_t step = 0;
  std::vector<HeadTypeScores> heads;              // layer-major
  double loss = 0;                                // mean over every scored position of the rows
  double loss_early = 0, loss_late = 0, icl = 0;  // NaN where the positions carry no target (tasks)
};

// Where the in-context-learning score falls fastest: the observation interval (from, to] with the
// largest drop of the ICL score per step, and what the heads did. It is a phase change (Olsson et al.)
// when it is sharp: a fall of at least kPhaseChangeNats and kPhaseChangeRatio times the median change
// between observations, not one step of a slow slide or of the score's wandering.
constexpr double kPhaseChangeNats = 0.1, kPhaseChangeRatio = 5;
struct PhaseChange {
  bool found = false;                                  // an interval where the score fell (needs 3 observations)
  bool sharp = false;                                  // and the fall was a phase change
  double fall = 0, median_change = 0, whole_fall = 0;  // whole: its highest before the interval - lowest after
  int64_t from = 0, to = 0;
  double icl_first = 0, icl_from = 0, icl_to = 0, icl_last = 0;
  double loss_from = 0, loss_to = 0;
  // The head with the highest induction score at the last observation, and the first step at which
  // any head reached kRepeatThreshold (-1: none did).
  int64_t layer = -1, head = -1, first_induction_step = -1;
  double induction_last = 0, induction_from = 0, induction_to = 0;
};
PhaseChange find_phase_change(const std::vector<HeadsAtStep>& history);

// Positions of the in-context-learning score for rows of T tokens: {early, late}.
std::pair<int64_t, int64_t> icl_positions(int64_t T);
// The model's mean loss over the data, at position `early` and at `late` over its rows, and late - early.
HeadsAtStep icl_score(nn::DecoderModel& model, const EvalSet& data, int64_t early, int64_t late);

class HeadsOverTime {
 public:
  // Validation rows of T tokens, drawn once on the first observation, so that every observation scores
  // the same rows: score_rows for the attention-pattern scores (and as many rows of repeated random
  // tokens), icl_rows for the loss and the ICL score (one position per row: more rows).
  // icl_rows 0: 16384 / T rows, at least 64 (tokens enough that the score does not wander with the rows).
  explicit HeadsOverTime(int64_t score_rows = 8, int64_t icl_rows = 0) : score_rows_(score_rows), icl_rows_(icl_rows) {}
  void observe(nn::DecoderModel& model, const tasks::Task& task, int64_t T, int64_t step);
  // What observe needs of a model and rows of T tokens, checked before any work (errors as observe's).
  void check(const nn::DecoderShape& shape, int64_t T) const;
  const std::vector<HeadsAtStep>& history() const { return history_; }
  // step,layer,head,previous_token,induction,duplicate_token,loss,icl_score: a row per head per observation.
  std::string csv() const;
  // Two charts side by side, the phase change marked on both: every head's induction score and the
  // ICL score; the loss of the tracked rows.
  void save_png(const std::string& path) const;
  // The phase change and the heads, in a few lines of markdown.
  std::string summary_md() const;

 private:
  HeadTypeOptions scoring() const;
  int64_t score_rows_, icl_rows_;
  std::optional<EvalSet> scores_data_, icl_data_;
  std::vector<HeadsAtStep> history_;
};

// A folder of one run's checkpoints, by step: headlab's history (checkpoint-<step>.h5: train::checkpoint_history)
// or subfolders step<N> each holding a model folder (Pythia's revisions: step1000, step2000, ...); empty when it
// holds neither. `headlab heads FOLDER` observes each with HeadsOverTime, as --track-heads does while training.
std::vector<std::pair<int64_t, std::string>> checkpoint_series(const std::string& folder);

// <out>/heads_over_time.csv and .png from what the tracker observed so far (errors start with who).
void save_tracking(const HeadsOverTime& tracker, const std::string& out, const std::string& who);

// What `train --track-heads N` attaches to a run (train::StepObserver): every N steps the decoder's heads
// observed, and <out>/heads_over_time.csv and .png rewritten so that a run can be watched while it trains.
train::StepObserver track_heads(const std::shared_ptr<HeadsOverTime>& tracker, const std::string& out, int64_t every);
// After the run: <out>/heads_over_time.md, and the text that reports it ("" when nothing was observed).
std::string finish_tracking(const HeadsOverTime& tracker, const std::string& out);

}  // namespace headlab::analysis
