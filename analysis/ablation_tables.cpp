// The tables, prose and report.md of headlab ablate (analysis/ablation.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "analysis/ablation.h"
#include "analysis/files.h"
#include "io/atomic_file.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<std::string> attention_kinds(const nn::Model& m) {
  std::vector<std::string> kinds;
  for (int64_t l = 0; l < m.attention_count(); ++l)
    if (std::find(kinds.begin(), kinds.end(), m.attention_kind(l)) == kinds.end()) kinds.push_back(m.attention_kind(l));
  return kinds;
}

const char* kind_title(const std::string& kind) {
  if (kind == "encoder") return "encoder self-attention";
  if (kind == "decoder") return "decoder self-attention";
  if (kind == "cross") return "encoder-decoder (cross) attention";
  return "self-attention";
}

std::string signed3(double v) { return fmt_signed(v, 3); }

}  // namespace

Table importance_table(const AblationResult& a, const nn::Model& model) {
  const bool ex = a.base.has_exact_match;
  Table t("", {integer_column("rank"),
               text_column("head"),
               fixed_column("importance"),
               {"raw dL/dgate", NumberFormat::scientific, 2}});
  for (const char* kind : {"zero", "mean", "resample"}) {
    t.columns.push_back(signed_column(std::string(kind) + " dloss"));
    t.columns.push_back(signed_column(std::string(kind) + " dacc"));
    if (ex) t.columns.push_back(signed_column(std::string(kind) + " dexact"));
  }
  int rank = 1;
  for (const HeadAblation* h : heads_ranked(a)) {
    std::vector<Cell> row = {static_cast<double>(rank++), head_name(model, h->layer, h->head), h->importance,
                             h->importance_raw};
    for (const Scores* s : {&h->zero, &h->mean, &h->resample}) {
      row.emplace_back(s->loss - a.base.loss);
      row.emplace_back(s->token_accuracy - a.base.token_accuracy);
      if (ex) row.emplace_back(s->exact_match - a.base.exact_match);
    }
    t.add_row(std::move(row));
  }
  return t;
}

Table pruning_table(const PruningCurve& c, const nn::Model& model, const std::string& title) {
  HL_CHECK(!c.steps.empty(), "pruning_table: the curve is empty");
  const bool ex = c.steps.front().scores.has_exact_match;
  const bool ft =
      std::any_of(c.steps.begin(), c.steps.end(), [](const PruneStep& s) { return s.finetuned.has_value(); });
  Table t(title, {integer_column("step"), integer_column("heads_pruned"), fixed_column("fraction_pruned", 3),
                  fixed_column("loss"), fixed_column("token_accuracy")});
  if (ex) t.columns.push_back(fixed_column("exact_match"));
  if (ft) {
    t.columns.push_back(fixed_column("finetuned_loss"));
    t.columns.push_back(fixed_column("finetuned_token_accuracy"));
    if (ex) t.columns.push_back(fixed_column("finetuned_exact_match"));
  }
  t.columns.push_back(text_column("removed"));
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const PruneStep& s = c.steps[i];
    std::vector<Cell> row = {static_cast<double>(i), static_cast<double>(s.pruned), s.fraction};
    auto scores = [&](const Scores& v) {
      row.emplace_back(v.loss);
      row.emplace_back(v.token_accuracy);
      if (ex) row.emplace_back(v.exact_match);
    };
    scores(s.scores);
    if (ft) scores(s.finetuned.value_or(Scores{}));  // NaN where a step was not fine-tuned
    row.emplace_back(removed_heads_str(s, model));
    t.add_row(std::move(row));
  }
  return t;
}

void save_pruning_csv(const std::string& path, const PruningCurve& c, const nn::Model& model) {
  HL_CHECK(!c.steps.empty(), "save_pruning_csv: the curve is empty");
  io::write_file_atomic(path, render_csv(pruning_table(c, model)), "save_pruning_csv");
}

