// What a hostile user found, each checked against the real `headlab` binary (or the library where a
// child process is not needed): one writer per output folder; inputs that are not regular files refused
// instead of opened (a FIFO blocked forever); --resume refusing options that contradict the checkpoint
// and applying the ones that may change; divergence without a NaN; messages that claim only what was
// written; sizes the machine cannot hold refused before anything is allocated.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "base/input_path.h"
#include "base/sizes.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/folder_lock.h"
#include "io/hf_gpt2.h"
#include "nn/decoder_family.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/internal.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "train/memory.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace headlab;
using headlab::testing::error_of;
using headlab::testing::run_process;
using headlab::testing::slurp;
using Result = headlab::testing::ProcessResult;

extern char** environ;

namespace {

const std::string kBinary = std::string(HEADLAB_BINARY_DIR) + "/headlab";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class ReliabilityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(fs::exists(kBinary)) << kBinary << " is not built (target headlab_cli)"; }
  std::string path(const std::string& name) const { return tmp_.path(name); }
  // The binary with these arguments, one thread, under a time limit: a hang ends as exit code 124.
  Result headlab(const std::vector<std::string>& args, int seconds = 60) const {
    std::vector<std::string> argv{kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, tmp_.dir(), "OMP_NUM_THREADS=1 timeout " + std::to_string(seconds));
  }
  // A tiny reverse run (emb 16, batch 8) of `steps` steps into `out`, every step logged and evaluated.
  void train_tiny(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args{"train",
                                  "--out",
                                  out,
                                  "--steps",
                                  std::to_string(steps),
                                  "--emb-dim",
                                  "16",
                                  "--batch-size",
                                  "8",
                                  "--eval-batches",
                                  "1",
                                  "--eval-every",
                                  "1",
                                  "--warmup",
                                  "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    const Result r = headlab(args);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  // A tiny chars run (context 8) of `steps` steps into `out`, on t.txt (the alphabet, 20 times).
  void train_tiny_chars(const std::string& out, int64_t steps) const {
    {
      std::ofstream text(path("t.txt"));
      for (int i = 0; i < 20; ++i) text << "abcdefghijklmnopqrstuvwxyz ";
    }
    const Result r =
        headlab({"train", "--task", "chars", "--text", path("t.txt"), "--steps", std::to_string(steps), "--emb-dim",
                 "16", "--batch-size", "2", "--context-length", "8", "--eval-batches", "1", "--out", out});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  headlab::testing::TempDir tmp_{"reliability_test"};
};

// The pid in a folder's lock file ("" when empty or absent).
std::string lock_holder(const std::string& dir) { return slurp(dir + "/" + io::FolderLock::file_name()); }

// ---- one writer per folder ------------------------------------------------------------------------

TEST_F(ReliabilityTest, FolderLockRefusesASecondHolderAndIsTakenOverOnceReleased) {
  const std::string dir = path("out");
  fs::create_directories(dir);
  {
    const io::FolderLock first(dir, "train");
    EXPECT_TRUE(first.held());
    EXPECT_EQ(lock_holder(dir), std::to_string(::getpid()));
    // (flock conflicts between two open file descriptions even in one process)
    EXPECT_EQ(error_of([&] { io::FolderLock second(dir, "ablate"); }),
              "ablate: '" + dir + "' is in use by headlab process " + std::to_string(::getpid()) +
                  "; wait for it or choose another --out");
  }
  const io::FolderLock again(dir, "train");  // released with the first: taken at once
  EXPECT_TRUE(again.held());
}

// A process that dies holding the lock (no destructor runs) leaves its pid in the file; the kernel has
// dropped the flock, so the next run takes it over and writes its own pid.
TEST_F(ReliabilityTest, TheLockOfADeadProcessIsTakenOver) {
  const std::string dir = path("out");
  fs::create_directories(dir);
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      io::FolderLock held(dir, "train");
      ::_exit(0);  // dies holding it
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(lock_holder(dir), std::to_string(child)) << "the dead process's pid is left in the file";
  const io::FolderLock mine(dir, "train");
  EXPECT_EQ(lock_holder(dir), std::to_string(::getpid()));
}

// Every command with an --out, in a run that writes into `folder` (convert: a file there). `ck` is a
// tiny reverse checkpoint, `hf` a GPT-2 folder with a tokenizer.
std::vector<std::pair<std::string, std::vector<std::string>>> writing_commands(const std::string& ck,
                                                                               const std::string& hf,
                                                                               const std::string& folder) {
  return {
      {"train", {"train", "--out", folder, "--steps", "2", "--emb-dim", "16", "--eval-batches", "1"}},
      {"ablate", {"ablate", ck, "--out", folder, "--batches", "1"}},
      {"heads", {"heads", ck, "--out", folder, "--batches", "1"}},
      {"attention", {"attention", ck, "--prompt", "1234", "--out", folder}},
      {"compare",
       {"compare", "--no-peer-grid", "--heads", "1", "--emb-dim", "8", "--tokens", "4", "--batch", "1", "--repeats",
        "1", "--warmup", "0", "--torch-peer", "off", "--out", folder}},
      {"circuit", {"circuit", ck, "--task", "induction", "--rows", "2", "--check-edges", "4", "--out", folder}},
      {"export", {"export", ck, "--out", folder}},
      {"convert", {"convert", hf, "--out", folder + "/converted.h5"}},
      {"sae",
       {"sae", "train", ck, "--hook", "blocks.0.hook_resid_post", "--training-tokens", "64", "--batch-size", "32",
        "--buffer-rows", "64", "--out", folder}},
  };
}

// The commands the options table says have an --out.
std::set<std::string> commands_with_out(const std::string& scratch) {
  const Result r = run_process({kBinary, "--options-table"}, scratch);
  std::set<std::string> names;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.find("\t--out\t") != std::string::npos) names.insert(line.substr(0, line.find('\t')));
  return names;
}

// A GPT-2 folder of the 256 byte tokens (vocab.json, merges.txt), for convert.
void write_byte_gpt2_folder(const std::string& dir) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[tasks::detail::encode_utf8(tasks::gpt2_byte_to_unicode(uint8_t(b)))] = b;
  nn::DecoderConfig c;
  c.vocab_size = 256, c.context_length = 8, c.emb_dim = 8, c.n_heads = 2, c.n_layers = 1, c.qkv_bias = true;
  c.tie_embeddings = true;
  const nn::DecoderModel model(c);
  io::write_hf_gpt2(dir, model, {"bpe", {{"vocab.json", vocab.dump()}, {"merges.txt", "#version: 0.2\n"}}});
}

