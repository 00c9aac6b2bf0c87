// headlab heads on prompt pairs (analysis/heads_pairs.h): the patcher's per-head analyses, the table, the files.
#include "analysis/heads_pairs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "analysis/explorer.h"
#include "analysis/files.h"
#include "io/atomic_file.h"

namespace headlab::analysis {

namespace {

// The clean prompts as evaluation data: each position's target the next token, the last one the answer.
Batch clean_batch(const PromptPairs& pairs) {
  Batch clean;
  clean.B = pairs.rows(), clean.T = pairs.T, clean.inputs = pairs.clean;
  clean.targets.assign(pairs.clean.size(), kIgnoreIndex);
  for (int64_t r = 0; r < clean.B; ++r) {
    for (int64_t t = 0; t + 1 < clean.T; ++t)
      clean.targets[static_cast<size_t>(r * clean.T + t)] = pairs.clean[static_cast<size_t>(r * clean.T + t + 1)];
    clean.targets[static_cast<size_t>((r + 1) * clean.T - 1)] = pairs.answer[static_cast<size_t>(r)];
  }
  return clean;
}

std::string metric_text(const PromptPairs& pairs) {
  return pairs.probability_metric() ? "probability difference (p(years above the start) - p(the rest))"
                                    : "logit difference (answer - wrong)";
}

// The time taken, then the 12 heads with the largest |effect|.
std::string results_text(const PairHeads& r) {
  std::ostringstream os;
  os << "ablation (zero, mean) " << fmt(r.ablation_seconds, 2) << " s, activation patching "
     << fmt(r.patching_seconds, 2) << " s, " << r.forwards << " patched forwards\n";
  std::vector<double> size;
  for (size_t i = 0; i < r.heads.size(); ++i)
    size.push_back(std::max(
        {std::abs(r.ablation.mean[i] - 1), std::abs(r.patching.noising[i] - 1), std::abs(r.patching.denoising[i])}));
  std::vector<size_t> order(r.heads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return size[x] > size[y]; });
  Table top(r.table.title, r.table.columns);
  for (size_t i = 0; i < std::min<size_t>(12, order.size()); ++i) top.rows.push_back(r.table.rows[order[i]]);
  os << "\n"
     << render_text(top)
     << "ablation and patching: the change of the normalised metric (denoising: the share of the clean behaviour "
        "restored);\nDLA: the head's direct share of the clean logit difference answer - wrong ("
     << fmt(r.dla.clean, 4) << "; final norm's scale frozen); types: attention-pattern scores on the clean prompts\n";
  if (!r.kv_table.rows.empty()) os << "\n" << render_text(r.kv_table);
  return os.str();
}

}  // namespace

