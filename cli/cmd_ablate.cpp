// headlab ablate: which heads of a checkpoint matter (analysis/heads.h, pruning.h): the terminal
// table, heads.csv, pruning.csv, report.md, pictures, and a physically pruned checkpoint.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <numeric>
#include <set>
#include <sstream>

#include "analysis/analysis.h"
#include "analysis/explorer.h"
#include "analysis/finetune.h"
#include "analysis/l0_gates.h"
#include "backends/backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/h5file.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {

struct AblateArgs : AnalysisArgs {
  std::string metric, criterion = "auto";
  int64_t prune = -1, repeats = 20, finetune = 0, l0_steps = 200;
  std::vector<double> l0_penalties = analysis::L0Options{}.penalties;
  double threshold = 0.9, step = 0.1, prune_to_metric = std::nan(""), finetune_lr = 0;
  bool full_curve = false, finetune_curve = false;
};

struct PrunedReport {
  bool done = false;
  std::string path;
  int64_t removed = 0, params_before = 0, params_after = 0;
  std::string kept;  // kept_str of the pruned model
  std::optional<analysis::FinetuneResult> finetuned;
  double max_diff = 0;
  analysis::Scores gated, scores;
  analysis::TimeStats time_before, time_after;
  int64_t B = 0, T = 0;
};

// Spearman correlation of a head's importance with the loss increase of zeroing it.
double agreement(const analysis::AblationResult& a, bool normalized) {
  std::vector<double> imp, dloss;
  for (const auto& h : a.heads) {
    imp.push_back(normalized ? h.importance : h.importance_raw);
    dloss.push_back(h.zero.loss - a.base.loss);
  }
  return analysis::rank_correlation(imp, dloss);
}

// "ablation (auto: 8 heads <= 64)", or the criterion asked for.
std::string criterion_text(const AblateArgs& args, const analysis::PruningCurve& curve) {
  std::string s = enum_name(curve.criterion);
  if (args.criterion == "auto")
    s += " (auto: " + std::to_string(curve.total_heads) +
         (curve.criterion == analysis::Criterion::ablation ? " heads <= " : " heads > ") +
         std::to_string(analysis::kAblationCriterionMaxHeads) + ")";
  return s;
}

// Why the gradient scores should not be trusted on this model, or "".
std::string gradient_warning(const analysis::AblationResult& a) {
  const double rho = agreement(a, true);
  std::string why;
  if (a.base.loss < 0.01) why = "at a loss of " + fmt(a.base.loss) + " the gate gradients are mostly noise";
  else if (rho < 0.5) why = "they rank the heads unlike zero ablation";
  if (why.empty()) return "";
  return "the gradient scores are unreliable here (Spearman " + fmt(rho, 2) + " with zero ablation; " + why +
         "); the ablation criterion (the default up to " + std::to_string(analysis::kAblationCriterionMaxHeads) +
         " heads) measures instead";
}

// Whether the heads that cost nothing alone can go together: "4 heads cost nothing alone (L0H0 L1H0
// L1H1 L1H3); pruned together they are not free: exact_match stays within 1% of unpruned for 3 of
// them (4: 0.863)".
std::string free_heads_text(const analysis::AblationResult& a, const analysis::PruningCurve& curve,
                            const nn::Model& model) {
  const auto free = analysis::free_heads(a, curve.metric);
  std::string names;
  for (const auto& [l, h] : free) names += (names.empty() ? "" : " ") + analysis::head_name(model, l, h);
  const int64_t n = static_cast<int64_t>(free.size());
  const double base = analysis::metric_value(a.base, curve.metric);
  const int64_t within = analysis::prune_count_for_metric(curve, base - 0.01 * std::fabs(base));
  std::string s = std::to_string(n) + " heads cost nothing alone (" + (names.empty() ? "none" : names) + ")";
  if (n == 0) return s;
  if (within >= n) return s + "; the curve prunes " + std::to_string(within) + " heads with " +
                          analysis::metric_name(curve.metric) + " within 1% of unpruned";
  if (curve.criterion == analysis::Criterion::gradient)
    return s + "; this curve (gradient scores) keeps " + analysis::metric_name(curve.metric) +
           " within 1% of unpruned for " + std::to_string(within) + " heads: --criterion ablation prunes by measured cost";
  s += "; pruned together they are not free: " + std::string(analysis::metric_name(curve.metric)) +
       " stays within 1% of unpruned for " + std::to_string(within) + " of them";
  for (const auto& step : curve.steps)
    if (step.pruned == n) s += " (" + std::to_string(n) + ": " + fmt(analysis::metric_value(step.scores, curve.metric), 3) + ")";
  return s;
}