// Every command that writes into a folder refuses one another process holds, naming that process,
// and writes nothing there; the list covers every command with an --out.
TEST_F(ReliabilityTest, EveryWritingCommandRefusesAFolderInUse) {
  train_tiny(path("run"), 2);
  write_byte_gpt2_folder(path("gpt2"));
  const std::string ck = path("run/checkpoint.h5"), busy = path("busy");
  fs::create_directories(busy);
  const io::FolderLock held(busy, "test");
  const std::string holder =
      "is in use by headlab process " + std::to_string(::getpid()) + "; wait for it or choose another --out";
  std::set<std::string> covered;
  for (const auto& [cmd, args] : writing_commands(ck, path("gpt2"), busy)) {
    covered.insert(cmd);
    const Result r = headlab(args);
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, cmd + ": '" + busy + "' " + holder)) << cmd << ": " << r.err;
  }
  EXPECT_EQ(covered, commands_with_out(tmp_.dir())) << "a command with --out is missing from writing_commands";
  EXPECT_EQ(fs::directory_iterator(busy)->path().filename(), io::FolderLock::file_name()) << "nothing else written";
  EXPECT_EQ(std::distance(fs::directory_iterator(busy), fs::directory_iterator()), 1);
}

// A writer killed half-way leaves .headlab-tmp-<pid>.<name> behind (a file, or export's folder); every
// command that writes into a folder removes those of dead processes there, and only those.
TEST_F(ReliabilityTest, EveryWritingCommandRemovesDeadWritersTempFiles) {
  train_tiny(path("run"), 2);
  write_byte_gpt2_folder(path("gpt2"));
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = ".headlab-tmp-" + std::to_string(dead) + ".";
  const std::string live = ".headlab-tmp-" + std::to_string(::getpid()) + ".x.csv";
  for (const auto& [cmd, unused] : writing_commands("", "", "")) {
    const std::string out = path("w_" + cmd);
    std::vector<std::string> mine;
    for (const auto& [name, args] : writing_commands(path("run/checkpoint.h5"), path("gpt2"), out))
      if (name == cmd) mine = args;
    fs::create_directories(out);
    fs::create_directories(out + "/" + stale + "hf");  // an export's folder
    std::ofstream(out + "/" + stale + "metrics.csv") << "half";
    // (export swaps the whole folder in, so it refuses one holding a live writer's file)
    if (cmd != "export") std::ofstream(out + "/" + live) << "a live writer's";
    const Result r = headlab(mine);
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.err;
    EXPECT_FALSE(fs::exists(out + "/" + stale + "hf")) << cmd;
    EXPECT_FALSE(fs::exists(out + "/" + stale + "metrics.csv")) << cmd;
    if (cmd != "export") {
      EXPECT_TRUE(fs::exists(out + "/" + live)) << cmd << " removed a live process's file";
    }
  }
}

// A command run again into its own output folder replaces what it wrote there (train and convert when told
// to): the demo and every script can be rerun. ablate's fine-tune trains into its own subfolder.
TEST_F(ReliabilityTest, EveryWritingCommandRerunReplacesItsOwnOutput) {
  train_tiny(path("run"), 2);
  write_byte_gpt2_folder(path("gpt2"));
  for (const auto& [cmd, unused] : writing_commands("", "", "")) {
    const std::string out = path("again_" + cmd);
    fs::create_directories(out);  // (convert writes a file into a folder that must exist)
    std::vector<std::string> args;
    for (const auto& [name, a] : writing_commands(path("run/checkpoint.h5"), path("gpt2"), out))
      if (name == cmd) args = a;
    if (cmd == "train" || cmd == "convert") args.push_back("--overwrite");
    if (cmd == "ablate") args.insert(args.end(), {"--prune", "1", "--finetune", "2"});
    for (int run = 0; run < 2; ++run) {
      const Result r = headlab(args);
      EXPECT_EQ(r.code, 0) << cmd << " run " << run << ": " << r.err;
    }
  }
}

// train without --resume into a folder holding another run: refused, naming its files and the options
// that would allow it; --overwrite removes the earlier run first, so the histories never mix.
TEST_F(ReliabilityTest, TrainNeverMixesTwoRunsInOneFolder) {
  const std::string out = path("run");
  train_tiny(out, 3, {"--save-every", "1", "--keep-last", "5"});
  const std::string before = slurp(out + "/checkpoint.h5");
  const Result again = headlab({"train", "--out", out, "--steps", "1", "--emb-dim", "16"});
  EXPECT_EQ(again.code, 1) << again.err;
  EXPECT_TRUE(
      contains(again.err, "train: '" + out +
                              "' holds another run (checkpoint-1.h5, checkpoint-2.h5, "
                              "checkpoint-3.h5, checkpoint.h5, and 1 more); continue it with --resume, replace it "
                              "with --overwrite, or choose another --out"))
      << again.err;
  EXPECT_EQ(slurp(out + "/checkpoint.h5"), before) << "the refused run touched the checkpoint";
  const Result both = headlab({"train", "--out", out, "--resume", "--overwrite", "--steps", "4"});
  EXPECT_EQ(both.code, 1) << both.err;
  EXPECT_TRUE(contains(both.err, "give one of them")) << both.err;
  train_tiny(out, 1, {"--overwrite"});
  EXPECT_FALSE(fs::exists(out + "/checkpoint-3.h5")) << "the earlier run's history was left beside the new one";
  EXPECT_TRUE(fs::exists(out + "/checkpoint-1.h5"));
  EXPECT_EQ(io::load_checkpoint(out + "/checkpoint.h5").trainer.step, 1);
}

