// Data-parallel training (issue: MPI). What makes N ranks train the model one process trains:
// a batch's rows split exactly (Batch::rows), dropout masks of a row slice equal to the whole
// batch's draw (Generator::set_row_shard), and, under mpirun, the whole run: losses and parameters
// of 2 ranks against 1 process, resume across the two, a signal on one rank, a killed rank, bad
// batch sizes. The mpirun tests skip when headlab was built without MPI or mpirun is missing. And the
// threads transport (issue: CPU training, second pass): its collectives in one process, and the threads
// of one headlab train against one thread.
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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
#include "tiny_models.h"
#include "train/collectives.h"
#include "train/evaluate.h"
#include "train/trainer.h"

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

// Runs of the headlab command: one process, or N ranks under mpirun.
class TrainRuns : public ::testing::Test {
 protected:
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

class DataParallel : public TrainRuns {
 protected:
  void SetUp() override {
    if (!train::built_with_mpi()) GTEST_SKIP() << "headlab was built without MPI (-DHEADLAB_MPI)";
    if (!have_mpirun()) GTEST_SKIP() << "mpirun is not installed (apt-get install openmpi-bin)";
  }
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

// `many` (ranks or threads, into tmp's "two") trained what `one` (into "one") trained, 30 steps: its banner
// printed once, the same batches and dropout masks with the gradients summed, so every step's loss up to
// float summation order, the generator where one process's is, and the parameters to 2e-3.
void expect_the_same_run(const TempDir& tmp, const ProcessResult& one, const ProcessResult& many,
                         const std::string& banner) {
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(many.code, 0) << many.out << many.err;
  EXPECT_NE(many.out.find(banner), std::string::npos) << many.out;
  EXPECT_EQ(many.out.find("headlab train: task"), many.out.rfind("headlab train: task")) << "rank 0 alone prints";
  const auto a = step_losses(one.out), b = step_losses(many.out);
  ASSERT_EQ(a.size(), 30u) << one.out;
  ASSERT_EQ(b.size(), 30u) << many.out;
  for (const auto& [step, loss] : a) EXPECT_NEAR(b.at(step), loss, 2e-3 * loss) << "step " << step;
  const io::Checkpoint ca = io::load_checkpoint(tmp.path("one/checkpoint.h5"));
  const io::Checkpoint cb = io::load_checkpoint(tmp.path("two/checkpoint.h5"));
  EXPECT_EQ(cb.trainer.step, 30);
  EXPECT_EQ(cb.trainer.rng_offset, ca.trainer.rng_offset) << "the generator moved as one process's did";
  EXPECT_LT(max_parameter_difference(ca, cb), 2e-3);
  EXPECT_EQ(ca.config, cb.config);
}

TEST_F(DataParallel, TwoRanksTrainWhatOneProcessTrains) {
  expect_the_same_run(tmp, single(train_args("one", 30)), ranks(2, train_args("two", 30)),
                      "data parallel: 2 ranks (MPI");
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

// Ranks started with different commands (mpirun's "A : B" form) are refused before any work, on every
// rank with one message naming the first difference: before, a different --steps crashed train and a
// different --out was ignored.
TEST_F(DataParallel, RanksStartedWithDifferentOptionsAreRefusedBeforeAnyWork) {
  const auto mpmd = [&](const std::vector<std::string>& a, const std::vector<std::string>& b) {
    std::vector<std::string> argv{"timeout", "-k", "5", "120", "mpirun", "-np", "1", kBinary};
    argv.insert(argv.end(), a.begin(), a.end());
    argv.insert(argv.end(), {":", "-np", "1", kBinary});
    argv.insert(argv.end(), b.begin(), b.end());
    return testing::run_process(argv, tmp.dir(), kMpiEnv);
  };
  const ProcessResult steps = mpmd(train_args("s", 10), train_args("s", 20));
  EXPECT_NE(steps.code, 0) << steps.out << steps.err;
  EXPECT_LT(steps.code, 124) << "ended by the time limit";
  EXPECT_NE(steps.err.find("headlab: train: the 2 ranks were started with different options: rank 0 has "
                           "'steps=10', rank 1 has 'steps=20'; every rank must run the same command (nothing was run)"),
            std::string::npos)
      << steps.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.path("s"))) << "work began";
  const ProcessResult out = mpmd(train_args("o1", 10), train_args("o2", 10));
  EXPECT_NE(out.err.find("rank 0 has 'out=\"" + tmp.path("o1") + "\"', rank 1 has 'out=\"" + tmp.path("o2") + "\"'"),
            std::string::npos)
      << out.err;
  const ProcessResult rows = mpmd({"heads", "x.h5", "--task", "induction", "--rows", "8"},
                                  {"heads", "x.h5", "--task", "induction", "--rows", "16"});
  EXPECT_NE(rows.err.find("rank 0 has 'rows=8', rank 1 has 'rows=16'"), std::string::npos) << rows.err;
}

// A rank that cannot go on stops every rank: here rank 0 alone writes, and its --out cannot be made
// while rank 1 goes on to share the prompt rows (it waited there forever before).
TEST_F(DataParallel, ARankThatFailsStopsEveryRank) {
  ASSERT_EQ(single(train_args("m", 2)).code, 0);
  std::ofstream(tmp.path("file")) << "not a folder";
  for (const std::string cmd : {"heads", "circuit"}) {
    std::vector<std::string> argv{"timeout",   "-k",
                                  "5",         "120",
                                  "mpirun",    "-np",
                                  "2",         kBinary,
                                  cmd,         tmp.path("m/checkpoint.h5"),
                                  "--task",    "induction",
                                  "--rows",    "8",
                                  "--threads", "1",
                                  "--out",     tmp.path("file/below")};
    const ProcessResult r = testing::run_process(argv, tmp.dir(), kMpiEnv);
    EXPECT_NE(r.code, 0) << cmd << ": " << r.out << r.err;
    EXPECT_LT(r.code, 124) << cmd << ": the other rank was left waiting";
    EXPECT_NE(r.err.find("headlab: rank 0 of 2: " + cmd + ": cannot create output folder '" + tmp.path("file/below")),
              std::string::npos)
        << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("headlab: stopping every rank"), std::string::npos) << r.err;
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

// ---- data parallelism over the threads of one process ----

// Every thread of run_on_threads gets its rank, the group's sums and the root's bytes.
TEST(ThreadsTransport, AllreduceBroadcastAndBarrierOverThreeThreads) {
  constexpr int kThreads = 3;
  std::vector<std::vector<float>> sums(kThreads);
  std::vector<double> doubles(kThreads);
  std::vector<std::string> broadcast(kThreads);
  std::vector<int> ranks(kThreads, -1), sizes(kThreads);
  train::run_on_threads(kThreads, train::single_process(), [&](const std::shared_ptr<train::Collectives>& comm) {
    const int r = comm->rank();
    ranks[static_cast<size_t>(r)] = r;
    sizes[static_cast<size_t>(r)] = comm->size();
    std::vector<float> v(7);  // 7: the threads' slices of the sum are uneven
    for (int i = 0; i < 7; ++i) v[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i + 1));
    comm->allreduce_sum(v.data(), 7);
    sums[static_cast<size_t>(r)] = v;
    double d = r + 0.5;
    comm->allreduce_sum(&d, 1);
    doubles[static_cast<size_t>(r)] = d;
    char text[8] = {};
    std::snprintf(text, sizeof text, "rank %d", r);
    comm->broadcast(text, sizeof text, 2);
    broadcast[static_cast<size_t>(r)] = text;
    comm->barrier();
  });
  for (int r = 0; r < kThreads; ++r) {
    EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
    EXPECT_EQ(sizes[static_cast<size_t>(r)], kThreads);
    for (int i = 0; i < 7; ++i) EXPECT_EQ(sums[static_cast<size_t>(r)][static_cast<size_t>(i)], 6.0f * (i + 1));
    EXPECT_EQ(doubles[static_cast<size_t>(r)], 4.5);
    EXPECT_EQ(broadcast[static_cast<size_t>(r)], "rank 2");
  }
}

// Data parallelism's one collective per step: each thread's gradients and extras come back summed (a
// parameter without a gradient counts as zeros), the gradients as views of one buffer, and every thread
// gets the global norm of the summed gradients.
TEST(ThreadsTransport, AllreduceGradientsSumsGradientsAndExtrasAndReturnsTheirNorm) {
  constexpr int kThreads = 2;
  std::vector<std::vector<float>> got_w(kThreads), got_b(kThreads), got_extra(kThreads);
  std::vector<double> norms(kThreads);
  train::run_on_threads(kThreads, train::single_process(), [&](const std::shared_ptr<train::Collectives>& comm) {
    const auto r = static_cast<size_t>(comm->rank());
    const float k = static_cast<float>(r + 1);
    Tensor w = zeros({2, 3}).requires_grad_(), b = zeros({3}).requires_grad_();
    w.set_grad(tensor(std::vector<float>{k, -k, 2 * k, 0, 1, -2}, {2, 3}));
    if (r == 1) b.set_grad(tensor(std::vector<float>{3, 4, 0}, {3}));  // thread 0 has none for b
    std::vector<float> extra{0.5f * k};
    norms[r] = train::allreduce_gradients(*comm, {w, b}, extra);
    got_w[r] = w.grad().to_vector<float>();
    got_b[r] = b.grad().to_vector<float>();
    got_extra[r] = extra;
    EXPECT_EQ(w.grad().shape(), (Shape{2, 3}));
  });
  const std::vector<float> w = {3, -3, 6, 0, 2, -4}, b = {3, 4, 0};
  double sq = 0;
  for (float v : w) sq += v * v;
  for (float v : b) sq += v * v;
  for (size_t r = 0; r < kThreads; ++r) {
    EXPECT_EQ(got_w[r], w);
    EXPECT_EQ(got_b[r], b);
    EXPECT_EQ(got_extra[r], std::vector<float>{1.5f});
    EXPECT_DOUBLE_EQ(norms[r], std::sqrt(sq));
  }
}

// Inside, each thread's kernels run one thread and draw from their own copy of the generator; the
// caller's thread count is back afterwards.
TEST(ThreadsTransport, EachThreadHasItsOwnGeneratorAndSingleThreadedKernels) {
  const int before = omp_get_max_threads();
  manual_seed(11);
  const Tensor expected = rand({4});
  manual_seed(11);
  Generator* process = &default_generator();
  std::vector<Generator*> generators(2);
  std::vector<int> kernel_threads(2);
  std::vector<std::vector<double>> draws(2);
  train::run_on_threads(2, train::single_process(), [&](const std::shared_ptr<train::Collectives>& comm) {
    const auto r = static_cast<size_t>(comm->rank());
    generators[r] = &default_generator();
    kernel_threads[r] = omp_get_max_threads();
    draws[r] = rand({4}).to_vector<double>();
  });
  EXPECT_EQ(generators[0], process) << "thread 0 is the caller and keeps its generator";
  EXPECT_NE(generators[1], process);
  EXPECT_EQ(kernel_threads, (std::vector<int>{1, 1}));
  EXPECT_EQ(draws[0], expected.to_vector<double>()) << "both start from the caller's state";
  EXPECT_EQ(draws[1], expected.to_vector<double>());
  EXPECT_EQ(omp_get_max_threads(), before);
  EXPECT_EQ(&default_generator(), process);
}

// An error on one thread wakes the others out of the collective they wait in; the caller gets it.
TEST(ThreadsTransport, AnErrorOnOneThreadEndsEveryThreadAndReachesTheCaller) {
  std::vector<int> stopped(3);
  try {
    train::run_on_threads(3, train::single_process(), [&](const std::shared_ptr<train::Collectives>& comm) {
      if (comm->rank() == 1) throw Error("rank 1 ran out of luck");
      float x = 1;
      try {
        comm->allreduce_sum(&x, 1);
      } catch (const train::ThreadGroupStopped&) {
        stopped[static_cast<size_t>(comm->rank())] = 1;
        throw;
      }
    });
    FAIL() << "expected an error";
  } catch (const train::ThreadGroupStopped& e) {
    FAIL() << "the other threads' error came instead of rank 1's: " << e.what();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 ran out of luck");
  }
  EXPECT_EQ(stopped, (std::vector<int>{1, 0, 1}));
}

// Threads x processes: an outer transport of 2 processes (this one and a twin that holds the same
// values), so every sum doubles across it; ranks are process x threads + thread.
TEST(ThreadsTransport, ComposesWithAnOuterTransport) {
  class Twin final : public train::Collectives {
   public:
    int rank() const override { return 1; }
    int size() const override { return 2; }
    int local_size() const override { return 2; }
    std::string name() const override { return "twin"; }
    void allreduce_sum(float* d, int64_t n) override {
      std::for_each(d, d + n, [](float& x) { x *= 2; });
    }
    void allreduce_sum(double* d, int64_t n) override {
      std::for_each(d, d + n, [](double& x) { x *= 2; });
    }
    void broadcast(void*, int64_t, int root) override { roots.push_back(root); }
    void barrier() override { ++barriers; }
    [[noreturn]] void abort(int) override { std::abort(); }
    std::vector<int> roots;
    int barriers = 0;
  };
  const auto twin = std::make_shared<Twin>();
  std::vector<float> sums(2);
  std::vector<int> ranks(2);
  std::string name;
  train::run_on_threads(2, twin, [&](const std::shared_ptr<train::Collectives>& comm) {
    const auto t = static_cast<size_t>(comm->rank() % 2);
    ranks[t] = comm->rank();
    EXPECT_EQ(comm->size(), 4);
    EXPECT_EQ(comm->processes(), 2);
    float x = static_cast<float>(t + 1);
    comm->allreduce_sum(&x, 1);
    sums[t] = x;
    int v = static_cast<int>(t);
    comm->broadcast(&v, sizeof v, 3);  // rank 3: this process's thread 1
    EXPECT_EQ(v, 1);
    comm->barrier();
    if (t == 0) name = comm->name();
  });
  EXPECT_EQ(ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(sums, (std::vector<float>{6, 6}));
  EXPECT_EQ(twin->roots, (std::vector<int>{1}));
  EXPECT_EQ(twin->barriers, 1);
  EXPECT_EQ(name, "twin x 2 threads");
}

// Evaluation over the threads: batch i is scored on rank i mod 3 (5 batches: uneven shares; 2: a rank without
// one) and every rank gets the scores of all. The replicas differ here on purpose, so the scores say which
// replica scored which batch: rank r's model on batches r, r + 3, ..., summed over the ranks.
TEST(ThreadsTransport, EvaluationSharesTheBatchesAndEveryRankGetsTheScoresOfAll) {
  tasks::TaskOptions to;
  to.seed = 5;
  const auto task = tasks::make_task("reverse", to);
  const nn::DecoderConfig cfg = headlab::testing::tiny_gpt_config(
      headlab::testing::kFourHeadGpt.sized_for(task->vocab_size(), task->required_context_length()));
  constexpr int kRanks = 3;
  constexpr int64_t kRows = 8;
  const int64_t T = cfg.context_length;
  for (const int64_t batches : {int64_t{5}, int64_t{2}}) {
    double loss_sum = 0, correct = 0, exact = 0;
    int64_t tokens = 0, rows = 0;
    for (int r = 0; r < kRanks; ++r) {
      std::vector<tasks::Batch> mine;
      for (int64_t i = r; i < batches; i += kRanks)
        mine.push_back(task->batch(tasks::Split::val, static_cast<uint64_t>(i), kRows, T));
      if (mine.empty()) continue;
      manual_seed(100 + r);
      nn::DecoderModel replica(cfg);
      const train::Scores e = train::evaluate(replica, mine);
      loss_sum += e.loss * static_cast<double>(e.tokens);
      correct += e.token_accuracy * static_cast<double>(e.tokens);
      exact += e.exact_match * static_cast<double>(kRows) * static_cast<double>(mine.size());
      tokens += e.tokens;
      rows += kRows * static_cast<int64_t>(mine.size());
    }
    std::vector<train::Scores> got(kRanks);
    train::run_on_threads(kRanks, train::single_process(), [&](const std::shared_ptr<train::Collectives>& comm) {
      manual_seed(100 + comm->rank());
      nn::DecoderModel replica(cfg);
      got[static_cast<size_t>(comm->rank())] = train::evaluate(replica, *task, batches, kRows, T, comm.get());
    });
    for (const train::Scores& g : got) {
      EXPECT_EQ(g.tokens, tokens) << batches << " batches";
      // float32's rounding: the ranks' products run on one thread, the reference's in two threads' bands, and
      // OpenBLAS's kernels may sum a band's rows in another order than all of them
      EXPECT_NEAR(g.loss, loss_sum / static_cast<double>(tokens), 1e-6);
      EXPECT_NEAR(g.token_accuracy, correct / static_cast<double>(tokens), 1e-12);
      EXPECT_TRUE(g.has_exact_match);
      EXPECT_NEAR(g.exact_match, exact / static_cast<double>(rows), 1e-12);
    }
  }
}

// The whole run: the command's threads, each on its rows, train what one thread trains.
using ThreadDataParallel = TrainRuns;

std::vector<std::string> with_option(std::vector<std::string> args, const std::string& option,
                                     const std::string& value) {
  const auto at = std::find(args.begin(), args.end(), option);
  if (at == args.end()) {
    args.push_back(option);
    args.push_back(value);
  } else {
    *(at + 1) = value;
  }
  return args;
}

TEST_F(ThreadDataParallel, TwoThreadsTrainWhatOneThreadTrains) {
  expect_the_same_run(tmp, single(train_args("one", 30)),
                      single(with_option(with_option(train_args("two", 30), "--threads", "2"), "--parallel", "data")),
                      "data parallel: 2 ranks (2 threads), 8 of the 16 rows");
}

// The threads sum in a fixed order: stopping and resuming changes nothing, to the bit.
TEST_F(ThreadDataParallel, ResumeIsBitExact) {
  const auto args = [&](const std::string& out, int64_t steps) {
    return with_option(with_option(train_args(out, steps), "--threads", "2"), "--parallel", "data");
  };
  ASSERT_EQ(single(args("straight", 20)).code, 0);
  ASSERT_EQ(single(args("resumed", 10)).code, 0);
  std::vector<std::string> rest = args("resumed", 20);
  rest.push_back("--resume");
  const ProcessResult r = single(rest);
  ASSERT_EQ(r.code, 0) << r.err;
  const io::Checkpoint a = io::load_checkpoint(tmp.path("straight/checkpoint.h5"));
  const io::Checkpoint b = io::load_checkpoint(tmp.path("resumed/checkpoint.h5"));
  EXPECT_EQ(b.trainer.step, 20);
  EXPECT_EQ(max_parameter_difference(a, b), 0.0);
  EXPECT_EQ(a.trainer.rng_offset, b.trainer.rng_offset);
}

// auto: data parallel when the batch splits into shares of a multiple of 4 rows; ops otherwise.
TEST_F(ThreadDataParallel, AutoChoosesByTheBatchAndDataRefusesABatchThatDoesNotSplit) {
  const auto args = [&](const std::string& out, const std::string& batch, const std::string& parallel) {
    return with_option(with_option(with_option(train_args(out, 2), "--threads", "2"), "--batch-size", batch),
                       "--parallel", parallel);
  };
  const ProcessResult splits = single(args("a", "16", "auto"));
  ASSERT_EQ(splits.code, 0) << splits.err;
  EXPECT_NE(splits.out.find("data parallel: 2 ranks (2 threads)"), std::string::npos) << splits.out;
  const ProcessResult odd = single(args("b", "6", "auto"));  // 3 rows each
  ASSERT_EQ(odd.code, 0) << odd.err;
  EXPECT_EQ(odd.out.find("data parallel"), std::string::npos) << odd.out;
  const ProcessResult ops = single(args("c", "16", "ops"));
  ASSERT_EQ(ops.code, 0) << ops.err;
  EXPECT_EQ(ops.out.find("data parallel"), std::string::npos) << ops.out;
  const ProcessResult bad = single(args("d", "5", "data"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("--parallel data: --batch-size 5 does not split evenly over 2 threads"), std::string::npos)
      << bad.err;
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