Table l0_table(const L0Result& l0, Metric metric, const nn::Model& model, const std::string& title) {
  Table t(title, {fixed_column("penalty"), integer_column("heads closed"), fixed_column(enum_name(metric), 3),
                  fixed_column("loss"), text_column("which")});
  for (const L0Point& p : l0.points) {
    std::string which;
    for (const auto& [l, h] : p.closed) which.append(which.empty() ? "" : " ").append(head_name(model, l, h));
    t.add_row({p.penalty, static_cast<double>(p.closed.size()), metric_value(p.scores, metric), p.scores.loss,
               which.empty() ? "none" : which});
  }
  return t;
}

Table best_head_table(const nn::Model& model, const AblationResult& a, const std::vector<BestHeadOnly>& best,
                      Metric metric, std::string* mean_change, const std::string& title) {
  const std::vector<std::string> kinds = attention_kinds(model);
  const double base = metric_value(a.base, metric);
  Table t(title, {integer_column("layer")});
  for (const std::string& k : kinds) {
    t.columns.push_back(text_column(std::string(kind_title(k)) + ": best head"));
    t.columns.push_back(fixed_column(enum_name(metric), 3));
    t.columns.push_back(signed_column("delta", 3));
  }
  int64_t layers = 0;
  for (const auto& b : best) layers = std::max(layers, model.attention_layer(b.layer) + 1);
  std::map<std::string, std::pair<double, int64_t>> mean_delta;  // kind -> (sum, count)
  for (int64_t layer = 0; layer < layers; ++layer) {
    std::vector<Cell> row = {static_cast<double>(layer)};
    for (const std::string& k : kinds) {
      const auto it = std::find_if(best.begin(), best.end(), [&](const BestHeadOnly& b) {
        return model.attention_kind(b.layer) == k && model.attention_layer(b.layer) == layer;
      });
      if (it == best.end()) {
        for (int i = 0; i < 3; ++i) row.emplace_back(std::string());
        continue;
      }
      const double m = metric_value(it->scores, metric);
      row.emplace_back(head_name(model, it->layer, it->best_head) + " (of " +
                       std::to_string(model.heads_at(it->layer)) + ")");
      row.emplace_back(m);
      row.emplace_back(m - base);
      mean_delta[k].first += m - base;
      ++mean_delta[k].second;
    }
    t.add_row(std::move(row));
  }
  if (mean_change) {
    std::string s;
    for (const std::string& k : kinds) {
      const auto& [sum, count] = mean_delta[k];
      s.append(s.empty() ? "" : "; ")
          .append(kind_title(k))
          .append(" ")
          .append(signed3(count ? sum / static_cast<double>(count) : kNaN));
    }
    *mean_change = s;
  }
  return t;
}

double agreement(const analysis::AblationResult& a, bool normalized) {
  std::vector<double> imp, dloss;
  for (const auto& h : a.heads) {
    imp.push_back(normalized ? h.importance : h.importance_raw);
    dloss.push_back(h.zero.loss - a.base.loss);
  }
  return analysis::rank_correlation(imp, dloss);
}

std::string criterion_text(const PruningCurve& curve, bool automatic) {
  std::string s = enum_name(curve.criterion);
  if (automatic)
    s += " (auto: " + std::to_string(curve.total_heads) +
         (curve.criterion == analysis::Criterion::ablation ? " heads <= " : " heads > ") +
         std::to_string(analysis::kAblationCriterionMaxHeads) + ")";
  return s;
}

std::string gradient_warning(const analysis::AblationResult& a) {
  const double rho = agreement(a, true);
  std::string why;
  if (a.base.loss < 0.01)
    why = "at a loss of " + fmt(a.base.loss) + " the gate gradients are mostly noise";
  else if (rho < 0.5)
    why = "they rank the heads unlike zero ablation";
  if (why.empty()) return "";
  return "the gradient scores are unreliable here (Spearman " + fmt(rho, 2) + " with zero ablation; " + why +
         "); the ablation criterion (the default up to " + std::to_string(analysis::kAblationCriterionMaxHeads) +
         " heads) measures instead";
}

