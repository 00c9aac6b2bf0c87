// The `headlab` command as a user runs it (the real binary, HEADLAB_BINARY_DIR/headlab): --help on
// every command; usage errors exit 2 with a usage message; a missing or damaged checkpoint exits 1
// with one clear line on stderr; a tiny train, then eval, generate (greedy, sampling, sliding
// window) and inspect, checked against the library doing the same in this process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "backends/cpu/omp_policy.h"
#include "io/checkpoint.h"
#include "io/families.h"
#include "io/hf_gpt2.h"
#include "nn/generate.h"
#include "ops/ops.h"
#include "tasks/bpe_tokenizer.h"
#include "tests/process_util.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace headlab;
using headlab::testing::run_process;
using headlab::testing::slurp;
using Result = headlab::testing::ProcessResult;

namespace {

const std::string kBinary = std::string(HEADLAB_BINARY_DIR) + "/headlab";

std::string scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/cli_test.XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    return std::string(d ? d : "/tmp");
  }();
  return dir;
}

// Runs the binary with these arguments (one thread, as the models here are tiny); captures both streams.
Result headlab(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kBinary};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, scratch_dir(), "OMP_NUM_THREADS=1");
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Removes the scratch folder once every test of this process has run.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(scratch_dir()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is not built (target headlab_cli)"; }
  std::string path(const std::string& name) const { return scratch_dir() + "/" + name; }
};

// ---- help and usage errors ----------------------------------------------------------------------------

TEST_F(CliTest, HelpOnEveryCommandExitsZero) {
  const Result top = headlab({"--help"});
  EXPECT_EQ(top.code, 0) << top.err;
  for (const char* cmd :
       {"train", "eval", "generate", "inspect", "compare", "ablate", "attention", "heads", "tokenize", "export"}) {
    EXPECT_TRUE(contains(top.out, cmd)) << "headlab --help lists " << cmd;
    const Result r = headlab({cmd, "--help"});
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.err;
    EXPECT_TRUE(contains(r.out, "Usage:")) << cmd << ": " << r.out;
    EXPECT_TRUE(r.err.empty()) << cmd << ": " << r.err;
  }
  const Result train = headlab({"train", "-h"});
  EXPECT_TRUE(contains(train.out, "--task")) << train.out;
  EXPECT_TRUE(contains(train.out, "reverse")) << "the tasks are described in the footer";
  const Result version = headlab({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_TRUE(contains(version.out, "headlab 0.1.0")) << version.out;
  EXPECT_TRUE(contains(version.out, std::string("CPU GEMMs: ") + cpu_gemm_kernels())) << version.out;
}

void expect_usage_error(const std::vector<std::string>& args, const std::string& mentions) {
  std::string shown;
  for (const auto& a : args) shown += a + " ";
  const Result r = headlab(args);
  EXPECT_EQ(r.code, 2) << shown << "\nstdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_TRUE(contains(r.err, mentions)) << shown << "\nstderr: " << r.err;
  EXPECT_TRUE(contains(r.err, "Run with --help for more information.")) << shown << "\nstderr: " << r.err;
  EXPECT_LT(r.err.size(), 300u) << shown << ": a usage message is short\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << shown << "\nstdout: " << r.out;
}

TEST_F(CliTest, BadArgumentsExitTwoWithAUsageMessage) {
  expect_usage_error({}, "A subcommand is required");
  expect_usage_error({"frobnicate"}, "frobnicate");
  expect_usage_error({"train", "--bogus"}, "--bogus");
  expect_usage_error({"train", "--task", "juggle"}, "--task: juggle not in {reverse,copy,sort,add,chars,numbers}");
  expect_usage_error({"train", "--steps", "abc"}, "--steps");
  expect_usage_error({"train", "--steps", "-5"}, "--steps");
  expect_usage_error({"train", "--steps", "0"}, "--steps");
  expect_usage_error({"train", "--steps"}, "--steps");
  expect_usage_error({"train", "--lr", "fast"}, "--lr");
  expect_usage_error({"train", "--attention", "flash"}, "--attention");
  expect_usage_error({"train", "--drop-rate", "2"}, "--drop-rate");
  expect_usage_error({"eval"}, "checkpoint is required");
  expect_usage_error({"inspect"}, "checkpoint is required");
  expect_usage_error({"generate", "--prompt", "12"}, "checkpoint is required");
  expect_usage_error({"generate", "x.h5"}, "--prompt is required");
  expect_usage_error({"eval", "x.h5", "--batches", "many"}, "--batches");
  expect_usage_error({"generate", "x.h5", "--prompt", "1", "--temperature", "-1"}, "--temperature");
  expect_usage_error({"eval", "a.h5", "b.h5"}, "b.h5");
}

// ---- run errors: exit 1, one line on stderr ------------------------------------------------------------

void expect_run_error(const std::vector<std::string>& args, const std::vector<std::string>& mentions) {
  std::string shown;
  for (const auto& a : args) shown += a + " ";
  const Result r = headlab(args);
  EXPECT_EQ(r.code, 1) << shown << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.rfind("headlab: ", 0), 0u) << shown << "\nstderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << shown << ": one line\n" << r.err;
  for (const std::string& m : mentions)
    EXPECT_TRUE(contains(r.err, m)) << shown << "\nstderr: " << r.err << "\nmissing: " << m;
  EXPECT_TRUE(r.out.empty()) << shown << "\nstdout: " << r.out;
}

// headlab compare on a tiny grid: the table, the files, and the PyTorch peer beside it when
// python3-torch is installed (on / off / a missing script).
TEST_F(CliTest, CompareWritesItsTableAndFiles) {
  const std::string out = path("compare_off");
  const Result r = headlab({"compare", "--no-peer-grid", "--heads", "1,2", "--emb-dim", "16", "--tokens", "8",
                            "--batch", "2", "--repeats", "2", "--warmup", "0", "--torch-peer", "off", "--out", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "fused speed-up over wrapper")) << r.out;
  EXPECT_FALSE(contains(r.out, "torch fu")) << r.out;
  for (const char* f : {"compare.csv", "compare.json", "compare.png"}) EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  // Multi-head and multi-query for each head count: one config per (heads, kv_heads).
  const std::string kv_out = path("compare_kv");
  const Result kv = headlab({"compare",      "--no-peer-grid",
                             "--heads",      "2,4",
                             "--kv-heads",   "0,1",
                             "--emb-dim",    "16",
                             "--tokens",     "8",
                             "--batch",      "2",
                             "--repeats",    "1",
                             "--warmup",     "0",
                             "--torch-peer", "off",
                             "--out",        kv_out});
  ASSERT_EQ(kv.code, 0) << kv.err;
  EXPECT_TRUE(contains(kv.out, "H=4  KV=1")) << kv.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(kv_out + "/compare.json"));
  std::vector<std::pair<int64_t, int64_t>> heads;
  for (const auto& c : j["configs"]) heads.emplace_back(c["heads"].get<int64_t>(), c["kv_heads"].get<int64_t>());
  EXPECT_EQ(heads, (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {2, 1}, {4, 4}, {4, 1}}));
  expect_run_error({"compare", "--no-peer-grid", "--heads", "4", "--kv-heads", "3", "--torch-peer", "off", "--out",
                    path("compare_bad")},
                   {"--kv-heads 3 does not divide the 4 heads"});
}

