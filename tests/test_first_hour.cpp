// A new user's first hour (issue 68): each thing that stopped or misled a student and a researcher, held
// by a test so that it cannot come back. Reports agree with the measure they trust; metrics that cannot
// mean what they say are flagged; every command writes beside the model it read, whatever its format;
// the command explains itself (examples in --help, shell completion, defaults spelled out).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/ablation.h"
#include "analysis/circuit_report.h"
#include "analysis/machine_load.h"
#include "analysis/prompt_pairs.h"
#include "io/checkpoint.h"
#include "loader/load.h"
#include "ops/ops.h"
#include "tests/process_util.h"
#include "tests/tiny_models.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace headlab;
using headlab::testing::quote;
using headlab::testing::run_process;
using headlab::testing::slurp;
using headlab::testing::TempDir;

namespace {

const std::string kBinary = std::string(HEADLAB_BINARY_DIR) + "/headlab";
const std::string kStories = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/stories260K";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  ASSERT_TRUE(f.good()) << path;
}

headlab::testing::ProcessResult run_headlab(const std::vector<std::string>& args, const std::string& scratch) {
  std::vector<std::string> argv{kBinary};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, scratch, "OMP_NUM_THREADS=1");
}

// Eight heads (2 layers x 4) whose zero-ablation costs rise with their index while the gradient
// importance falls with it: the scores disagree, as on stories260K (Spearman -0.32).
analysis::AblationResult disagreeing_scores(bool reliable) {
  analysis::AblationResult a;
  a.base.loss = 1.0;
  for (int64_t i = 0; i < 8; ++i) {
    analysis::HeadAblation h;
    h.layer = i / 4, h.head = h.original_head = i % 4;
    h.zero.loss = a.base.loss + 0.1 * static_cast<double>(i);
    h.mean.loss = h.resample.loss = h.zero.loss;
    h.importance = h.importance_raw = reliable ? 0.1 * static_cast<double>(i) : 1.0 - 0.1 * static_cast<double>(i);
    a.heads.push_back(h);
  }
  return a;
}

}  // namespace

// ---- 2. reports agree with themselves ----

TEST(FirstHour, AblationRanksByTheMeasureItTrusts) {
  const auto model = std::make_shared<nn::DecoderModel>(headlab::testing::tiny_gpt_config(headlab::testing::kFourHeadGpt));
  const analysis::AblationResult bad = disagreeing_scores(false);
  ASSERT_FALSE(analysis::gradient_warning(bad).empty());
  EXPECT_FALSE(analysis::gradient_reliable(bad));
  // The dearest head by zero ablation (L1H3, +0.7) leads: headline, table and picture follow it.
  const auto ranked = analysis::heads_ranked(bad);
  EXPECT_EQ(ranked.front()->layer, 1);
  EXPECT_EQ(ranked.front()->head, 3);
  EXPECT_TRUE(contains(analysis::ranking_text(bad), "zero ablation"));
  const analysis::Table t = analysis::importance_table(bad, *model);
  EXPECT_EQ(std::get<std::string>(t.rows.front()[1]), "L1H3");
  EXPECT_EQ(std::get<std::string>(t.rows.back()[1]), "L0H0");
  // Where the gradient agrees, its importance orders the heads.
  const analysis::AblationResult good = disagreeing_scores(true);
  EXPECT_TRUE(analysis::gradient_reliable(good));
  EXPECT_EQ(analysis::heads_ranked(good).front()->head, 3);
  EXPECT_TRUE(contains(analysis::ranking_text(good), "importance"));
}

