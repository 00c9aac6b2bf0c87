// headlab ablate's run (analysis/ablation.h): the sweep, the curve, the best heads, the pruned model, the files.
#include "analysis/ablation.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "analysis/explorer.h"
#include "analysis/files.h"
#include "analysis/surgery.h"
#include "io/atomic_file.h"

namespace headlab::analysis {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool pruned_before(const nn::Model& m) {
  for (int64_t l = 0; l < m.attention_count(); ++l)
    if (m.heads_at(l) < m.full_heads()) return true;
  return false;
}

// pruned.h5 without the first k heads of the curve's order: written, loaded back the way every command
// loads a checkpoint, held against the gated model and timed; fine-tuned when asked.
PrunedModelReport write_pruned(const loader::Loaded& in, const EvalSet& data, const AblateOptions& o, int64_t k,
                               const PruningCurve& curve, const FinetuneOptions& fo, const Say& say) {
  nn::Model& model = *in.model;
  const auto keep = whole_kv_groups(model, kept_after(model, curve.order, k));
  PrunedModelReport pr;
  pr.done = true;
  pr.removed = 0;
  for (int64_t l = 0; l < model.attention_count(); ++l)
    pr.removed += model.heads_at(l) - static_cast<int64_t>(keep[static_cast<size_t>(l)].size());
  pr.path = (std::filesystem::path(o.out) / "pruned.h5").string();
  io::save_checkpoint(pr.path, prune_checkpoint(in.ckpt, keep, o.checkpoint));
  const io::Checkpoint pck = io::load_checkpoint(pr.path);
  std::shared_ptr<nn::Model> pruned = io::load_model(pck, pr.path, model.device());
  pr.kept = kept_heads_text(*pruned);
  const HeadMatrix gates = gates_keeping(model, keep);
  pr.max_diff = max_logit_difference(model, gates, *pruned, data);
  pr.gated = evaluate_heads(model, data, gates);
  pr.scores = evaluate_heads(*pruned, data);
  pr.params_before = model.num_parameters();
  pr.params_after = pruned->num_parameters();
  const tasks::Batch& b0 = data.batches.front();
  pr.B = b0.B, pr.T = b0.T;
  const nn::ModelInputs inputs = train::model_inputs(b0, model.device());
  const auto forward = [&](nn::Model& m) -> std::function<void()> {
    return [&m, &inputs] {
      NoGradGuard no_grad;
      m.logits(inputs);
    };
  };
  const auto times = time_interleaved({forward(model), forward(*pruned)}, model.device(), 3, o.repeats);
  pr.time_before = times[0], pr.time_after = times[1];
  std::ostringstream os;
  if (k == 0)
    os << "\nnote: no step of the curve keeps " << enum_name(curve.metric) << " >= " << fmt(o.prune_to_metric)
       << ", so pruned.h5 keeps every head";
  os << "\npruned model: removed " << pr.removed << " of " << curve.total_heads << " heads";
  if (pr.removed != k)  // grouped-query attention: a group goes when all its heads do
    os << " (the curve's first " << k << ", less those whose key/value group keeps a head)";
  os << ", kept " << pr.kept << "\n  wrote " << pr.path << "; parameters " << pr.params_before << " -> "
     << pr.params_after << " ("
     << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) / static_cast<double>(pr.params_before), 1)
     << "% fewer)\n  forward (batch " << pr.B << " x " << pr.T << ", median of " << o.repeats
     << "): " << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3)
     << " ms, speed-up " << fmt(pr.time_before.median / pr.time_after.median, 2) << "x\n"
     << "  max |logits(pruned) - logits(gated)| = " << fmt_sci(pr.max_diff, 2) << "\n"
     << "  pruned.h5: " << scores_line(pr.scores) << "\n";
  if (o.finetune > 0) {
    FinetuneOptions f = fo;
    f.out = (std::filesystem::path(o.out) / "finetune").string();
    pr.finetuned = finetune(pck, data, f);
    os << "  fine-tuned " << o.finetune << " steps (" << fmt(pr.finetuned->seconds, 1)
       << " s): " << scores_line(pr.finetuned->after) << "\n  wrote " << pr.finetuned->checkpoint << "\n";
  }
  if (say) say(os.str());
  return pr;
}

}  // namespace

