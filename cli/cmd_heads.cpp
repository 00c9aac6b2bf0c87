// headlab heads: what every attention head of a checkpoint does, in one command: zero/mean/resample
// ablation, direct logit attribution, activation patching (noising and denoising), head types.
// Writes heads.csv (a row per head, a column per score), report.md and its pictures.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "analysis/analysis.h"
#include "analysis/explorer.h"
#include "analysis/head_scores.h"
#include "analysis/patching.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "tasks/algorithmic.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {

struct HeadsArgs : AnalysisArgs {
  uint64_t seed = 1;
  bool by_position = false;
};

using analysis::HeadMatrix;

// What every analysis found, by (layer, model-local head).
struct Findings {
  analysis::AblationResult ablation;
  analysis::LogitAttribution dla;
  analysis::PatchingResult patching;
  analysis::HeadTypes types;
  std::string corruption;  // how the corrupted inputs were made
  double seconds_ablation = 0, seconds_dla = 0, seconds_patching = 0, seconds_types = 0;
};

HeadMatrix by_head(const nn::GPTModel& m, const auto& rows, auto value) {
  HeadMatrix v = analysis::head_matrix(m, std::nan(""));
  for (const auto& r : rows) v[static_cast<size_t>(r.layer)][static_cast<size_t>(r.head)] = value(r);
  return v;
}

analysis::HeadColumn column(const std::string& name, const HeadMatrix& values) {
  analysis::HeadColumn c{name, {}};
  for (const auto& row : values) {
    auto& out = c.values.emplace_back();
    for (double v : row) out.push_back(fmt(v, 6));
  }
  return c;
}

template <class F>
double timed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "| L0H1 | v | v |" rows of a head table, heads in `order`.
void head_rows(std::ostream& os, const nn::GPTConfig& cfg, const std::vector<std::pair<int64_t, int64_t>>& order,
               const std::vector<std::pair<std::string, HeadMatrix>>& cols) {
  os << "| head |";
  for (const auto& [name, v] : cols) os << " " << name << " |";
  os << "\n|---|";
  for (size_t i = 0; i < cols.size(); ++i) os << "---|";
  os << "\n";
  for (const auto& [l, h] : order) {
    os << "| " << analysis::head_label(l, analysis::original_head(cfg, l, h)) << " |";
    for (const auto& [name, v] : cols) os << " " << fmt_signed(v[static_cast<size_t>(l)][static_cast<size_t>(h)], 3) << " |";
    os << "\n";
  }
}

// Heads sorted by |value| descending.
std::vector<std::pair<int64_t, int64_t>> by_magnitude(const HeadMatrix& v) {
  std::vector<std::pair<int64_t, int64_t>> order;
  for (size_t l = 0; l < v.size(); ++l)
    for (size_t h = 0; h < v[l].size(); ++h) order.emplace_back(l, h);
  std::stable_sort(order.begin(), order.end(), [&](auto& a, auto& b) {
    return std::fabs(v[static_cast<size_t>(a.first)][static_cast<size_t>(a.second)]) >
           std::fabs(v[static_cast<size_t>(b.first)][static_cast<size_t>(b.second)]);
  });
  return order;
}

}  // namespace