// export writes the whole folder or nothing: into a new folder, or over a folder it wrote whole (the old
// files go, those it does not write this time included); a folder holding anything else is refused,
// naming the files, and left as it was.
TEST_F(ReliabilityTest, ExportReplacesOnlyAWholeFolderItWrote) {
  train_tiny(path("run"), 2);
  const std::string ck = path("run/checkpoint.h5"), hf = path("hf");
  ASSERT_EQ(headlab({"export", ck, "--out", hf}).code, 0);
  EXPECT_TRUE(fs::exists(hf + "/config.json") && fs::exists(hf + "/model.safetensors"));
  // An earlier export that wrote a tokenizer file this one does not: it must not survive beside new weights.
  std::ofstream(hf + "/vocab.json") << "{}";
  std::ofstream(hf + "/" + io::AtomicFolder::manifest_name(), std::ios::app) << "vocab.json\n";
  const Result r = headlab({"export", ck, "--out", hf});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(hf + "/vocab.json")) << "an old file was left beside the new ones";
  EXPECT_FALSE(contains(slurp(hf + "/" + io::AtomicFolder::manifest_name()), "vocab.json"));
  // Anything else: refused, nothing changed.
  std::ofstream(hf + "/notes.txt") << "mine";
  const std::string weights = slurp(hf + "/model.safetensors");
  const Result theirs = headlab({"export", ck, "--out", hf});
  EXPECT_EQ(theirs.code, 1);
  EXPECT_TRUE(
      contains(theirs.err, "export: '" + hf +
                               "' holds files headlab did not write there (notes.txt); export "
                               "replaces a folder only whole and only one it wrote: choose a new or empty --out"))
      << theirs.err;
  EXPECT_EQ(slurp(hf + "/model.safetensors"), weights);
  // --out a link to a folder: the folder it names is replaced, the link kept and pointing at the new one.
  fs::remove(hf + "/notes.txt");
  fs::create_directory_symlink(hf, path("link"));
  const Result linked = headlab({"export", ck, "--out", path("link")});
  EXPECT_EQ(linked.code, 0) << linked.err;
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_TRUE(fs::exists(path("link/model.safetensors")) && fs::exists(hf + "/config.json"));
  // The checkpoint's own folder is another run's: refused, the checkpoint kept.
  const Result own = headlab({"export", ck, "--out", path("run")});
  EXPECT_EQ(own.code, 1);
  EXPECT_TRUE(contains(own.err, "holds files headlab did not write there")) << own.err;
  EXPECT_TRUE(fs::exists(ck));
  for (const auto& e : fs::directory_iterator(tmp_.dir()))
    EXPECT_FALSE(e.path().filename().string().starts_with(".headlab-tmp-")) << e.path() << " left behind";
}

// convert replaces nothing it was not told to, and never its own input.
TEST_F(ReliabilityTest, ConvertReplacesNeitherAnExistingFileNorItsInput) {
  const std::string gpt2 = path("gpt2");
  write_byte_gpt2_folder(gpt2);
  const std::string weights = slurp(gpt2 + "/model.safetensors");
  const Result exists = headlab({"convert", gpt2, "--out", gpt2 + "/model.safetensors"});
  EXPECT_EQ(exists.code, 1);
  EXPECT_TRUE(contains(
      exists.err,
      "convert: --out '" + gpt2 + "/model.safetensors' exists; replace it with --overwrite, or choose another name"))
      << exists.err;
  const Result input = headlab({"convert", gpt2, "--out", gpt2 + "/model.safetensors", "--overwrite"});
  EXPECT_EQ(input.code, 1);
  EXPECT_TRUE(contains(input.err, ": will not replace '" + gpt2 +
                                      "/model.safetensors': it is an input of this command (write the output "
                                      "somewhere else)"))
      << input.err;
  EXPECT_EQ(slurp(gpt2 + "/model.safetensors"), weights);
  // The same file under another name (a hard link) is the same input.
  ASSERT_EQ(::link((gpt2 + "/model.safetensors").c_str(), path("linked.safetensors").c_str()), 0);
  const Result linked = headlab({"convert", gpt2, "--out", path("linked.safetensors"), "--overwrite"});
  EXPECT_EQ(linked.code, 1);
  EXPECT_TRUE(contains(linked.err, "it is an input of this command")) << linked.err;
  EXPECT_EQ(slurp(gpt2 + "/model.safetensors"), weights);
  ASSERT_EQ(headlab({"convert", gpt2, "--out", path("c.h5")}).code, 0);
  EXPECT_EQ(headlab({"convert", gpt2, "--out", path("c.h5"), "--overwrite"}).code, 0);
}

