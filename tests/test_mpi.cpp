// Data-parallel training (issue: MPI). What makes N ranks train the model one process trains:
// a batch's rows split exactly (Batch::rows), dropout masks of a row slice equal to the whole
// batch's draw (Generator::set_row_shard), and, under mpirun, the whole run: losses and parameters
// of 2 ranks against 1 process, resume across the two, a signal on one rank, a killed rank, bad
// batch sizes. The mpirun tests skip when headlab was built without MPI or mpirun is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "io/checkpoint.h"
#include "ops/ops.h"
#include "process_util.h"
#include "tasks/seq2seq.h"
#include "tasks/task.h"
#include "train/collectives.h"

namespace headlab {
namespace {

using testing::ProcessResult;
using testing::TempDir;

// ---- the pieces, in one process ----

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<double>() == b.to_vector<double>();
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

TEST(RowShard, DropoutMasksOfRowSlicesAreTheWholeBatchs) {
  const Tensor x = ones({8, 3, 4});  // (B, T, C): 12 elements per row, a multiple of 4 as a shard needs
  Generator whole(7), sharded(7);
  const Tensor full = dropout(x, 0.5, true, whole);
  for (int64_t first : {0, 2, 4, 6}) {
    Generator g(7);
    g.set_row_shard(first, 2, 8);
    const Tensor part = dropout(slice(x, 0, first, first + 2), 0.5, true, g);
    EXPECT_TRUE(equal(part, slice(full, 0, first, first + 2))) << "rows " << first << ".." << first + 2;
    EXPECT_EQ(g.offset(), whole.offset()) << "the generator moves on as the whole batch's draw did";
  }
  // Two draws in a row (as two dropout layers): the second starts where the whole batch's did.
  const Tensor full2 = dropout(x, 0.5, true, whole);
  sharded.set_row_shard(6, 2, 8);
  (void)dropout(slice(x, 0, 6, 8), 0.5, true, sharded);
  EXPECT_TRUE(equal(dropout(slice(x, 0, 6, 8), 0.5, true, sharded), slice(full2, 0, 6, 8)));
  sharded.set_row_shard(0, 0, 0);  // off: draws are whole again
  EXPECT_TRUE(equal(dropout(x, 0.5, true, sharded), dropout(x, 0.5, true, whole)));
}

TEST(RowShard, MisalignedOrNonBatchDrawsAreRefused) {
  Generator g(1);
  g.set_row_shard(1, 1, 2);
  try {
    (void)dropout(ones({2, 3}), 0.5, true, g);  // row 1 starts at element 3: inside a Philox block of 4
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 4"), std::string::npos) << e.what();
  }
  Generator h(1);
  h.set_row_shard(0, 2, 4);
  EXPECT_THROW((void)dropout(ones({3}), 0.5, true, h), Error);  // 3 elements are not over 2 rows
}

TEST(BatchRows, SliceEveryPerRowField) {
  const auto task = tasks::make_seq2seq_task("numbers", tasks::TaskOptions{});
  const tasks::Batch b = task->batch(tasks::Split::train, 3, 6, 0);
  ASSERT_TRUE(b.has_source());
  const tasks::Batch r = b.rows(2, 3);
  ASSERT_EQ(r.B, 3);
  EXPECT_EQ(r.T, b.T);
  EXPECT_EQ(r.S, b.S);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t t = 0; t < b.T; ++t) {
      EXPECT_EQ(r.input(i, t), b.input(2 + i, t));
      EXPECT_EQ(r.target(i, t), b.target(2 + i, t));
    }
    for (int64_t s = 0; s < b.S; ++s) EXPECT_EQ(r.source[i * b.S + s], b.source[(2 + i) * b.S + s]);
    EXPECT_EQ(r.source_valid_lens[i], b.source_valid_lens[2 + i]);
    EXPECT_EQ(r.answer_end[i], b.answer_end[2 + i]);
  }
  EXPECT_EQ(b.rows(0, 2).scored_targets() + b.rows(2, 4).scored_targets(), b.scored_targets());
  EXPECT_THROW((void)b.rows(4, 3), Error);
}

// ---- the whole run under mpirun ----