AblationReport run_ablation(const loader::Loaded& in, const EvalSet& data, const AblateOptions& o, const Say& say) {
  nn::Model& model = *in.model;
  const tasks::Task& task = *in.task;
  const auto tell = [&](const std::string& text) {
    if (say) say(text);
  };
  HL_CHECK(o.finetune > 0 || (!o.finetune_curve && o.finetune_lr == 0),
           "ablate: --finetune-curve and --finetune-lr need --finetune STEPS");
  HL_CHECK(o.finetune == 0 || o.finetune_curve || o.prune >= 0 || !std::isnan(o.prune_to_metric),
           "ablate: --finetune needs a pruned model to train (--prune K or --prune-to-metric X) or --finetune-curve");
  int64_t max_prunable = 0;
  for (int64_t l = 0; l < model.attention_count(); ++l) max_prunable += model.heads_at(l) - 1;
  HL_CHECK(o.prune <= max_prunable, "ablate: --prune ", o.prune, " is more than the ", max_prunable,
           " heads that can go (every layer keeps one head)");
  AblationReport r;
  r.checkpoint = o.checkpoint;
  if (in.ckpt.has_trainer) r.checkpoint_step = in.ckpt.trainer.step;
  r.task = task.name();
  r.model_description = in.config.describe_model();
  if (pruned_before(model)) r.kept_before = kept_heads_text(model);
  r.metric = o.metric ? *o.metric : default_metric(data);
  check_metric(data, r.metric);  // what later stages need, before the first line
  if (o.criterion == Criterion::l0) (void)in.decoder("ablate --criterion l0");
  FinetuneOptions fo;
  fo.steps = o.finetune;
  fo.lr = o.finetune_lr;
  fo.device = o.device;
  if (o.finetune > 0) check_finetune(in.ckpt, fo, "ablate --finetune");
  r.step_fraction = o.step, r.l0_steps = o.l0_steps, r.finetune_steps = o.finetune, r.finetune_curve = o.finetune_curve;
  const bool decoder = model.is_decoder();
  tell("headlab ablate: " + o.checkpoint + " (task " + task.name() + ", " + r.model_description +
       (r.kept_before.empty() ? "" : ", pruned: kept " + r.kept_before) + ", " +
       std::to_string(model.num_parameters()) + " parameters, device " + model.device().str() + ")\ndata: " +
       count_of(static_cast<int64_t>(data.batches.size()), "validation batch", "validation batches") + " of " + std::to_string(data.batches.front().B) + " (" +
       std::to_string(data.tokens()) + " scored tokens); pruning metric " + enum_name(r.metric) + "\n");

  // Every head ablated, and its importance.
  const auto sweep_start = Clock::now();
  r.ablation = ablate_heads(model, data);
  r.sweep_seconds = seconds_since(sweep_start);
  const AblationResult& abl = r.ablation;
  const double base_metric = metric_value(abl.base, r.metric);
  r.stop_below = o.threshold * base_metric;
  if (!std::isnan(o.prune_to_metric)) r.stop_below = std::min(r.stop_below, o.prune_to_metric);
  r.tables.importance = importance_table(abl, model);
  r.tables.importance.title =
      "heads ranked by " + ranking_text(abl) + "; deltas of zero, mean and resample ablation (" +
      std::to_string(3 * abl.heads.size()) + " ablations" + (decoder ? " in one batched pass, " : ", ") +
      fmt(r.sweep_seconds, 2) + " s" + (decoder ? "" : "; resample not computed for the encoder-decoder") + ")";
  std::string sweep = "unpruned: " + scores_line(abl.base) + "\n\n" + render_text(r.tables.importance) +
                      "agreement of the gradient scores with zero ablation (Spearman, over heads): normalised " +
                      fmt(agreement(abl, true), 2) + ", raw " + fmt(agreement(abl, false), 2) + "\n";
  if (const std::string w = gradient_warning(abl); !w.empty()) sweep += "warning: " + w + "\n";
  tell(sweep);

  // The pruning curve, by learned gates when asked.
  PruneOptions po;
  po.step_fraction = o.step;
  po.criterion = o.criterion;
  po.metric = r.metric;
  po.stop_below = r.curve_stop = o.full_curve ? -1.0 : r.stop_below;
  po.min_pruned = std::max<int64_t>(o.prune, 0);
  if (po.criterion == Criterion::l0) {
    L0Options lo;
    lo.penalties = o.l0_penalties;
    lo.steps = o.l0_steps;
    lo.batch_size = data.batches.front().B;
    const auto start = Clock::now();
    r.l0 = l0_gates(in.decoder("ablate --criterion l0"), task, data, lo);
    r.tables.l0 =
        l0_table(*r.l0, r.metric, model,
                 "learned gates (hard concrete, L0 penalty; " + std::to_string(o.l0_steps) + " Adam steps of batch " +
                     std::to_string(lo.batch_size) + " per penalty, " + fmt(seconds_since(start), 1) + " s)");
    tell("\n" + render_text(*r.tables.l0));
    po.l0_rank = r.l0->rank;
  }
  r.curve = iterative_pruning(model, data, po);
  r.criterion = criterion_text(r.curve, o.criterion == Criterion::automatic);
  const bool by_target = !std::isnan(o.prune_to_metric) && o.prune_to_metric < o.threshold * base_metric;
  // (appended, not "\n" + ...: GCC 12 warns falsely of an overlapping memcpy there, its bug 105329)
  tell(std::string("\n")
           .append(render_text(pruning_table(
               r.curve, model,
               "pruning curve (" + r.criterion + " criterion, " + fmt(100 * o.step, 0) +
                   "% of the remaining heads per step; stop below " + enum_name(r.metric) + " " + fmt(r.stop_below) +
                   " = " + (by_target ? "--prune-to-metric" : fmt(o.threshold, 2) + " x unpruned") + ")")))
           .append(free_heads_text(abl, r.curve, model))
           .append("\n"));

  // Michel et al.'s Table 2: each layer with only its best head.
  r.best = best_head_only(model, data, r.metric);
  r.tables.best_head =
      best_head_table(model, abl, r.best, r.metric, &r.tables.best_head_mean,
                      "only the best head of each layer kept (Michel et al. Table 2; " +
                          std::string(enum_name(r.metric)) + ", unpruned " + fmt(base_metric, 3) + ")");
  tell(std::string("\n")
           .append(render_text(r.tables.best_head))
           .append("  mean change per layer: ")
           .append(r.tables.best_head_mean)
           .append("\n"));

  if (o.finetune_curve) {
    std::ostringstream os;
    os << "\nfine-tuning the model pruned at every step of the curve (" << o.finetune << " steps each)\n";
    for (PruneStep& step : r.curve.steps) {
      fo.out = (std::filesystem::path(o.out) / ("finetune/pruned_" + std::to_string(step.pruned))).string();
      const auto keep = whole_kv_groups(model, kept_after(model, r.curve.order, step.pruned));
      step.finetuned = finetune(prune_checkpoint(in.ckpt, keep, o.checkpoint), data, fo).after;
      os << "  " << std::setw(3) << step.pruned << " pruned: " << enum_name(r.metric) << " "
         << fmt(metric_value(step.scores, r.metric), 3) << " -> " << fmt(metric_value(*step.finetuned, r.metric), 3)
         << "\n";
    }
    tell(os.str());
  }
  if (o.prune >= 0 || !std::isnan(o.prune_to_metric)) {
    const int64_t k = o.prune >= 0 ? o.prune : prune_count_for_metric(r.curve, o.prune_to_metric);
    r.pruned = write_pruned(in, data, o, k, r.curve, fo, say);
  }
  r.tables.pruning = pruning_table(r.curve, model);  // with the fine-tuned columns, if any
  return r;
}

