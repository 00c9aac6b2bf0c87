// HeadsOverTime: head_types and the ICL score at each observation, as a CSV and a picture.
#include "analysis/heads_over_time.h"

#include <algorithm>
#include <bit>
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
  const train::Scores scores = all.scores();
  s.loss = scores.loss, s.token_accuracy = scores.token_accuracy, s.exact_match = scores.exact_match;
  s.loss_early = at_early.scores().loss;
  s.loss_late = at_late.scores().loss;
  s.icl = s.loss_late - s.loss_early;
  return s;
}

namespace {

// max - min of v[i..j] in O(1) after O(n log n): a sparse table of minima and maxima, so that every
// stretch's plateaus can be measured (O(n^2 log n) for a history of n observations).
class Spread {
 public:
  explicit Spread(const std::vector<double>& v) : lo_{v}, hi_{v} {
    for (size_t w = 1; 2 * w <= v.size(); w *= 2) {
      const std::vector<double>&lo = lo_.back(), &hi = hi_.back();
      std::vector<double> l(v.size() - 2 * w + 1), h(l.size());
      for (size_t i = 0; i < l.size(); ++i) l[i] = std::min(lo[i], lo[i + w]), h[i] = std::max(hi[i], hi[i + w]);
      lo_.push_back(std::move(l)), hi_.push_back(std::move(h));
    }
  }
  double operator()(size_t i, size_t j) const {
    const size_t k = static_cast<size_t>(std::bit_width(j - i + 1)) - 1, w = size_t{1} << k;
    return std::max(hi_[k][i], hi_[k][j + 1 - w]) - std::min(lo_[k][i], lo_[k][j + 1 - w]);
  }

 private:
  std::vector<std::vector<double>> lo_, hi_;
};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double score_of(const HeadsAtStep& s, size_t i, const TrackedScore& kind) {
  return i < s.heads.size() ? s.heads[i].*kind.score : kNaN;
}

// Head i's `kind` score at the first and last observations.
HeadTrack track(const std::vector<HeadsAtStep>& history, size_t i, const TrackedScore& kind) {
  const HeadTypeScores& h = history.back().heads[i];
  return {&kind, h.layer, h.original_head, score_of(history.front(), i, kind), h.*kind.score, kNaN, kNaN};
}

}  // namespace