const std::string kBinary = std::string(HEADLAB_BINARY_DIR) + "/headlab";
// Open MPI refuses root without these; vader's single copy needs ptrace rights containers lack.
const std::string kMpiEnv =
    "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
    "OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1";

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!train::built_with_mpi()) GTEST_SKIP() << "headlab was built without MPI (-DHEADLAB_MPI)";
    if (!have_mpirun()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  }
  // A small GPT on reverse with dropout on, so that the masks matter; every step logged.
  std::vector<std::string> train_args(const std::string& out, int64_t steps) const {
    return {"train",
            "--task",
            "reverse",
            "--emb-dim",
            "32",
            "--n-heads",
            "4",
            "--n-layers",
            "2",
            "--drop-rate",
            "0.1",
            "--batch-size",
            "16",
            "--steps",
            std::to_string(steps),
            "--eval-every",
            "10",
            "--eval-batches",
            "2",
            "--save-every",
            "10",
            "--log-every",
            "1",
            "--threads",
            "1",
            "--out",
            tmp.path(out)};
  }
  ProcessResult single(const std::vector<std::string>& args) {
    std::vector<std::string> argv{kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_process(argv, tmp.dir(), "OMP_NUM_THREADS=1");
  }
  ProcessResult ranks(int n, const std::vector<std::string>& args) {
    std::vector<std::string> argv{"mpirun", "-np", std::to_string(n), kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_process(argv, tmp.dir(), kMpiEnv);
  }
  TempDir tmp{"headlab_mpi"};
};

// step -> loss, from the "step k/n  loss x" lines.
std::map<int64_t, double> step_losses(const std::string& out) {
  std::map<int64_t, double> losses;
  static const std::regex line(R"(step (\d+)/\d+  loss ([0-9.]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    losses[std::stoll((*it)[1].str())] = std::stod((*it)[2].str());
  return losses;
}

double max_parameter_difference(const io::Checkpoint& a, const io::Checkpoint& b) {
  double worst = 0;
  EXPECT_EQ(a.model.size(), b.model.size());
  for (size_t i = 0; i < std::min(a.model.size(), b.model.size()); ++i) {
    EXPECT_EQ(a.model[i].first, b.model[i].first);
    worst = std::max(worst, max_abs_diff(a.model[i].second, b.model[i].second));
  }
  return worst;
}

TEST_F(DataParallel, TwoRanksTrainWhatOneProcessTrains) {
  const ProcessResult one = single(train_args("one", 30));
  ASSERT_EQ(one.code, 0) << one.err;
  const ProcessResult two = ranks(2, train_args("two", 30));
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  EXPECT_NE(two.out.find("data parallel: 2 ranks (MPI"), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("headlab train: task"), two.out.rfind("headlab train: task")) << "rank 0 alone prints";
  // Same batches, same dropout masks, gradients summed: the same run up to float summation order.
  const auto a = step_losses(one.out), b = step_losses(two.out);
  ASSERT_EQ(a.size(), 30u) << one.out;
  ASSERT_EQ(b.size(), 30u) << two.out;
  for (const auto& [step, loss] : a) EXPECT_NEAR(b.at(step), loss, 2e-3 * loss) << "step " << step;
  const io::Checkpoint ca = io::load_checkpoint(tmp.path("one/checkpoint.h5"));
  const io::Checkpoint cb = io::load_checkpoint(tmp.path("two/checkpoint.h5"));
  EXPECT_EQ(cb.trainer.step, 30);
  EXPECT_EQ(cb.trainer.rng_offset, ca.trainer.rng_offset) << "the generator moved as one process's did";
  EXPECT_LT(max_parameter_difference(ca, cb), 2e-3);
  EXPECT_EQ(ca.config, cb.config);
}

// circuit under mpirun: the ranks share the prompt rows (chunks of 4 rows in turn) and rank 0 writes
// what one process writes, up to the order of the sums.
TEST_F(DataParallel, CircuitOnTwoRanksIsTheSingleProcesses) {
  ASSERT_EQ(single(train_args("m", 20)).code, 0);
  const auto args = [&](const std::string& out) {
    return std::vector<std::string>{"circuit",      tmp.path("m/checkpoint.h5"),
                                    "--task",       "induction",
                                    "--rows",       "16",
                                    "--chunk-rows", "4",
                                    "--threads",    "1",
                                    "--out",        tmp.path(out)};
  };
  const ProcessResult one = single(args("c1"));
  ASSERT_EQ(one.code, 0) << one.err;
  const ProcessResult two = ranks(2, args("c2"));
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  EXPECT_NE(two.out.find("ranks: 2 (MPI"), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("headlab circuit:"), two.out.rfind("headlab circuit:")) << "rank 0 alone prints";
  const auto a = nlohmann::json::parse(testing::slurp(tmp.path("c1/circuit.json")));
  const auto b = nlohmann::json::parse(testing::slurp(tmp.path("c2/circuit.json")));
  ASSERT_EQ(a["edges"].size(), b["edges"].size()) << one.out << two.out;
  for (size_t i = 0; i < a["edges"].size(); ++i) {
    EXPECT_EQ(a["edges"][i]["sender"], b["edges"][i]["sender"]);
    EXPECT_EQ(a["edges"][i]["receiver"], b["edges"][i]["receiver"]);
    EXPECT_NEAR(a["edges"][i]["attribution"].get<double>(), b["edges"][i]["attribution"].get<double>(), 1e-9);
  }
  for (const char* k : {"circuit", "clean_logit_difference", "corrupt_logit_difference"})
    EXPECT_NEAR(a["metric"][k].get<double>(), b["metric"][k].get<double>(), 1e-9) << k;
  EXPECT_EQ(testing::slurp(tmp.path("c1/path_patching.csv")), testing::slurp(tmp.path("c2/path_patching.csv")));
}

// heads on prompt pairs under mpirun: the same engine, the same sharing; every score one process's.
TEST_F(DataParallel, HeadsOnPromptPairsOnTwoRanksIsTheSingleProcesses) {
  ASSERT_EQ(single(train_args("m", 20)).code, 0);
  const auto args = [&](const std::string& out) {
    return std::vector<std::string>{
        "heads",      tmp.path("m/checkpoint.h5"), "--task", "induction", "--rows", "16", "--threads", "1", "--out",
        tmp.path(out)};
  };
  const ProcessResult one = single(args("h1"));
  ASSERT_EQ(one.code, 0) << one.err;
  const ProcessResult two = ranks(2, args("h2"));
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  EXPECT_EQ(two.out.find("headlab heads:"), two.out.rfind("headlab heads:")) << "rank 0 alone prints";
  const auto cells = [](const std::string& csv) {
    std::vector<std::string> v;
    std::stringstream in(csv);
    for (std::string line; std::getline(in, line);) {
      std::stringstream l(line);
      for (std::string c; std::getline(l, c, ',');) v.push_back(c);
    }
    return v;
  };
  const std::vector<std::string> a = cells(testing::slurp(tmp.path("h1/heads.csv")));
  const std::vector<std::string> b = cells(testing::slurp(tmp.path("h2/heads.csv")));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 11u * 4);  // the header and a row per head
  for (size_t i = 0; i < a.size(); ++i) {
    char* end = nullptr;
    const double x = std::strtod(a[i].c_str(), &end);
    if (end == a[i].c_str() || *end != '\0')
      EXPECT_EQ(a[i], b[i]);  // names and labels
    else
      EXPECT_NEAR(x, std::stod(b[i]), 1e-8 + 1e-8 * std::abs(x)) << i;
  }
}

TEST_F(DataParallel, ResumesAcrossProcessCounts) {
  ASSERT_EQ(single(train_args("straight", 20)).code, 0);
  const ProcessResult first = ranks(2, train_args("switched", 10));
  ASSERT_EQ(first.code, 0) << first.err;
  std::vector<std::string> resume = train_args("switched", 20);
  resume.push_back("--resume");
  const ProcessResult rest = single(resume);
  ASSERT_EQ(rest.code, 0) << rest.err;
  const auto a = step_losses(single(resume).out);  // already at 20: nothing to do, no step lines
  EXPECT_TRUE(a.empty());
  const io::Checkpoint straight = io::load_checkpoint(tmp.path("straight/checkpoint.h5"));
  const io::Checkpoint switched = io::load_checkpoint(tmp.path("switched/checkpoint.h5"));
  EXPECT_EQ(switched.trainer.step, 20);
  EXPECT_LT(max_parameter_difference(straight, switched), 2e-3);
}

TEST_F(DataParallel, BadBatchSizeIsAClearErrorOnEveryRank) {
  std::vector<std::string> args = train_args("odd", 5);
  args[std::find(args.begin(), args.end(), "--batch-size") - args.begin() + 1] = "15";
  const ProcessResult r = ranks(2, args);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--batch-size 15 does not split evenly over 2 ranks"), std::string::npos) << r.err;
}

// A started job: mpirun in its own process group, killed with the test if it is still there.
class Job {
 public:
  Job(const std::string& command) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Job() {
    if (pid_ > 0 && !done_) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // The exit code, or -1 if it is still running after `seconds`.
  int wait(double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        done_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
};

// The pid of rank `rank` of the job writing to `out` (from /proc: its command line and environment).
pid_t rank_pid(const std::string& out, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = testing::slurp(e.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.rfind(kBinary + " ", 0) != 0 || cmdline.find(out) == std::string::npos) continue;
    std::string env = testing::slurp(e.path().string() + "/environ");
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (env.find("\nOMPI_COMM_WORLD_RANK=" + std::to_string(rank) + "\n") != std::string::npos) return std::stoi(name);
  }
  return -1;
}

// The command of a 2-rank run that would take minutes, its output to `log`.
std::string start_long_run(const std::string& out, const std::string& log) {
  std::string command = kMpiEnv + " mpirun -np 2 " + testing::quote(kBinary);
  for (const char* a :
       {"train", "--task",       "reverse", "--emb-dim",   "32",     "--n-heads",    "4",  "--n-layers",
        "2",     "--batch-size", "16",      "--steps",     "100000", "--eval-every", "50", "--eval-batches",
        "1",     "--save-every", "20",      "--log-every", "10",     "--threads",    "1",  "--out"})
    command += std::string(" ") + a;
  return command + " " + testing::quote(out) + " >" + testing::quote(log) + " 2>&1";
}

bool wait_for_file(const std::string& path, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// Starts a 2-rank run that would take minutes, waits for its first checkpoint, sends `signal` to rank 1
// alone and waits for the job: its exit code (-1: still running after 60 s) and output.
std::pair<int, std::string> signal_rank_1(const std::string& out, int signal) {
  const std::string log = out + ".log";
  Job job(start_long_run(out, log));
  if (!wait_for_file(out + "/checkpoint.h5", 120)) {
    ADD_FAILURE() << "no first checkpoint: " << testing::slurp(log);
    return {-1, ""};
  }
  const pid_t rank1 = rank_pid(out, 1);
  if (rank1 <= 0) {
    ADD_FAILURE() << "rank 1 of the job writing " << out << " not found";
    return {-1, ""};
  }
  ::kill(rank1, signal);
  const int code = job.wait(60);
  return {code, testing::slurp(log)};
}

TEST_F(DataParallel, ASignalToOneRankStopsEveryRankAtTheSameStep) {
  const std::string out = tmp.path("signal");
  // Rank 1 alone: its flag reaches rank 0 through the next step's allreduce.
  const auto [code, text] = signal_rank_1(out, SIGTERM);
  EXPECT_EQ(code, 130) << text;
  EXPECT_NE(text.find("interrupted: saved"), std::string::npos) << text;
  const io::Checkpoint ck = io::load_checkpoint(out + "/checkpoint.h5");
  EXPECT_GT(ck.trainer.step, 0);
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-" + std::to_string(ck.trainer.step) + ".h5"));
}

TEST_F(DataParallel, AKilledRankEndsTheJobAndLeavesTheLastCheckpoint) {
  const std::string out = tmp.path("killed");
  const auto [code, text] = signal_rank_1(out, SIGKILL);
  EXPECT_GT(code, 0) << "the job ends, with an error, instead of waiting for the dead rank\n" << text;
  // Checkpoints are written to a temporary file and renamed: whatever moment rank 0 died at, the
  // last one is whole.
  const io::Checkpoint ck = io::load_checkpoint(out + "/checkpoint.h5");
  EXPECT_GT(ck.trainer.step, 0);
}

}  // namespace
}  // namespace headlab