// "L0H0 L1H3" (original indices), or "none".
std::string l0_closed_str(const analysis::L0Point& p, const nn::Model& model) {
  std::string s;
  for (const auto& [l, h] : p.closed) s += (s.empty() ? "" : " ") + analysis::head_name(model, l, h);
  return s.empty() ? "none" : s;
}

bool is_gpt(const nn::Model& m) { return dynamic_cast<const nn::GPTModel*>(&m) != nullptr; }

bool pruned_before(const nn::Model& m) {
  for (int64_t l = 0; l < m.attention_count(); ++l)
    if (m.heads_at(l) < m.full_heads()) return true;
  return false;
}

// The kinds of attention in the model's order ("self"; or "encoder", "decoder", "cross") and their layers.
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

// Michel et al.'s Table 2: per layer and kind, the metric with only the layer's best head kept.
std::string best_head_md(const nn::Model& model, const analysis::AblationResult& a,
                         const std::vector<analysis::BestHeadOnly>& best, analysis::Metric metric) {
  const std::vector<std::string> kinds = attention_kinds(model);
  const double base = analysis::metric_value(a.base, metric);
  std::ostringstream os;
  os << "## Only the best head of each layer (Michel et al. 2019, Table 2)\n\nFor each attention layer, every "
        "head but one masked (the one that keeps "
     << analysis::metric_name(metric) << " highest), the rest of the model whole; unpruned " << fmt(base, 3)
     << ".\n\n| layer |";
  for (const std::string& k : kinds) os << " " << kind_title(k) << ": best head | " << analysis::metric_name(metric) << " | delta |";
  os << "\n|---|";
  for (size_t i = 0; i < kinds.size(); ++i) os << "---|---|---|";
  os << "\n";
  int64_t layers = 0;
  for (const auto& b : best) layers = std::max(layers, model.attention_layer(b.layer) + 1);
  std::map<std::string, std::pair<double, int64_t>> mean_delta;  // kind -> (sum, count)
  for (int64_t layer = 0; layer < layers; ++layer) {
    os << "| " << layer << " |";
    for (const std::string& k : kinds) {
      const auto it = std::find_if(best.begin(), best.end(), [&](const analysis::BestHeadOnly& b) {
        return model.attention_kind(b.layer) == k && model.attention_layer(b.layer) == layer;
      });
      if (it == best.end()) {
        os << " | | |";
        continue;
      }
      const double m = analysis::metric_value(it->scores, metric);
      os << " " << analysis::head_name(model, it->layer, it->best_head) << " (of " << model.heads_at(it->layer) << ") | "
         << fmt(m, 3) << " | " << fmt_signed(m - base, 3) << " |";
      mean_delta[k].first += m - base;
      ++mean_delta[k].second;
    }
    os << "\n";
  }
  os << "\nMean change per layer:";
  for (const std::string& k : kinds)
    os << " " << kind_title(k) << " " << fmt_signed(mean_delta[k].first / static_cast<double>(mean_delta[k].second), 3)
       << (k == kinds.back() ? "." : ";");
  os << "\n\n";
  return os.str();
}

std::string scores_line(const analysis::Scores& s) {
  std::string out = "loss " + fmt(s.loss) + "  token accuracy " + fmt(s.token_accuracy);
  if (s.has_exact_match) out += "  exact match " + fmt(s.exact_match);
  return out;
}