bool gradient_reliable(const AblationResult& a) { return gradient_warning(a).empty(); }

std::vector<const HeadAblation*> heads_ranked(const AblationResult& a) {
  const bool by_gradient = gradient_reliable(a);
  std::vector<const HeadAblation*> v;
  for (const auto& h : a.heads) v.push_back(&h);
  std::stable_sort(v.begin(), v.end(), [by_gradient](const HeadAblation* x, const HeadAblation* y) {
    return by_gradient ? x->importance > y->importance : x->zero.loss > y->zero.loss;
  });
  return v;
}

std::string ranking_text(const AblationResult& a) {
  return gradient_reliable(a) ? "importance (|dL/d gate|, normalised per layer, Michel et al. 2019)"
                              : "zero ablation's loss increase (measured: the gradient scores are unreliable here)";
}

std::string free_heads_text(const analysis::AblationResult& a, const analysis::PruningCurve& curve,
                            const nn::Model& model) {
  const auto free = analysis::free_heads(a, curve.metric);
  std::string names;
  for (const auto& [l, h] : free) names.append(names.empty() ? "" : " ").append(analysis::head_name(model, l, h));
  const int64_t n = static_cast<int64_t>(free.size());
  const double base = analysis::metric_value(a.base, curve.metric);
  const int64_t within = analysis::prune_count_for_metric(curve, base - 0.01 * std::fabs(base));
  std::string s = std::to_string(n) + " heads cost nothing alone (" + (names.empty() ? "none" : names) + ")";
  if (n == 0) return s;
  if (within >= n)
    return s + "; the curve prunes " + std::to_string(within) + " heads with " + enum_name(curve.metric) +
           " within 1% of unpruned";
  if (curve.criterion == analysis::Criterion::gradient)
    return s + "; this curve (gradient scores) keeps " + enum_name(curve.metric) + " within 1% of unpruned for " +
           std::to_string(within) + " heads: --criterion ablation prunes by measured cost";
  s += "; pruned together they are not free: " + std::string(enum_name(curve.metric)) +
       " stays within 1% of unpruned for " + std::to_string(within) + " of them";
  for (const auto& step : curve.steps)
    if (step.pruned == n)
      s += " (" + std::to_string(n) + ": " + fmt(analysis::metric_value(step.scores, curve.metric), 3) + ")";
  return s;
}

std::string scores_line(const analysis::Scores& s) {
  std::string out = "loss " + fmt(s.loss) + "  token accuracy " + fmt(s.token_accuracy);
  if (s.has_exact_match) out += "  exact match " + fmt(s.exact_match);
  return out;
}