PhaseChange find_phase_change(const std::vector<HeadsAtStep>& history) {
  PhaseChange p;
  if (history.empty()) return p;
  const bool icl =
      std::all_of(history.begin(), history.end(), [](const HeadsAtStep& s) { return std::isfinite(s.icl); });
  p.measure = icl ? PhaseMeasure::icl : PhaseMeasure::loss;
  std::vector<const HeadsAtStep*> obs;  // where the measure is finite
  std::vector<double> s, v;
  for (const HeadsAtStep& h : history)
    if (const double x = icl ? h.icl : h.loss; std::isfinite(x))
      obs.push_back(&h), s.push_back(static_cast<double>(h.step)), v.push_back(x);
  const size_t n = obs.size();
  const HeadsAtStep& last = history.back();
  for (size_t i = 0; i < last.heads.size(); ++i) {
    if (p.strongest_induction.layer < 0 || last.heads[i].induction > p.strongest_induction.last)
      p.strongest_induction = track(history, i, kTrackedScores[1]);
    for (const TrackedScore& kind : kTrackedScores)
      if (const HeadTrack t = track(history, i, kind);
          p.grew_most.layer < 0 || t.last - t.first > p.grew_most.last - p.grew_most.first)
        p.grew_most = t;
  }
  for (const HeadsAtStep& h : history)
    for (const HeadTypeScores& x : h.heads)
      if (x.induction >= kRepeatThreshold && p.first_induction_step < 0) p.first_induction_step = h.step;
  if (n == 0) return p;
  p.first = v.front(), p.last = v.back();
  if (n < 3) return p;
  std::vector<double> changes;
  for (size_t i = 1; i < n; ++i) changes.push_back(std::abs(v[i] - v[i - 1]));
  std::nth_element(changes.begin(), changes.begin() + static_cast<std::ptrdiff_t>(changes.size() / 2), changes.end());
  p.median_change = changes[changes.size() / 2];
  // Of independent noise of deviation sigma a second difference has deviation sqrt(6) sigma, and the median of
  // its size is 0.6745 of that; a trend (a slide, a plateau's drift) hardly moves it.
  std::vector<double> bends;
  for (size_t i = 1; i + 1 < n; ++i) bends.push_back(std::abs(v[i + 1] - 2 * v[i] + v[i - 1]));
  std::nth_element(bends.begin(), bends.begin() + static_cast<std::ptrdiff_t>(bends.size() / 2), bends.end());
  p.noise = bends[bends.size() / 2] / (0.6745 * std::sqrt(6.0));
  const double least_move = std::max(p.median_change, kPhaseChangeNoise * p.noise);
  size_t a = 0, b = 0;  // the steepest fall per step between two observations: what a run without one reports
  double steepest = 0;
  for (size_t i = 1; i < n; ++i)
    if (const double drop = (v[i - 1] - v[i]) / std::max(1.0, s[i] - s[i - 1]); drop > steepest)
      steepest = drop, a = i - 1, b = i, p.found = true;
  if (!p.found) return p;
  // Every stretch [a, b] with kPhaseChangeSide times its steps before and after it, each holding
  // kPhaseChangePlateau observations: the one whose fall most exceeds kPhaseChangeRatio times the most the
  // measure moved around it is the nearest to a phase change (of equals, the shortest).
  const Spread spread(v);
  double best = -std::numeric_limits<double>::infinity(), best_w = 0;
  size_t best_a = 0, best_b = 0;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const double w = s[j] - s[i], side = kPhaseChangeSide * w, fall = v[i] - v[j];
      if (w <= 0 || fall < kPhaseChangeNats || s[i] - side < s.front() || s[j] + side > s.back()) continue;
      const auto before = static_cast<size_t>(std::upper_bound(s.begin(), s.end(), s[i] - side) - s.begin()) - 1;
      const auto after = static_cast<size_t>(std::lower_bound(s.begin(), s.end(), s[j] + side) - s.begin());
      if (i - before + 1 < kPhaseChangePlateau || after - j + 1 < kPhaseChangePlateau) continue;
      const double moved = std::max({spread(before, i), spread(j, after), least_move});
      const double excess = fall - kPhaseChangeRatio * moved;
      if (excess > best || (excess == best && w < best_w))
        best = excess, best_w = w, best_a = i, best_b = j, p.moved = moved, p.contrast = fall / moved;
    }
  p.sharp = best >= 0;
  if (p.sharp) {  // the stretch, from the fall's first 10% to its last 10%
    const double fall = v[best_a] - v[best_b];
    a = best_a, b = best_b;
    while (a + 1 < b && v[a + 1] > v[best_a] - 0.1 * fall) ++a;
    while (b > a + 1 && v[b - 1] < v[best_b] + 0.1 * fall) --b;
  }
  p.from = obs[a]->step, p.to = obs[b]->step;
  p.at_from = v[a], p.at_to = v[b], p.fall = v[a] - v[b];
  p.whole_fall = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(a) + 1) -
                 *std::min_element(v.begin() + static_cast<std::ptrdiff_t>(b), v.end());
  p.loss_from = obs[a]->loss, p.loss_to = obs[b]->loss;
  if (p.sharp)
    for (HeadTrack* t : {&p.strongest_induction, &p.grew_most}) {
      const auto i = static_cast<size_t>(
          std::find_if(last.heads.begin(), last.heads.end(),
                       [&](const HeadTypeScores& h) { return h.layer == t->layer && h.original_head == t->head; }) -
          last.heads.begin());
      if (t->layer >= 0) t->from = score_of(*obs[a], i, *t->kind), t->to = score_of(*obs[b], i, *t->kind);
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
    task_ = task.name();
  }
  const auto [early, late] = icl_positions(T);
  HeadsAtStep s = icl_score(model, *icl_data_, early, late);
  s.step = step;
  s.heads = head_types(model, *scores_data_, scoring()).heads;
  history_.push_back(std::move(s));
}

