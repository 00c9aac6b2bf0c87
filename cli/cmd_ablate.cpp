// headlab ablate: which heads of a checkpoint matter (analysis/heads.h, pruning.h): the terminal
// tables, heads.csv, pruning.csv, report.md (built in analysis/reports.h), pictures, and a physically
// pruned checkpoint.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>

#include "analysis/analysis.h"
#include "analysis/explorer.h"
#include "analysis/finetune.h"
#include "analysis/l0_gates.h"
#include "analysis/reports.h"
#include "backends/backend.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/h5file.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace {

struct AblateArgs : AnalysisArgs {
  std::string metric, criterion = "auto";
  int64_t prune = -1, repeats = 20, finetune = 0, l0_steps = 200;
  std::vector<double> l0_penalties = analysis::L0Options{}.penalties;
  double threshold = 0.9, step = 0.1, prune_to_metric = std::nan(""), finetune_lr = 0;
  bool full_curve = false, finetune_curve = false;
};

bool is_gpt(const nn::Model& m) { return dynamic_cast<const nn::GPTModel*>(&m) != nullptr; }

bool pruned_before(const nn::Model& m) {
  for (int64_t l = 0; l < m.attention_count(); ++l)
    if (m.heads_at(l) < m.full_heads()) return true;
  return false;
}

}  // namespace