// The whole report on a trained model: its headline is its table's first row and its pictures exist.
TEST(FirstHour, AblationReportHeadlineIsItsTablesFirstRow) {
  TempDir tmp("first_hour_ablate");
  const std::string run = tmp.dir() + "/run";
  auto r = run_headlab({"train", "--task", "sort", "--steps", "60", "--n-layers", "1", "--n-heads", "2", "--emb-dim", "16",
                    "--out", run},
                   tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_headlab({"ablate", run + "/checkpoint.h5", "--batches", "1", "--batch-size", "16"}, tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  // The default output folder: beside the checkpoint.
  const std::string md = slurp(run + "/ablate/report.md");
  ASSERT_FALSE(md.empty());
  EXPECT_TRUE(fs::exists(run + "/ablate/ablation.png"));
  EXPECT_TRUE(fs::exists(run + "/ablate/importance.png"));
  const size_t headline = md.find("| most important head | ");
  ASSERT_NE(headline, std::string::npos) << md;
  const std::string head = md.substr(headline + 24, md.find(' ', headline + 24) - headline - 24);
  const size_t table = md.find("## Heads ranked by ");
  ASSERT_NE(table, std::string::npos) << md;
  const size_t first_row = md.find("\n| 1 ", table);
  ASSERT_NE(first_row, std::string::npos) << md.substr(table);
  EXPECT_TRUE(contains(md.substr(first_row, 40), "| " + head + " ")) << head << "\n" << md.substr(table, 600);
  EXPECT_TRUE(contains(r.out, "validation batch ") && !contains(r.out, "1 validation batches")) << r.out;
}

// ---- 4. metrics that cannot mean what they say are flagged ----

TEST(FirstHour, PromptPairBaselinesThatMeanNothingAreFlagged) {
  analysis::LogitDifference d;
  d.clean = {0.5, 0.7, 0.6, 0.58}, d.corrupt = {1.1, 1.2, 1.0, 1.18};  // stories260K's induction: corrupted above
  d.clean_mean = 0.595, d.corrupt_mean = 1.12;
  EXPECT_TRUE(contains(d.warning(false), "at or above the clean")) << d.warning(false);
  d.clean = {3, -2, 4, -1.5}, d.corrupt = {0, 0, 0, 0};  // a mean gap of 0.875 logits, rows all over
  d.clean_mean = 0.875, d.corrupt_mean = 0;
  EXPECT_TRUE(contains(d.warning(false), "within the rows' noise")) << d.warning(false);
  d.clean = {0.25, 0.22, 0.24, 0.21}, d.corrupt = {0, 0.01, 0, 0.01};  // 0.23 logits, steady: small
  d.clean_mean = 0.23, d.corrupt_mean = 0.005;
  EXPECT_TRUE(contains(d.warning(false), "is small")) << d.warning(false);
  EXPECT_EQ(d.warning(true), "") << "0.23 is a large gap in probability";
  d.clean = {5, 6, 5.5, 6.5}, d.corrupt = {0, 0.5, -0.5, 0};
  d.clean_mean = 5.75, d.corrupt_mean = 0;
  EXPECT_EQ(d.warning(false), "");
  // A circuit scoring outside [0, 1] of its model.
  EXPECT_EQ(analysis::circuit_warning(0.93), "");
  EXPECT_TRUE(contains(analysis::circuit_warning(3.056), "above the full model's 1"));
  EXPECT_TRUE(contains(analysis::circuit_warning(-0.4), "below the corrupted run"));
}

TEST(FirstHour, OtherProcessesBusyAreMeasuredAndOurOwnWorkIsNot) {
  const analysis::OtherLoad load;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // another process keeping one core busy
    volatile double x = 0;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < end) x = x + 1;
    _exit(0);
  }
  usleep(1200 * 1000);
  const double busy = load.cores();  // before the child is waited for: not ours
  const std::string warning = load.warning();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  if (std::isnan(busy)) GTEST_SKIP() << "/proc cannot be read here";
  EXPECT_GT(busy, 0.3) << "a child spinning 1.2 s of 1.2 s";
  if (busy >= analysis::OtherLoad::kBusyCores) {
    EXPECT_TRUE(contains(warning, "cores busy")) << warning;
  }
}

// ---- 3. every command writes beside the model it read, whatever its format ----

TEST(FirstHour, Llama2cFilesGetDefaultOutputFoldersBesideThem) {
  if (!fs::exists(kStories + "/stories260K.bin")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  TempDir tmp("first_hour_llama2c");
  const std::string model = tmp.dir() + "/stories260K.bin", tok = tmp.dir() + "/tok512.bin";
  fs::copy_file(kStories + "/stories260K.bin", model);  // a writable folder, as a user's download is
  fs::copy_file(kStories + "/tok512.bin", tok);
  const std::string text = std::string(HEADLAB_SOURCE_DIR) + "/README.md";
  auto r = run_headlab({"heads", model, "--tokenizer", tok, "--text", text, "--batches", "1", "--batch-size", "2",
                    "--tokens", "64"},
                   tmp.dir());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.dir() + "/heads/report.md")) << r.out;
  r = run_headlab({"attention", model, "--tokenizer", tok, "--prompt", "Once upon a time"}, tmp.dir());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.dir() + "/attention/attention.html")) << r.out;
  // stories260K on induction pairs: corrupted scores above clean, and both outputs say what that means.
  r = run_headlab({"heads", model, "--tokenizer", tok, "--task", "induction", "--rows", "16"}, tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string md = slurp(tmp.dir() + "/heads/report.md");
  const bool flagged = contains(r.out, "warning: ");
  EXPECT_EQ(flagged, contains(md, "**Warning:**")) << r.out;
  // A missing model is "no such file", even with --tokenizer.
  r = run_headlab({"heads", tmp.dir() + "/missing.bin", "--tokenizer", tok}, tmp.dir());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "no such file")) << r.err;
}