std::string HeadsOverTime::csv() const {
  const auto cell = [](double v) { return std::isfinite(v) ? fmt(v, 6) : std::string(); };
  std::string out =
      "step,layer,head,previous_token,induction,duplicate_token,loss,icl_score,token_accuracy,exact_match\n";
  for (const HeadsAtStep& s : history_)
    for (const HeadTypeScores& h : s.heads)
      out += std::to_string(s.step) + "," + std::to_string(h.layer) + "," + std::to_string(h.original_head) + "," +
             cell(h.previous_token) + "," + cell(h.induction) + "," + cell(h.duplicate_token) + "," + cell(s.loss) +
             "," + cell(s.icl) + "," + cell(s.token_accuracy) + "," + cell(s.exact_match) + "\n";
  return out;
}

namespace {

// A head's score at the end with what to read beside it: its values across the phase change where it was
// sharp, and that it is short of the threshold at which head_types labels a head by it (so that no line reads as
// a label): "0.300 (0.100 -> 0.250 across the phase change; under 0.4, where heads labels a head induction)".
std::string score_notes(const PhaseChange& p, const HeadTrack& t) {
  std::vector<std::string> notes;
  if (p.sharp) notes.push_back(fmt(t.from, 3) + " -> " + fmt(t.to, 3) + " across the phase change");
  if (t.last < t.kind->threshold)
    notes.push_back("under " + fmt(t.kind->threshold, 1) + ", where heads labels a head " + t.kind->name);
  std::string out;
  for (const std::string& n : notes) out += (out.empty() ? " (" : "; ") + n;
  return out.empty() ? out : out + ")";
}

}  // namespace

std::string heads_over_time_md(const std::vector<HeadsAtStep>& history, const std::string& task, int64_t rows) {
  if (history.empty()) return "no observation\n";
  const PhaseChange p = find_phase_change(history);
  const bool icl = p.measure == PhaseMeasure::icl;
  const std::string measure = icl ? "the ICL score" : "the loss";
  const HeadsAtStep &first = history.front(), &last = history.back();
  std::ostringstream o;
  o << "- observations: " << history.size() << ", steps " << first.step << " to " << last.step << "\n";
  if (icl) {
    o << "- in-context-learning score (loss at the late position - at the early one): " << fmt(p.first, 3)
      << " at the first observation, " << fmt(p.last, 3) << " at the last\n";
  } else {
    o << "- tracked: the loss of the " << task << " task's answers on " << rows
      << " validation rows (the in-context-learning score needs a target at every position; " << task
      << " has them at its answers only): " << fmt(p.first, 3) << " at the first observation, " << fmt(p.last, 3)
      << " at the last";
    for (const auto& [name, of] : {std::pair{"token accuracy", &HeadsAtStep::token_accuracy},
                                   std::pair{"exact match", &HeadsAtStep::exact_match}})
      if (std::isfinite(first.*of) && std::isfinite(last.*of))
        o << "; " << name << " " << fmt(first.*of, 3) << " -> " << fmt(last.*of, 3);
    o << "\n";
  }
  static_assert(kPhaseChangeSide == 0.5, "the summary says half as many steps");
  const std::string rule = "a phase change falls >= " + fmt(kPhaseChangeNats, 1) +
                           " nats and >= " + fmt(kPhaseChangeRatio, 0) +
                           " x the most the measure moves in half as many steps before and after";
  if (p.sharp) {
    o << "- phase change: " << measure << " fell " << fmt(p.fall, 3) << " nats between steps " << p.from << " and "
      << p.to << " (" << fmt(p.at_from, 3) << " -> " << fmt(p.at_to, 3) << "; its whole fall " << fmt(p.whole_fall, 3)
      << " nats); in half as many steps before and after, it moved at most " << fmt(p.moved, 3) << " nats";
    if (p.moved > 0) o << " (" << fmt(p.contrast, 1) << " x less)";
    if (icl) o << "; the loss of the tracked rows went " << fmt(p.loss_from, 3) << " -> " << fmt(p.loss_to, 3);
    o << "\n";
  } else if (p.found) {
    o << "- no phase change: " << measure << " fell fastest between steps " << p.from << " and " << p.to << " ("
      << fmt(p.at_from, 3) << " -> " << fmt(p.at_to, 3) << "), but no fall was sharp: " << rule << " it";
    if (p.contrast > 0)
      o << " (the sharpest fall fell " << fmt(p.contrast, 1) << " x that)\n";
    else
      o << ", with " << kPhaseChangePlateau << " observations on either side (no fall had them)\n";
  } else {
    o << "- no phase change: " << measure << " never fell between observations (or fewer than 3 observations)\n";
  }
  const HeadTrack& g = p.grew_most;
  if (g.layer >= 0 && g.last > g.first)
    o << "- head score that grew most: " << g.kind->name << ", " << head_label(g.layer, g.head) << " "
      << fmt(g.first, 3) << " -> " << fmt(g.last, 3) << score_notes(p, g) << "\n";
  else if (g.layer >= 0)
    o << "- no head's previous-token, induction or duplicate-token score grew\n";
  // Induction is what the ICL score measures; on a task it is named only where a head reached the threshold.
  const HeadTrack& ind = p.strongest_induction;
  if (ind.layer >= 0 && (icl || p.first_induction_step >= 0)) {
    o << "- strongest induction head at the end: " << head_label(ind.layer, ind.head) << ", induction score "
      << fmt(ind.last, 3) << score_notes(p, ind) << "\n- first step at which a head's induction score reached "
      << kRepeatThreshold << ": "
      << (p.first_induction_step >= 0 ? std::to_string(p.first_induction_step) : std::string("never")) << "\n";
  }
  return o.str();
}