// A save that cannot finish (a file size limit, as on a full disk) names the file and the OS error,
// removes its temporary file, and leaves the previous checkpoint as it was.
TEST_F(CliTest, SaveUnderAFileSizeLimitKeepsThePreviousCheckpoint) {
  const std::string out = path("fsize");
  Result r = headlab({"train", "--task", "reverse", "--min-len", "2", "--max-len", "4", "--emb-dim", "32", "--steps",
                      "2", "--eval-every", "2", "--save-every", "2", "--eval-batches", "1", "--out", out});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string before = slurp(out + "/checkpoint.h5");
  ASSERT_GT(before.size(), 100000u);
  // 64 blocks of at most 1 KiB: room for metrics.csv, not for a checkpoint.
  r = run_process({"/bin/sh", "-c", "ulimit -f 64 && exec \"$0\" \"$@\"", kBinary, "train", "--resume", "--steps", "4",
                   "--out", out},
                  scratch_dir(), "OMP_NUM_THREADS=1");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "checkpoint-4.h5")) << r.err;
  EXPECT_TRUE(contains(r.err, "File too large")) << r.err;
  EXPECT_EQ(slurp(out + "/checkpoint.h5"), before);
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_FALSE(contains(e.path().filename().string(), "headlab-tmp")) << e.path();
}

TEST_F(CliTest, CompareTorchPeerOnNeedsItsScript) {
  expect_run_error({"compare", "--no-sweep", "--torch-peer", "on", "--torch-peer-script", path("missing.py")},
                   {"--torch-peer on", "missing.py"});
}

TEST_F(CliTest, CompareBesideThePyTorchPeer) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3-torch is not installed";
  const std::string out = path("compare_torch");
  const Result r =
      headlab({"compare", "--no-sweep", "--no-peer-grid", "--config", "tiny,2,8,16,16,2", "--config",
               "gqa,2,8,16,16,4,2", "--repeats", "2", "--warmup", "0", "--torch-peer", "on", "--out", out});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* part : {"torch wr", "torch fu", "headlab over PyTorch", "wrapper fwd", "fused fwd"})
    EXPECT_TRUE(contains(r.out, part)) << part << "\n" << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(out + "/compare.json"));
  EXPECT_GT(j["configs"][0]["fused"]["torch"]["forward_backward"]["median_ms"].get<double>(), 0);
  // The peer ran the grouped-query forms too (its line names kv_heads 2, or attaching it would have failed).
  EXPECT_EQ(j["configs"][1]["kv_heads"], 2);
  EXPECT_GT(j["configs"][1]["wrapper"]["torch"]["forward"]["median_ms"].get<double>(), 0);
}

TEST_F(CliTest, MissingOrDamagedCheckpointExitsOneWithAClearMessage) {
  const std::string missing = path("nope.h5");
  for (const char* cmd : {"eval", "inspect"})
    expect_run_error({cmd, missing}, {"checkpoint '" + missing + "': no such file"});
  expect_run_error({"generate", missing, "--prompt", "12"}, {"checkpoint '" + missing + "': no such file"});
  const std::string text = path("notes.h5");
  std::ofstream(text) << "not a checkpoint\n";
  expect_run_error({"eval", text}, {"checkpoint '" + text + "': is not an HDF5 file"});
  expect_run_error({"eval", scratch_dir()}, {"checkpoint '" + scratch_dir() + "'", "folder"});
}

// ---- a tiny run, then every read-only command ----------------------------------------------------------

// The two trained runs every CliRunTest reads. ctest starts each test as its own process, so they
// are trained once per build of the binary and shared: under an exclusive lock, into a temporary
// folder that is renamed into place when complete; later processes just read them. Tests never
// write into it.
struct CachedRuns {
  std::string dir;
  Result reverse, chars;
};

void save_result(const std::string& file, const Result& r) {
  std::ofstream(file + ".code") << r.code;
  std::ofstream(file + ".out", std::ios::binary) << r.out;
  std::ofstream(file + ".err", std::ios::binary) << r.err;
}

Result load_result(const std::string& file) {
  Result r;
  r.code = std::stoi(slurp(file + ".code"));
  r.out = slurp(file + ".out");
  r.err = slurp(file + ".err");
  return r;
}

CachedRuns make_runs() {
  struct stat st {};
  if (::stat(kBinary.c_str(), &st) != 0) return {};
  const std::string root = std::string(HEADLAB_BINARY_DIR) + "/tests/cli_test_runs";
  fs::create_directories(root);
  const std::string key =
      std::to_string(st.st_size) + "-" + std::to_string(st.st_mtim.tv_sec) + "-" + std::to_string(st.st_mtim.tv_nsec);
  const std::string dir = root + "/" + key;
  const int lock = ::open((root + "/lock").c_str(), O_CREAT | O_RDWR, 0644);
  if (lock >= 0) ::flock(lock, LOCK_EX);
  if (!fs::exists(dir)) {
    for (const auto& e : fs::directory_iterator(root))  // runs of older binaries
      if (e.is_directory()) fs::remove_all(e.path());
    const std::string tmp = dir + ".tmp";
    fs::create_directories(tmp);
    const Result reverse = headlab({"train",
                                    "--task",
                                    "reverse",
                                    "--min-len",
                                    "2",
                                    "--max-len",
                                    "4",
                                    "--emb-dim",
                                    "32",
                                    "--n-heads",
                                    "2",
                                    "--steps",
                                    "150",
                                    "--batch-size",
                                    "32",
                                    "--lr",
                                    "5e-3",
                                    "--warmup",
                                    "10",
                                    "--eval-every",
                                    "75",
                                    "--eval-batches",
                                    "2",
                                    "--out",
                                    tmp + "/reverse",
                                    "--threads",
                                    "1"});
    const Result chars = headlab({"train",
                                  "--task",
                                  "chars",
                                  "--text",
                                  std::string(HEADLAB_SOURCE_DIR) + "/data/tiny.txt",
                                  "--context-length",
                                  "8",
                                  "--emb-dim",
                                  "16",
                                  "--n-heads",
                                  "2",
                                  "--n-layers",
                                  "1",
                                  "--steps",
                                  "20",
                                  "--batch-size",
                                  "8",
                                  "--eval-every",
                                  "20",
                                  "--eval-batches",
                                  "1",
                                  "--out",
                                  tmp + "/chars",
                                  "--threads",
                                  "1"});
    save_result(tmp + "/reverse", reverse);
    save_result(tmp + "/chars", chars);
    if (reverse.code == 0 && chars.code == 0) {
      fs::rename(tmp, dir);
    } else {
      fs::remove_all(tmp);
      if (lock >= 0) ::close(lock);
      return {"", reverse, chars};
    }
  }
  if (lock >= 0) ::close(lock);  // releases the lock
  return {dir, load_result(dir + "/reverse"), load_result(dir + "/chars")};
}

class CliRunTest : public CliTest {
 protected:
  static void SetUpTestSuite() {
    CliTest::SetUpTestSuite();
    runs_ = make_runs();
  }
  void SetUp() override {
    ASSERT_EQ(runs_.reverse.code, 0) << runs_.reverse.err;
    ASSERT_EQ(runs_.chars.code, 0) << runs_.chars.err;
    ASSERT_FALSE(runs_.dir.empty());
    omp_set_num_threads(1);
  }
  std::string ckpt() const { return runs_.dir + "/reverse/checkpoint.h5"; }
  std::string chars_ckpt() const { return runs_.dir + "/chars/checkpoint.h5"; }
  std::string run_file(const std::string& name) const { return runs_.dir + "/" + name; }
  static CachedRuns runs_;
};
CachedRuns CliRunTest::runs_;

