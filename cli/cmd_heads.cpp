// headlab heads: what every attention head of a checkpoint does, in one command: zero/mean/resample
// ablation, direct logit attribution, activation patching (noising and denoising), head types.
// Writes heads.csv (a row per head, a column per score), report.md (analysis/reports.h) and its pictures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>

#include "analysis/analysis.h"
#include "analysis/explorer.h"
#include "analysis/head_scores.h"
#include "analysis/patching.h"
#include "analysis/reports.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "tasks/algorithmic.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace {

struct HeadsArgs : AnalysisArgs {
  uint64_t seed = 1;
  bool by_position = false;
};

template <class F>
double timed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Action add_heads(CLI::App& app) {
  auto a = std::make_shared<HeadsArgs>();
  add_analysis_options(app, *a, "heads");
  app.add_flag("--by-position", a->by_position,
               "activation patching per head and position too (denoising; a pass per position)");
  add_seed_option(app, a->seed, "which prompt digit the corruption changes (tasks)");
  return [a] {
    const AnalysisInputs ai = load_analysis(*a, "heads", "heads");
    const Loaded& in = ai.in;
    nn::GPTModel& model = in.gpt("heads");
    const nn::GPTConfig& cfg = model.config();
    const int64_t n = ai.batches, B = ai.batch_size;
    const std::string& out = ai.out;
    const analysis::EvalSet& data = ai.data;
    std::cout << "headlab heads: " << a->path << " (task " << in.task->name() << ", " << cfg.n_layers << " layers x "
              << cfg.n_heads << " heads" << (cfg.kept_heads.empty() ? "" : ", pruned: kept " + kept_str(cfg.kept_heads))
              << ")\ndata: " << n << " validation batches of " << B << " x " << ai.tokens << " (" << data.tokens()
              << " scored tokens)\n";

    analysis::HeadsFindings f;
    f.seconds_ablation = timed([&] { f.ablation = analysis::ablate_heads(model, data); });
    f.seconds_dla = timed([&] { f.dla = analysis::logit_attribution(model, data); });
    const auto* algo = dynamic_cast<const tasks::AlgorithmicTask*>(in.task.get());
    analysis::HeadTypeOptions to;
    to.separator_id = algo ? algo->sep_id() : -1;
    f.seconds_types = timed([&] { f.types = analysis::head_types(model, data, to); });
    std::vector<analysis::Batch> corrupted;
    if (algo) {
      for (size_t i = 0; i < data.batches.size(); ++i) corrupted.push_back(algo->corrupt(data.batches[i], a->seed + i));
      f.corruption = "one prompt digit of every row changed to another digit (the answer changes with it)";
    } else {
      corrupted = analysis::rotated_rows(data);
      f.corruption = "every row replaced by the next row of the data (another stretch of the text)";
    }
    f.seconds_patching = timed([&] { f.patching = analysis::patch_heads(model, data, corrupted, a->by_position); });
    // Copying from the context: ablation on repeated random tokens (at most 128 per copy: GPT-2's 512
    // would multiply the cost by 16 for the same answer).
    f.repeated_rows = 16;
    f.repeated_half = std::min<int64_t>(f.types.induction_half, 128);
    if (f.repeated_half >= 2)
      f.seconds_repeated = timed([&] {
        f.repeated = analysis::ablate_heads(
            model, analysis::repeated_tokens_set(cfg.vocab_size, f.repeated_rows, f.repeated_half, a->seed));
      });
    f.composition = analysis::composition_scores(model);

    const analysis::HeadsScores sc = analysis::heads_scores(model, f);
    const auto& abl = f.ablation;
    // terminal: one line per head
    const analysis::Table summary = analysis::heads_summary_table(model, sc);
    std::cout << "unablated: loss " << fmt(abl.base.loss) << ", token accuracy " << fmt(abl.base.token_accuracy)
              << "\n\n"
              << analysis::render_text(summary);
    std::cout << "DLA: each head's direct share of logit(correct) - mean logit (final norm's scale frozen), mean over "
              << f.dla.tokens << " tokens; the components sum to " << fmt(f.dla.vs_mean.sum(), 4)
              << " (model: " << fmt(f.dla.vs_mean.total, 4) << ")\npatching: " << f.corruption << "; corrupted loss "
              << fmt(f.patching.corrupted.loss) << " vs clean " << fmt(f.patching.clean.loss)
              << "; effects are fractions of that gap\n";

    analysis::save_heads_csv(join_path(out, "heads.csv"), abl, analysis::heads_csv_columns(f, sc));
    analysis::save_head_map_png(join_path(out, "dla.png"),
                                {"direct logit attribution: logit(correct) - mean logit", "logit", sc.dla, {}, {}},
                                model);
    analysis::save_head_map_png(
        join_path(out, "patching.png"),
        {"activation patching, denoising: fraction of the loss gap restored", "fraction", sc.denoising, {}, {}}, model);

    analysis::save_head_maps_png(join_path(out, "types.png"),
                                 "head types: attention-pattern scores (entropy as a fraction of its maximum)",
                                 {{"previous token", "score", sc.previous, {}, {}},
                                  {"first token", "score", sc.first, {}, {}},
                                  {"induction", "score", sc.induction, {}, {}},
                                  {"entropy", "score", sc.entropy_normalized, {}, {}}},
                                 model, 0.0, 1.0);
    analysis::save_head_map_png(join_path(out, "ablation.png"),
                                {"resample ablation: loss increase", "d loss", sc.resample, 0.0, {}}, model);
    // The explorer page on the first validation row, with every score beside its head.
    analysis::save_row_explorer(join_path(out, "attention.html"), model, *in.task, data.batches.front(), 0,
                                a->path + ": validation row 0",
                                {{"resample: d loss", sc.resample},
                                 {"zero: d loss", sc.zero},
                                 {"DLA (vs mean)", sc.dla},
                                 {"patching: denoising", sc.denoising},
                                 {"previous token", sc.previous},
                                 {"induction", sc.induction},
                                 {"entropy / max", sc.entropy_normalized}});
    const std::vector<analysis::CompositionScore>& comp = f.composition;
    if (!comp.empty()) {  // every pair in a CSV, the strongest of each kind here, and the induction circuits
      std::string csv = "layer_a,head_a,layer_b,head_b,q_composition,k_composition,v_composition\n";
      for (const analysis::CompositionScore& c : comp)
        csv += std::to_string(c.layer_a) + "," + std::to_string(c.head_a) + "," + std::to_string(c.layer_b) + "," +
               std::to_string(c.head_b) + "," + fmt(c.q, 6) + "," + fmt(c.k, 6) + "," + fmt(c.v, 6) + "\n";
      write_text(join_path(out, "composition.csv"), csv, "heads");
      analysis::save_composition_png(join_path(out, "composition.png"), comp, model);
      std::cout << "\ncomposition (Elhage et al.; |W_OV^a W_QK^b|_F over the norms; norm1's scale folded in), "
                   "strongest pairs:\n";
      for (const auto& [kind, member] :
           {std::pair{"Q", &analysis::CompositionScore::q}, std::pair{"K", &analysis::CompositionScore::k},
            std::pair{"V", &analysis::CompositionScore::v}}) {
        std::vector<analysis::CompositionScore> top = comp;
        std::partial_sort(top.begin(), top.begin() + std::min<size_t>(3, top.size()), top.end(),
                          [m = member](const auto& x, const auto& y) { return x.*m > y.*m; });
        std::cout << "  " << kind << ":";
        for (size_t i = 0; i < std::min<size_t>(3, top.size()); ++i)
          std::cout << "  L" << top[i].layer_a << "H" << top[i].head_a << " -> L" << top[i].layer_b << "H"
                    << top[i].head_b << " " << fmt(top[i].*member, 3);
        std::cout << "\n";
      }
      std::cout << analysis::induction_pairs_text(f.types, comp);
    }
    if (!f.repeated.heads.empty()) {
      const auto& rep = f.repeated;
      const auto worst = std::max_element(rep.heads.begin(), rep.heads.end(),
                                          [](const auto& x, const auto& y) { return x.mean.loss < y.mean.loss; });
      std::cout << "repeated random tokens (" << f.repeated_rows << " rows of 2 x " << f.repeated_half << "): loss "
                << fmt(rep.base.loss) << "; ablating (mean) "
                << analysis::head_label(worst->layer, worst->original_head) << " raises it most, to "
                << fmt(worst->mean.loss) << " (+" << fmt(worst->mean.loss - rep.base.loss) << ")\n";
    }
    write_text(join_path(out, "report.md"),
               analysis::heads_report_md(model, data, {a->path, in.task->name(), a->by_position}, f, sc), "heads");
    std::cout << "\nwrote " << out << "/{heads.csv, report.md, ablation.png, dla.png, patching.png, types.png, "
              << "attention.html" << (comp.empty() ? "" : ", composition.csv, composition.png") << "}\n";
    return 0;
  };
}

}  // namespace headlab::cli