// Two real train runs into one folder: the second is refused naming the first's pid; once the first
// has ended, a third run goes ahead.
TEST_F(ReliabilityTest, ASecondTrainRunIntoTheSameFolderIsRefused) {
  const std::string out = path("shared");
  std::vector<std::string> args{kBinary,        "train",  "--out",        out,     "--steps",        "100000",
                                "--emb-dim",    "16",     "--batch-size", "8",     "--eval-batches", "1",
                                "--save-every", "100000", "--eval-every", "100000"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t first = 0;
  ASSERT_EQ(posix_spawn(&first, kBinary.c_str(), &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  const auto t0 = std::chrono::steady_clock::now();
  while (lock_holder(out) != std::to_string(first) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(lock_holder(out), std::to_string(first)) << "the first run holds the folder";
  const Result second = headlab({"train", "--out", out, "--steps", "2", "--emb-dim", "16"});
  ::kill(first, SIGINT);  // it saves a checkpoint and ends
  int status = 0;
  ::waitpid(first, &status, 0);
  EXPECT_EQ(second.code, 1) << second.out << second.err;
  EXPECT_TRUE(contains(second.err, "train: '" + out + "' is in use by headlab process " + std::to_string(first) +
                                       "; wait for it or choose another --out"))
      << second.err;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130) << "the first run was interrupted, not disturbed";
  const Result third = headlab({"train", "--out", out, "--resume", "--steps",
                                std::to_string(io::load_checkpoint(out + "/checkpoint.h5").trainer.step + 1)});
  EXPECT_EQ(third.code, 0) << third.err;
}

// ---- input paths ------------------------------------------------------------------------------------

// A FIFO, a folder, a character device and a socket given as a checkpoint or a text file: one line
// naming the command, the path and what it is, at once (a FIFO blocked open() until the time limit).
TEST_F(ReliabilityTest, InputsThatAreNotRegularFilesAreRefusedWithoutOpeningThem) {
  train_tiny(path("run"), 1);
  const std::string fifo = path("fifo"), sock = path("sock");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {fifo, "is not a regular file (it is a FIFO)"},
      {sock, "is not a regular file (it is a socket)"},
      {"/dev/zero", "is not a regular file (it is a character device)"},
      {path("plain"), "is a folder, not a file"}};  // (a run's folder is heads' series of checkpoints)
  fs::create_directory(path("plain"));
  for (const auto& [input, what] : inputs) {
    for (const std::string cmd : {"eval", "inspect", "ablate", "heads"}) {
      const Result r =
          cmd == "eval" || cmd == "inspect" ? headlab({cmd, input}, 20) : headlab({cmd, input, "--out", path("o")}, 20);
      EXPECT_EQ(r.code, 1) << cmd << " " << input << ": " << r.err;
      EXPECT_TRUE(contains(r.err, cmd + ": checkpoint '" + input + "' " + what)) << cmd << ": " << r.err;
    }
    for (const std::string cmd : {"generate", "attention"}) {
      const Result r = headlab({cmd, input, "--prompt", "12"}, 20);
      EXPECT_EQ(r.code, 1) << cmd << " " << input << ": " << r.err;
      EXPECT_TRUE(contains(r.err, cmd + ": checkpoint '" + input + "' " + what)) << cmd << ": " << r.err;
    }
  }
  const Result peer = headlab({"compare", "--no-peer-grid", "--heads", "1", "--emb-dim", "8", "--tokens", "4",
                               "--batch", "1", "--torch-peer", "on", "--torch-peer-script", fifo, "--out", path("c")},
                              20);
  EXPECT_EQ(peer.code, 1) << peer.err;
  EXPECT_TRUE(contains(peer.err, "compare: --torch-peer-script '" + fifo + "' is not a regular file (it is a FIFO)"))
      << peer.err;
  // --text: the task says which file, as for a missing one
  const Result text = headlab({"train", "--task", "chars", "--text", fifo, "--steps", "1", "--out", path("t")}, 20);
  EXPECT_EQ(text.code, 1) << text.err;
  EXPECT_TRUE(contains(text.err, "text file '" + fifo + "' is not a regular file (it is a FIFO)")) << text.err;
  // The library's readers: an error, not a hang.
  const auto child = headlab::testing::run_in_child([&] { io::load_checkpoint(fifo); });
  EXPECT_TRUE(child.error) << child.abnormal;
  EXPECT_TRUE(contains(child.message, "checkpoint '" + fifo + "': is not a regular file (it is a FIFO)"))
      << child.message;
  ::close(fd);
}

TEST_F(ReliabilityTest, InputPathHelperNamesWhatThePathIs) {
  const std::string file = path("f.txt"), dir = path("d");
  std::ofstream(file) << "x";
  fs::create_directories(dir);
  EXPECT_EQ(not_a_file_reason(file), "");
  EXPECT_EQ(not_a_file_reason(path("missing")), "does not exist");
  EXPECT_EQ(not_a_file_reason(path("f.txt/below")), "does not exist");
  EXPECT_EQ(not_a_file_reason(dir), "is a folder, not a file");
  EXPECT_EQ(error_of([&] { check_input_file(path("missing"), "eval: checkpoint", true); }), "<no error>")
      << "missing_ok: the reader reports it";
  EXPECT_EQ(error_of([&] { check_input_file(path("missing"), "eval: checkpoint"); }),
            "eval: checkpoint '" + path("missing") + "' does not exist");
  EXPECT_EQ(error_of([&] { check_input_file("/dev/null", "eval: checkpoint"); }),
            "eval: checkpoint '/dev/null' is not a regular file (it is a character device)");
  EXPECT_EQ(error_of([&] { check_input_folder(dir, "x:"); }), "<no error>");
  EXPECT_EQ(error_of([&] { check_input_folder(file, "x:"); }), "x: '" + file + "' is not a folder (it is a file)");
  EXPECT_EQ(error_of([&] { check_input_folder(path("missing"), "x:"); }),
            "x: '" + path("missing") + "' does not exist");
}

// ---- --resume -------------------------------------------------------------------------------------

TEST_F(ReliabilityTest, ResumeRefusesOptionsThatContradictTheCheckpoint) {
  const std::string out = path("r");
  train_tiny(out, 3);
  const std::string before = slurp(out + "/checkpoint.h5");
  const Result r = headlab({"train", "--resume", "--out", out, "--steps", "6", "--emb-dim", "32", "--task", "copy",
                            "--n-layers", "2", "--batch-size", "4", "--seed", "7"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  for (const char* part :
       {"train --resume: ", "--emb-dim 32 differs from the checkpoint's 16",
        "--task copy differs from the checkpoint's reverse", "--batch-size 4 differs from the checkpoint's 8",
        "--seed 7 differs from the checkpoint's 1"})
    EXPECT_TRUE(contains(r.err, part)) << part << "\n" << r.err;
  EXPECT_FALSE(contains(r.err, "--n-layers")) << "2 layers is what the checkpoint has\n" << r.err;
  EXPECT_EQ(slurp(out + "/checkpoint.h5"), before) << "nothing was run";
  // Told, but equal to the checkpoint's: no difference.
  const Result same =
      headlab({"train", "--resume", "--out", out, "--steps", "4", "--emb-dim", "16", "--task", "reverse"});
  EXPECT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(io::load_checkpoint(out + "/checkpoint.h5").trainer.step, 4);
}

// Options that may change are applied (the checkpoint written after resuming holds them) and reported.
TEST_F(ReliabilityTest, ResumeAppliesAndReportsWhatMayChange) {
  const std::string out = path("r");
  train_tiny(out, 3);
  const Result r = headlab({"train", "--resume", "--out", out, "--steps", "8", "--lr", "0.001", "--eval-every", "4",
                            "--grad-clip", "0.5", "--save-every", "4"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out,
                       "resume: changed --lr 0.001 (was 0.003), --grad-clip 0.5 (was 1), --eval-every 4 (was 1), "
                       "--save-every 4 (was 200), --steps 8 (was 3)"))
      << r.out;
  const io::Checkpoint ck = io::load_checkpoint(out + "/checkpoint.h5");
  const train::RunConfig c = train::RunConfig::from_json(ck.config);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.001);
  EXPECT_DOUBLE_EQ(c.schedule.lr, 0.001);
  EXPECT_DOUBLE_EQ(c.run.grad_clip, 0.5);
  EXPECT_EQ(c.run.eval_every, 4);
  std::vector<int64_t> steps;
  for (const io::MetricRow& m : ck.trainer.metrics) steps.push_back(m.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 8})) << "evaluated every 4 steps after the resume";
  EXPECT_DOUBLE_EQ(ck.trainer.metrics.back().lr, c.schedule.at(7)) << "the schedule from the new peak";
  EXPECT_TRUE(fs::exists(out + "/checkpoint-4.h5"));
}

// ---- divergence ---------------------------------------------------------------------------------------

TEST_F(ReliabilityTest, LossSpikeRule) {
  auto rows = [](std::vector<double> losses) {
    std::vector<io::MetricRow> r;
    for (size_t i = 0; i < losses.size(); ++i) r.push_back(io::MetricRow{int64_t(i + 1), losses[i]});
    return r;
  };
  const int64_t V = 14;  // ln 14 = 2.64
  EXPECT_EQ(train::loss_spike(30, rows({2.0, 2.0, 2.0}), 10, 0, V).substr(0, 8), "loss 30,");
  EXPECT_EQ(train::loss_spike(30, rows({2.0, 2.0, 2.0}), 10, 10, V), "") << "within the warm-up";
  EXPECT_EQ(train::loss_spike(30, rows({2.0, 2.0}), 10, 0, V), "") << "too few logged losses";
  EXPECT_EQ(train::loss_spike(19, rows({2.0, 2.0, 2.0}), 10, 0, V), "") << "below 10 x the median";
  EXPECT_EQ(train::loss_spike(0.5, rows({0.001, 0.001, 0.001}), 10, 0, V), "")
      << "a near-perfect model's noise is below a uniform guess";
  EXPECT_NE(train::loss_spike(3.0, rows({0.001, 0.001, 0.001}), 10, 0, V), "");
  // The median of the last 50: 60 rows of 100 then 50 of 1.
  std::vector<double> many(60, 100.0);
  many.insert(many.end(), 50, 1.0);
  EXPECT_TRUE(contains(train::loss_spike(11, rows(many), 200, 0, V), "the median 1 of the last 50 logged"));
}

// A learning rate raised on resume blows the loss up without a NaN: the run stops at that step, and the
// checkpoint it resumed from stays the last one.
TEST_F(ReliabilityTest, ALossSpikeStopsTheRunAndNothingIsSavedAfterIt) {
  const std::string out = path("s");
  train_tiny(out, 10, {"--optimizer", "sgd", "--lr", "0.1", "--grad-clip", "0"});
  const std::string before = slurp(out + "/checkpoint.h5");
  const Result r = headlab({"train", "--resume", "--out", out, "--steps", "50", "--lr", "30", "--eval-every", "100"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, " diverged: loss ")) << r.err;
  EXPECT_TRUE(contains(r.err, "more than 10 x the median")) << r.err;
  EXPECT_TRUE(contains(r.err, "'" + out + "/checkpoint.h5' (the last good checkpoint, step 10) is untouched")) << r.err;
  EXPECT_FALSE(contains(r.err, "--skip-nonfinite")) << "skipping does not apply to a finite loss";
  EXPECT_EQ(slurp(out + "/checkpoint.h5"), before);
  EXPECT_FALSE(fs::exists(out + "/checkpoint-11.h5"));
}

// Weights growing towards 1e30 without a NaN: stopped at the first check past 1e6, nothing saved for it.
TEST_F(ReliabilityTest, AParameterPastTheLimitStopsTheRun) {
  const std::string out = path("p");
  const Result r = headlab({"train", "--out",     out,  "--steps",      "200", "--optimizer",    "sgd", "--lr",
                            "30",    "--warmup",  "0",  "--grad-clip",  "0",   "--eval-every",   "2",   "--save-every",
                            "2",     "--emb-dim", "16", "--batch-size", "8",   "--eval-batches", "1"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "holds a value of magnitude ")) << r.err;
  EXPECT_TRUE(contains(r.err, ", more than 1e+06")) << r.err;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().extension() != ".h5") continue;
    for (const auto& [name, t] : io::load_checkpoint(e.path().string()).model) {
      const Tensor f = t.to(DType::f32).contiguous();
      for (int64_t i = 0; i < f.numel(); ++i)
        ASSERT_LE(std::fabs(f.data<float>()[i]), train::kMaxParameter) << e.path() << " " << name;
    }
  }
}