// What `generate` computes, done here with the library: the book's loop, cropping the context to the
// last context_length tokens, greedy, stopping at the end token or the answer length.
std::string library_greedy(const std::string& file, const std::string& prompt, int64_t max_new) {
  const io::Checkpoint ck = io::load_checkpoint(file);
  auto model = io::model_from_checkpoint<nn::DecoderModel>(ck, file);
  const auto task = train::RunConfig::from_json(ck.config).make_task();
  const tasks::Prompt p = task->encode_prompt(prompt);
  const int64_t ctx = model->config().context_length;
  const int64_t limit = p.answer_length >= 0 ? std::min<int64_t>(max_new, p.answer_length + 1) : max_new;
  std::vector<int64_t> ids = p.ids, generated;
  NoGradGuard no_grad;
  for (int64_t i = 0; i < limit; ++i) {
    const int64_t start = std::max<int64_t>(0, int64_t(ids.size()) - ctx);
    std::vector<int64_t> window(ids.begin() + start, ids.end());
    const Tensor logits = (*model)(tensor(window, {1, int64_t(window.size())}));
    const int64_t next = argmax(logits.select(1, int64_t(window.size()) - 1).select(0, 0), 0).item<int64_t>();
    if (next == task->end_id()) break;
    ids.push_back(next);
    generated.push_back(next);
  }
  return p.text + task->format_answer(generated) + "\n";
}

TEST_F(CliRunTest, TrainWritesCheckpointsMetricsAndAReport) {
  const Result& train = runs_.reverse;
  EXPECT_TRUE(contains(train.out, "headlab train: task reverse, fused attention, 2 layers x 2 heads, emb 32"))
      << train.out;
  EXPECT_TRUE(contains(train.out, "trained 150 steps")) << train.out;
  EXPECT_TRUE(contains(train.out, "eval step 75:")) << train.out;
  EXPECT_TRUE(train.err.empty()) << train.err;
  for (const char* f : {"reverse/checkpoint.h5", "reverse/checkpoint-150.h5", "reverse/metrics.csv"})
    EXPECT_TRUE(fs::exists(run_file(f))) << f;
  const io::Checkpoint ck = io::load_checkpoint(ckpt());
  EXPECT_EQ(ck.trainer.step, 150);
  EXPECT_EQ(ck.config["training"]["batch_size"], 32);
  EXPECT_EQ(ck.config["model"]["emb_dim"], 32);
}

