// The CLI property test: every option of every command, read from `headlab --options-table` (so an
// option joins by being declared), is given the values a hostile user would give: for numbers NaN,
// inf, -1, 0, 1e30, 2^63, an empty value and a non-number; for input files a folder, a FIFO,
// /dev/zero, a missing path and an empty one; for input folders a file instead, a FIFO, /dev/zero, a
// missing path and an empty one; for output folders a regular file, /dev/null, a path
// below a file and an empty one; for text an empty value and 100k characters. Each run has a time
// limit and (outside the sanitizer build) a memory limit. Expected: no crash, no hang, no sanitizer
// report; a number outside its declared range exits 2 naming the option; a bad path exits 1 or 2
// with a message naming the option or the path.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/hf_gpt2.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/internal.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

namespace fs = std::filesystem;
using headlab::testing::ProcessResult;
using headlab::testing::run_process;

namespace {

const std::string kBinary = std::string(HEADLAB_BINARY_DIR) + "/headlab";

struct OptionRow {
  std::string command, name, type;
  std::string lo, hi;  // numbers: the declared range, lo prefixed by '(' when open
};

std::vector<OptionRow> options_table(const std::string& scratch) {
  const ProcessResult r = run_process({kBinary, "--options-table"}, scratch);
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<OptionRow> rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::istringstream cells(line);
    for (std::string c; std::getline(cells, c, '\t');) f.push_back(c);
    f.resize(5);
    rows.push_back({f[0], f[1], f[2], f[3], f[4]});
  }
  return rows;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// value as a number within the row's range (and whole, for integer options).
bool in_declared_range(const OptionRow& row, const std::string& value) {
  char* end = nullptr;
  const long double x = value.empty() ? NAN : std::strtold(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(x)) return false;
  if (row.type != "FLOAT" && x != std::floor(x)) return false;
  const bool lo_open = !row.lo.empty() && row.lo[0] == '(';
  const long double lo = std::strtold(row.lo.c_str() + (lo_open ? 1 : 0), nullptr);
  const long double hi = std::strtold(row.hi.c_str(), nullptr);
  return (lo_open ? x > lo : x >= lo) && x <= hi;
}

class CliOptionsTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A chars checkpoint (so that --text and free --prompt text apply), trained for two steps.
  static void SetUpTestSuite() {
    ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is not built";
    scratch_ = new headlab::testing::TempDir("cli_options_test");
    const ProcessResult r = run_process({kBinary,
                                         "train",
                                         "--task",
                                         "chars",
                                         "--context-length",
                                         "16",
                                         "--emb-dim",
                                         "8",
                                         "--n-heads",
                                         "2",
                                         "--n-layers",
                                         "1",
                                         "--batch-size",
                                         "2",
                                         "--steps",
                                         "2",
                                         "--eval-every",
                                         "2",
                                         "--eval-batches",
                                         "1",
                                         "--threads",
                                         "1",
                                         "--out",
                                         scratch_->path("model")},
                                        scratch_->dir());
    ASSERT_EQ(r.code, 0) << r.err;
    ckpt_ = scratch_->path("model/checkpoint.h5");
    ASSERT_EQ(::mkfifo(scratch_->path("fifo").c_str(), 0600), 0);
    std::ofstream(scratch_->path("file")) << "not a folder\n";
    // A byte-level BPE vocabulary of the 256 byte tokens and no merges, for tokenize.
    fs::create_directories(scratch_->path("bpe"));
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b)
      vocab[headlab::tasks::detail::encode_utf8(headlab::tasks::gpt2_byte_to_unicode(uint8_t(b)))] = b;
    std::ofstream(scratch_->path("bpe/vocab.json")) << vocab.dump();
    std::ofstream(scratch_->path("bpe/merges.txt")) << "#version: 0.2\n";
    // A GPT-2 folder of that vocabulary, for convert.
    headlab::nn::DecoderConfig c;
    c.vocab_size = 256, c.context_length = 8, c.emb_dim = 8, c.n_heads = 2, c.n_layers = 1, c.qkv_bias = true;
    c.tie_embeddings = true;
    headlab::nn::DecoderModel model(c);
    headlab::io::write_hf_gpt2(scratch_->path("gpt2"), model,
                               {"bpe", {{"vocab.json", vocab.dump()}, {"merges.txt", "#version: 0.2\n"}}});
  }
  static void TearDownTestSuite() {
    delete scratch_;
    scratch_ = nullptr;
  }

  // A quick, valid run of the command: {option, value} pairs ("" names the positional argument).
  static std::vector<std::pair<std::string, std::string>> base(const std::string& command) {
    const std::string out = scratch_->path("out_" + command);
    if (command == "train")
      return {{"--task", "chars"},     {"--context-length", "16"}, {"--emb-dim", "8"}, {"--n-heads", "2"},
              {"--n-layers", "1"},     {"--batch-size", "2"},      {"--steps", "1"},   {"--eval-every", "1"},
              {"--eval-batches", "1"}, {"--threads", "1"},         {"--out", out},     {"--overwrite", ""}};
    if (command == "compare")
      return {{"--no-peer-grid", ""}, {"--no-sweep", ""}, {"--config", "t,1,4,8,8,2"}, {"--torch-peer", "off"},
              {"--repeats", "1"},     {"--warmup", "0"},  {"--threads", "1"},          {"--out", out}};
    if (command == "eval") return {{"checkpoint", ckpt_}, {"--batches", "1"}, {"--threads", "1"}};
    if (command == "generate") return {{"checkpoint", ckpt_}, {"--prompt", "ab"}, {"--max-new-tokens", "2"}};
    if (command == "inspect") return {{"checkpoint", ckpt_}};
    if (command == "attention") return {{"checkpoint", ckpt_}, {"--prompt", "ab"}, {"--threads", "1"}, {"--out", out}};
    if (command == "ablate")
      return {{"checkpoint", ckpt_}, {"--batches", "1"}, {"--batch-size", "2"},
              {"--repeats", "1"},    {"--threads", "1"}, {"--out", out}};
    if (command == "tokenize") return {{"checkpoint", scratch_->path("bpe")}, {"--prompt", "ab"}};
    if (command == "export") return {{"checkpoint", ckpt_}, {"--out", out}};
    if (command == "convert")
      return {{"checkpoint", scratch_->path("gpt2")}, {"--out", out + ".h5"}, {"--overwrite", ""}};
    if (command == "heads")
      return {{"checkpoint", ckpt_}, {"--batches", "1"}, {"--batch-size", "2"}, {"--threads", "1"}, {"--out", out}};
    if (command == "circuit")
      return {{"checkpoint", ckpt_},  {"--task", "induction"}, {"--rows", "2"},
              {"--check-edges", "4"}, {"--threads", "1"},      {"--out", out}};
    if (command == "sae")
      return {{"action", "train"},         {"checkpoint", ckpt_},  {"--hook", "blocks.0.hook_resid_post"},
              {"--training-tokens", "32"}, {"--batch-size", "16"}, {"--buffer-rows", "32"},
              {"--tokens", "8"},           {"--threads", "1"},     {"--out", out}};
    ADD_FAILURE() << "no base invocation for '" << command << "': add one to this test";
    return {};
  }

  // The base invocation with `option` set to `value` (replacing the base's own value).
  static ProcessResult run_with(const std::string& command, const OptionRow& row, const std::string& value) {
    std::vector<std::string> argv{kBinary, command};
    const std::string& key = row.name;  // a positional argument's is its name, given without it
    bool placed = false;
    for (const auto& [name, v] : base(command)) {
      const bool ours = name == key;
      if (name.starts_with("-")) argv.push_back(name);
      if (ours) {
        argv.push_back(value);
        placed = true;
      } else if (!v.empty()) {
        argv.push_back(v);
      }
    }
    if (!placed) {
      if (key.starts_with("-")) argv.push_back(key);
      argv.push_back(value);
    }
    std::string limits = "OMP_NUM_THREADS=1 timeout -s KILL 60";
    if (!headlab::testing::kAddressSanitizer)
      limits += " prlimit --as=8000000000";  // ASan reserves terabytes of address space
    return run_process(argv, scratch_->dir(), limits);
  }

  static headlab::testing::TempDir* scratch_;
  static std::string ckpt_;
};
headlab::testing::TempDir* CliOptionsTest::scratch_ = nullptr;
std::string CliOptionsTest::ckpt_;