// eval of a checkpoint whose loss is not finite says so and fails.
TEST_F(ReliabilityTest, EvalOfADivergedCheckpointFails) {
  train_tiny(path("e"), 1);
  io::Checkpoint ck = io::load_checkpoint(path("e/checkpoint.h5"));
  for (auto& [name, t] : ck.model) {
    Tensor bad = t.to(DType::f32).contiguous();
    for (int64_t i = 0; i < bad.numel(); ++i) bad.data<float>()[i] = std::nanf("");
    t = bad;
  }
  io::save_checkpoint(path("e/nan.h5"), ck);
  const Result r = headlab({"eval", path("e/nan.h5")});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_TRUE(
      contains(r.err, "eval: the model's loss on the validation data is nan: the checkpoint holds a diverged model"))
      << r.err;
  EXPECT_FALSE(contains(r.out, "val loss")) << r.out;
}

// ---- messages -----------------------------------------------------------------------------------------

// Interrupted before any evaluation: the checkpoint is saved and said so; metrics.csv was not written
// and is not claimed.
TEST_F(ReliabilityTest, AnInterruptedRunClaimsOnlyWhatItWrote) {
  train::TrainOptions o;
  o.out = path("i");
  o.config.run.steps = 50;
  o.model.emb_dim = 16;
  o.config.run.batch_size = 8;
  o.config.run.eval_every = 40;
  o.config.run.eval_batches = 1;
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  train::stop_requested() = true;  // a Ctrl-C before the first step
  const std::string err = error_of([&] { train::Trainer(o).run(); });
  train::stop_requested() = false;
  std::cout.rdbuf(old);
  EXPECT_EQ(err, "<no error>");
  EXPECT_TRUE(contains(captured.str(), "interrupted: saved " + o.out + "/checkpoint.h5 at step 0")) << captured.str();
  EXPECT_FALSE(fs::exists(o.out + "/metrics.csv"));
  EXPECT_FALSE(contains(captured.str(), "metrics.csv")) << captured.str();
  EXPECT_TRUE(contains(captured.str(), "wrote " + o.out + "/checkpoint.h5")) << captured.str();
}