TEST_F(CliRunTest, EvalReportsWhatTheLibraryComputes) {
  const Result r = headlab({"eval", ckpt()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  const io::Checkpoint ck = io::load_checkpoint(ckpt());
  auto model = io::model_from_checkpoint<nn::DecoderModel>(ck, ckpt());
  const auto task = train::RunConfig::from_json(ck.config).make_task();
  const train::Scores e = train::evaluate(*model, *task, 2, 32, model->config().context_length);
  std::ostringstream expected;
  expected << std::fixed << std::setprecision(4) << "val loss        " << e.loss << "\ntoken accuracy  "
           << e.token_accuracy << "\nexact match     " << e.exact_match << "\n";
  EXPECT_TRUE(contains(r.out, "checkpoint " + ckpt() + " (task reverse, step 150)")) << r.out;
  EXPECT_TRUE(contains(r.out, expected.str())) << r.out << "\nexpected:\n" << expected.str();
  EXPECT_GT(e.token_accuracy, 0.5) << "150 steps learn reverse on 2-4 digits";
  const Result more = headlab({"eval", ckpt(), "--batches", "3"});
  EXPECT_TRUE(contains(more.out, "in 3 batches of 32")) << more.out;
}

TEST_F(CliRunTest, GenerateGreedyPrintsThePromptAndTheAnswer) {
  for (const std::string prompt : {"3141", "12", "907"}) {
    const Result r = headlab({"generate", ckpt(), "--prompt", prompt});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
    EXPECT_EQ(r.out, library_greedy(ckpt(), prompt, 64)) << prompt;
    const std::string reversed(prompt.rbegin(), prompt.rend());
    EXPECT_EQ(r.out, prompt + ">" + reversed + "\n") << "the trained model reverses " << prompt;
    EXPECT_EQ(headlab({"generate", ckpt(), "--prompt", prompt}).out, r.out) << "greedy is deterministic";
    EXPECT_EQ(headlab({"generate", ckpt(), "--prompt", prompt, "--temperature", "0.7", "--top-k", "1"}).out, r.out)
        << "top-k 1 is greedy";
    for (const char* chunk : {"1", "2", "0"})  // the prompt through the cache a token, two, or all at a time
      EXPECT_EQ(headlab({"generate", ckpt(), "--prompt", prompt, "--prefill-chunk", chunk}).out, r.out) << chunk;
  }
  const Result bad = headlab({"generate", ckpt(), "--prompt", "12a"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains(bad.err, "headlab: task reverse: prompt '12a' has character 'a' outside the vocabulary"))
      << bad.err;
}

TEST_F(CliRunTest, SamplingIsReproducibleWithASeed) {
  const std::vector<std::string> args = {"generate",         chars_ckpt(), "--prompt",      "Th",
                                         "--max-new-tokens", "24",         "--temperature", "1.0"};
  auto with_seed = [&](const char* seed) {
    std::vector<std::string> a = args;
    a.insert(a.end(), {"--seed", seed});
    const Result r = headlab(a);
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  };
  const std::string a = with_seed("5");
  EXPECT_EQ(with_seed("5"), a);
  EXPECT_NE(with_seed("6"), a) << "another seed, another sample (an undertrained char model is far from greedy)";
  EXPECT_EQ(a.rfind("Th", 0), 0u) << a;
}

TEST_F(CliRunTest, CharsGenerationSlidesPastTheContextLength) {
  // context_length 8: a 19-character prompt plus 20 new characters is five times the context.
  const std::string prompt = "The quick brown fox";
  const Result r = headlab({"generate", chars_ckpt(), "--prompt", prompt, "--max-new-tokens", "20"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, library_greedy(chars_ckpt(), prompt, 20));
  EXPECT_EQ(r.out.rfind(prompt, 0), 0u) << r.out;
  const Result zero = headlab({"generate", chars_ckpt(), "--prompt", prompt, "--max-new-tokens", "0"});
  EXPECT_EQ(zero.out, prompt + "\n");
}

TEST_F(CliRunTest, InspectShowsConfigParametersAndTrainingState) {
  const Result r = headlab({"inspect", ckpt()});
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint ck = io::load_checkpoint(ckpt());
  for (const std::string& part :
       {std::string("config"), std::string("\"vocab_size\": 13"), std::string("\"attention\": \"fused\""),
        std::string("\"name\": \"reverse\""), std::string("0123456789>._"), std::string("(13 tokens)"),
        std::string("parameters"), std::string("optimizer adamw"), std::string("training state"),
        std::string("step 150, next batch 150"), std::string("metrics")})
    EXPECT_TRUE(contains(r.out, part)) << "missing: " << part << "\n" << r.out;
  int64_t total = 0;
  for (const auto& [name, t] : ck.model) {
    total += t.numel();
    // One table row per parameter: name, shape, size.
    std::istringstream lines(r.out);
    std::string line;
    bool found = false;
    while (std::getline(lines, line)) {
      std::istringstream cells(line);
      std::string n;
      cells >> n;
      if (n != name) continue;
      found = true;
      EXPECT_TRUE(contains(line, shape_str(t.shape()))) << line;
      std::string size;
      while (cells >> size) {}
      EXPECT_EQ(size, std::to_string(t.numel())) << line;
    }
    EXPECT_TRUE(found) << name << " is not in the table";
  }
  EXPECT_TRUE(contains(r.out, std::to_string(total))) << "total " << total;
  // Two evaluations: rows for steps 75 and 150.
  EXPECT_TRUE(contains(r.out, "\n      75 ")) << r.out;
  EXPECT_TRUE(contains(r.out, "\n     150 ")) << r.out;
}

TEST_F(CliRunTest, ResumeContinuesARunFromItsCheckpoint) {
  const std::string out = path("resumed");
  fs::create_directories(out);
  fs::copy_file(ckpt(), out + "/checkpoint.h5");
  const Result r = headlab({"train", "--resume", "--out", out, "--steps", "160", "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "resuming from " + out + "/checkpoint.h5 at step 150")) << r.out;
  EXPECT_TRUE(contains(r.out, "trained 10 steps")) << r.out;
  EXPECT_EQ(io::load_checkpoint(out + "/checkpoint.h5").trainer.step, 160);
  const Result done = headlab({"train", "--resume", "--out", out, "--steps", "160", "--threads", "1"});
  EXPECT_EQ(done.code, 0) << done.err;
  EXPECT_TRUE(contains(done.out, "nothing to do")) << done.out;
}

TEST_F(CliRunTest, DamagedCheckpointsGiveTheLoadersMessage) {
  const std::string bytes = slurp(ckpt());
  const std::string truncated = path("truncated.h5");
  std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  expect_run_error({"eval", truncated}, {"checkpoint '" + truncated + "'"});
  expect_run_error({"inspect", truncated}, {"checkpoint '" + truncated + "'"});
  expect_run_error({"generate", truncated, "--prompt", "12"}, {"checkpoint '" + truncated + "'"});
  // A flipped bit in out_head.weight's data: the checksum names the dataset.
  const io::Checkpoint ck = io::load_checkpoint(ckpt());
  const std::vector<float> w = ck.model.back().second.to_vector<float>();
  const std::string pattern(reinterpret_cast<const char*>(w.data()), 16);
  const size_t at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos);
  std::string damaged = bytes;
  damaged[at + 5] = static_cast<char>(damaged[at + 5] ^ 0x04);
  const std::string flipped = path("flipped.h5");
  std::ofstream(flipped, std::ios::binary) << damaged;
  expect_run_error({"eval", flipped},
                   {"checkpoint '" + flipped + "': dataset model/out_head.weight failed its checksum"});
}

#ifndef HEADLAB_HAS_CUDA
TEST_F(CliRunTest, CudaOnACpuBuildIsAClearError) {
  expect_run_error({"eval", ckpt(), "--device", "cuda"}, {"built without CUDA"});
}
#endif

// ---- startup: what a run loads, and how often it starts ------------------------------------------------

// Runs the binary under the dynamic loader's log of every shared object it opens, at start or later
// with dlopen (LD_DEBUG=files, on stderr), and libgomp's report of its settings, printed by each
// start of the program (OMP_DISPLAY_ENV=verbose). No OpenMP policy of the caller's leaks in.
Result headlab_logged(const std::vector<std::string>& args, const std::string& env = "") {
  std::vector<std::string> argv{"env",
                                "-u",
                                "OMP_WAIT_POLICY",
                                "-u",
                                "GOMP_SPINCOUNT",
                                "LD_DEBUG=files",
                                "OMP_DISPLAY_ENV=verbose",
                                "OMP_NUM_THREADS=1"};
  if (!env.empty()) argv.push_back(env);
  argv.push_back(kBinary);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, scratch_dir());
}

// libgomp's spin counts, one per start of the program, in order.
std::vector<std::string> spin_counts(const std::string& err) {
  std::vector<std::string> out;
  const std::string key = "GOMP_SPINCOUNT = '";
  for (size_t at = err.find(key); at != std::string::npos; at = err.find(key, at + 1))
    out.push_back(err.substr(at + key.size(), err.find('\'', at + key.size()) - at - key.size()));
  return out;
}

const char* const kCudaLibraries[] = {"libheadlab_cuda.so", "libcudart", "libcublas", "libcuda.so"};

// --help and --version load no CUDA library and start once: the CPU threading policy's re-execution
// (backends/cpu/omp_policy.h) waits until a command is about to run, and the CUDA backend is a plugin.
TEST_F(CliTest, HelpAndVersionStartOnceAndLoadNoCudaLibrary) {
  for (const char* arg : {"--help", "--version"}) {
    const Result r = headlab_logged({arg});
    ASSERT_EQ(r.code, 0) << arg << ": " << r.err;
    ASSERT_TRUE(contains(r.err, "file=libstdc++.so")) << "the loader's log is missing:\n" << r.err;
    for (const char* lib : kCudaLibraries) EXPECT_FALSE(contains(r.err, lib)) << arg << " loads " << lib;
    EXPECT_EQ(spin_counts(r.err).size(), 1u) << arg << " started more than once:\n" << r.err;
  }
}

// A command starts again with OpenMP threads that spin briefly, then sleep (backends/cpu/omp_policy.h);
// a policy the user set is kept.
TEST_F(CliTest, ACommandRunsWithABoundedOpenMPSpin) {
  const Result r = headlab_logged({"eval", path("no_such_checkpoint.h5")});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(spin_counts(r.err), (std::vector<std::string>{"300000", cpu::kOmpSpinCount})) << r.err;
  const Result passive = headlab_logged({"eval", path("no_such_checkpoint.h5")}, "OMP_WAIT_POLICY=passive");
  EXPECT_EQ(spin_counts(passive.err), (std::vector<std::string>{"0"})) << passive.err;
  for (const char* lib : kCudaLibraries) EXPECT_FALSE(contains(r.err, lib)) << "a CPU command loads " << lib;
}

#ifdef HEADLAB_HAS_CUDA
// Asking for a GPU loads the plugin beside the binary, and the CUDA runtime with it (which is what
// the checks above would see). Without a GPU the plugin's error is the one line the user gets.
TEST_F(CliTest, CudaLoadsThePluginOnFirstUse) {
  const Result r =
      headlab_logged({"train", "--task", "reverse", "--steps", "1", "--device", "cuda", "--out", path("cuda_run")});
  EXPECT_TRUE(contains(r.err, "file=" + std::string(HEADLAB_BINARY_DIR) + "/libheadlab_cuda.so")) << r.err;
  EXPECT_TRUE(contains(r.err, "file=libcudart.so")) << r.err;
  if (r.code == 0) GTEST_SKIP() << "a GPU is visible: the run trained on it";
  expect_run_error({"train", "--task", "reverse", "--steps", "1", "--device", "cuda", "--out", path("cuda_run")},
                   {"cuda: no CUDA device is visible", "use --device cpu"});
}

// A plugin that cannot be loaded: the error names each file tried and the loader's reason.
TEST_F(CliTest, AMissingCudaPluginNamesTheFilesTried) {
  const std::vector<std::string> args{
      "train", "--task", "reverse", "--steps", "1", "--device", "cuda", "--out", path("no_plugin_run")};
  const auto run = [&](const std::string& binary, const std::string& env) {
    std::vector<std::string> argv{binary};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, scratch_dir(), env);
  };
  // HEADLAB_CUDA_PLUGIN, when set, is the only file tried.
  const std::string wrong = path("elsewhere/libheadlab_cuda.so");
  Result r = run(kBinary, "HEADLAB_CUDA_PLUGIN=" + wrong);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, "headlab: cuda: cannot load the CUDA backend libheadlab_cuda.so: tried " + wrong +
                       " (cannot open shared object file: No such file or directory); set "
                       "HEADLAB_CUDA_PLUGIN=/path/to/libheadlab_cuda.so or use --device cpu\n");
  // A file that is not a shared library.
  const std::string text = path("not_a_library.so");
  std::ofstream(text) << "not ELF\n";
  r = run(kBinary, "HEADLAB_CUDA_PLUGIN=" + text);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "cannot load the CUDA backend libheadlab_cuda.so: tried " + text + " (")) << r.err;
  // A copy of the binary with no plugin beside it looks there, then in the install libdir.
  const std::string alone = path("alone/headlab");
  fs::create_directories(path("alone"));
  fs::copy_file(kBinary, alone, fs::copy_options::overwrite_existing);
  r = run(alone, "");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "tried " + path("alone/libheadlab_cuda.so") +
                                  " (cannot open shared object file: No such file or directory), /"))
      << r.err;
}
#endif