std::string report_md(const AblateArgs& args, const io::Checkpoint& ck, const nn::Model& model,
                      const train::RunConfig& run, const analysis::EvalSet& data, const analysis::AblationResult& a,
                      const analysis::PruningCurve& curve, double stop_below, const PrunedReport& pr,
                      const std::string& task_name, double sweep_seconds, const std::optional<analysis::L0Result>& l0,
                      const std::vector<analysis::BestHeadOnly>& best) {
  const bool ex = a.base.has_exact_match;
  std::ostringstream os;
  os << "# Head ablation report\n\n## Summary\n\n";
  os << "| | |\n|---|---|\n";
  os << "| checkpoint | `" << args.path << "`" << (ck.has_trainer ? " (step " + std::to_string(ck.trainer.step) + ")" : "")
     << " |\n";
  os << "| task | " << task_name << " |\n";
  os << "| model | " << run.describe_model() << ", head size " << model.head_size_at(0) << ", "
     << model.num_parameters() << " parameters |\n";
  if (pruned_before(model)) os << "| kept heads (already pruned) | " << kept_str(model) << " |\n";
  os << "| data | " << data.batches.size() << " validation batches of " << data.batches.front().B << " x "
     << data.batches.front().T << " tokens, " << data.tokens() << " scored tokens |\n";
  os << "| unpruned | loss " << fmt(a.base.loss) << ", token accuracy " << fmt(a.base.token_accuracy);
  if (ex) os << ", exact match " << fmt(a.base.exact_match);
  os << " |\n";
  os << "| pruning | " << criterion_text(args, curve) << " criterion; metric " << analysis::metric_name(curve.metric)
     << ", stop below " << fmt(stop_below) << " |\n";
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
  const auto by_imp = [&] {
    std::vector<const analysis::HeadAblation*> v;
    for (const auto& h : a.heads) v.push_back(&h);
    std::sort(v.begin(), v.end(), [](auto* x, auto* y) { return x->importance > y->importance; });
    return v;
  }();
  if (!by_imp.empty()) {
    const auto& t = *by_imp.front();
    os << "| most important head | " << analysis::head_name(model, t.layer, t.head) << " (zero ablation: loss "
       << fmt_signed(t.zero.loss - a.base.loss) << ", token accuracy "
       << fmt_signed(t.zero.token_accuracy - a.base.token_accuracy) << ") |\n";
  }
  if (curve.steps.size() > 1) {
    const int64_t keep_n = analysis::prune_count_for_metric(curve, stop_below);
    os << "| prunable at the threshold | " << keep_n << " of " << curve.total_heads << " heads ("
       << fmt(100.0 * static_cast<double>(keep_n) / static_cast<double>(curve.total_heads), 0) << "%) |\n";
  }
  os << "\n![head importance](importance.png)\n\n";
  if (is_gpt(model))
    os << "Every head's attention on a validation row, with these scores beside it: [attention.html](attention.html).\n\n";

  os << "## Heads by importance\n\n";
  os << "Importance: I_h = E_x |dL/d gate_h| over the evaluation batches, divided by the l2 norm of its layer's "
        "scores (Michel, Levy & Neubig 2019). Zero ablation sets the head's gate to 0; mean ablation replaces the "
        "head's context by its mean over the evaluation data; resample ablation by its context on another "
        "validation row. Deltas are ablated minus unpruned, on "
     << data.tokens() << " scored tokens; all " << 3 * a.heads.size()
     << " ablations ran " << (is_gpt(model) ? "as one batched pass" : "one pass each") << " (" << fmt(sweep_seconds, 2)
     << " s)" << (is_gpt(model) ? "" : "; resample ablation is not computed for the encoder-decoder (nan)") << ".\n\n";
  os << "| rank | head | importance | raw mean abs dL/dgate |";
  for (const char* kind : {"zero", "mean", "resample"})
    os << " " << kind << ": d loss | " << kind << ": d token acc |" << (ex ? std::string(" ") + kind + ": d exact |" : "");
  os << "\n|";
  for (int i = 0; i < (ex ? 13 : 10); ++i) os << "---|";
  os << "\n";
  int rank = 1;
  for (const auto* h : by_imp) {
    os << "| " << rank++ << " | " << analysis::head_name(model, h->layer, h->head) << " | " << fmt(h->importance) << " | "
       << fmt_sci(h->importance_raw, 2) << " |";
    for (const analysis::Scores* s : {&h->zero, &h->mean, &h->resample}) {
      os << " " << fmt_signed(s->loss - a.base.loss) << " | " << fmt_signed(s->token_accuracy - a.base.token_accuracy)
         << " |";
      if (ex) os << " " << fmt_signed(s->exact_match - a.base.exact_match) << " |";
    }
    os << "\n";
  }

  if (l0) {
    os << "\n## Learned gates (L0)\n\nHard-concrete gates on every head of the frozen model, trained with the task's "
          "loss plus penalty x the expected number of open heads (Voita et al. 2019), "
       << args.l0_steps << " Adam steps per penalty. Scores: the model with the closed heads masked, on "
       << data.tokens() << " scored tokens.\n\n| penalty | heads closed | " << analysis::metric_name(curve.metric)
       << " | loss | which |\n|---|---|---|---|---|\n";
    for (const auto& p : l0->points)
      os << "| " << fmt(p.penalty, 4) << " | " << p.closed.size() << " | "
         << fmt(analysis::metric_value(p.scores, curve.metric), 3) << " | " << fmt(p.scores.loss) << " | "
         << l0_closed_str(p, model) << " |\n";
  }
  os << "\n## Pruning curve\n\n";
  os << "Each step masks the least important " << fmt(100 * args.step, 0)
     << "% of the remaining heads (at least one; every layer keeps one head) and recomputes the importance of the "
        "heads left"
     << (curve.criterion == analysis::Criterion::gradient ? " (gradient scores)"
         : curve.criterion == analysis::Criterion::l0
             ? " (l0: in the order the learned gates close them, not recomputed)"
             : " (what masking the head too costs, measured: the metric lost, then the loss increase)")
     << ".\n\n";
  const bool ft = args.finetune_curve;
  if (ft)
    os << "Each pruned model was also fine-tuned " << args.finetune
       << " steps on its task (a fresh optimizer; `finetune/pruned_<k>/`): the fine-tuned columns.\n\n";
  os << "| step | heads pruned | fraction | loss | token accuracy |" << (ex ? " exact match |" : "")
     << (ft ? std::string(" fine-tuned: loss | fine-tuned: token accuracy |") + (ex ? " fine-tuned: exact match |" : "") : "")
     << " removed (layer/head) |\n|---|---|---|---|---|" << (ex ? "---|" : "") << (ft ? (ex ? "---|---|---|" : "---|---|") : "")
     << "---|\n";
  for (size_t i = 0; i < curve.steps.size(); ++i) {
    const auto& s = curve.steps[i];
    auto columns = [&](const analysis::Scores& sc) {
      os << " " << fmt(sc.loss) << " | " << fmt(sc.token_accuracy) << " |";
      if (ex) os << " " << fmt(sc.exact_match) << " |";
    };
    os << "| " << i << " | " << s.pruned << " | " << fmt(s.fraction, 3) << " |";
    columns(s.scores);
    if (ft) columns(s.finetuned.value_or(analysis::Scores{}));
    os << " " << analysis::removed_heads_str(s, model) << " |\n";
  }
  os << "\n![pruning curve](pruning.png)\n\n";
  os << best_head_md(model, a, best, curve.metric);

  os << "## Pruned model\n\n";
  if (!pr.done) {
    os << "Not written (use `--prune K` or `--prune-to-metric X`).\n";
  } else {
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
      os << "| scores after fine-tuning " << args.finetune << " steps (" << fmt(pr.finetuned->seconds, 1) << " s; `"
         << pr.finetuned->checkpoint << "`) | " << scores_line(pr.finetuned->after) << " |\n";
  }
  return os.str();
}

}  // namespace