// ---- memory -------------------------------------------------------------------------------------------

// Numbers no machine can hold are refused at once with the estimate, not allocated until killed.
TEST_F(ReliabilityTest, HugeEvaluationAndGenerationSizesAreRefusedBeforeAllocating) {
  train_tiny(path("m"), 1);
  const std::string ck = path("m/checkpoint.h5"), huge = "1000000000000000";
  {
    std::ofstream text(path("text.txt"));
    for (int i = 0; i < 20; ++i) text << "the quick brown fox jumps over the lazy dog\n";
  }
  {
    const Result chars =
        headlab({"train", "--task", "chars", "--text", path("text.txt"), "--steps", "1", "--emb-dim", "16",
                 "--batch-size", "2", "--context-length", "8", "--eval-batches", "1", "--out", path("c")});
    ASSERT_EQ(chars.code, 0) << chars.err;
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"eval", ck, "--batches", huge}, "lower --batches (now " + huge + ")"},
      {{"ablate", ck, "--batches", huge, "--out", path("a")}, "lower --batches (now " + huge + ")"},
      {{"heads", ck, "--batch-size", huge, "--batches", "1", "--out", path("h")}, "--batch-size (now " + huge + ")"},
      {{"generate", path("c/checkpoint.h5"), "--prompt", "the", "--max-new-tokens", huge},
       "lower --max-new-tokens (now " + huge + ")"},
      {{"attention", ck, "--prompt", "1234", "--max-new-tokens", huge, "--out", path("t")},
       "lower --max-new-tokens (now " + huge + ")"},
      {{"train", "--out", path("tr"), "--eval-batches", huge, "--steps", "1"}, "--eval-batches (now " + huge + ")"},
  };
  for (const auto& [args, advice] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = headlab(args, 30);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.code, 1) << args[0] << ": " << r.err;
    EXPECT_TRUE(contains(r.err, args[0] + ": needs about ")) << r.err;
    EXPECT_TRUE(contains(r.err, "this machine has available")) << r.err;
    EXPECT_TRUE(contains(r.err, advice)) << advice << "\n" << r.err;
    EXPECT_FALSE(contains(r.err, "internal error")) << r.err;
    EXPECT_LT(s, 15.0) << args[0];
  }
}

// ---- nothing given is ignored or cut ------------------------------------------------------------------