// ---- the Hugging Face GPT-2 layout: tokenize and export ---------------------------------------------

// GPT-2's vocabulary (fetched by scripts/install-deps.sh) as a folder tokenize takes.
TEST_F(CliTest, TokenizeGivesGpt2sIds) {
  const std::string vocab = HEADLAB_GPT2_VOCAB_DIR;
  ASSERT_TRUE(fs::exists(vocab + "/vocab.json")) << "run scripts/install-deps.sh: it fetches GPT-2's vocabulary";
  Result r = headlab({"tokenize", vocab, "--prompt", "Hello world<|endoftext|>"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 995 50256\n");
  r = headlab({"tokenize", vocab, "--prompt", "Hello world", "--show"});
  EXPECT_EQ(r.out, "Hello \xc4\xa0world\n");  // Ġ: the space
  std::ofstream(path("text.txt")) << "Hello world";
  r = headlab({"tokenize", vocab, "--text", path("text.txt")});
  EXPECT_EQ(r.out, "15496 995\n");
  std::ofstream(path("bad.txt")) << "ok \xff";
  r = headlab({"tokenize", vocab, "--text", path("bad.txt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, path("bad.txt") + ": invalid UTF-8 at byte offset 3")) << r.err;
  r = headlab({"tokenize", vocab});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "give --text FILE or --prompt TEXT")) << r.err;
  // A folder whose config.json disagrees with the vocabulary's size.
  fs::create_directories(path("mismatch"));
  for (const char* f : {"vocab.json", "merges.txt"}) fs::copy_file(vocab + "/" + f, path("mismatch/") + f);
  fs::copy_file(std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/gpt2_folders/untied/config.json",
                path("mismatch/config.json"));
  r = headlab({"tokenize", path("mismatch"), "--prompt", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "96")) << r.err;
}

// A grouped-query LLaMA checkpoint prunes whole key/value groups: ablate --prune rounds the curve's heads to
// the groups they empty (each layer keeps its last head's group), and the pruned checkpoint computes what the
// gated model computes and exports at full width to the same logits.
TEST_F(CliTest, AblatePrunesWholeKeyValueGroupsOfALlamaCheckpoint) {
  Result r =
      headlab({"train", "--task",       "reverse", "--arch",         "llama", "--steps",    "3",        "--emb-dim",
               "16",    "--n-heads",    "4",       "--n-kv-heads",   "2",     "--n-layers", "2",        "--batch-size",
               "4",     "--eval-every", "3",       "--eval-batches", "1",     "--out",      path("gqa")});
  ASSERT_EQ(r.code, 0) << r.err;
  r = headlab({"ablate", path("gqa/checkpoint.h5"), "--batches", "1", "--batch-size", "4", "--prune", "6", "--repeats",
               "1", "--out", path("gqa/ablate")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out,
                       "pruned model: removed 4 of 8 heads (the curve's first 6, less those whose key/value "
                       "group keeps a head)"))
      << r.out;
  const size_t at = r.out.find("max |logits(pruned) - logits(gated)| = ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_LT(std::stod(r.out.substr(at + 40)), 1e-4) << r.out.substr(at);
  const std::string pruned = path("gqa/ablate/pruned.h5");
  const io::Checkpoint ck = io::load_checkpoint(pruned);
  for (const auto& layer : ck.config["model"]["kept_heads"]) {
    ASSERT_EQ(layer.size(), 2u) << ck.config["model"].dump();
    EXPECT_EQ(layer[0].get<int64_t>() % 2, 0) << "a whole group: " << layer.dump();
  }
  r = headlab({"export", pruned, "--out", path("gqa/hf")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "written as zeros at full width")) << r.out;
  const std::shared_ptr<nn::Model> want = io::load_model(ck, pruned, kCPU);
  const std::shared_ptr<nn::Model> got =
      io::build_folder_model(io::family_of_folder(path("gqa/hf")).folder->read(path("gqa/hf")), path("gqa/hf"));
  const NoGradGuard no_grad;
  const Tensor ids = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {1, 6});
  auto& a = dynamic_cast<nn::DecoderModel&>(*want);
  auto& b = dynamic_cast<nn::DecoderModel&>(*got);
  a.eval();
  EXPECT_EQ(b.attention(0).head_count(), 4);
  EXPECT_LT(amax(abs(sub(a.forward(ids), b.forward(ids)))).item<double>(), 1e-5);
}

// export writes what PyTorch loads: the checkpoint's logits from the folder, pruned models included.
TEST_F(CliTest, ExportWritesAFolderWithTheCheckpointsFunction) {
  Result r = headlab({"train", "--task", "reverse", "--steps", "3", "--emb-dim", "16", "--n-heads", "4", "--batch-size",
                      "4", "--eval-every", "3", "--eval-batches", "1", "--out", path("exp")});
  ASSERT_EQ(r.code, 0) << r.err;
  r = headlab({"ablate", path("exp/checkpoint.h5"), "--batches", "1", "--batch-size", "4", "--prune", "2", "--repeats",
               "1", "--out", path("exp/ablate")});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string ckpt : {"exp/checkpoint.h5", "exp/ablate/pruned.h5"}) {
    const std::string out = path(ckpt + ".hf");
    r = headlab({"export", path(ckpt), "--out", out});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains(r.out, "model.safetensors")) << r.out;
    const io::Checkpoint ck = io::load_checkpoint(path(ckpt));
    const std::shared_ptr<nn::DecoderModel> want = io::model_from_checkpoint<nn::DecoderModel>(ck, path(ckpt));
    const io::HfGpt2 hf = io::read_hf_gpt2(out);
    nn::DecoderModel got(hf.config);
    got.load_parameters(hf.parameters, out);
    got.eval();
    want->eval();
    const NoGradGuard no_grad;
    const Tensor ids = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {1, 6});
    const std::vector<float> a = want->forward(ids).to_vector<float>(), b = got.forward(ids).to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << ckpt << " logit " << i;
    if (ckpt.find("pruned") != std::string::npos) {
      EXPECT_TRUE(contains(r.out, "written as zeros")) << r.out;
    }
  }
  r = headlab({"export", path("exp/checkpoint.h5"), "--out", path("exp/checkpoint.h5")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "export")) << r.err;
}

// GPT-2's vocab.json and merges.txt (fetched by scripts/install-deps.sh).
const std::string kGpt2Vocab = HEADLAB_GPT2_VOCAB_DIR;

// A random GPT-2 of n_layers (2 heads, emb 8, context 16, GPT-2's vocabulary and tied head) written
// as a Hugging Face folder with GPT-2's tokenizer files.
void write_random_gpt2(const std::string& dir, int64_t n_layers) {
  nn::DecoderConfig c;
  c.vocab_size = 50257, c.context_length = 16, c.emb_dim = 8, c.n_heads = 2, c.n_layers = n_layers;
  c.qkv_bias = true, c.tie_embeddings = true;
  const nn::DecoderModel random(c);
  io::write_hf_gpt2(
      dir, random,
      {"bpe", {{"vocab.json", slurp(kGpt2Vocab + "/vocab.json")}, {"merges.txt", slurp(kGpt2Vocab + "/merges.txt")}}});
}