namespace {

// The report's opening table: what was measured, and the headline findings.
void summary_md(std::ostream& os, const nn::Model& model, const EvalSet& data, const AblationReport& r) {
  const AblationResult& a = r.ablation;
  const PruningCurve& curve = r.curve;
  const std::optional<L0Result>& l0 = r.l0;
  const double stop_below = r.stop_below;
  const bool ex = a.base.has_exact_match;
  os << "| | |\n|---|---|\n";
  os << "| checkpoint | `" << r.checkpoint << "`"
     << (r.checkpoint_step ? " (step " + std::to_string(*r.checkpoint_step) + ")" : "") << " |\n";
  os << "| task | " << r.task << " |\n";
  os << "| model | " << r.model_description << ", head size " << model.head_size_at(0) << ", " << model.num_parameters()
     << " parameters |\n";
  if (!r.kept_before.empty()) os << "| kept heads (already pruned) | " << r.kept_before << " |\n";
  os << "| data | " << count_of(static_cast<int64_t>(data.batches.size()), "validation batch", "validation batches") << " of " << data.batches.front().B << " x "
     << data.batches.front().T << " tokens, " << data.tokens() << " scored tokens |\n";
  os << "| unpruned | loss " << fmt(a.base.loss) << ", token accuracy " << fmt(a.base.token_accuracy);
  if (ex) os << ", exact match " << fmt(a.base.exact_match);
  os << " |\n";
  os << "| pruning | " << r.criterion << " criterion; metric " << enum_name(curve.metric) << ", stop below "
     << fmt(stop_below) << " |\n";
  os << "| gradient scores vs zero ablation | Spearman " << fmt(agreement(a, true), 2) << " (normalised), "
     << fmt(agreement(a, false), 2) << " (raw) |\n";
  if (l0) {  // a later place in the L0 order should mean a dearer head
    std::vector<double> rank, dloss;
    for (const auto& h : a.heads) {
      rank.push_back(l0->rank[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)]);
      dloss.push_back(h.zero.loss - a.base.loss);
    }
    os << "| L0 gate order vs zero ablation | Spearman " << fmt(analysis::rank_correlation(rank, dloss), 2) << " |\n";
  }
  if (const std::string w = gradient_warning(a); !w.empty()) os << "| warning | " << w << " |\n";
  os << "| free heads | " << free_heads_text(a, curve, model) << " |\n";
  if (const auto ranked = heads_ranked(a); !ranked.empty()) {
    const auto& t = *ranked.front();
    os << "| most important head | " << analysis::head_name(model, t.layer, t.head) << " (by "
       << (gradient_reliable(a) ? "importance " + fmt(t.importance, 3) + "; " : "") << "zero ablation: loss "
       << fmt_signed(t.zero.loss - a.base.loss) << ", token accuracy "
       << fmt_signed(t.zero.token_accuracy - a.base.token_accuracy) << ") |\n";
  }
  if (curve.steps.size() > 1) {
    const int64_t keep_n = analysis::prune_count_for_metric(curve, stop_below);
    os << "| prunable at the threshold | " << keep_n << " of " << curve.total_heads << " heads ("
       << fmt(100.0 * static_cast<double>(keep_n) / static_cast<double>(curve.total_heads), 0) << "%) |\n";
  }
}

// The pruned model's file, size, speed and scores.
void pruned_model_md(std::ostream& os, const PruningCurve& curve, const AblationReport& r) {
  const PrunedModelReport& pr = r.pruned;
  os << "## Pruned model\n\n";
  if (!pr.done) {
    os << "Not written (use `--prune K` or `--prune-to-metric X`).\n";
    return;
  }
  os << "| | |\n|---|---|\n";
  os << "| file | `" << pr.path << "` |\n";
  os << "| heads removed | " << pr.removed << " of " << curve.total_heads << " |\n";
  os << "| kept heads (original indices) | " << pr.kept << " |\n";
  os << "| parameters | " << pr.params_before << " -> " << pr.params_after << " ("
     << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) / static_cast<double>(pr.params_before), 1)
     << "% fewer) |\n";
  os << "| forward time, batch " << pr.B << " x " << pr.T << " (median of " << pr.time_before.repeats << ") | "
     << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3) << " ms (speed-up "
     << fmt(pr.time_before.median / pr.time_after.median, 2) << "x; IQR " << fmt(pr.time_before.p25 * 1e3, 3) << "-"
     << fmt(pr.time_before.p75 * 1e3, 3) << " -> " << fmt(pr.time_after.p25 * 1e3, 3) << "-"
     << fmt(pr.time_after.p75 * 1e3, 3) << " ms) |\n";
  os << "| max abs logit difference, pruned vs gated | " << fmt_sci(pr.max_diff, 2) << " |\n";
  os << "| scores, gated model | " << scores_line(pr.gated) << " |\n";
  os << "| scores, pruned.h5 | " << scores_line(pr.scores) << " |\n";
  if (pr.finetuned)
    os << "| scores after fine-tuning " << r.finetune_steps << " steps (" << fmt(pr.finetuned->seconds, 1) << " s; `"
       << pr.finetuned->checkpoint << "`) | " << scores_line(pr.finetuned->after) << " |\n";
}

}  // namespace