PairHeads heads_on_pairs(nn::DecoderModel& model, const PromptPairs& pairs, const PairHeadsOptions& o, const Say& say) {
  const auto timed = [](auto&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  HeadTypeOptions to;  // checked before any work: no failure after the results were printed
  to.seed = o.seed;
  check_head_types(model.shape(), pairs.T, to);
  CircuitOptions copt;
  copt.collectives = o.collectives;
  copt.stored_rows = o.stored_rows;
  CircuitPatcher patcher(model, pairs, copt);
  const CircuitGraph& g = patcher.graph();
  PairHeads r;
  r.baseline = patcher.baseline();
  const nn::DecoderShape& shape = model.shape();
  if (say)
    say("headlab heads: " + o.checkpoint + " (" + std::to_string(shape.n_layers) + " layers x " +
        std::to_string(shape.n_heads) + " heads" +
        (shape.kept_heads.empty() ? "" : ", pruned: kept " + kept_heads_text(shape.kept_heads)) +
        ")\nprompt pairs: " + std::to_string(pairs.rows()) + " rows of " + std::to_string(pairs.T) + " tokens (" +
        o.source + ")\n" + metric_text(pairs) + " at the last position: clean " + fmt(r.baseline.clean_mean, 4) +
        ", corrupted " + fmt(r.baseline.corrupt_mean, 4) +
        "; effects below are on the normalised metric (clean 1, corrupted 0)\n" + stored_runs_text(patcher));
  if (const std::string w = r.baseline.warning(pairs.probability_metric()); say && !w.empty()) say("warning: " + w + "\n");
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (g.nodes()[static_cast<size_t>(n)].head >= 0) r.heads.push_back(n), r.names.push_back(g.node_name(n));
  r.ablation_seconds = timed([&] { r.ablation = ablate_nodes(patcher, r.heads); });
  r.patching_seconds = timed([&] { r.patching = activation_patching(patcher, r.heads, o.by_position); });
  if (o.kv_groups) {
    r.patching_seconds += timed([&] { r.key_values = key_value_patching(patcher); });
    r.kv_table = Table("key/value groups: their keys and values from the corrupted prompt (kv_groups.csv)",
                       {text_column("group"), text_column("query_heads"), signed_column("resample_keys_values", 3)});
    for (size_t i = 0; i < r.key_values.groups.size(); ++i) {
      std::string heads;
      for (int64_t n : r.key_values.heads[i]) heads.append(heads.empty() ? "" : " ").append(g.node_name(n));
      r.kv_table.add_row({r.key_values.groups[i], heads, r.key_values.noising[i] - 1});
    }
  }
  r.dla = patcher.direct_logit_attribution();
  r.forwards = patcher.forwards();
  r.clean = clean_batch(pairs);
  EvalSet clean_set;
  clean_set.batches.push_back(r.clean);
  r.types = head_types(model, clean_set, to);

  r.table = Table("heads, by the largest effect (all in heads.csv)",
                  {text_column("head"), signed_column("zero_ablation", 3), signed_column("mean_ablation", 3),
                   signed_column("resample_ablation", 3), signed_column("denoising", 3), signed_column("dla_logits", 3),
                   fixed_column("previous_token", 2), fixed_column("induction", 2), fixed_column("duplicate_token", 2),
                   fixed_column("first_token", 2), text_column("type")});
  for (HeadMatrix* m : {&r.mean, &r.resample, &r.denoising, &r.dla_heads}) *m = head_matrix(model, std::nan(""));
  for (size_t i = 0; i < r.heads.size(); ++i) {
    const CircuitGraph::Node& n = g.nodes()[static_cast<size_t>(r.heads[i])];
    const HeadTypeScores& ty = r.types.heads[i];
    const double zero = r.ablation.zero[i] - 1, mean = r.ablation.mean[i] - 1, resample = r.patching.noising[i] - 1;
    const double dla = r.dla.node[static_cast<size_t>(r.heads[i])];
    r.table.add_row({r.names[i], zero, mean, resample, r.patching.denoising[i], dla, ty.previous_token, ty.induction,
                     ty.duplicate_token, ty.first_token, ty.label});
    const auto L = static_cast<size_t>(n.layer), H = static_cast<size_t>(n.head);
    r.mean[L][H] = mean, r.resample[L][H] = resample, r.denoising[L][H] = r.patching.denoising[i];
    r.dla_heads[L][H] = dla;
  }
  if (say) say(results_text(r));
  return r;
}

std::vector<std::string> write_pair_heads_files(const std::string& out, nn::DecoderModel& model,
                                                const tasks::Task& task, const PromptPairs& pairs,
                                                const PairHeadsOptions& o, const PairHeads& r) {
  const auto path = [&](const char* name) { return (std::filesystem::path(out) / name).string(); };
  std::vector<std::string> wrote = {"heads.csv"};
  io::write_file_atomic(path("heads.csv"), render_csv(r.table), "heads");
  if (!r.patching.denoising_by_position.empty()) {
    std::string csv = "head,position,noising_effect,denoising\n";
    for (size_t i = 0; i < r.heads.size(); ++i)
      for (int64_t p = 0; p < pairs.T; ++p)
        csv += r.names[i] + "," + std::to_string(p) + "," +
               fmt_signed(r.patching.noising_by_position[i][static_cast<size_t>(p)] - 1, 6) + "," +
               fmt(r.patching.denoising_by_position[i][static_cast<size_t>(p)], 6) + "\n";
    io::write_file_atomic(path("heads_by_position.csv"), csv, "heads");
    wrote.push_back("heads_by_position.csv");
  }
  if (!r.kv_table.rows.empty()) {
    io::write_file_atomic(path("kv_groups.csv"), render_csv(r.kv_table), "heads");
    wrote.push_back("kv_groups.csv");
  }
  save_head_map_png(path("ablation.png"), {"mean ablation: change of the normalised metric", "effect", r.mean, {}, {}},
                    model);
  save_head_map_png(
      path("patching.png"),
      {"activation patching, denoising: share of the clean behaviour restored", "fraction", r.denoising, {}, {}},
      model);
  save_head_map_png(path("dla.png"), {"direct logit attribution: answer - wrong", "logit", r.dla_heads, {}, {}}, model);
  save_row_explorer(path("attention.html"), model, task, r.clean, 0, o.checkpoint + ": clean prompt 0",
                    {{"mean ablation", r.mean},
                     {"resample ablation", r.resample},
                     {"denoising", r.denoising},
                     {"DLA (answer - wrong)", r.dla_heads}});
  std::ostringstream md;
  md << "# Heads of " << o.checkpoint << " on prompt pairs\n\nPrompt pairs: " << pairs.rows() << " rows of " << pairs.T
     << " tokens (" << o.source << "); clean metric " << fmt(r.baseline.clean_mean, 4) << ", corrupted "
     << fmt(r.baseline.corrupt_mean, 4)
     << ". Ablation and patching columns are changes of the normalised metric (clean 1, corrupted 0): zero and "
        "mean ablation (the head's mean output over the prompts at each position), resample ablation (the "
        "corrupted prompt's output, activation patching's noising); denoising is the share of the clean behaviour "
        "one head's clean output restores in the corrupted run; DLA is in logits of answer - wrong.\n\n";
  if (const std::string w = r.baseline.warning(pairs.probability_metric()); !w.empty())
    md << "**Warning:** " << w << ".\n\n";
  md
     << "![mean ablation](ablation.png) ![denoising](patching.png) ![DLA](dla.png)\n\n"
     << render_markdown(r.table);
  if (!r.kv_table.rows.empty())
    md << "\nKey/value groups: the change of the normalised metric when a group's keys and values come from the "
          "corrupted prompt (every query head of the group reads them).\n\n"
       << render_markdown(r.kv_table);
  io::write_file_atomic(path("report.md"), md.str(), "heads");
  wrote.insert(wrote.end(), {"report.md", "ablation.png", "patching.png", "dla.png", "attention.html"});
  return wrote;
}

}  // namespace headlab::analysis