// eval, generate and inspect take a Hugging Face GPT-2 folder: a random one with GPT-2's vocabulary,
// each command's figures against the library doing the same here.
TEST_F(CliTest, Gpt2FolderEvalGenerateInspect) {
  const std::string dir = path("gpt2");
  ASSERT_TRUE(fs::exists(kGpt2Vocab + "/vocab.json")) << "run scripts/install-deps.sh: it fetches GPT-2's vocabulary";
  write_random_gpt2(dir, 1);
  NoGradGuard no_grad;
  const io::HfGpt2 hf = io::read_hf_gpt2(dir);
  nn::DecoderModel model(hf.config);
  model.load_parameters(hf.parameters, dir);
  const tasks::BpeTokenizer tok = tasks::BpeTokenizer::from_files(hf.vocab_path, hf.merges_path, 50257);

  Result r = headlab({"inspect", dir});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "\"vocab_size\": 50257")) << r.out;
  EXPECT_TRUE(contains(r.out, "head: tied to wte")) << r.out;

  r = headlab({"generate", dir, "--prompt", "Hello, world", "--max-new-tokens", "6"});
  ASSERT_EQ(r.code, 0) << r.err;
  nn::GenerateOptions o;
  o.max_new_tokens = 6;
  o.end_id = 50256;
  EXPECT_EQ(r.out, "Hello, world" + tok.decode(nn::generate(model, tok.encode("Hello, world"), o)) + "\n");

  std::ofstream(path("story.txt")) << "Once upon a time there was a small model that read a long story. "
                                      "It read every word, one token after another, and guessed the next.";
  r = headlab({"eval", dir, "--text", path("story.txt"), "--stride", "4"});
  ASSERT_EQ(r.code, 0) << r.err;
  const train::TextScores s = train::evaluate_text(model, tok.encode(slurp(path("story.txt"))), 4);
  std::ostringstream want;
  want << std::fixed << std::setprecision(4) << "loss            " << s.loss << "\nperplexity      " << s.perplexity;
  EXPECT_TRUE(contains(r.out, want.str())) << r.out << "\nwant " << want.str();
  EXPECT_TRUE(contains(r.out, std::to_string(s.windows) + " windows of 16 (stride 4)")) << r.out;

  // attention: GPT-2 splits the emoji's bytes over tokens; the page shows them as U+FFFD.
  r = headlab({"attention", dir, "--prompt", "Hi \xF0\x9F\x99\x82 there", "--max-new-tokens", "2", "--out",
               path("gpt2_attention")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("gpt2_attention/attention.html")));
  EXPECT_TRUE(contains(slurp(path("gpt2_attention/attention.html")), "Hi")) << "the page holds the tokens";

  r = headlab({"eval", dir});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "give --text FILE")) << r.err;
  r = headlab(
      {"eval", std::string(HEADLAB_SOURCE_DIR) + "/tests/fuzz/corpus/checkpoint_file/reverse.h5", "--stride", "4"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "--stride applies to subword models")) << r.err;
  fs::remove(dir + "/vocab.json");
  r = headlab({"generate", dir, "--prompt", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "has no tokenizer headlab reads (vocab.json and merges.txt")) << r.err;
}

// circuit on a random GPT-2 folder: IOI prompt pairs from GPT-2's tokenizer, then the user's own pairs;
// every file written, and the errors a user meets.
TEST_F(CliTest, CircuitRunsIoiAndUserPairsOnAGpt2Folder) {
  const std::string dir = path("gpt2c");
  ASSERT_TRUE(fs::exists(kGpt2Vocab + "/vocab.json")) << "run scripts/install-deps.sh: it fetches GPT-2's vocabulary";
  write_random_gpt2(dir, 2);
  Result r = headlab(
      {"circuit", dir, "--task", "ioi", "--rows", "8", "--check-edges", "16", "--by-position", "--out", path("ioi")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "prompt pairs: 8 rows of 15 tokens (ioi: Wang et al.'s template 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "Pearson r = ")) << r.out;
  for (const char* f : {"circuit.json", "circuit.dot", "circuit.svg", "edges.csv", "path_patching.csv",
                        "activation_patching.csv", "report.md"})
    EXPECT_TRUE(fs::exists(path("ioi/") + f)) << f;
  EXPECT_EQ(slurp(path("ioi/circuit.png")).substr(1, 3), "PNG");
  const auto j = nlohmann::json::parse(slurp(path("ioi/circuit.json")));
  // nodes: embed, then 2 heads and an MLP a layer; edges into L0's q/k/v, MLP0, L1's q/k/v, MLP1, the logits
  EXPECT_EQ(j["graph_edges"].get<int64_t>(), 6 * 1 + 3 + 6 * 4 + 6 + 7);
  const std::string path_csv = slurp(path("ioi/path_patching.csv"));
  EXPECT_EQ(std::count(path_csv.begin(), path_csv.end(), '\n'), 1 + 4);  // the header and every head
  const std::string nodes_csv = slurp(path("ioi/activation_patching.csv"));
  EXPECT_EQ(std::count(nodes_csv.begin(), nodes_csv.end(), '\n'), 1 + 6);  // and every head and MLP
  EXPECT_EQ(nodes_csv.substr(0, nodes_csv.find('\n')), "node,noising,noising_effect,denoising");
  EXPECT_TRUE(contains(r.out, "activation patching, denoising: each node's clean output restored")) << r.out;
  EXPECT_TRUE(contains(r.out, "denoising at one position (0-based, of 15)")) << r.out;
  const std::string positions_csv = slurp(path("ioi/activation_patching_by_position.csv"));
  EXPECT_EQ(std::count(positions_csv.begin(), positions_csv.end(), '\n'), 1 + 6 * 15);  // every node at every position
  EXPECT_EQ(positions_csv.substr(0, positions_csv.find('\n')), "node,position,noising,denoising");

  // heads on the same prompt pairs: every per-head analysis on the logit difference.
  r = headlab({"heads", dir, "--task", "ioi", "--rows", "8", "--by-position", "--out", path("heads_ioi")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "prompt pairs: 8 rows of 15 tokens (ioi: Wang et al.'s template 0")) << r.out;
  EXPECT_TRUE(contains(r.out, "logit difference (answer - wrong) at the last position: clean ")) << r.out;
  EXPECT_TRUE(contains(r.out, "heads, by the largest effect")) << r.out;
  const std::string heads_csv = slurp(path("heads_ioi/heads.csv"));
  EXPECT_EQ(heads_csv.substr(0, heads_csv.find('\n')),
            "head,zero_ablation,mean_ablation,resample_ablation,denoising,dla_logits,previous_token,induction,"
            "duplicate_token,first_token,type");
  EXPECT_EQ(std::count(heads_csv.begin(), heads_csv.end(), '\n'), 1 + 4);
  const std::string heads_positions = slurp(path("heads_ioi/heads_by_position.csv"));
  EXPECT_EQ(std::count(heads_positions.begin(), heads_positions.end(), '\n'), 1 + 4 * 15);
  for (const char* f : {"report.md", "attention.html"}) EXPECT_TRUE(fs::exists(path("heads_ioi/") + f)) << f;
  for (const char* f : {"ablation.png", "patching.png", "dla.png"})
    EXPECT_EQ(slurp(path("heads_ioi/") + f).substr(1, 3), "PNG") << f;
  // The resample ablation is the circuit command's noising of the same head on the same pairs.
  const auto column = [&](const std::string& csv, const std::string& row_start, size_t index) {
    const size_t at = csv.find("\n" + row_start + ",");
    EXPECT_NE(at, std::string::npos) << row_start;
    std::stringstream line(csv.substr(at + 1, csv.find('\n', at + 1) - at - 1));
    std::string cell;
    for (size_t i = 0; i <= index; ++i) std::getline(line, cell, ',');
    return std::stod(cell);
  };
  EXPECT_NEAR(column(heads_csv, "L1H1", 3), column(nodes_csv, "L1H1", 2), 1e-5);

  // Greater-than: the probability metric over the two-digit year tokens.
  r = headlab({"circuit", dir, "--task", "greater-than", "--rows", "8", "--check-edges", "8", "--out", path("gt")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "prompt pairs: 8 rows of 12 tokens (greater-than: Hanna et al.'s")) << r.out;
  EXPECT_TRUE(contains(r.out, "probability difference (p(years above the start) - p(the rest)) at the last position"))
      << r.out;

  std::ofstream(path("pairs.jsonl")) << R"({"clean": "When Mary and John went to the store, John gave a drink to", )"
                                     << R"("corrupt": "When Alex and Kate went to the store, Anna gave a drink to", )"
                                     << R"("answer": " Mary", "wrong": " John"})"
                                     << "\n\n";
  r = headlab({"circuit", dir, "--pairs", path("pairs.jsonl"), "--senders", "L0H0,L1H1", "--receivers", "L1H0.k,logits",
               "--out", path("own")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "into L1H0.k, logits only (2 senders")) << r.out;

  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"circuit", dir}, "give the prompt pairs by --task induction|ioi|greater-than or by --pairs FILE"},
           {{"circuit", dir, "--task", "sort"}, "--task is induction, ioi or greater-than, not 'sort'"},
           {{"circuit", std::string(HEADLAB_SOURCE_DIR) + "/tests/fuzz/corpus/checkpoint_file/reverse.h5", "--task",
             "greater-than", "--out", path("e")},
            "greater-than: needs 1 nouns that are one token each"},
           {{"circuit", dir, "--task", "ioi", "--senders", "L9H0", "--out", path("e")},
            "--senders: the model has no node 'L9H0'"},
           {{"heads", dir, "--task", "sort", "--out", path("e")}, "heads: --task is induction, ioi or greater-than"},
           {{"heads", dir, "--task", "ioi", "--text", kGpt2Vocab + "/vocab.json", "--out", path("e")},
            "with --task/--pairs the prompt pairs are the data"},
           {{"circuit", dir, "--task", "induction", "--span", "9", "--out", path("e")},
            "--span 9 makes prompts of 17 tokens"},
           {{"circuit", std::string(HEADLAB_SOURCE_DIR) + "/tests/fuzz/corpus/checkpoint_file/reverse.h5", "--task",
             "ioi", "--out", path("e")},
            "ioi: needs 5 names that are one token each"}}) {
    r = headlab(args);
    EXPECT_EQ(r.code, 1) << args.back();
    EXPECT_TRUE(contains(r.err, message)) << r.err;
  }
}