std::string ablation_report_md(const nn::Model& model, const EvalSet& data, const AblationReport& r) {
  const AblationResult& a = r.ablation;
  const PruningCurve& curve = r.curve;
  const std::optional<L0Result>& l0 = r.l0;
  const AblationTables& tables = r.tables;
  const bool decoder = model.is_decoder();
  std::ostringstream os;
  os << "# Head ablation report\n\n## Summary\n\n";
  summary_md(os, model, data, r);
  os << "\n![heads by " << (gradient_reliable(a) ? "importance" : "zero ablation")
     << "](importance.png)\n\n![every head's zero, mean and resample ablation](ablation.png)\n\n";
  if (decoder)
    os << "Every head's attention on a validation row, with these scores beside it: "
          "[attention.html](attention.html).\n\n";

  os << "## Heads ranked by " << ranking_text(a) << "\n\n";
  os << "Importance: I_h = E_x |dL/d gate_h| over the evaluation batches, divided by the l2 norm of its layer's "
        "scores (Michel, Levy & Neubig 2019). Zero ablation sets the head's gate to 0; mean ablation replaces the "
        "head's context by its mean over the evaluation data; resample ablation by its context on another "
        "validation row. Deltas are ablated minus unpruned, on "
     << data.tokens() << " scored tokens; all " << 3 * a.heads.size() << " ablations ran "
     << (decoder ? "as one batched pass" : "one pass each") << " (" << fmt(r.sweep_seconds, 2) << " s)"
     << (decoder ? "" : "; resample ablation is not computed for the encoder-decoder (nan)") << ".\n\n";
  os << analysis::render_markdown(tables.importance);

  if (l0) {
    os << "\n## Learned gates (L0)\n\nHard-concrete gates on every head of the frozen model, trained with the task's "
          "loss plus penalty x the expected number of open heads (Voita et al. 2019), "
       << r.l0_steps << " Adam steps per penalty. Scores: the model with the closed heads masked, on " << data.tokens()
       << " scored tokens.\n\n"
       << analysis::render_markdown(*tables.l0);
  }
  os << "\n## Pruning curve\n\n";
  os << "Each step masks the least important " << fmt(100 * r.step_fraction, 0)
     << "% of the remaining heads (at least one; every layer keeps one head) and recomputes the importance of the "
        "heads left"
     << (curve.criterion == analysis::Criterion::gradient ? " (gradient scores)"
         : curve.criterion == analysis::Criterion::l0
             ? " (l0: in the order the learned gates close them, not recomputed)"
             : " (what masking the head too costs, measured: the metric lost, then the loss increase)")
     << ".\n\n";
  const bool ft = r.finetune_curve;
  if (ft)
    os << "Each pruned model was also fine-tuned " << r.finetune_steps
       << " steps on its task (a fresh optimizer; `finetune/pruned_<k>/`): the fine-tuned columns.\n\n";
  os << analysis::render_markdown(tables.pruning);
  os << "\n![pruning curve](pruning.png)\n\n";
  os << "## Only the best head of each layer (Michel et al. 2019, Table 2)\n\nFor each attention layer, every "
        "head but one masked (the one that keeps "
     << enum_name(curve.metric) << " highest), the rest of the model whole; unpruned "
     << fmt(analysis::metric_value(a.base, curve.metric), 3) << ".\n\n"
     << analysis::render_markdown(tables.best_head) << "\nMean change per layer: " << tables.best_head_mean << ".\n\n";

  pruned_model_md(os, curve, r);
  return os.str();
}

}  // namespace headlab::analysis