Action add_heads(CLI::App& app) {
  auto a = std::make_shared<HeadsArgs>();
  add_analysis_options(app, *a, "heads");
  app.add_flag("--by-position", a->by_position,
               "activation patching per head and position too (denoising; a pass per position)");
  app.add_option("--seed", a->seed, "which prompt digit the corruption changes (tasks)")->capture_default_str();
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
              << ")\ndata: " << n << " validation batches of " << B << " x " << cfg.context_length << " ("
              << data.tokens() << " scored tokens)\n";

    Findings f;
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

    const auto& abl = f.ablation;
    const HeadMatrix zero = by_head(model, abl.heads, [&](auto& h) { return h.zero.loss - abl.base.loss; });
    const HeadMatrix mean = by_head(model, abl.heads, [&](auto& h) { return h.mean.loss - abl.base.loss; });
    const HeadMatrix resample = by_head(model, abl.heads, [&](auto& h) { return h.resample.loss - abl.base.loss; });
    const HeadMatrix noising = by_head(model, f.patching.heads, [](auto& p) { return p.noising; });
    const HeadMatrix denoising = by_head(model, f.patching.heads, [](auto& p) { return p.denoising; });
    const HeadMatrix& dla = f.dla.vs_mean.heads;
    const auto& types = f.types.heads;
    auto type_score = [&](double analysis::HeadTypeScores::*field) {
      return by_head(model, types, [&](auto& t) { return t.*field; });
    };
    const HeadMatrix prev = type_score(&analysis::HeadTypeScores::previous_token),
                     first = type_score(&analysis::HeadTypeScores::first_token),
                     sep = type_score(&analysis::HeadTypeScores::separator),
                     entropy = type_score(&analysis::HeadTypeScores::entropy),
                     entropy_norm = type_score(&analysis::HeadTypeScores::entropy_normalized),
                     induction = type_score(&analysis::HeadTypeScores::induction),
                     duplicate = type_score(&analysis::HeadTypeScores::duplicate_token);
    analysis::HeadColumn labels{"label", {}};
    for (int64_t l = 0; l < model.n_layers(); ++l) labels.values.emplace_back(static_cast<size_t>(model.attention(l).head_count()));
    for (const auto& t : types) labels.values[static_cast<size_t>(t.layer)][static_cast<size_t>(t.head)] = t.label;

    // terminal: one line per head
    std::cout << "unablated: loss " << fmt(abl.base.loss) << ", token accuracy " << fmt(abl.base.token_accuracy)
              << "\n\n  " << pad("head", 7) << pad("zero dloss", 12) << pad("resample", 12) << pad("DLA", 10)
              << pad("noising", 10) << pad("denoising", 10) << "  type\n";
    for (int64_t l = 0; l < model.n_layers(); ++l)
      for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
        const auto L = static_cast<size_t>(l), H = static_cast<size_t>(h);
        std::cout << "  " << pad(analysis::head_label(l, analysis::original_head(cfg, l, h)), 7)
                  << pad(fmt_signed(zero[L][H]), 12) << pad(fmt_signed(resample[L][H]), 12)
                  << pad(fmt_signed(dla[L][H], 3), 10) << pad(fmt_signed(noising[L][H], 3), 10)
                  << pad(fmt_signed(denoising[L][H], 3), 10) << "  " << labels.values[L][H] << "\n";
      }
    std::cout << "DLA: each head's direct share of logit(correct) - mean logit (final norm's scale frozen), mean over "
              << f.dla.tokens << " tokens; the components sum to " << fmt(f.dla.vs_mean.sum(), 4) << " (model: "
              << fmt(f.dla.vs_mean.total, 4) << ")\npatching: " << f.corruption << "; corrupted loss "
              << fmt(f.patching.corrupted.loss) << " vs clean " << fmt(f.patching.clean.loss)
              << "; effects are fractions of that gap\n";

    std::vector<analysis::HeadColumn> extra = {
        column("dla_logit_vs_mean", dla), column("dla_logit", f.dla.logit.heads),
        column("patch_noising", noising), column("patch_denoising", denoising),
        column("previous_token", prev), column("first_token", first), column("separator", sep),
        column("entropy", entropy), column("entropy_normalized", entropy_norm), column("induction", induction),
        column("duplicate_token", duplicate), labels};
    analysis::save_heads_csv(join_path(out, "heads.csv"), abl, extra);
    analysis::save_head_map_png(join_path(out, "dla.png"),
                                {"direct logit attribution: logit(correct) - mean logit", "logit", dla, {}, {}}, model);
    analysis::save_head_map_png(join_path(out, "patching.png"),
                                {"activation patching, denoising: fraction of the loss gap restored", "fraction",
                                 denoising, {}, {}},
                                model);

    analysis::save_head_maps_png(join_path(out, "types.png"),
                                 "head types: attention-pattern scores (entropy as a fraction of its maximum)",
                                 {{"previous token", "score", prev, {}, {}},
                                  {"first token", "score", first, {}, {}},
                                  {"induction", "score", induction, {}, {}},
                                  {"entropy", "score", entropy_norm, {}, {}}},
                                 model, 0.0, 1.0);
    analysis::save_head_map_png(join_path(out, "ablation.png"),
                                {"resample ablation: loss increase", "d loss", resample, 0.0, {}}, model);
    // The explorer page on the first validation row, with every score beside its head.
    analysis::save_row_explorer(join_path(out, "attention.html"), model, *in.task, data.batches.front(), 0,
                                a->path + ": validation row 0",
                                {{"resample: d loss", resample}, {"zero: d loss", zero}, {"DLA (vs mean)", dla},
                                 {"patching: denoising", denoising}, {"previous token", prev},
                                 {"induction", induction}, {"entropy / max", entropy_norm}});
    std::ostringstream md;
    md << "# Heads of `" << a->path << "`\n\nEvery head's attention on a validation row, with these scores "
          "beside it: [attention.html](attention.html) (open it in a browser).\n\n";
    md << "| | |\n|---|---|\n| task | " << in.task->name() << " |\n| model | " << cfg.n_layers << " layers x "
       << cfg.n_heads << " heads, emb " << cfg.emb_dim << " |\n| data | " << n << " validation batches of " << B << " x "
       << cfg.context_length << ", " << data.tokens() << " scored tokens |\n| unablated | loss " << fmt(abl.base.loss)
       << ", token accuracy " << fmt(abl.base.token_accuracy) << " |\n| time | ablation " << fmt(f.seconds_ablation, 2)
       << " s (" << 3 * abl.heads.size() << " ablations, one batched pass), DLA " << fmt(f.seconds_dla, 2)
       << " s, patching " << fmt(f.seconds_patching, 2) << " s, head types " << fmt(f.seconds_types, 2) << " s |\n\n";
    md << "## Ablation\n\nLoss increase when the head's context is replaced by zero, its mean over the data, or its "
          "context on another row (resample), on "
       << data.tokens() << " scored tokens.\n\n";
    md << "![resample ablation](ablation.png)\n\n";
    head_rows(md, cfg, by_magnitude(resample), {{"zero: d loss", zero}, {"mean: d loss", mean}, {"resample: d loss", resample}});
    md << "\n## Direct logit attribution\n\nEach head's direct contribution, through out_proj and the unembedding "
          "with the final layer norm's scale frozen per token, to logit(correct) minus the mean logit (and to the "
          "raw correct logit), mean over "
       << f.dla.tokens << " scored tokens. Embeddings " << fmt_signed(f.dla.vs_mean.embeddings, 3)
       << ", final norm shift " << fmt_signed(f.dla.vs_mean.final_shift, 3) << ", feed-forward blocks";
    for (double v : f.dla.vs_mean.feed_forward) md << " " << fmt_signed(v, 3);
    md << ", out_proj biases";
    for (double v : f.dla.vs_mean.out_proj_bias) md << " " << fmt_signed(v, 3);
    md << "; everything sums to " << fmt(f.dla.vs_mean.sum(), 4) << " = the model's " << fmt(f.dla.vs_mean.total, 4)
       << ".\n\n![direct logit attribution](dla.png)\n\n";
    head_rows(md, cfg, by_magnitude(dla), {{"DLA vs mean", dla}, {"DLA raw logit", f.dla.logit.heads}});
    md << "\n## Activation patching\n\nCorrupted input: " << f.corruption << ". Clean loss " << fmt(f.patching.clean.loss)
       << ", corrupted " << fmt(f.patching.corrupted.loss) << " (on the clean targets, " << f.patching.tokens
       << " tokens). Noising: the clean run with the head's context from the corrupted run, as a fraction of the "
          "gap it opens; denoising: the corrupted run with the head's clean context, the fraction of the gap it "
          "closes.\n\n![patching](patching.png)\n\n";
    head_rows(md, cfg, by_magnitude(denoising), {{"noising", noising}, {"denoising", denoising}});
    if (a->by_position) {
      md << "\n### Denoising by position\n\n| head |";
      const int64_t T = data.batches.front().T;
      for (int64_t t = 0; t < T; ++t) md << " " << t << " |";
      md << "\n|---|";
      for (int64_t t = 0; t < T; ++t) md << "---|";
      md << "\n";
      for (const auto& p : f.patching.heads) {
        md << "| " << analysis::head_label(p.layer, p.original_head) << " |";
        for (double v : p.denoising_by_position) md << " " << fmt(v, 2) << " |";
        md << "\n";
      }
    }
    const auto& ht = f.types;
    md << "\n## Head types\n\nMean attention weight on the previous token, the first token and the separator, over "
       << ht.queries << " query positions of the data (" << ht.separator_queries
       << " after a separator); mean attention entropy (nats, and divided by its maximum log(q+1)); induction and "
          "duplicate-token scores on "
       << ht.induction_rows << " rows of " << ht.induction_half << " random tokens repeated twice ("
       << ht.induction_queries << " queries). A label when a score is clear: >= " << fmt(analysis::kPatternThreshold, 1)
       << " for the pattern scores, >= " << fmt(analysis::kRepeatThreshold, 1) << " for induction and duplicate-token, "
       << "normalised entropy >= " << fmt(analysis::kBroadThreshold, 1) << " for broad.\n\n![head types](types.png)\n\n"
       << "| head | previous | first | separator | entropy | entropy / max | induction | duplicate | label |\n"
       << "|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& t : ht.heads)
      md << "| " << analysis::head_label(t.layer, t.original_head) << " | " << fmt(t.previous_token, 3) << " | "
         << fmt(t.first_token, 3) << " | " << fmt(t.separator, 3) << " | " << fmt(t.entropy, 3) << " | "
         << fmt(t.entropy_normalized, 3) << " | " << fmt(t.induction, 3) << " | " << fmt(t.duplicate_token, 3) << " | "
         << t.label << " |\n";
    write_text(join_path(out, "report.md"), md.str(), "heads");
    std::cout << "\nwrote " << out << "/{heads.csv, report.md, ablation.png, dla.png, patching.png, types.png, attention.html}\n";
    return 0;
  };
}

}  // namespace headlab::cli
