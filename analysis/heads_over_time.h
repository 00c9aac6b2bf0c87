// Heads watched while a model trains (Olsson et al. 2022 watched induction heads form this way): at each
// observation, every head's previous-token, induction and duplicate-token scores (head_types, on
// fixed validation rows and repeated random tokens), the loss of the rows and, on text, the model's
// in-context-learning score, the mean loss at a late position minus that at an early one (early = T/10,
// late = T - 1 - T/50: Olsson's tokens 50 and 500 of 512, scaled to the context; negative when later tokens
// are predicted better). A task's rows carry targets at their answers only: there the answers' loss, token
// accuracy and exact match are what is tracked, and the phase change is looked for in the loss.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/head_scores.h"
#include "plot/plot.h"
#include "train/trainer.h"

namespace headlab::analysis {

struct HeadsAtStep {
  int64_t step = 0;
  std::vector<HeadTypeScores> heads;              // layer-major
  double loss = 0;                                // mean over every scored position of the rows
  double token_accuracy = 0, exact_match = 0;     // of those positions; exact match NaN where it does not apply
  double loss_early = 0, loss_late = 0, icl = 0;  // NaN where the positions carry no target (tasks)
};

// The head scores tracked, with the threshold at which head_types labels a head by them.
struct TrackedScore {
  const char* name;  // "previous-token", "induction", "duplicate-token"
  double HeadTypeScores::*score;
  double threshold;
};
inline constexpr TrackedScore kTrackedScores[3] = {
    {"previous-token", &HeadTypeScores::previous_token, kPatternThreshold},
    {"induction", &HeadTypeScores::induction, kRepeatThreshold},
    {"duplicate-token", &HeadTypeScores::duplicate_token, kRepeatThreshold}};

// One head's score over the run: at the first and last observations and across the phase change.
struct HeadTrack {
  const TrackedScore* kind = &kTrackedScores[1];
  int64_t layer = -1, head = -1;                 // -1: no heads observed
  double first = 0, last = 0, from = 0, to = 0;  // from, to: at the phase change's ends (when sharp)
};

// What the phase change is looked for in: the ICL score where the positions carry targets (text), else
// the loss of the tracked rows (a task's answers: its ICL positions carry no target).
enum class PhaseMeasure { icl, loss };

// A phase change (Olsson et al.) is a sharp fall of the measure between two plateaus: over some stretch of
// w steps [from, to] it falls at least kPhaseChangeNats and at least kPhaseChangeRatio times the most it
// moved (max - min) in the kPhaseChangeSide * w steps before and after, each of those holding
// >= kPhaseChangePlateau observations. That move counts at least the median change between observations
// and kPhaseChangeNoise times the noise (from the median second difference, which a steady slope does not
// reach), so that a quiet stretch of a few noisy points does not pass for a plateau. Comparing a fall with
// its own surroundings, over steps in proportion to it, makes the rule independent of how often the run was
// observed; a slow slide moves at half its rate in half the steps; a fall at the very start (a loss's first
// drop) has no plateau before it.
constexpr double kPhaseChangeNats = 0.1, kPhaseChangeRatio = 5, kPhaseChangeSide = 0.5, kPhaseChangeNoise = 3;
constexpr int64_t kPhaseChangePlateau = 3;
struct PhaseChange {
  PhaseMeasure measure = PhaseMeasure::icl;
  bool found = false;  // the measure fell between two observations (needs 3 observations where it is finite)
  bool sharp = false;  // and a fall was a phase change
  // sharp: where the fall took place (from its first 10% to its last); else the interval of the steepest
  // fall per step.
  int64_t from = 0, to = 0;
  double at_from = 0, at_to = 0, fall = 0;  // the measure at from and to; fall = at_from - at_to
  // Of the fall that came nearest to a phase change (sharp: the one found): the most the measure moved in the
  // steps before and after it, and its fall over that (0: no fall had plateaus on both sides to check).
  double moved = 0, contrast = 0;
  double median_change = 0;    // of |change| between observations
  double noise = 0;            // the measure's noise: median |second difference| / (0.6745 sqrt 6)
  double whole_fall = 0;       // its highest up to `from` - its lowest from `to`
  double first = 0, last = 0;  // the measure at the first and last observations
  double loss_from = 0, loss_to = 0;
  HeadTrack strongest_induction;      // the highest induction score at the last observation
  int64_t first_induction_step = -1;  // the first step a head's induction score reached kRepeatThreshold
  HeadTrack grew_most;                // of every head and tracked score, the largest rise first -> last
};
PhaseChange find_phase_change(const std::vector<HeadsAtStep>& history);

// Positions of the in-context-learning score for rows of T tokens: {early, late}.
std::pair<int64_t, int64_t> icl_positions(int64_t T);
// The model's mean loss over the data, at position `early` and at `late` over its rows, and late - early.
HeadsAtStep icl_score(nn::DecoderModel& model, const EvalSet& data, int64_t early, int64_t late);

// The summary and the charts of a history (HeadsOverTime's): `task` names the task observed, `rows` the rows
// the loss was tracked on. The summary is worded for the measure (no ICL score where it is NaN, induction
// named on a task only where a head reached the threshold).
std::string heads_over_time_md(const std::vector<HeadsAtStep>& history, const std::string& task, int64_t rows);
std::vector<plot::LineChart> heads_over_time_charts(const std::vector<HeadsAtStep>& history, const std::string& task);

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
  // step,layer,head,previous_token,induction,duplicate_token,loss,icl_score,token_accuracy,exact_match: a row
  // per head per observation; a score that does not apply (NaN) is left empty.
  std::string csv() const;
  // Charts side by side, the phase change's stretch marked on each: a panel per tracked head score (every
  // head a line), the ICL score (tasks: the answers' token accuracy and exact match), the loss.
  void save_png(const std::string& path) const;
  // The phase change and the heads, in a few lines of markdown, worded for the measure tracked.
  std::string summary_md() const;

 private:
  HeadTypeOptions scoring() const;
  int64_t score_rows_, icl_rows_;
  std::optional<EvalSet> scores_data_, icl_data_;
  std::string task_;  // the task observed ("sort", "chars", ...)
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
