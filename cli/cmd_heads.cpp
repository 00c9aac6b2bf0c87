// headlab heads: what every attention head of a checkpoint does, in one command: zero/mean/resample
// ablation, direct logit attribution, activation patching (noising and denoising), head types.
// Writes heads.csv (a row per head, a column per score), report.md (analysis/reports.h) and its pictures.
// On the task's data the measure is the loss; on prompt pairs (--task ioi|greater-than|induction, --pairs
// FILE) it is the normalised logit difference of the circuit analyses (analysis/circuit.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>

#include "analysis/analysis.h"
#include "analysis/circuit.h"
#include "analysis/explorer.h"
#include "analysis/head_scores.h"
#include "analysis/patching.h"
#include "analysis/reports.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "tasks/algorithmic.h"
#include "train/collectives.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace {

struct HeadsArgs : AnalysisArgs {
  uint64_t seed = 1;
  bool by_position = false;
  PromptPairArgs pairs;
};

template <class F>
double timed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Every per-head analysis on prompt pairs, on the metric of the circuit analyses (1: clean, 0: corrupted):
// zero and mean ablation, resample ablation (the corrupted prompt's output: activation patching's noising),
// denoising, both at each position with --by-position, direct logit attribution along answer - wrong,
// and head types on the clean prompts. Under mpirun the ranks share the prompt rows; rank 0 writes.
int heads_on_pairs(const HeadsArgs& a) {
  HL_CHECK(a.text.empty() && a.batches == 0 && a.batch_size == 0 && a.tokens == 0,
           "heads: --text, --batches, --batch-size and --tokens choose the data of the loss analyses; with "
           "--task/--pairs the prompt pairs are the data");
  HL_CHECK(a.device == "cpu",
           "heads: --task/--pairs runs on the CPU (its patching engine is not tested on CUDA), not '", a.device, "'");
  const std::shared_ptr<train::Collectives> comm = train::world();
  set_threads(a.threads, comm->local_size());
  const bool writer = comm->rank() == 0;
  std::ostream null_stream(nullptr);
  std::ostream& say = writer ? std::cout : null_stream;
  const Loaded in = load("heads", a.path, "cpu");
  nn::GPTModel& model = in.gpt("heads");
  const nn::GPTConfig& cfg = model.config();
  const MadePairs made = make_prompt_pairs(a.pairs, in, a.seed, "heads");
  const analysis::PromptPairs& pairs = made.pairs;
  const std::string home = in.from_folder ? a.path : std::filesystem::path(a.path).parent_path().string();
  const std::string out = a.out.empty() ? join_path(home, "heads") : a.out;
  std::optional<io::FolderLock> lock;
  if (writer) lock.emplace(make_locked_dir(out, "heads"));

  analysis::CircuitOptions copt;
  copt.collectives = comm;
  analysis::CircuitPatcher patcher(model, pairs, copt);
  const analysis::CircuitGraph& g = patcher.graph();
  const analysis::LogitDifference& base = patcher.baseline();
  std::vector<int64_t> heads;  // the graph's head nodes, layer-major
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (g.nodes()[static_cast<size_t>(n)].head >= 0) heads.push_back(n);
  say << "headlab heads: " << a.path << " (" << cfg.n_layers << " layers x " << cfg.n_heads << " heads"
      << (cfg.kept_heads.empty() ? "" : ", pruned: kept " + kept_str(cfg.kept_heads))
      << ")\nprompt pairs: " << pairs.rows() << " rows of " << pairs.T << " tokens (" << made.source << ")\n"
      << (pairs.probability_metric() ? "probability difference (p(years above the start) - p(the rest))"
                                     : "logit difference (answer - wrong)")
      << " at the last position: clean " << fmt(base.clean_mean, 4) << ", corrupted " << fmt(base.corrupt_mean, 4)
      << "; effects below are on the normalised metric (clean 1, corrupted 0)\n";

  analysis::NodeAblation abl;
  analysis::ActivationPatching act;
  const double ablation_s = timed([&] { abl = analysis::ablate_nodes(patcher, heads); });
  const double patching_s = timed([&] { act = analysis::activation_patching(patcher, heads, a.by_position); });
  const analysis::DirectLogitAttribution dla = patcher.direct_logit_attribution();
  analysis::Batch clean;  // the clean prompts as evaluation data: head types and the explorer read them
  clean.B = pairs.rows(), clean.T = pairs.T, clean.inputs = pairs.clean;
  clean.targets.assign(pairs.clean.size(), kIgnoreIndex);
  for (int64_t r = 0; r < clean.B; ++r) {
    for (int64_t t = 0; t + 1 < clean.T; ++t)
      clean.targets[static_cast<size_t>(r * clean.T + t)] = pairs.clean[static_cast<size_t>(r * clean.T + t + 1)];
    clean.targets[static_cast<size_t>((r + 1) * clean.T - 1)] = pairs.answer[static_cast<size_t>(r)];
  }
  analysis::EvalSet clean_set;
  clean_set.batches.push_back(clean);
  analysis::HeadTypeOptions to;
  to.seed = a.seed;
  const analysis::HeadTypes types = analysis::head_types(model, clean_set, to);
  say << "ablation (zero, mean) " << fmt(ablation_s, 2) << " s, activation patching " << fmt(patching_s, 2) << " s, "
      << patcher.forwards() << " patched forwards\n";

  // One table: a row per head.
  analysis::Table t("heads, by the largest effect (all in heads.csv)",
                    {analysis::text_column("head"),
                     {"zero_ablation", analysis::NumberFormat::signed_fixed, 3},
                     {"mean_ablation", analysis::NumberFormat::signed_fixed, 3},
                     {"resample_ablation", analysis::NumberFormat::signed_fixed, 3},
                     {"denoising", analysis::NumberFormat::signed_fixed, 3},
                     {"dla_logits", analysis::NumberFormat::signed_fixed, 3},
                     {"previous_token", analysis::NumberFormat::fixed, 2},
                     {"induction", analysis::NumberFormat::fixed, 2},
                     {"duplicate_token", analysis::NumberFormat::fixed, 2},
                     {"first_token", analysis::NumberFormat::fixed, 2},
                     analysis::text_column("type")});
  analysis::HeadMatrix m_mean, m_resample, m_denoising, m_dla;
  std::vector<double> size;  // the largest |effect| of a head, which orders the terminal's rows
  for (size_t i = 0; i < heads.size(); ++i) {
    const analysis::CircuitGraph::Node& n = g.nodes()[static_cast<size_t>(heads[i])];
    const analysis::HeadTypeScores& ty = types.heads[i];
    const double zero = abl.zero[i] - 1, mean = abl.mean[i] - 1, resample = act.noising[i] - 1;
    t.add_row({g.node_name(heads[i]), zero, mean, resample, act.denoising[i], dla.node[static_cast<size_t>(heads[i])],
               ty.previous_token, ty.induction, ty.duplicate_token, ty.first_token, ty.label});
    for (analysis::HeadMatrix* mm : {&m_mean, &m_resample, &m_denoising, &m_dla})
      if (static_cast<int64_t>(mm->size()) <= n.layer) mm->resize(static_cast<size_t>(n.layer + 1));
    m_mean[static_cast<size_t>(n.layer)].push_back(mean);
    m_resample[static_cast<size_t>(n.layer)].push_back(resample);
    m_denoising[static_cast<size_t>(n.layer)].push_back(act.denoising[i]);
    m_dla[static_cast<size_t>(n.layer)].push_back(dla.node[static_cast<size_t>(heads[i])]);
    size.push_back(std::max({std::abs(mean), std::abs(resample), std::abs(act.denoising[i])}));
  }
  std::vector<size_t> order(heads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return size[x] > size[y]; });
  analysis::Table top(t.title, t.columns);
  for (size_t i = 0; i < std::min<size_t>(12, order.size()); ++i) top.rows.push_back(t.rows[order[i]]);
  say << "\n"
      << analysis::render_text(top)
      << "ablation and patching: the change of the normalised metric (denoising: the share of the clean behaviour "
         "restored);\nDLA: the head's direct share of the clean logit difference answer - wrong ("
      << fmt(dla.clean, 4) << "; final norm's scale frozen); types: attention-pattern scores on the clean prompts\n";

  std::string by_position_csv;
  if (a.by_position) {
    by_position_csv = "head,position,noising_effect,denoising\n";
    for (size_t i = 0; i < heads.size(); ++i)
      for (int64_t p = 0; p < pairs.T; ++p)
        by_position_csv += g.node_name(heads[i]) + "," + std::to_string(p) + "," +
                           fmt_signed(act.noising_by_position[i][static_cast<size_t>(p)] - 1, 6) + "," +
                           fmt(act.denoising_by_position[i][static_cast<size_t>(p)], 6) + "\n";
  }
  if (!writer) return 0;
  write_text(join_path(out, "heads.csv"), analysis::render_csv(t), "heads");
  if (a.by_position) write_text(join_path(out, "heads_by_position.csv"), by_position_csv, "heads");
  analysis::save_head_map_png(join_path(out, "ablation.png"),
                              {"mean ablation: change of the normalised metric", "effect", m_mean, {}, {}}, model);
  analysis::save_head_map_png(
      join_path(out, "patching.png"),
      {"activation patching, denoising: share of the clean behaviour restored", "fraction", m_denoising, {}, {}},
      model);
  analysis::save_head_map_png(join_path(out, "dla.png"),
                              {"direct logit attribution: answer - wrong", "logit", m_dla, {}, {}}, model);
  analysis::save_row_explorer(join_path(out, "attention.html"), model, *in.task, clean, 0, a.path + ": clean prompt 0",
                              {{"mean ablation", m_mean},
                               {"resample ablation", m_resample},
                               {"denoising", m_denoising},
                               {"DLA (answer - wrong)", m_dla}});
  std::ostringstream md;
  md << "# Heads of " << a.path << " on prompt pairs\n\nPrompt pairs: " << pairs.rows() << " rows of " << pairs.T
     << " tokens (" << made.source << "); clean metric " << fmt(base.clean_mean, 4) << ", corrupted "
     << fmt(base.corrupt_mean, 4)
     << ". Ablation and patching columns are changes of the normalised metric (clean 1, corrupted 0): zero and "
        "mean ablation (the head's mean output over the prompts at each position), resample ablation (the "
        "corrupted prompt's output, activation patching's noising); denoising is the share of the clean behaviour "
        "one head's clean output restores in the corrupted run; DLA is in logits of answer - wrong.\n\n"
     << "![mean ablation](ablation.png) ![denoising](patching.png) ![DLA](dla.png)\n\n"
     << analysis::render_markdown(t);
  write_text(join_path(out, "report.md"), md.str(), "heads");
  std::cout << "\nwrote " << out << "/{heads.csv, " << (a.by_position ? "heads_by_position.csv, " : "")
            << "report.md, ablation.png, patching.png, dla.png, attention.html}\n";
  return 0;
}

}  // namespace

Action add_heads(CLI::App& app) {
  auto a = std::make_shared<HeadsArgs>();
  add_analysis_options(app, *a, "heads");
  app.add_flag("--by-position", a->by_position,
               "activation patching per head and position too (denoising; on prompt pairs noising too, "
               "heads_by_position.csv)");
  add_prompt_pair_options(app, a->pairs);
  add_seed_option(app, a->seed, "which prompt digit the corruption changes (tasks); the generated prompt pairs");
  return [a] {
    if (a->pairs.given()) return heads_on_pairs(*a);
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