// An attention-only GPT trains, and every command loads it; export refuses it (GPT-2 has MLPs).
TEST_F(CliTest, AttentionOnlyModelsTrainAndLoadEverywhere) {
  Result r = headlab({"train", "--task", "reverse", "--attn-only", "--steps", "3", "--emb-dim", "16", "--n-heads", "2",
                      "--batch-size", "4", "--eval-every", "3", "--eval-batches", "1", "--out", path("ao")});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string ckpt = path("ao/checkpoint.h5");
  const io::Checkpoint ck = io::load_checkpoint(ckpt);
  EXPECT_TRUE(ck.config["model"]["attn_only"].get<bool>());
  for (const auto& [name, t] : ck.model) EXPECT_EQ(name.find(".ff."), std::string::npos) << name;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"eval", ckpt, "--batches", "1"}, std::vector<std::string>{"inspect", ckpt},
        std::vector<std::string>{"generate", ckpt, "--prompt", "31415"},
        std::vector<std::string>{"attention", ckpt, "--prompt", "31415", "--out", path("ao_att")},
        std::vector<std::string>{"heads", ckpt, "--batches", "1", "--batch-size", "4", "--out", path("ao_heads")},
        std::vector<std::string>{"circuit", ckpt, "--task", "induction", "--rows", "4", "--out", path("ao_circuit")},
        std::vector<std::string>{"heads", ckpt, "--task", "induction", "--rows", "4", "--out",
                                 path("ao_heads_pairs")}}) {
    r = headlab(args);
    EXPECT_EQ(r.code, 0) << args[0] << "\n" << r.err;
  }
  r = headlab({"export", ckpt, "--out", path("ao_hf")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "attention-only model has no MLPs")) << r.err;
  r = headlab({"train", "--resume", "--out", path("ao"), "--steps", "4"});
  EXPECT_EQ(r.code, 0) << r.err;
  // Heads watched while a 2-layer attention-only chars model trains: before the first step, at 2, 4.
  const std::string tiny = std::string(HEADLAB_SOURCE_DIR) + "/data/tiny.txt";
  r = headlab({"train",
               "--task",
               "chars",
               "--text",
               tiny,
               "--attn-only",
               "--context-length",
               "16",
               "--emb-dim",
               "16",
               "--n-heads",
               "2",
               "--steps",
               "4",
               "--batch-size",
               "4",
               "--eval-every",
               "4",
               "--eval-batches",
               "1",
               "--track-heads",
               "2",
               "--out",
               path("watch")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "watching the model (--track-heads) took")) << r.out;
  const std::string watched = slurp(path("watch/heads_over_time.csv"));
  EXPECT_EQ(std::count(watched.begin(), watched.end(), '\n'), 1 + 3 * 4) << watched;  // 3 observations x 4 heads
  EXPECT_TRUE(watched.find("\n4,1,1,") != std::string::npos) << watched;
  EXPECT_TRUE(fs::exists(path("watch/heads_over_time.png")));
  EXPECT_TRUE(contains(slurp(path("watch/heads_over_time.md")), "strongest induction head at the end: L"));
  EXPECT_TRUE(contains(r.out, "heads over time:")) << r.out;
  r = headlab({"train", "--arch", "encoder-decoder", "--attn-only", "--steps", "1", "--out", path("ao_ed")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "--attn-only applies to --arch gpt")) << r.err;
}

// heads over a folder of one run's checkpoints (checkpoint-<step>.h5) gives, for each, the rows train --track-heads
// recorded at that step while the run trained: the same table, bit for bit, from the files alone.
TEST_F(CliTest, HeadsOverARunsCheckpointsIsTheTableTrackedWhileTraining) {
  const std::string tiny = std::string(HEADLAB_SOURCE_DIR) + "/data/tiny.txt";
  Result r =
      headlab({"train", "--task",         "chars",    "--text",       tiny, "--context-length", "16", "--emb-dim",
               "16",    "--n-heads",      "2",        "--steps",      "6",  "--batch-size",     "4",  "--eval-every",
               "6",     "--eval-batches", "1",        "--save-every", "3",  "--keep-last",      "5",  "--track-heads",
               "3",     "--out",          path("run")});
  ASSERT_EQ(r.code, 0) << r.err;
  r = headlab({"heads", path("run"), "--out", path("series")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "headlab heads: 2 checkpoints of one run in " + path("run") + " (steps 3 to 6)"))
      << r.out;
  const std::string series = slurp(path("series/heads_over_time.csv")),
                    tracked = slurp(path("run/heads_over_time.csv"));
  std::string tracked_saved;  // the tracked rows of the steps with a checkpoint (not step 0)
  std::istringstream lines(tracked);
  for (std::string line; std::getline(lines, line);)
    if (!line.starts_with("0,")) tracked_saved += line + "\n";
  EXPECT_EQ(series, tracked_saved);
  EXPECT_EQ(std::count(series.begin(), series.end(), '\n'), 1 + 2 * 4) << series;  // 2 checkpoints x 4 heads
  EXPECT_TRUE(fs::exists(path("series/heads_over_time.png")) && fs::exists(path("series/heads_over_time.md")));
  r = headlab({"heads", path("run"), "--batches", "2"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "over a folder of checkpoints each is scored on the same tracked rows")) << r.err;
}