// The logit lens drawn: its last row is the model's own prediction, probability for probability.
TEST(FirstHour, LogitLensIsDrawnAndEndsAtTheModelsPrediction) {
  if (!fs::exists(kStories + "/stories260K.bin")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  TempDir tmp("first_hour_lens");
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  const auto r = run_headlab({"heads", kStories + "/stories260K.bin", "--tokenizer", kStories + "/tok512.model",
                              "--logit-lens", prompt, "--out", tmp.dir()},
                             tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(tmp.dir() + "/logit_lens.png"));
  const loader::Loaded l = loader::load("test", kStories + "/stories260K.bin", "cpu", "", kStories + "/tok512.model");
  const std::vector<int64_t> ids = l.task->encode_prompt(prompt).ids;
  const auto T = static_cast<int64_t>(ids.size());
  const Tensor probs = softmax(l.decoder("test").forward(tensor(ids, {1, T})).to(DType::f64), 2);  // (1, T, V)
  std::istringstream csv(slurp(tmp.dir() + "/logit_lens.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "row,position,token,next_token,probability,rank");
  int64_t rows = 0, checked = 0;
  while (std::getline(csv, line)) {
    ++rows;
    if (line.rfind("final_post,", 0) != 0) continue;
    const int64_t t = std::stoll(line.substr(11, line.find(',', 11) - 11));
    const size_t last = line.rfind(','), before = line.rfind(',', last - 1);
    const double p = std::stod(line.substr(before + 1, last - before - 1));
    EXPECT_NEAR(p, probs.select(0, 0).select(0, t).select(0, ids[static_cast<size_t>(t) + 1]).item<double>(), 1e-4)
        << line;
    ++checked;
  }
  EXPECT_EQ(checked, T - 1);
  EXPECT_EQ(rows, (l.decoder("test").n_layers() + 1) * (T - 1));
}

TEST(FirstHour, FilesOfFormatsNotReadYetAreNamed) {
  TempDir tmp("first_hour_formats");
  for (const char* name : {"model.gguf", "model.pth"}) {
    const std::string path = tmp.dir() + "/" + name;
    std::string bytes = std::string(name).ends_with(".gguf") ? std::string("GGUF\3\0\0\0", 8) : std::string("PK\3\4");
    bytes.resize(64, '\0');
    write_file(path, bytes);
    const auto r = run_headlab({"inspect", path}, tmp.dir());
    EXPECT_EQ(r.code, 1) << name;
    EXPECT_FALSE(contains(r.err, "not an HDF5 file")) << r.err;
    EXPECT_TRUE(contains(r.err, std::string(name).ends_with(".gguf") ? "GGUF" : "PyTorch")) << r.err;
  }
}

// ---- 7. the command explains itself ----

TEST(FirstHour, HelpHasExamplesAndBashCompletesCommandsAndOptions) {
  TempDir tmp("first_hour_help");
  for (const char* cmd : {"train", "eval", "generate", "inspect", "compare", "ablate", "attention", "heads", "circuit",
                          "tokenize", "export", "convert"}) {
    const auto r = run_headlab({cmd, "--help"}, tmp.dir());
    EXPECT_TRUE(contains(r.out, "Examples") && contains(r.out, std::string("headlab ") + cmd + " ")) << cmd;
  }
  const auto r = run_headlab({"--completion", "bash"}, tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  write_file(tmp.dir() + "/completion.bash", r.out);
  const auto complete = [&](const std::string& words, int cword) {
    const std::string script = "source " + quote(tmp.dir() + "/completion.bash") + "; COMP_WORDS=(" + words +
                               "); COMP_CWORD=" + std::to_string(cword) + "; _headlab; echo \"${COMPREPLY[*]}\"";
    return run_process({"bash", "-c", script}, tmp.dir(), "").out;
  };
  EXPECT_EQ(complete("headlab abl", 1), "ablate\n");
  EXPECT_TRUE(contains(complete("headlab ablate --pru", 2), "--prune")) << complete("headlab ablate --pru", 2);
  EXPECT_FALSE(contains(complete("headlab train --pru", 2), "--prune"));
}

TEST(FirstHour, InspectSpellsOutDefaultSizes) {
  TempDir tmp("first_hour_inspect");
  const std::string run = tmp.dir() + "/run";
  auto r = run_headlab({"train", "--task", "copy", "--arch", "llama", "--steps", "2", "--n-layers", "1", "--n-heads", "2",
                        "--emb-dim", "16", "--out", run},
                   tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run_headlab({"inspect", run + "/checkpoint.h5"}, tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.out, "\"head_dim\": 0,")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"head_dim\": \"0 (the default: emb_dim / n_heads = 8)\"")) << r.out;
}