// What every run must avoid, whatever the value: a signal, the time limit, a sanitizer report, an
// exit code other than 0, 1 or 2, a failure without a message.
void expect_sound(const ProcessResult& r, const std::string& what) {
  EXPECT_LE(r.code, 2) << what << ": crashed or hung (exit " << r.code << ")\n" << r.err;
  EXPECT_FALSE(contains(r.err, "Sanitizer") || contains(r.err, "runtime error:")) << what << "\n" << r.err;
  EXPECT_FALSE(contains(r.err, "internal error")) << what << ": an error nobody named\n" << r.err;
  if (r.code != 0) {
    EXPECT_FALSE(r.err.empty()) << what << ": exit " << r.code << " without a message";
  }
}

TEST_P(CliOptionsTest, EveryOptionRefusesBadValuesCleanly) {
  const std::string command = GetParam();
  const std::string long_text(100000, 'x');
  const std::vector<std::string> numbers{"nan", "inf", "-1", "0", "1e30", "9223372036854775808", "", "x1"};
  const std::vector<std::string> files{scratch_->dir(), scratch_->path("fifo"), "/dev/zero",
                                       scratch_->path("missing.h5"), ""};
  const std::vector<std::string> folders{scratch_->path("file"), scratch_->path("fifo"), "/dev/zero",
                                         scratch_->path("missing"), ""};
  const std::vector<std::string> dirs{scratch_->path("file"), "/dev/null", scratch_->path("file/below"), ""};
  const std::vector<std::string> out_files{scratch_->dir(), scratch_->path("fifo"), scratch_->path("file/below"),
                                           scratch_->path("missing/x.h5"), ""};
  int options = 0, runs = 0;
  for (const OptionRow& row : options_table(scratch_->dir())) {
    if (row.command != command || row.type == "FLAG") continue;
    ++options;
    const bool number = row.type == "INT" || row.type == "UINT" || row.type == "FLOAT";
    if (number) {
      EXPECT_FALSE(row.lo.empty()) << command << " " << row.name << " declares no range";
    }
    const std::vector<std::string>& values = number                  ? numbers
                                             : row.type == "FILE"    ? files
                                             : row.type == "DIR"     ? dirs
                                             : row.type == "FOLDER"  ? folders
                                             : row.type == "OUTFILE" ? out_files
                                                                     : std::vector<std::string>{"", long_text};
    for (const std::string& value : values) {
      ++runs;
      const std::string what = "headlab " + command + " " + row.name + " '" +
                               (value.size() > 40 ? value.substr(0, 40) + "..." : value) + "'";
      const ProcessResult r = run_with(command, row, value);
      expect_sound(r, what);
      if (number && !in_declared_range(row, value)) {
        EXPECT_EQ(r.code, 2) << what << ": outside " << row.lo << ", " << row.hi << "\n" << r.err;
        EXPECT_TRUE(contains(r.err, row.name)) << what << ": the error does not name the option\n" << r.err;
      }
      if (row.type == "FILE" || row.type == "FOLDER" || row.type == "DIR" || row.type == "OUTFILE") {
        EXPECT_TRUE(r.code == 1 || r.code == 2) << what << ": accepted (exit " << r.code << ")\n" << r.out;
        const bool named = contains(r.err, row.name) || (!value.empty() && contains(r.err, value));
        EXPECT_TRUE(named) << what << ": the error names neither the option nor the path\n" << r.err;
      }
    }
  }
  EXPECT_GT(options, 0) << "the options table lists nothing for " << command;
  std::cout << command << ": " << options << " options, " << runs << " runs\n";
}

INSTANTIATE_TEST_SUITE_P(Commands, CliOptionsTest,
                         ::testing::Values("train", "eval", "generate", "inspect", "compare", "attention", "ablate",
                                           "heads", "tokenize", "export", "convert", "circuit", "sae"));

// The table covers every command the binary has, so a new command cannot slip past the test above.
TEST(CliOptionsTable, CoversEveryCommand) {
  headlab::testing::TempDir tmp("cli_options_table");
  std::set<std::string> commands;
  for (const OptionRow& row : options_table(tmp.dir())) commands.insert(row.command);
  EXPECT_EQ(commands, (std::set<std::string>{"ablate", "attention", "circuit", "compare", "convert", "eval", "export",
                                             "generate", "heads", "inspect", "sae", "tokenize", "train"}));
}

}  // namespace