// scripts/induction.sh, the induction-head reproduction, in its quick form (a few steps on data/tiny.txt
// with this build's binary): both models train with the same settings, heads runs on both, and the
// report has every part, the composition heatmap and the copying ablation included.
TEST_F(CliTest, InductionScriptRunsEndToEnd) {
  const std::string out = path("induction");
  const Result r = run_process(
      {std::string(HEADLAB_SOURCE_DIR) + "/scripts/induction.sh", "--quick", "--out", out, "--headlab", kBinary},
      scratch_dir(), "OMP_NUM_THREADS=1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string report = slurp(out + "/report.md");
  for (const char* part : {"## 2 layers", "## 1 layer", "--repeat-prob 1", "tok/s", "in-context-learning score",
                           "strongest induction head at the end", "labels from `headlab heads`",
                           "repeated random tokens (16 rows of 2 x 16)", "L2/heads_over_time.png",
                           "(`headlab heads --task induction`)", "resample_ablation"})
    EXPECT_TRUE(contains(report, part)) << part << "\n" << report;
  for (const char* file :
       {"L1/heads_over_time.png", "L2/heads/composition.png", "L2/heads/composition.csv", "L1/heads/heads.csv"})
    EXPECT_TRUE(fs::exists(out + "/" + file)) << file;
  EXPECT_FALSE(fs::exists(out + "/L1/heads/composition.csv"));  // one layer: nothing to compose with
  const std::string csv = slurp(out + "/L2/heads/heads.csv");
  EXPECT_TRUE(contains(csv.substr(0, csv.find('\n')), "repeated_zero_delta_loss,repeated_mean_delta_loss,label"));
  const Result bad = run_process({std::string(HEADLAB_SOURCE_DIR) + "/scripts/induction.sh", "--steps"}, scratch_dir());
  EXPECT_NE(bad.code, 0);
}

// Every command on a GPT-2 folder, and the folder's trip through headlab: convert -> a checkpoint that
// evaluates and generates as the folder does -> export back, bitwise; heads and ablate on its text;
// train --init fine-tunes it with its BPE and keeps the head tied.
TEST_F(CliTest, Gpt2FolderConvertsAnalysesAndFineTunes) {
  const std::string vocab = kGpt2Vocab, dir = path("gpt2");
  ASSERT_TRUE(fs::exists(vocab + "/vocab.json")) << "run scripts/install-deps.sh: it fetches GPT-2's vocabulary";
  write_random_gpt2(dir, 2);
  std::string story;
  for (int i = 0; i < 12; ++i)
    story += "Once upon a time there was a small model that read a long story, number " + std::to_string(i) +
             ". It read every word, one token after another, and guessed the next.\n";
  std::ofstream(path("story.txt")) << story;

  Result r = headlab({"convert", dir, "--out", path("gpt2.h5")});
  ASSERT_EQ(r.code, 0) << r.err;
  r = headlab({"inspect", path("gpt2.h5")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "\"type\": \"bpe\"")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"tie_embeddings\": true")) << r.out;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"eval", "--text", path("story.txt"), "--stride", "4"},
        std::vector<std::string>{"generate", "--prompt", "Once upon", "--max-new-tokens", "5"}}) {
    std::vector<std::string> on_folder{args[0], dir}, on_h5{args[0], path("gpt2.h5")};
    on_folder.insert(on_folder.end(), args.begin() + 1, args.end());
    on_h5.insert(on_h5.end(), args.begin() + 1, args.end());
    const Result a = headlab(on_folder), b = headlab(on_h5);
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    const auto figures = [](const std::string& out) { return out.substr(out.find('\n')); };  // after the path
    EXPECT_EQ(figures(a.out), figures(b.out)) << args[0];
  }
  r = headlab({"export", path("gpt2.h5"), "--out", path("back")});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"model.safetensors", "vocab.json", "merges.txt"})
    EXPECT_EQ(slurp(path("back/") + f), slurp(dir + "/" + f)) << f << ": folder -> h5 -> folder is bitwise";

  for (const char* cmd : {"heads", "ablate"}) {
    r = headlab({cmd, dir, "--text", path("story.txt"), "--batches", "1", "--batch-size", "2", "--tokens", "8",
                 "--threads", "1", "--out", path(std::string(cmd) + "_out")});
    ASSERT_EQ(r.code, 0) << cmd << "\n" << r.err;
    EXPECT_TRUE(contains(r.out, "1 validation batch of 2 x 8") || std::string(cmd) == "ablate") << r.out;
  }
  EXPECT_TRUE(fs::exists(path("heads_out/heads.csv")));
  const std::string comp = slurp(path("heads_out/composition.csv"));  // 2 x 2 heads of layer 0 -> layer 1
  EXPECT_EQ(std::count(comp.begin(), comp.end(), '\n'), 5) << comp;
  const std::string page = slurp(path("heads_out/attention.html"));
  const std::vector<std::string> words{"Once",   "upon",  "time", "small", "model",   "read",    "story",
                                       "number", "every", "word", "token", "another", "guessed", "next"};
  EXPECT_TRUE(std::any_of(words.begin(), words.end(), [&](const std::string& w) { return contains(page, w); }))
      << "the page shows the row's tokens as text";
  EXPECT_FALSE(contains(page, "\xc4\xa0")) << "not as vocab.json spells them (\u0120 for a space)";
  r = headlab({"heads", dir, "--batches", "1"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "give --text FILE")) << r.err;
  r = headlab({"heads", dir, "--text", path("story.txt"), "--tokens", "17"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "--tokens 17 is longer than the model's context (16)")) << r.err;

  r = headlab({"train", "--init", dir, "--text", path("story.txt"), "--steps", "2", "--batch-size", "2", "--eval-every",
               "2", "--eval-batches", "1", "--threads", "1", "--out", path("tuned")});
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint tuned = io::load_checkpoint(path("tuned/checkpoint.h5"));
  EXPECT_EQ(tuned.config["task"]["name"], "text");
  EXPECT_TRUE(tuned.config["model"]["tie_embeddings"].get<bool>());
  EXPECT_TRUE(find_named(tuned.model, "out_head.weight") == tuned.model.end()) << "one tied parameter";
  ASSERT_NE(tuned.tokenizer.find("merges.txt"), nullptr);
  EXPECT_EQ(*tuned.tokenizer.find("merges.txt"), slurp(vocab + "/merges.txt"));
  const io::HfGpt2 start = io::read_hf_gpt2(dir);
  const Tensor before = find_named(start.parameters, "tok_emb.weight")->second;
  const Tensor after = find_named(tuned.model, "tok_emb.weight")->second;
  EXPECT_NE(after.to_vector<float>(), before.to_vector<float>()) << "the weights moved";
  r = headlab({"generate", path("tuned/checkpoint.h5"), "--prompt", "Once upon", "--max-new-tokens", "3"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(r.out.starts_with("Once upon")) << r.out;

  r = headlab({"train", "--init", dir, "--steps", "2"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "give --text FILE")) << r.err;
  r = headlab({"train", "--init", dir, "--emb-dim", "16", "--text", path("story.txt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "--emb-dim is fixed by --init")) << r.err;
  fs::create_directories(path("empty_folder"));
  r = headlab({"eval", path("empty_folder"), "--text", path("story.txt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "has no config.json")) << r.err;
  r = headlab({"convert", path("story.txt"), "--out", path("x.h5")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "story.txt")) << r.err;
}

}  // namespace