TEST_F(ReliabilityTest, WhatIsGivenIsUsedOrRefused) {
  train_tiny(path("run"), 2);
  const std::string ck = path("run/checkpoint.h5");
  write_byte_gpt2_folder(path("gpt2"));
  std::ofstream(path("t.txt")) << "some text to score, long enough for a few windows of eight tokens";
  // eval --text on a task checkpoint, --batches on a subword model's perplexity
  Result r = headlab({"eval", ck, "--text", path("t.txt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "eval: --text applies to text models (chars); '" + ck +
                                  "' was trained on the reverse task, which reads no text"))
      << r.err;
  r = headlab({"eval", path("gpt2"), "--text", path("t.txt"), "--batches", "3"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "eval: --batches applies to task checkpoints")) << r.err;
  // path patching: a sender that cannot reach the receivers, refused before any result is printed
  r = headlab({"circuit", ck, "--task", "induction", "--rows", "2", "--senders", "L1H0", "--receivers", "L0H1", "--out",
               path("circ")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "circuit: --senders L1H0 cannot reach --receivers L0H1")) << r.err;
  EXPECT_EQ(r.out, "") << "results before the error";
  r = headlab({"circuit", ck, "--task", "induction", "--rows", "2", "--receivers", "L0H1", "--out", path("circ")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "circuit: no head reaches --receivers L0H1")) << r.err;
  // options that mean something only with others
  r = headlab({"heads", ck, "--stored-rows", "5", "--out", path("h")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "heads: --stored-rows is an option of prompt pairs; give --task or --pairs with it"))
      << r.err;
  r = headlab({"ablate", ck, "--l0-steps", "3", "--out", path("a")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "ablate: --l0-steps and --l0-penalties set the gates of --criterion l0")) << r.err;
}

TEST_F(ReliabilityTest, PromptPairsThatMeasureNothingAreRefusedBeforeAnyResult) {
  train_tiny_chars(path("c"), 1);
  std::ofstream(path("same.jsonl")) << R"({"clean": "abc", "corrupt": "abd", "answer": "e", "wrong": "e"})"
                                    << "\n";
  Result r = headlab({"heads", path("c/checkpoint.h5"), "--pairs", path("same.jsonl"), "--out", path("h")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "prompt pairs: " + path("same.jsonl") +
                                  ":1: answer and wrong are the same token (\"e\"), so their logit difference is 0"))
      << r.err;
  // One-token prompts: the head types cannot be scored; said before the first result, not after.
  std::ofstream(path("one.jsonl")) << R"({"clean": "a", "corrupt": "b", "answer": "c", "wrong": "d"})"
                                   << "\n";
  r = headlab({"heads", path("c/checkpoint.h5"), "--pairs", path("one.jsonl"), "--out", path("h")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "head types: rows of 1 token leave nothing to score")) << r.err;
  EXPECT_EQ(r.out, "") << "results before the error";
  // attention: a prompt longer than the context (8) is refused, not cut
  r = headlab({"attention", path("c/checkpoint.h5"), "--prompt", std::string(30, 'a'), "--out", path("att")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "attention: the prompt is 30 tokens, longer than the model's context of 8")) << r.err;
  EXPECT_FALSE(fs::exists(path("att/attention.h5")));
}

// Class 7: what a command's later stages need of its input is checked before its first result, so a refusal
// never follows printed results (and --overwrite never removes a run for a command that is then refused).
TEST_F(ReliabilityTest, EveryCommandChecksWhatItsLaterStagesNeedBeforeItsFirstResult) {
  train_tiny(path("run"), 2);  // reverse: exact match applies
  train_tiny_chars(path("c"), 2);
  const Result ed = headlab({"train", "--arch", "encoder-decoder", "--steps", "1", "--out", path("ed")});
  ASSERT_EQ(ed.code, 0) << ed.err;
  const auto refused_silently = [&](const std::vector<std::string>& args, const std::string& error) {
    const Result r = headlab(args);
    EXPECT_EQ(r.code, 1) << args[0];
    EXPECT_TRUE(contains(r.err, error)) << r.err;
    EXPECT_EQ(r.out, "") << args[0] << ": results before the error";
  };
  const std::string ck = path("c/checkpoint.h5");
  refused_silently({"heads", ck, "--tokens", "1", "--out", path("h1")}, "rows of 1 token");
  refused_silently({"heads", path("c"), "--tokens", "2", "--out", path("h2")}, "rows of 2 tokens are too short");
  refused_silently({"ablate", ck, "--metric", "exact_match", "--batches", "1", "--out", path("a1")},
                   "exact match does not apply to this data");
  refused_silently({"ablate", path("ed/checkpoint.h5"), "--criterion", "l0", "--batches", "1", "--out", path("a2")},
                   "ablate --criterion l0");
  std::ofstream(path("long.jsonl"))
      << R"({"clean": "abcdefghijkl", "corrupt": "abcdefghijkm", "answer": "c", "wrong": "d"})"
      << "\n";
  refused_silently({"circuit", ck, "--pairs", path("long.jsonl"), "--out", path("ci")},
                   "prompts of 12 tokens do not fit the model's context of 8");
  std::ofstream(path("same.jsonl")) << R"({"clean": "abc", "corrupt": "abc", "answer": "c", "wrong": "d"})"
                                    << "\n";
  refused_silently({"circuit", ck, "--pairs", path("same.jsonl"), "--out", path("ci")},
                   "every clean prompt equals its corrupted one");
  refused_silently({"compare", "--tokens", "200000", "--batch", "64", "--no-peer-grid", "--out", path("cmp")},
                   "compare: needs about");
  refused_silently({"train", "--arch", "encoder-decoder", "--steps", "1", "--track-heads", "1", "--out", path("t1")},
                   "--track-heads applies to decoders");
  const std::string stories = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/stories260K/stories260K.bin";
  if (fs::exists(stories)) {  // a llama2.c checkpoint's header is printed only with its tokenizer read
    std::ofstream(path("bogus.bin")) << "not a tokenizer";
    refused_silently({"inspect", stories, "--tokenizer", path("bogus.bin")}, path("bogus.bin"));
  }
  // --overwrite of a good run by a command that is refused keeps the good run.
  refused_silently(
      {"train", "--arch", "encoder-decoder", "--steps", "1", "--track-heads", "1", "--overwrite", "--out", path("run")},
      "--track-heads applies to decoders");
  EXPECT_TRUE(fs::exists(path("run/checkpoint.h5")));
  EXPECT_TRUE(fs::exists(path("run/metrics.csv")));
}

// --resume reads the run's own text: stored as an absolute path with its size and hash, so a resume from
// another folder finds it, and a changed file is refused (before, a relative --text was found again
// relative to the new folder: another file with the same name).
TEST_F(ReliabilityTest, ResumeReadsTheSameTextFromAnyFolderOrRefuses) {
  fs::create_directories(path("a")), fs::create_directories(path("b"));
  {
    std::ofstream a(path("a/data.txt")), b(path("b/data.txt"));
    for (int i = 0; i < 20; ++i) a << "the quick brown fox jumps over the lazy dog\n", b << "0123456789 ";
  }
  const auto in = [&](const std::string& dir, std::vector<std::string> args) {
    std::vector<std::string> argv{kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, tmp_.dir(), "cd " + dir + " && OMP_NUM_THREADS=1 timeout 60");
  };
  Result r = in(path("a"), {"train", "--task", "chars", "--text", "data.txt", "--steps", "2", "--emb-dim", "16",
                            "--batch-size", "2", "--context-length", "8", "--eval-batches", "1", "--out", path("run")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(slurp(path("run/metrics.csv")), "step")) << "a run was written";
  r = in(path("b"), {"train", "--resume", "--out", path("run"), "--steps", "3"});
  EXPECT_EQ(r.code, 0) << r.err;
  const train::RunConfig stored = train::config_of(io::load_checkpoint(path("run/checkpoint.h5")), "run");
  EXPECT_EQ(stored.task.options.text_path, fs::path(path("a/data.txt")).lexically_normal().string());
  EXPECT_TRUE(contains(stored.task.options.text_digest, " bytes, fnv1a64 ")) << stored.task.options.text_digest;
  std::ofstream(path("a/data.txt"), std::ios::app) << " and more";
  r = in(path("b"), {"train", "--resume", "--out", path("run"), "--steps", "4"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.err, "is not the text this run was trained on")) << r.err;
  EXPECT_EQ(io::load_checkpoint(path("run/checkpoint.h5")).trainer.step, 3) << "the refused resume saved";
}

// ---- files read whole have a cap ---------------------------------------------------------------------------

// A file padded past its kind's cap is refused by its size before a byte is read (sparse files: nothing is
// written), naming the file, its size and the cap: a vocab.json, a config.json, a text.
TEST_F(ReliabilityTest, FilesReadWholeAreRefusedPastTheirCapBeforeReading) {
  const auto sparse = [&](const std::string& p, int64_t bytes) {
    std::ofstream(p) << "{}";
    fs::resize_file(p, static_cast<uintmax_t>(bytes));
  };
  write_byte_gpt2_folder(path("g"));
  sparse(path("g/vocab.json"), (int64_t{512} << 20) + 1);
  const auto t0 = std::chrono::steady_clock::now();
  Result r = headlab({"tokenize", path("g"), "--prompt", "ab"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, path("g/vocab.json") +
                                  ": is 512.0 MiB (536870913 bytes), more than the 512.0 MiB headlab reads whole of a "
                                  "tokenizer file"))
      << r.err;
  write_byte_gpt2_folder(path("c"));
  sparse(path("c/config.json"), (int64_t{16} << 20) + 1);
  r = headlab({"inspect", path("c")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(
      r.err, "model config '" + path("c/config.json") + "' is 16.0 MiB (16777217 bytes), more than the 16.0 MiB"))
      << r.err;
  sparse(path("huge.txt"), int64_t{1} << 40);
  write_byte_gpt2_folder(path("g2"));
  r = headlab({"tokenize", path("g2"), "--text", path("huge.txt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(
      contains(r.err, "tokenize: --text '" + path("huge.txt") + "' is 1.0 TiB (1099511627776 bytes), more than the "))
      << r.err;
  EXPECT_TRUE(contains(r.err, "headlab reads whole of a text (1/64 of the memory available")) << r.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0) << "read, not refused";
  EXPECT_EQ(whole_file_cap(WholeFile::config), int64_t{16} << 20);
  EXPECT_GE(whole_file_cap(WholeFile::text), int64_t{64} << 20);
}

// ---- errors say what is true --------------------------------------------------------------------------

TEST_F(ReliabilityTest, ErrorsNameWhatThePathReallyIs) {
  // a config.json that is a loop of links: not "a folder"
  fs::create_directories(path("loop"));
  fs::create_symlink("config.json", path("loop/config.json"));
  Result r = headlab({"inspect", path("loop")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, path("loop/config.json") + "' is a loop of symbolic links")) << r.err;
  // merges.txt a FIFO: not "no vocab.json and merges.txt"
  write_byte_gpt2_folder(path("gpt2"));
  fs::remove(path("gpt2/merges.txt"));
  ASSERT_EQ(::mkfifo(path("gpt2/merges.txt").c_str(), 0644), 0);
  r = headlab({"tokenize", path("gpt2"), "--prompt", "ab"}, 20);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, path("gpt2/merges.txt") + ": is not a regular file (it is a FIFO)")) << r.err;
  // a dangling tokenizer.model link: not "does not exist" where ls shows it
  write_byte_gpt2_folder(path("g2"));
  fs::create_symlink(path("nowhere.model"), path("g2/tokenizer.model"));
  r = headlab({"tokenize", path("g2"), "--prompt", "ab"}, 20);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "is a symbolic link to nothing")) << r.err;
  // a .safetensors file where a checkpoint or a folder is expected: not "not an HDF5 file"
  r = headlab({"inspect", path("g2/model.safetensors")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "is a safetensors file, not a headlab checkpoint (.h5); give the model folder")) << r.err;
  // an empty text: named, with its count
  std::ofstream(path("empty.txt")) << "";
  write_byte_gpt2_folder(path("g3"));
  r = headlab({"eval", path("g3"), "--text", path("empty.txt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "eval: --text '" + path("empty.txt") + "' is 0 tokens (the file is empty)")) << r.err;
}

// ---- memory estimates count what a call allocates -------------------------------------------------------

// A long-context model generating 3 tokens after 5: its key/value cache and a forward of the prompt, not
// the whole context times the vocabulary (which asked a 128k-context model for tens of GiB).
TEST_F(ReliabilityTest, AGenerationsEstimateCountsItsCacheNotTheWholeContext) {
  nn::DecoderConfig c;
  c.vocab_size = 152064, c.context_length = 131072, c.emb_dim = 64, c.n_heads = 2, c.n_layers = 2;
  const nlohmann::json model = c.to_json();
  const double forward = c.activation_floats(false);  // floats a token of one forward
  const train::MemoryEstimate small = train::estimate_generation_memory(model, 5, 3, 512);
  EXPECT_LT(small.activations, 8.0 * forward * 4) << "more than a forward of the prompt";
  EXPECT_GE(small.activations, 5.0 * forward * 4 + 8.0 * 2 * 2 * 64 * 4);
  // a long generation: the cache grows with it, and the chunk bounds the prefill
  const train::MemoryEstimate big = train::estimate_generation_memory(model, 100000, 20000, 512);
  EXPECT_NEAR(big.activations, 512.0 * forward * 4 + 120000.0 * 2 * 2 * 64 * 4, 1.0);
}

}  // namespace
