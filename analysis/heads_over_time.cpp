// HeadsOverTime: head_types and the ICL score at each observation, as a CSV and a picture.
#include "analysis/heads_over_time.h"

#include <cmath>

#include "analysis/table.h"
#include "plot/plot.h"
#include "train/evaluate.h"

namespace headlab::analysis {

std::pair<int64_t, int64_t> icl_positions(int64_t T) {
  HL_CHECK(T >= 3, "icl_score: rows of ", T, " tokens are too short for an early and a late position");
  const int64_t late = T - 1 - T / 50, early = std::min(late - 1, std::max<int64_t>(0, T / 10));
  return {early, late};
}

HeadsAtStep icl_score(nn::GPTModel& model, const EvalSet& data, int64_t early, int64_t late) {
  HL_CHECK(!data.batches.empty(), "icl_score: the evaluation data has no batches");
  train::ScoreSum at_early, at_late;
  const NoGradGuard no_grad;
  for (const Batch& b : data.batches) {
    HL_CHECK(early >= 0 && early < late && late < b.T, "icl_score: positions ", early, " and ", late,
             " do not fit rows of ", b.T, " tokens");
    auto [idx, tgt] = train::batch_tensors(b, model.device());
    const Tensor logits = model.forward(idx);  // (B, T, V)
    for (const auto& [t, sum] : {std::pair{early, &at_early}, std::pair{late, &at_late}}) {
      Batch one = b;  // the column t alone, as a batch of one token per row
      one.T = 1;
      one.has_answers = false;
      one.answer_begin.clear(), one.answer_end.clear();
      one.inputs.clear(), one.targets.clear();
      for (int64_t r = 0; r < b.B; ++r) {
        one.inputs.push_back(b.input(r, t));
        one.targets.push_back(b.target(r, t));
      }
      sum->add(one, logits.narrow(1, t, 1), tgt.narrow(1, t, 1));
    }
  }
  HeadsAtStep s;
  s.loss_early = at_early.scores().loss;
  s.loss_late = at_late.scores().loss;
  s.icl = s.loss_late - s.loss_early;
  return s;
}

void HeadsOverTime::observe(nn::GPTModel& model, const tasks::Task& task, int64_t T, int64_t step) {
  if (!data_) data_ = make_eval_set(task, 1, rows_, T);
  const auto [early, late] = icl_positions(T);
  HeadsAtStep s = icl_score(model, *data_, early, late);
  s.step = step;
  HeadTypeOptions o;
  o.induction_rows = rows_;
  s.heads = head_types(model, *data_, o).heads;
  history_.push_back(std::move(s));
}

std::string HeadsOverTime::csv() const {
  std::string out = "step,layer,head,previous_token,induction,duplicate_token,icl_score\n";
  for (const HeadsAtStep& s : history_)
    for (const HeadTypeScores& h : s.heads)
      out += std::to_string(s.step) + "," + std::to_string(h.layer) + "," + std::to_string(h.original_head) + "," +
             fmt(h.previous_token, 6) + "," + fmt(h.induction, 6) + "," + fmt(h.duplicate_token, 6) + "," +
             fmt(s.icl, 6) + "\n";
  return out;
}

void HeadsOverTime::save_png(const std::string& path) const {
  plot::LineChart chart;
  chart.title = "induction score of every head, and the in-context-learning score (late - early loss)";
  chart.x_label = "step";
  chart.y_label = "score";
  if (!history_.empty())
    for (size_t i = 0; i < history_.front().heads.size(); ++i) {
      const HeadTypeScores& h = history_.front().heads[i];
      std::string name = "L";  // (appended, not "L" + ...: GCC 12 warns falsely on that form, -Wrestrict)
      name += std::to_string(h.layer) + "H" + std::to_string(h.original_head);
      plot::Series line{name, {}, {}};
      for (const HeadsAtStep& s : history_) {
        line.x.push_back(static_cast<double>(s.step));
        line.y.push_back(s.heads[i].induction);
      }
      chart.series.push_back(std::move(line));
    }
  plot::Series icl{"ICL score", {}, {}};
  for (const HeadsAtStep& s : history_) {
    icl.x.push_back(static_cast<double>(s.step));
    icl.y.push_back(s.icl);
  }
  chart.series.push_back(std::move(icl));
  plot::save_line_chart(chart, path);
}

}  // namespace headlab::analysis