std::vector<std::string> write_ablation_files(const std::string& out, const loader::Loaded& in, const EvalSet& data,
                                              const AblationReport& r) {
  const nn::Model& model = *in.model;
  const auto path = [&](const char* name) { return (std::filesystem::path(out) / name).string(); };
  const AblationResult& abl = r.ablation;
  save_heads_csv(path("heads.csv"), abl, {}, &model);
  const auto delta = [&](const Scores HeadAblation::*kind) {
    HeadMatrix v = head_matrix(model, std::nan(""));
    for (const auto& h : abl.heads)
      v[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)] = (h.*kind).loss - abl.base.loss;
    return v;
  };
  // (an encoder-decoder's page has its three kinds of attention, each head's scores beside it)
  save_row_explorer(path("attention.html"), *in.model, *in.task, data.batches.front(), 0,
                    r.checkpoint + ": validation row 0",
                    {{"importance", abl.importance.normalized},
                     {"zero: d loss", delta(&HeadAblation::zero)},
                     {"mean: d loss", delta(&HeadAblation::mean)},
                     {"resample: d loss", delta(&HeadAblation::resample)}});
  save_pruning_csv(path("pruning.csv"), r.curve, model);
  save_importance_png(path("importance.png"), abl, model);
  {  // the measured costs themselves, one colour range over the three kinds
    std::vector<HeadMap> maps;
    double lo = 0, hi = 0;
    for (const auto& [title, kind] : {std::pair{"zero ablation", &HeadAblation::zero},
                                      std::pair{"mean ablation", &HeadAblation::mean},
                                      std::pair{"resample ablation", &HeadAblation::resample}}) {
      maps.push_back({title, "loss increase", delta(kind), std::nullopt, std::nullopt});
      for (const auto& row : maps.back().values)
        for (double v : row)
          if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
    save_head_maps_png(path("ablation.png"),
                       "loss increase when each head is ablated (unpruned loss " + fmt(abl.base.loss) + ")", maps,
                       model, lo, hi > lo ? hi : lo + 1);
  }
  save_pruning_png(path("pruning.png"), r.curve, r.curve_stop);
  io::write_file_atomic(path("report.md"), ablation_report_md(model, data, r), "ablate");
  std::vector<std::string> wrote = {"heads.csv",      "pruning.csv", "report.md",
                                    "importance.png", "ablation.png", "pruning.png", "attention.html"};
  if (r.pruned.done) wrote.push_back("pruned.h5");
  return wrote;
}

}  // namespace headlab::analysis