Action add_ablate(CLI::App& app) {
  auto a = std::make_shared<AblateArgs>();
  add_analysis_options(app, *a, "ablation");
  app.add_option("--metric", a->metric, "pruning metric: exact_match (task default) | token_accuracy (chars default)")
      ->check(CLI::IsMember(enum_names<analysis::Metric>()));
  app.add_option("--threshold", a->threshold, "stop pruning below this fraction of the unpruned metric")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--step", a->step, "fraction of the remaining heads pruned per step")
      ->check(CLI::Range(0.001, 1.0))
      ->capture_default_str();
  app.add_option("--criterion", a->criterion,
                 "pruning order: auto (ablation up to " + std::to_string(analysis::kAblationCriterionMaxHeads) +
                     " heads, else gradient) | ablation (measured cost of masking each head: metric, then loss) | "
                     "gradient (Michel et al. importance) | l0 (the order learned hard-concrete gates close heads "
                     "in, Voita et al. 2019)")
      ->check(CLI::IsMember(enum_names<analysis::Criterion>()))
      ->capture_default_str();
  app.add_option("--l0-steps", a->l0_steps, "--criterion l0: Adam steps of the gates per penalty strength")
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--l0-penalties", a->l0_penalties, "--criterion l0: the penalty strengths (L0 weights), one run each")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--full-curve", a->full_curve, "continue the pruning curve until every layer has one head left");
  auto* k = app.add_option("--prune", a->prune, "write pruned.h5 without the K least important heads (pruning order)")
                ->check(non_negative_number());
  app.add_option("--prune-to-metric", a->prune_to_metric,
                 "write pruned.h5 pruned by the curve as far as the metric stays >= X")
      ->excludes(k);
  app.add_option("--finetune", a->finetune,
                 "after pruning, train the pruned model N more steps (its task, a fresh optimizer of its run's kind) "
                 "and report the metric before and after; writes finetune/checkpoint.h5")
      ->check(positive_number());
  app.add_option("--finetune-lr", a->finetune_lr, "peak learning rate of the fine-tuning (default: the run's)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--finetune-curve", a->finetune_curve,
               "fine-tune the model pruned at every step of the curve too (--finetune steps each; "
               "finetune/pruned_<k>/), so that the curve shows both");
  app.add_option("--repeats", a->repeats, "timed forward passes for the pruned model's speed-up")
      ->check(positive_number())
      ->capture_default_str();
  return [a] {
    const AnalysisInputs ai = load_analysis(*a, "ablate", "ablation");
    const io::Checkpoint& ck = ai.in.ckpt;
    const std::shared_ptr<nn::Model>& model = ai.in.model;
    const Device device = model->device();
    const std::unique_ptr<tasks::Task>& task = ai.in.task;
    const int64_t n = ai.batches, B = ai.batch_size;
    const std::string& out = ai.out;
    const analysis::EvalSet& data = ai.data;
    const analysis::Metric metric =
        a->metric.empty() ? analysis::default_metric(data) : parse_enum<analysis::Metric>(a->metric, "ablate: --metric");

    std::cout << "headlab ablate: " << a->path << " (task " << task->name() << ", " << ai.run.describe_model()
              << (pruned_before(*model) ? ", pruned: kept " + kept_str(*model) : "") << ", " << model->num_parameters()
              << " parameters, device " << device.str() << ")\n"
              << "data: " << n << " validation batches of " << B << " (" << data.tokens()
              << " scored tokens); pruning metric " << analysis::metric_name(metric) << "\n";
    const auto sweep_start = std::chrono::steady_clock::now();
    const analysis::AblationResult abl = analysis::ablate_heads(*model, data);
    const double sweep_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sweep_start).count();
    const double base_metric = analysis::metric_value(abl.base, metric);
    double stop_below = a->threshold * base_metric;
    if (!std::isnan(a->prune_to_metric)) stop_below = std::min(stop_below, a->prune_to_metric);
    std::cout << "unpruned: " << scores_line(abl.base) << "\n\n";

    // per-head table, by importance
    std::vector<const analysis::HeadAblation*> by_imp;
    for (const auto& h : abl.heads) by_imp.push_back(&h);
    std::sort(by_imp.begin(), by_imp.end(), [](auto* x, auto* y) { return x->importance > y->importance; });
    const bool ex = abl.base.has_exact_match;
    std::cout << "heads by importance (|dL/d gate|, normalised per layer); deltas of zero, mean and resample ablation ("
              << 3 * abl.heads.size() << " ablations" << (is_gpt(*model) ? " in one batched pass, " : ", ")
              << fmt(sweep_seconds, 2) << " s" << (is_gpt(*model) ? "" : "; resample not computed for the encoder-decoder")
              << ")\n  " << pad("head", 12) << pad("importance", 11);
    for (const char* kind : {"zero", "mean", "resample"})
      std::cout << pad(std::string(kind) + " dloss", 15) << pad("dacc", 9) << (ex ? pad("dexact", 9) : "");
    std::cout << "\n";
    for (const auto* h : by_imp) {
      std::cout << "  " << pad(analysis::head_name(*model, h->layer, h->head), 12) << pad(fmt(h->importance, 3), 11);
      for (const analysis::Scores* s : {&h->zero, &h->mean, &h->resample})
        std::cout << pad(fmt_signed(s->loss - abl.base.loss), 15)
                  << pad(fmt_signed(s->token_accuracy - abl.base.token_accuracy, 3), 9)
                  << (ex ? pad(fmt_signed(s->exact_match - abl.base.exact_match, 3), 9) : "");
      std::cout << "\n";
    }

    std::cout << "agreement of the gradient scores with zero ablation (Spearman, over heads): normalised "
              << fmt(agreement(abl, true), 2) << ", raw " << fmt(agreement(abl, false), 2) << "\n";
    if (const std::string w = gradient_warning(abl); !w.empty()) std::cout << "warning: " << w << "\n";

    // pruning curve
    analysis::PruneOptions po;
    po.step_fraction = a->step;
    po.criterion = parse_enum<analysis::Criterion>(a->criterion, "ablate: --criterion");
    po.metric = metric;
    po.stop_below = a->full_curve ? -1.0 : stop_below;
    po.min_pruned = std::max<int64_t>(a->prune, 0);
    int64_t max_prunable = 0;
    for (int64_t l = 0; l < model->attention_count(); ++l) max_prunable += model->heads_at(l) - 1;
    HL_CHECK(a->prune <= max_prunable, "ablate: --prune ", a->prune, " is more than the ", max_prunable,
             " heads that can go (every layer keeps one head)");
    std::optional<analysis::L0Result> l0;
    if (po.criterion == analysis::Criterion::l0) {
      analysis::L0Options lo;
      lo.penalties = a->l0_penalties;
      lo.steps = a->l0_steps;
      lo.batch_size = B;
      const auto start = std::chrono::steady_clock::now();
      l0 = analysis::l0_gates(ai.in.gpt("ablate --criterion l0"), *task, data, lo);
      std::cout << "\nlearned gates (hard concrete, L0 penalty; " << a->l0_steps << " Adam steps of batch " << B
                << " per penalty, " << fmt(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1)
                << " s)\n";
      for (const auto& p : l0->points)
        std::cout << "  penalty " << pad(fmt(p.penalty, 4), 8) << " closes " << p.closed.size() << " heads; "
                  << analysis::metric_name(metric) << " " << fmt(analysis::metric_value(p.scores, metric), 3) << "  "
                  << l0_closed_str(p, *model) << "\n";
      po.l0_rank = l0->rank;
    }
    analysis::PruningCurve curve = analysis::iterative_pruning(*model, data, po);
    std::cout << "\npruning curve (" << criterion_text(*a, curve) << " criterion, " << fmt(100 * a->step, 0)
              << "% of the remaining heads per step; stop below "
              << analysis::metric_name(metric) << " " << fmt(stop_below) << " = "
              << (!std::isnan(a->prune_to_metric) && a->prune_to_metric < a->threshold * base_metric
                      ? "--prune-to-metric"
                      : fmt(a->threshold, 2) + " x unpruned")
              << ")\n  " << pad("pruned", 7) << pad("fraction", 9) << pad("loss", 9) << pad("tok acc", 9)
              << (ex ? pad("exact", 9) : "") << "  removed\n";
    for (const auto& s : curve.steps)
      std::cout << "  " << pad(std::to_string(s.pruned), 7) << pad(fmt(s.fraction, 3), 9) << pad(fmt(s.scores.loss), 9)
                << pad(fmt(s.scores.token_accuracy, 3), 9) << (ex ? pad(fmt(s.scores.exact_match, 3), 9) : "")
                << "  " << analysis::removed_heads_str(s, *model) << "\n";
    std::cout << free_heads_text(abl, curve, *model) << "\n";

    // Michel et al.'s Table 2: each layer with only its best head
    const std::vector<analysis::BestHeadOnly> best = analysis::best_head_only(*model, data, metric);
    std::cout << "\nonly the best head of each layer kept (Michel et al. Table 2; " << analysis::metric_name(metric)
              << ", unpruned " << fmt(base_metric, 3) << ")\n";
    for (const auto& b : best) {
      const double m = analysis::metric_value(b.scores, metric);
      std::cout << "  " << pad(model->attention_label(b.layer), 9) << "  best head "
                << pad(analysis::head_name(*model, b.layer, b.best_head), 11, true) << " " << fmt(m, 3) << " ("
                << fmt_signed(m - base_metric, 3) << ")\n";
    }

    HL_CHECK(a->finetune > 0 || (!a->finetune_curve && a->finetune_lr == 0), "ablate: --finetune-curve and "
             "--finetune-lr need --finetune STEPS");
    HL_CHECK(a->finetune == 0 || a->finetune_curve || a->prune >= 0 || !std::isnan(a->prune_to_metric),
             "ablate: --finetune needs a pruned model to train (--prune K or --prune-to-metric X) or --finetune-curve");
    analysis::FinetuneOptions fo;
    fo.steps = a->finetune;
    fo.lr = a->finetune_lr;
    fo.device = a->device;
    if (a->finetune_curve) {
      std::cout << "\nfine-tuning the model pruned at every step of the curve (" << a->finetune << " steps each)\n";
      for (analysis::PruneStep& step : curve.steps) {
        fo.out = join_path(out, "finetune/pruned_" + std::to_string(step.pruned));
        const auto keep = analysis::kept_after(*model, curve.order, step.pruned);
        step.finetuned = analysis::finetune(analysis::prune_checkpoint(ck, keep, a->path), data, fo).after;
        std::cout << "  " << pad(std::to_string(step.pruned), 3) << " pruned: " << analysis::metric_name(metric) << " "
                  << fmt(analysis::metric_value(step.scores, metric), 3) << " -> "
                  << fmt(analysis::metric_value(*step.finetuned, metric), 3) << "\n";
      }
    }

    // physical pruning
    PrunedReport pr;
    if (a->prune >= 0 || !std::isnan(a->prune_to_metric)) {
      const int64_t k_remove =
          a->prune >= 0 ? a->prune : analysis::prune_count_for_metric(curve, a->prune_to_metric);
      const auto keep = analysis::kept_after(*model, curve.order, k_remove);
      pr.done = true;
      pr.removed = k_remove;
      pr.path = join_path(out, "pruned.h5");
      io::save_checkpoint(pr.path, analysis::prune_checkpoint(ck, keep, a->path));
      // Load it back the way every command does, and hold it against the gated model.
      const io::Checkpoint pck = io::load_checkpoint(pr.path);
      std::shared_ptr<nn::Model> pruned = io::load_model(pck, pr.path, device);
      pr.kept = kept_str(*pruned);
      const analysis::HeadMatrix gates = analysis::gates_keeping(*model, keep);
      pr.max_diff = analysis::max_logit_difference(*model, gates, *pruned, data);
      pr.gated = analysis::evaluate_heads(*model, data, gates);
      pr.scores = analysis::evaluate_heads(*pruned, data);
      pr.params_before = model->num_parameters();
      pr.params_after = pruned->num_parameters();
      const tasks::Batch& b0 = data.batches.front();
      pr.B = b0.B;
      pr.T = b0.T;
      const nn::ModelInputs inputs = train::model_inputs(b0, device);
      auto fwd = [&](nn::Model& m) -> std::function<void()> {
        return [&m, &inputs] {
          NoGradGuard no_grad;
          m.logits(inputs);
        };
      };
      const auto times = analysis::time_interleaved({fwd(*model), fwd(*pruned)}, device, 3, a->repeats);
      pr.time_before = times[0];
      pr.time_after = times[1];
      if (k_remove == 0)
        std::cout << "\nnote: no step of the curve keeps " << analysis::metric_name(metric) << " >= "
                  << fmt(a->prune_to_metric) << ", so pruned.h5 keeps every head";
      std::cout << "\npruned model: removed " << k_remove << " of " << curve.total_heads << " heads, kept "
                << pr.kept << "\n  wrote " << pr.path << "; parameters " << pr.params_before
                << " -> " << pr.params_after << " ("
                << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) /
                           static_cast<double>(pr.params_before),
                       1)
                << "% fewer)\n  forward (batch " << pr.B << " x " << pr.T << ", median of " << a->repeats
                << "): " << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3)
                << " ms, speed-up " << fmt(pr.time_before.median / pr.time_after.median, 2) << "x\n"
                << "  max |logits(pruned) - logits(gated)| = " << fmt_sci(pr.max_diff, 2) << "\n"
                << "  pruned.h5: " << scores_line(pr.scores) << "\n";
      if (a->finetune > 0) {
        fo.out = join_path(out, "finetune");
        pr.finetuned = analysis::finetune(pck, data, fo);
        std::cout << "  fine-tuned " << a->finetune << " steps (" << fmt(pr.finetuned->seconds, 1) << " s): "
                  << scores_line(pr.finetuned->after) << "\n  wrote " << pr.finetuned->checkpoint << "\n";
      }
    }

    analysis::save_heads_csv(join_path(out, "heads.csv"), abl, {}, model.get());
    {
      auto delta = [&](const analysis::Scores analysis::HeadAblation::*kind) {
        analysis::HeadMatrix v = analysis::head_matrix(*model, std::nan(""));
        for (const auto& h : abl.heads)
          v[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)] = (h.*kind).loss - abl.base.loss;
        return v;
      };
      // (an encoder-decoder's page has its three kinds of attention, each head's scores beside it)
      analysis::save_row_explorer(join_path(out, "attention.html"), *model, *task, data.batches.front(), 0,
                                  a->path + ": validation row 0",
                                  {{"importance", abl.importance.normalized},
                                   {"zero: d loss", delta(&analysis::HeadAblation::zero)},
                                   {"mean: d loss", delta(&analysis::HeadAblation::mean)},
                                   {"resample: d loss", delta(&analysis::HeadAblation::resample)}});
    }
    analysis::save_pruning_csv(join_path(out, "pruning.csv"), curve, *model);
    analysis::save_importance_png(join_path(out, "importance.png"), abl, *model);
    analysis::save_pruning_png(join_path(out, "pruning.png"), curve, a->full_curve ? -1.0 : stop_below);
    write_text(join_path(out, "report.md"),
               report_md(*a, ck, *model, ai.run, data, abl, curve, stop_below, pr, task->name(), sweep_seconds, l0, best),
               "ablate");
    std::cout << "\nwrote " << out << "/{heads.csv, pruning.csv, report.md, importance.png, pruning.png, attention.html"
              << (pr.done ? ", pruned.h5" : "") << "}\n";
    return 0;
  };
}

}  // namespace headlab::cli
