// headlab heads: what every attention head of a checkpoint does, in one command: option parsing, then on
// the task's data analysis::find_heads (analysis/heads_report.h: ablation, logit attribution, patching,
// head types, composition), or on prompt pairs (--task ioi|greater-than|induction, --pairs FILE)
// analysis::heads_on_pairs (analysis/heads_pairs.h), and their files; given a folder of one run's checkpoints,
// every head's scores at each (analysis/heads_over_time.h), as train --track-heads records them.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "analysis/files.h"
#include "analysis/heads_over_time.h"
#include "analysis/heads_pairs.h"
#include "analysis/heads_report.h"
#include "analysis/residual.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "io/sources.h"
#include "nn/generate.h"
#include "train/collectives.h"

namespace headlab::cli {

namespace {

struct HeadsArgs : AnalysisArgs {
  uint64_t seed = 1;
  bool by_position = false;
  std::string by = "head";
  PromptPairArgs pairs;
  std::string logit_lens;  // a prompt
  const CLI::Option* logit_lens_option = nullptr;
};

// The logit lens on one prompt (a task model's: the prompt and its greedy answer): logit_lens.png and .csv, and
// on the terminal each stream's rank of the next token at every position (the shortest prompts) or its mean.
int heads_logit_lens(const HeadsArgs& a) {
  HL_CHECK(a.text.empty() && a.batches == 0 && a.batch_size == 0 && a.tokens == 0 && !a.by_position,
           "heads: --logit-lens reads one prompt; --text, --batches, --batch-size, --tokens and --by-position choose "
           "the data of the other analyses");
  set_threads(a.threads);
  const Loaded in = load("heads", a.path, a.device, "", a.tokenizer);
  nn::DecoderModel& model = in.decoder("heads --logit-lens");
  const tasks::Prompt p = in.task->encode_prompt(a.logit_lens);
  std::vector<int64_t> ids = p.ids;
  const int64_t context = model.shape().context_length;
  HL_CHECK(static_cast<int64_t>(ids.size()) <= context, "heads: --logit-lens: the prompt is ", ids.size(),
           " tokens, longer than the model's context of ", context);
  if (p.answer_length >= 0) {  // a task's prompt: the lens follows the answer the model gives
    nn::GenerateOptions gen;
    gen.max_new_tokens = std::min<int64_t>(p.answer_length + 1, context - static_cast<int64_t>(ids.size()));
    gen.end_id = in.task->end_id();
    gen.keep_end = true;
    for (int64_t id : nn::generate(model, ids, gen)) ids.push_back(id);
  }
  HL_CHECK(ids.size() >= 2, "heads: --logit-lens: the prompt '", a.logit_lens, "' is ",
           count_of(static_cast<int64_t>(ids.size()), "token", "tokens"), "; the lens needs a position and the token after it");
  const analysis::LogitLens lens = analysis::logit_lens(model, ids);
  std::vector<std::string> tokens;
  for (int64_t id : ids) tokens.push_back(in.task->token_text(id));
  const std::string out = output_folder(a.path, a.out, "heads");
  const io::FolderLock lock = make_locked_dir(out, "heads");
  analysis::save_logit_lens_png(join_path(out, "logit_lens.png"), lens, tokens);
  write_text(join_path(out, "logit_lens.csv"), analysis::logit_lens_csv(lens, tokens), "heads");
  std::cout << "headlab heads --logit-lens: " << a.path << ", " << lens.T << " tokens; each stream read out through "
            << "ln_final and the unembedding (final_post: the model's own prediction)\n";
  const bool each = lens.T - 1 <= 16;
  std::cout << pad("stream", 12, true) << (each ? "rank of the next token at each position" : "mean probability")
            << "\n";
  if (each) {
    std::cout << pad("", 12, true);
    for (int64_t t = 1; t < lens.T; ++t) std::cout << pad(tokens[static_cast<size_t>(t)].substr(0, 7), 8);
    std::cout << "\n";
  }
  for (size_t r = 0; r < lens.rows.size(); ++r) {
    std::cout << pad(lens.rows[r], 12, true);
    double mean = 0;
    for (int64_t t = 0; t + 1 < lens.T; ++t) {
      if (each) std::cout << pad(std::to_string(static_cast<int64_t>(lens.rank_at(r, t))), 8);
      mean += lens.prob_at(r, t) / static_cast<double>(lens.T - 1);
    }
    std::cout << (each ? "" : fmt(mean, 4)) << "\n";
  }
  std::cout << "\nwrote " << wrote_line(out, {"logit_lens.png", "logit_lens.csv"}) << "\n";
  return 0;
}

// On prompt pairs. Under mpirun the ranks share the prompt rows; rank 0 prints and writes.
int heads_on_pairs(const HeadsArgs& a) {
  HL_CHECK(a.text.empty() && a.batches == 0 && a.batch_size == 0 && a.tokens == 0,
           "heads: --text, --batches, --batch-size and --tokens choose the data of the loss analyses; with "
           "--task/--pairs the prompt pairs are the data");
  HL_CHECK(a.device == "cpu",
           "heads: --task/--pairs runs on the CPU (its patching engine is not tested on CUDA), not '", a.device, "'");
  const std::shared_ptr<train::Collectives> comm = train::world();
  set_threads(a.threads, comm->local_size());
  const bool writer = comm->rank() == 0;
  const Loaded in = load("heads", a.path, "cpu", "", a.tokenizer);
  nn::DecoderModel& model = in.decoder("heads");
  const MadePairs made = make_prompt_pairs(a.pairs, in, a.seed, "heads");
  const std::string out = output_folder(a.path, a.out, "heads");
  std::optional<io::FolderLock> lock;
  if (writer) lock.emplace(make_locked_dir(out, "heads"));
  analysis::PairHeadsOptions o;
  o.seed = a.seed, o.by_position = a.by_position, o.collectives = comm;
  o.kv_groups = a.by == "kv-group", o.stored_rows = a.pairs.stored_rows;
  o.checkpoint = a.path, o.source = made.source;
  const analysis::PairHeads r = analysis::heads_on_pairs(model, made.pairs, o, writer ? say : analysis::Say());
  if (!writer) return 0;
  std::cout << "\nwrote " << wrote_line(out, analysis::write_pair_heads_files(out, model, *in.task, made.pairs, o, r))
            << "\n";
  return 0;
}

// Over one run's checkpoints (analysis::checkpoint_series): each loaded in turn and observed on the same rows.
int heads_over_checkpoints(const HeadsArgs& a, const std::vector<std::pair<int64_t, std::string>>& series) {
  HL_CHECK(a.batches == 0 && a.batch_size == 0 && !a.by_position,
           "heads: --batches, --batch-size and --by-position choose the analyses of one checkpoint; over a folder of "
           "checkpoints each is scored on the same tracked rows (--tokens, --text)");
  set_threads(a.threads);
  const std::string out = output_folder(a.path, a.out, "heads");
  const io::FolderLock lock = make_locked_dir(out, "heads");
  analysis::HeadsOverTime tracker;
  for (const auto& [step, path] : series) {
    const Loaded in = load("heads", path, a.device, a.text, a.tokenizer);
    HL_CHECK(!in.from_folder || !a.text.empty(), "heads: '", path,
             "' is a model folder: give the text to score with --text FILE");
    const int64_t T = a.tokens > 0 ? a.tokens : in.config.batch_tokens();
    HL_CHECK(T <= in.config.batch_tokens(), "heads: --tokens ", T, " is longer than the context of '", path, "' (",
             in.config.batch_tokens(), ")");
    in.task->check_context_length(T);
    nn::DecoderModel& model = in.decoder("heads");
    tracker.check(model.shape(), T);
    if (step == series.front().first)  // after the first checkpoint's checks, which one run's checkpoints share
      std::cout << "headlab heads: " << series.size() << " checkpoints of one run in " << a.path << " (steps "
                << series.front().first << " to " << series.back().first << ")\n";
    tracker.observe(model, *in.task, T, step);
    const analysis::HeadsAtStep& s = tracker.history().back();
    const auto strongest = std::max_element(s.heads.begin(), s.heads.end(),
                                            [](const auto& x, const auto& y) { return x.induction < y.induction; });
    std::cout << "step " << step << ": loss " << analysis::fmt(s.loss, 4);
    if (std::isnan(s.icl))  // a task's rows: targets only at the answers
      std::cout << ", token accuracy " << analysis::fmt(s.token_accuracy, 3);
    else
      std::cout << ", in-context score " << analysis::fmt(s.icl, 3);
    std::cout << ", strongest induction score L" << strongest->layer << "H" << strongest->original_head << " "
              << analysis::fmt(strongest->induction, 2)
              << (strongest->induction < analysis::kRepeatThreshold ? " (under " + analysis::fmt(analysis::kRepeatThreshold, 1) + ": no induction head)" : std::string()) << "\n";
    analysis::save_tracking(tracker, out, "heads");
  }
  std::cout << analysis::finish_tracking(tracker, out);
  return 0;
}

}  // namespace

Action add_heads(CLI::App& app) {
  auto a = std::make_shared<HeadsArgs>();
  add_analysis_options(app, *a, "heads");
  app.add_flag("--by-position", a->by_position,
               "activation patching per head and position too (denoising; on prompt pairs noising too, "
               "heads_by_position.csv)");
  app.add_option("--by", a->by,
                 "head: every query head; kv-group: also each key/value group's keys and values patched from the "
                 "corrupted prompt (prompt pairs: --task or --pairs; grouped-query models share one per group)")
      ->check(CLI::IsMember({"head", "kv-group"}))
      ->capture_default_str();
  a->logit_lens_option = app.add_option(
      "--logit-lens", a->logit_lens,
      "the logit lens on this prompt (a task model's: with its answer): how likely the stream entering each layer, "
      "read out as the last is, finds the next token; logit_lens.png and .csv");
  add_prompt_pair_options(app, a->pairs);
  add_seed_option(app, a->seed, "which prompt digit the corruption changes (tasks); the generated prompt pairs");
  return [a] {
    if (a->logit_lens_option->count() > 0) {
      HL_CHECK(!a->pairs.given(), "heads: --logit-lens reads one prompt; --task/--pairs are prompt pairs, another run");
      return heads_logit_lens(*a);
    }
    if (a->pairs.given()) return heads_on_pairs(*a);
    HL_CHECK(a->by == "head", "heads: --by kv-group patches keys and values on prompt pairs; give --task or --pairs");
    a->pairs.refuse_without_pairs("heads");
    if (std::filesystem::is_directory(a->path) && !io::source_claiming(a->path))  // a folder, not a model's
      if (const auto series = analysis::checkpoint_series(a->path); !series.empty())
        return heads_over_checkpoints(*a, series);
    const AnalysisInputs ai = load_analysis(*a, "heads", "heads");
    const nn::DecoderModel& model = ai.in.decoder("heads");
    const nn::DecoderShape& shape = model.shape();
    analysis::check_find_heads(ai.in, ai.data);  // before the first line
    std::cout << "headlab heads: " << a->path << " (task " << ai.in.task->name() << ", " << shape.n_layers
              << " layers x " << shape.n_heads << " heads"
              << (shape.kept_heads.empty() ? "" : ", pruned: kept " + analysis::kept_heads_text(shape.kept_heads))
              << ")\ndata: " << count_of(ai.batches, "validation batch", "validation batches") << " of " << ai.batch_size << " x " << ai.tokens << " ("
              << ai.data.tokens() << " scored tokens)\n"
              << std::flush;
    analysis::HeadsOptions o;
    o.checkpoint = a->path, o.seed = a->seed, o.by_position = a->by_position;
    const analysis::HeadsFindings f = analysis::find_heads(ai.in, ai.data, o);
    const analysis::HeadsScores s = analysis::heads_scores(model, f);
    std::cout << analysis::heads_text(model, f, s);
    std::cout << "\nwrote " << wrote_line(ai.out, analysis::write_heads_files(ai.out, ai.in, ai.data, o, f, s)) << "\n";
    return 0;
  };
}

}  // namespace headlab::cli