std::vector<plot::LineChart> heads_over_time_charts(const std::vector<HeadsAtStep>& history, const std::string& task) {
  const PhaseChange p = find_phase_change(history);
  const bool icl = p.measure == PhaseMeasure::icl;
  // The phase change's stretch on every panel; `shift` moves the steps as the loss's axis does.
  const auto chart = [&](const std::string& title, const std::string& y_label, int width, double shift = 0) {
    plot::LineChart c;
    c.title = title, c.x_label = "step", c.y_label = y_label, c.width = width, c.height = 440;
    if (p.sharp)
      c.x_marks = {{static_cast<double>(p.from) + shift, "phase change"}, {static_cast<double>(p.to) + shift, ""}};
    return c;
  };
  const auto series = [&](const std::string& name, const auto& y, double shift = 0) {
    plot::Series line{name, {}, {}};
    for (const HeadsAtStep& s : history) line.x.push_back(static_cast<double>(s.step) + shift), line.y.push_back(y(s));
    return line;
  };
  std::vector<plot::LineChart> charts;
  for (const TrackedScore& kind : kTrackedScores) {
    const bool named = &kind == &kTrackedScores[0];  // the legend once: a head's line has one colour on every panel
    plot::LineChart& c =
        charts.emplace_back(chart(std::string(kind.name) + " score of every head", "score", named ? 620 : 480));
    if (!history.empty())
      for (size_t i = 0; i < history.front().heads.size(); ++i) {
        const HeadTypeScores& h = history.front().heads[i];
        c.series.push_back(series(named ? head_label(h.layer, h.original_head) : "",
                                  [&](const HeadsAtStep& s) { return score_of(s, i, kind); }));
      }
  }
  if (icl) {
    plot::LineChart& c = charts.emplace_back(chart("in-context-learning score (late - early loss)", "nats", 480));
    c.series.push_back(series("", [](const HeadsAtStep& s) { return s.icl; }));
  } else {
    plot::LineChart& c = charts.emplace_back(chart(task + ": its answers' accuracy", "fraction right", 560));
    c.series.push_back(series("token accuracy", [](const HeadsAtStep& s) { return s.token_accuracy; }));
    c.series.push_back(series("exact match", [](const HeadsAtStep& s) { return s.exact_match; }));
  }
  // The loss over log(step + 1), as Olsson et al. draw it: the fast first fall takes less room and a bump at the
  // phase change shows; the + 1 keeps step 0, the loss before training.
  plot::LineChart& loss = charts.emplace_back(chart(
      icl ? "loss of the tracked validation rows" : "loss of the task's answers", "cross entropy (nats)", 480, 1));
  loss.x_label = "step + 1 (log)";
  loss.log_x = true;
  loss.series.push_back(series(
      "", [](const HeadsAtStep& s) { return s.loss; }, 1));
  return charts;
}

std::string HeadsOverTime::summary_md() const {
  return heads_over_time_md(history_, task_, icl_data_ ? icl_data_->batches.front().B : 0);
}

void HeadsOverTime::save_png(const std::string& path) const {
  plot::save_line_charts(heads_over_time_charts(history_, task_), path);
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
