// headlab ablate: which heads of a checkpoint matter: option parsing, then analysis::run_ablation
// (analysis/ablation.h) and its files.
#include <iostream>
#include <memory>

#include "analysis/ablation.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace headlab::cli {

namespace {

struct AblateArgs : AnalysisArgs {
  analysis::AblateOptions run;
  std::string metric, criterion = "auto";
};

}  // namespace

Action add_ablate(CLI::App& app) {
  auto a = std::make_shared<AblateArgs>();
  add_analysis_options(app, *a, "ablate");
  app.add_option("--metric", a->metric, "pruning metric: exact_match (task default) | token_accuracy (chars default)")
      ->check(CLI::IsMember(enum_names<analysis::Metric>()));
  app.add_option("--threshold", a->run.threshold, "stop pruning below this fraction of the unpruned metric")
      ->check(in_range(0, 1))
      ->capture_default_str();
  app.add_option("--step", a->run.step, "fraction of the remaining heads pruned per step")
      ->check(in_range(0.001, 1))
      ->capture_default_str();
  app.add_option("--criterion", a->criterion,
                 "pruning order: auto (ablation up to " + std::to_string(analysis::kAblationCriterionMaxHeads) +
                     " heads, else gradient) | ablation (measured cost of masking each head: metric, then loss) | "
                     "gradient (Michel et al. importance) | l0 (the order learned hard-concrete gates close heads "
                     "in, Voita et al. 2019)")
      ->check(CLI::IsMember(enum_names<analysis::Criterion>()))
      ->capture_default_str();
  const CLI::Option* l0_options[] = {
      app.add_option("--l0-steps", a->run.l0_steps, "--criterion l0: Adam steps of the gates per penalty strength")
          ->check(positive_number(1e6))
          ->capture_default_str(),
      app.add_option("--l0-penalties", a->run.l0_penalties,
                     "--criterion l0: the penalty strengths (L0 weights), one run each")
          ->delimiter(',')
          ->check(non_negative_number(1e6))};
  app.add_flag("--full-curve", a->run.full_curve, "continue the pruning curve until every layer has one head left");
  auto* k =
      app.add_option("--prune", a->run.prune, "write pruned.h5 without the K least important heads (pruning order)")
          ->check(non_negative_number(1e6));
  app.add_option("--prune-to-metric", a->run.prune_to_metric,
                 "write pruned.h5 pruned by the curve as far as the metric stays >= X")
      ->check(in_range(0, 1))
      ->excludes(k);
  app.add_option("--finetune", a->run.finetune,
                 "after pruning, train the pruned model N more steps (its task, a fresh optimizer of its run's kind) "
                 "and report the metric before and after; writes finetune/checkpoint.h5")
      ->check(positive_number(1e12));
  app.add_option("--finetune-lr", a->run.finetune_lr, "peak learning rate of the fine-tuning (default: the run's)")
      ->check(positive_number(1e3));
  app.add_flag("--finetune-curve", a->run.finetune_curve,
               "fine-tune the model pruned at every step of the curve too (--finetune steps each; "
               "finetune/pruned_<k>/), so that the curve shows both");
  app.add_option("--repeats", a->run.repeats, "timed forward passes for the pruned model's speed-up")
      ->check(positive_number(1e6))
      ->capture_default_str();
  return [a, l0_options] {
    for (const CLI::Option* o : l0_options)
      HL_CHECK(o->count() == 0 || a->criterion == "l0",
               "ablate: --l0-steps and --l0-penalties set the gates of --criterion l0, not of --criterion ",
               a->criterion);
    const AnalysisInputs ai = load_analysis(*a, "ablate", "ablate");
    analysis::AblateOptions o = a->run;
    o.checkpoint = a->path;
    o.out = ai.out;
    o.device = a->device;
    if (!a->metric.empty()) o.metric = parse_enum<analysis::Metric>(a->metric, "ablate: --metric");
    o.criterion = parse_enum<analysis::Criterion>(a->criterion, "ablate: --criterion");
    const analysis::AblationReport r = analysis::run_ablation(ai.in, ai.data, o, say);
    std::cout << "\nwrote " << wrote_line(ai.out, analysis::write_ablation_files(ai.out, ai.in, ai.data, r)) << "\n";
    return 0;
  };
}

}  // namespace headlab::cli
