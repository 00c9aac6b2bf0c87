// HeadsOverTime: head_types and the ICL score at each observation, as a CSV and a picture.
#include "analysis/heads_over_time.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <regex>
#include <sstream>

#include "analysis/files.h"
#include "analysis/table.h"
#include "io/atomic_file.h"
#include "io/sources.h"
#include "plot/plot.h"
#include "train/evaluate.h"

namespace headlab::analysis {

std::pair<int64_t, int64_t> icl_positions(int64_t T) {
  HL_CHECK(T >= 3, "icl_score: rows of ", T, " tokens are too short for an early and a late position");
  const int64_t late = T - 1 - T / 50, early = std::min(late - 1, std::max<int64_t>(0, T / 10));
  return {early, late};
}

HeadsAtStep icl_score(nn::DecoderModel& model, const EvalSet& data, int64_t early, int64_t late) {
  HL_CHECK(!data.batches.empty(), "icl_score: the evaluation data has no batches");
  train::ScoreSum all, at_early, at_late;
  const NoGradGuard no_grad;
  for (const Batch& b : data.batches) {
    HL_CHECK(early >= 0 && early < late && late < b.T, "icl_score: positions ", early, " and ", late,
             " do not fit rows of ", b.T, " tokens");
    auto [idx, tgt] = train::batch_tensors(b, model.device());
    const Tensor logits = model.forward(idx);  // (B, T, V)
    all.add(b, logits, tgt);
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
  s.loss = all.scores().loss;
  s.loss_early = at_early.scores().loss;
  s.loss_late = at_late.scores().loss;
  s.icl = s.loss_late - s.loss_early;
  return s;
}

PhaseChange find_phase_change(const std::vector<HeadsAtStep>& history) {
  PhaseChange p;
  const size_t n = history.size();
  if (n == 0 || history.front().heads.empty()) return p;
  const HeadsAtStep& last = history.back();
  for (size_t i = 0; i < last.heads.size(); ++i)
    if (p.layer < 0 || last.heads[i].induction > p.induction_last)
      p.layer = last.heads[i].layer, p.head = last.heads[i].original_head, p.induction_last = last.heads[i].induction;
  for (const HeadsAtStep& s : history) {
    for (const HeadTypeScores& h : s.heads)
      if (h.induction >= kRepeatThreshold && p.first_induction_step < 0) p.first_induction_step = s.step;
  }
  double steepest = 0;
  for (size_t i = 1; i < n; ++i) {
    const double steps = static_cast<double>(std::max<int64_t>(1, history[i].step - history[i - 1].step));
    const double drop = (history[i - 1].icl - history[i].icl) / steps;
    if (n >= 3 && std::isfinite(drop) && drop > steepest)
      steepest = drop, p.found = true, p.from = history[i - 1].step, p.to = history[i].step;
  }
  const auto at = [&](int64_t step) -> const HeadsAtStep& {
    return *std::find_if(history.begin(), history.end(), [&](const HeadsAtStep& s) { return s.step == step; });
  };
  const auto induction_of = [&](const HeadsAtStep& s) {
    for (const HeadTypeScores& h : s.heads)
      if (h.layer == p.layer && h.original_head == p.head) return h.induction;
    return std::numeric_limits<double>::quiet_NaN();
  };
  p.icl_first = history.front().icl, p.icl_last = last.icl;
  if (p.found) {
    p.icl_from = at(p.from).icl, p.icl_to = at(p.to).icl;
    double high = p.icl_from, low = p.icl_to;
    for (const HeadsAtStep& s : history) {
      if (!std::isfinite(s.icl)) continue;
      if (s.step <= p.from)
        high = std::max(high, s.icl);
      else
        low = std::min(low, s.icl);
    }
    std::vector<double> changes;
    for (size_t i = 1; i < n; ++i)
      if (std::isfinite(history[i].icl - history[i - 1].icl))
        changes.push_back(std::abs(history[i].icl - history[i - 1].icl));
    std::nth_element(changes.begin(), changes.begin() + static_cast<std::ptrdiff_t>(changes.size() / 2), changes.end());
    p.median_change = changes[changes.size() / 2];
    p.fall = p.icl_from - p.icl_to, p.whole_fall = high - low;
    p.sharp = p.fall >= kPhaseChangeNats && p.fall >= kPhaseChangeRatio * p.median_change;
    p.loss_from = at(p.from).loss, p.loss_to = at(p.to).loss;
    p.induction_from = induction_of(at(p.from)), p.induction_to = induction_of(at(p.to));
  }
  return p;
}

HeadTypeOptions HeadsOverTime::scoring() const {
  HeadTypeOptions o;
  o.induction_rows = score_rows_;
  return o;
}

void HeadsOverTime::check(const nn::DecoderShape& shape, int64_t T) const {
  icl_positions(T);
  check_head_types(shape, T, scoring());
}

void HeadsOverTime::observe(nn::DecoderModel& model, const tasks::Task& task, int64_t T, int64_t step) {
  check(model.shape(), T);
  if (!icl_data_) {
    const int64_t rows = icl_rows_ > 0 ? icl_rows_ : std::max<int64_t>(64, 16384 / T);
    icl_data_ = make_eval_set(task, 1, rows, T), scores_data_ = make_eval_set(task, 1, score_rows_, T);
  }
  const auto [early, late] = icl_positions(T);
  HeadsAtStep s = icl_score(model, *icl_data_, early, late);
  s.step = step;
  s.heads = head_types(model, *scores_data_, scoring()).heads;
  history_.push_back(std::move(s));
}

std::string HeadsOverTime::csv() const {
  std::string out = "step,layer,head,previous_token,induction,duplicate_token,loss,icl_score\n";
  for (const HeadsAtStep& s : history_)
    for (const HeadTypeScores& h : s.heads)
      out += std::to_string(s.step) + "," + std::to_string(h.layer) + "," + std::to_string(h.original_head) + "," +
             fmt(h.previous_token, 6) + "," + fmt(h.induction, 6) + "," + fmt(h.duplicate_token, 6) + "," +
             fmt(s.loss, 6) + "," + fmt(s.icl, 6) + "\n";
  return out;
}

std::string HeadsOverTime::summary_md() const {
  const PhaseChange p = find_phase_change(history_);
  std::ostringstream o;
  if (history_.empty()) return "no observation\n";
  o << "- observations: " << history_.size() << ", steps " << history_.front().step << " to " << history_.back().step
    << "\n- in-context-learning score (loss at the late position - at the early one): " << fmt(p.icl_first, 3)
    << " at the first observation, " << fmt(p.icl_last, 3) << " at the last\n";
  if (p.found)
    o << "- " << (p.sharp ? "phase change" : "no phase change") << ": the ICL score fell fastest between steps "
      << p.from << " and " << p.to << " (" << fmt(p.icl_from, 3) << " -> " << fmt(p.icl_to, 3) << ", " << fmt(p.fall, 3)
      << " nats, " << fmt(p.fall / std::max(p.median_change, 1e-12), 1)
      << " x its median change between observations; its whole fall " << fmt(p.whole_fall, 3) << " nats"
      << (p.sharp ? "" : ": not sharp") << "); the loss of the tracked rows went " << fmt(p.loss_from, 3) << " -> "
      << fmt(p.loss_to, 3) << "\n";
  else
    o << "- no phase change: the ICL score never fell between observations (or fewer than 3 observations)\n";
  o << "- strongest induction head at the end: " << head_label(p.layer, p.head) << ", induction score "
    << fmt(p.induction_last, 3);
  if (p.sharp) o << " (" << fmt(p.induction_from, 3) << " -> " << fmt(p.induction_to, 3) << " across the phase change)";
  o << "\n- first step at which a head's induction score reached " << kRepeatThreshold << ": "
    << (p.first_induction_step >= 0 ? std::to_string(p.first_induction_step) : std::string("never")) << "\n";
  return o.str();
}

void HeadsOverTime::save_png(const std::string& path) const {
  const PhaseChange p = find_phase_change(history_);
  std::vector<plot::XMark> marks;
  if (p.sharp) marks.push_back({static_cast<double>(p.to), "phase change"});
  plot::LineChart chart;
  chart.title = "induction score of every head; ICL score (late - early loss)";
  chart.x_marks = marks;
  chart.x_label = "step";
  chart.y_label = "score";
  if (!history_.empty())
    for (size_t i = 0; i < history_.front().heads.size(); ++i) {
      const HeadTypeScores& h = history_.front().heads[i];
      plot::Series line{head_label(h.layer, h.original_head), {}, {}};
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
  // The loss on a log step axis (from step 1), as Olsson et al. draw it: the fast first fall takes
  // less room and a bump at the phase change shows.
  plot::LineChart loss;
  loss.title = "loss of the tracked validation rows";
  loss.x_label = "step (log)";
  loss.y_label = "cross entropy (nats)";
  loss.log_x = true;
  loss.width = 640;
  for (const plot::XMark& m : marks)
    if (m.x > 0) loss.x_marks.push_back(m);
  plot::Series line{"", {}, {}};
  for (const HeadsAtStep& s : history_)
    if (s.step > 0) line.x.push_back(static_cast<double>(s.step)), line.y.push_back(s.loss);
  loss.series.push_back(std::move(line));
  plot::save_line_charts({chart, loss}, path);
}

std::vector<std::pair<int64_t, std::string>> checkpoint_series(const std::string& folder) {
  std::vector<std::pair<int64_t, std::string>> found = train::checkpoint_history(folder);
  if (!found.empty()) return found;
  static const std::regex revision(R"(step(\d{1,18}))");
  std::error_code ec;
  for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    std::error_code kind;  // a revision's model folder, as the Hub's stepN branches (Pythia's) are checked out
    if (std::regex_match(name, m, revision) && it->is_directory(kind) && io::source_claiming(it->path().string()))
      found.emplace_back(std::stoll(m[1].str()), it->path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

train::StepObserver track_heads(const std::shared_ptr<HeadsOverTime>& tracker, const std::string& out, int64_t every) {
  train::StepObserver o;
  o.every = every;
  o.check = [tracker](const nn::Model& model, int64_t T) {
    const auto* decoder = model.as_decoder();
    HL_CHECK(decoder != nullptr, "train: --track-heads applies to decoders; this run trains an encoder-decoder");
    tracker->check(decoder->shape(), T);
  };
  o.call = [tracker, out](nn::Model& model, const tasks::Task& task, int64_t T, int64_t step) {
    tracker->observe(*model.as_decoder(), task, T, step);  // check ran when the run started
    save_tracking(*tracker, out, "train");
  };
  return o;
}

void save_tracking(const HeadsOverTime& tracker, const std::string& out, const std::string& who) {
  io::write_file_atomic((std::filesystem::path(out) / "heads_over_time.csv").string(), tracker.csv(), who);
  tracker.save_png((std::filesystem::path(out) / "heads_over_time.png").string());
}

std::string finish_tracking(const HeadsOverTime& tracker, const std::string& out) {
  if (tracker.history().empty()) return "";
  const std::string summary = tracker.summary_md();
  io::write_file_atomic((std::filesystem::path(out) / "heads_over_time.md").string(), summary, "train");
  return "heads over time:\n" + summary + "wrote " +
         (std::filesystem::path(out) / "heads_over_time.{csv,png,md}").string() + " (" +
         std::to_string(tracker.history().size()) + " observations)\n";
}

}  // namespace headlab::analysis