Action add_ablate(CLI::App& app) {
  auto a = std::make_shared<AblateArgs>();
  add_analysis_options(app, *a, "ablation");
  app.add_option("--metric", a->metric, "pruning metric: exact_match (task default) | token_accuracy (chars default)")
      ->check(CLI::IsMember(enum_names<analysis::Metric>()));
  app.add_option("--threshold", a->threshold, "stop pruning below this fraction of the unpruned metric")
      ->check(in_range(0, 1))
      ->capture_default_str();
  app.add_option("--step", a->step, "fraction of the remaining heads pruned per step")
      ->check(in_range(0.001, 1))
      ->capture_default_str();
  app.add_option("--criterion", a->criterion,
                 "pruning order: auto (ablation up to " + std::to_string(analysis::kAblationCriterionMaxHeads) +
                     " heads, else gradient) | ablation (measured cost of masking each head: metric, then loss) | "
                     "gradient (Michel et al. importance) | l0 (the order learned hard-concrete gates close heads "
                     "in, Voita et al. 2019)")
      ->check(CLI::IsMember(enum_names<analysis::Criterion>()))
      ->capture_default_str();
  app.add_option("--l0-steps", a->l0_steps, "--criterion l0: Adam steps of the gates per penalty strength")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--l0-penalties", a->l0_penalties, "--criterion l0: the penalty strengths (L0 weights), one run each")
      ->delimiter(',')
      ->check(non_negative_number(1e6));
  app.add_flag("--full-curve", a->full_curve, "continue the pruning curve until every layer has one head left");
  auto* k = app.add_option("--prune", a->prune, "write pruned.h5 without the K least important heads (pruning order)")
                ->check(non_negative_number(1e6));
  app.add_option("--prune-to-metric", a->prune_to_metric,
                 "write pruned.h5 pruned by the curve as far as the metric stays >= X")
      ->check(in_range(0, 1))
      ->excludes(k);
  app.add_option("--finetune", a->finetune,
                 "after pruning, train the pruned model N more steps (its task, a fresh optimizer of its run's kind) "
                 "and report the metric before and after; writes finetune/checkpoint.h5")
      ->check(positive_number(1e12));
  app.add_option("--finetune-lr", a->finetune_lr, "peak learning rate of the fine-tuning (default: the run's)")
      ->check(positive_number(1e3));
  app.add_flag("--finetune-curve", a->finetune_curve,
               "fine-tune the model pruned at every step of the curve too (--finetune steps each; "
               "finetune/pruned_<k>/), so that the curve shows both");
  app.add_option("--repeats", a->repeats, "timed forward passes for the pruned model's speed-up")
      ->check(positive_number(1e6))
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
    const analysis::Metric metric = a->metric.empty() ? analysis::default_metric(data)
                                                      : parse_enum<analysis::Metric>(a->metric, "ablate: --metric");

    std::cout << "headlab ablate: " << a->path << " (task " << task->name() << ", " << ai.run.describe_model()
              << (pruned_before(*model) ? ", pruned: kept " + kept_str(*model) : "") << ", " << model->num_parameters()
              << " parameters, device " << device.str() << ")\n"
              << "data: " << n << " validation batches of " << B << " (" << data.tokens()
              << " scored tokens); pruning metric " << enum_name(metric) << "\n";
    const auto sweep_start = std::chrono::steady_clock::now();
    const analysis::AblationResult abl = analysis::ablate_heads(*model, data);
    const double sweep_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sweep_start).count();
    const double base_metric = analysis::metric_value(abl.base, metric);
    double stop_below = a->threshold * base_metric;
    if (!std::isnan(a->prune_to_metric)) stop_below = std::min(stop_below, a->prune_to_metric);
    std::cout << "unpruned: " << analysis::scores_line(abl.base) << "\n\n";

    analysis::AblationTables tables;
    tables.importance = analysis::importance_table(abl, *model);
    tables.importance.title =
        "heads by importance (|dL/d gate|, normalised per layer); deltas of zero, mean and resample ablation (" +
        std::to_string(3 * abl.heads.size()) + " ablations" + (is_gpt(*model) ? " in one batched pass, " : ", ") +
        fmt(sweep_seconds, 2) + " s" + (is_gpt(*model) ? "" : "; resample not computed for the encoder-decoder") + ")";
    std::cout << analysis::render_text(tables.importance);
    std::cout << "agreement of the gradient scores with zero ablation (Spearman, over heads): normalised "
              << fmt(analysis::agreement(abl, true), 2) << ", raw " << fmt(analysis::agreement(abl, false), 2) << "\n";
    if (const std::string w = analysis::gradient_warning(abl); !w.empty()) std::cout << "warning: " << w << "\n";

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
      tables.l0 = analysis::l0_table(
          *l0, metric, *model,
          "learned gates (hard concrete, L0 penalty; " + std::to_string(a->l0_steps) + " Adam steps of batch " +
              std::to_string(B) + " per penalty, " +
              fmt(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1) + " s)");
      std::cout << "\n" << analysis::render_text(*tables.l0);
      po.l0_rank = l0->rank;
    }
    analysis::PruningCurve curve = analysis::iterative_pruning(*model, data, po);
    const std::string curve_title = "pruning curve (" + analysis::criterion_text(curve, a->criterion == "auto") +
                                    " criterion, " + fmt(100 * a->step, 0) +
                                    "% of the remaining heads per step; stop below " + enum_name(metric) + " " +
                                    fmt(stop_below) + " = " +
                                    (!std::isnan(a->prune_to_metric) && a->prune_to_metric < a->threshold * base_metric
                                         ? "--prune-to-metric"
                                         : fmt(a->threshold, 2) + " x unpruned") +
                                    ")";
    std::cout << "\n" << analysis::render_text(analysis::pruning_table(curve, *model, curve_title));
    std::cout << analysis::free_heads_text(abl, curve, *model) << "\n";

    // Michel et al.'s Table 2: each layer with only its best head
    const std::vector<analysis::BestHeadOnly> best = analysis::best_head_only(*model, data, metric);
    tables.best_head =
        analysis::best_head_table(*model, abl, best, metric, &tables.best_head_mean,
                                  "only the best head of each layer kept (Michel et al. Table 2; " +
                                      std::string(enum_name(metric)) + ", unpruned " + fmt(base_metric, 3) + ")");
    std::cout << "\n"
              << analysis::render_text(tables.best_head) << "  mean change per layer: " << tables.best_head_mean
              << "\n";

    HL_CHECK(a->finetune > 0 || (!a->finetune_curve && a->finetune_lr == 0),
             "ablate: --finetune-curve and "
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
        std::cout << "  " << pad(std::to_string(step.pruned), 3) << " pruned: " << enum_name(metric) << " "
                  << fmt(analysis::metric_value(step.scores, metric), 3) << " -> "
                  << fmt(analysis::metric_value(*step.finetuned, metric), 3) << "\n";
      }
    }

    // physical pruning
    analysis::PrunedModelReport pr;
    if (a->prune >= 0 || !std::isnan(a->prune_to_metric)) {
      const int64_t k_remove = a->prune >= 0 ? a->prune : analysis::prune_count_for_metric(curve, a->prune_to_metric);
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
        std::cout << "\nnote: no step of the curve keeps " << enum_name(metric) << " >= " << fmt(a->prune_to_metric)
                  << ", so pruned.h5 keeps every head";
      std::cout << "\npruned model: removed " << k_remove << " of " << curve.total_heads << " heads, kept " << pr.kept
                << "\n  wrote " << pr.path << "; parameters " << pr.params_before << " -> " << pr.params_after << " ("
                << fmt(100.0 * static_cast<double>(pr.params_before - pr.params_after) /
                           static_cast<double>(pr.params_before),
                       1)
                << "% fewer)\n  forward (batch " << pr.B << " x " << pr.T << ", median of " << a->repeats
                << "): " << fmt(pr.time_before.median * 1e3, 3) << " ms -> " << fmt(pr.time_after.median * 1e3, 3)
                << " ms, speed-up " << fmt(pr.time_before.median / pr.time_after.median, 2) << "x\n"
                << "  max |logits(pruned) - logits(gated)| = " << fmt_sci(pr.max_diff, 2) << "\n"
                << "  pruned.h5: " << analysis::scores_line(pr.scores) << "\n";
      if (a->finetune > 0) {
        fo.out = join_path(out, "finetune");
        pr.finetuned = analysis::finetune(pck, data, fo);
        std::cout << "  fine-tuned " << a->finetune << " steps (" << fmt(pr.finetuned->seconds, 1)
                  << " s): " << analysis::scores_line(pr.finetuned->after) << "\n  wrote " << pr.finetuned->checkpoint
                  << "\n";
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
    tables.pruning = analysis::pruning_table(curve, *model);  // with the fine-tuned columns, if any
    analysis::AblationReport report;
    report.checkpoint = a->path;
    if (ck.has_trainer) report.checkpoint_step = ck.trainer.step;
    report.task = task->name();
    report.model_description = ai.run.describe_model();
    if (pruned_before(*model)) report.kept_before = kept_str(*model);
    report.criterion = analysis::criterion_text(curve, a->criterion == "auto");
    report.step_fraction = a->step;
    report.sweep_seconds = sweep_seconds;
    report.stop_below = stop_below;
    report.l0_steps = a->l0_steps;
    report.finetune_steps = a->finetune;
    report.finetune_curve = a->finetune_curve;
    report.ablation = abl;
    report.curve = curve;
    report.l0 = l0;
    report.tables = std::move(tables);
    report.pruned = pr;
    write_text(join_path(out, "report.md"), analysis::ablation_report_md(*model, data, report), "ablate");
    std::cout << "\nwrote " << out << "/{heads.csv, pruning.csv, report.md, importance.png, pruning.png, attention.html"
              << (pr.done ? ", pruned.h5" : "") << "}\n";
    return 0;
  };
}

}  // namespace headlab::cli
