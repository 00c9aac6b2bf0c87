// The training loop (train/trainer.h): a short run per task learns (loss falls, validation token
// accuracy above chance); exact resume, both after an interruption and when a finished run is
// extended, is bit-identical to training straight through, with dropout on; runs are deterministic
// given the seed; keep-last pruning of checkpoint-<step>.h5; metrics.csv; evaluate and
// task_from_config. Tiny models and few steps, so each test takes a second or so.
#include "train/memory.h"
#include "train/trainer.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <streambuf>

#include "backends/backend.h"
#include "io/h5file.h"
#include "tests/process_util.h"
#include "tests/tiny_models.h"

namespace fs = std::filesystem;
using namespace headlab;
using namespace headlab::train;
using namespace headlab::tasks;
using namespace headlab::io;
using namespace headlab::optim;
using headlab::testing::TempDir;

namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    stop_requested() = false;
    // One thread: these models are far too small to gain from more, and on shared CI cores (ctest -j)
    // OpenMP barriers between descheduled threads make every op wait for a time slice.
    omp_set_num_threads(1);
  }
  void TearDown() override { stop_requested() = false; }
  std::string path(const std::string& name) const { return tmp_.path(name); }
  TempDir tmp_{"trainer_test"};
};

std::string tiny_text() { return std::string(HEADLAB_SOURCE_DIR) + "/data/tiny.txt"; }

// A model and run small enough for seconds under the sanitizers.
TrainOptions tiny_options(const std::string& task, const std::string& out, int64_t steps) {
  TrainOptions o;
  o.config.task.name = task;
  o.config.task.options.min_len = 2;
  o.config.task.options.max_len = 4;
  o.config.task.options.n_digits = 2;
  o.model.emb_dim = 32;
  o.model.n_heads = 2;
  o.model.n_layers = 2;
  o.config.run.batch_size = 32;
  o.config.run.steps = steps;
  o.config.optimizer.lr = 5e-3;
  o.config.schedule.min_lr = 5e-4;
  o.config.schedule.warmup = 10;
  o.config.run.eval_every = steps;
  o.config.run.eval_batches = 2;
  o.config.run.save_every = steps;
  o.config.run.keep_last = 2;
  o.config.run.seed = 3;
  o.out = out;
  o.quiet = true;
  if (task == "chars") {
    o.config.task.options.text_path = tiny_text();
    o.model.context_length = 16;
  }
  return o;
}

// Every dataset of a checkpoint file, as raw bytes.
std::map<std::string, io::h5::Array> datasets(const std::string& file) {
  io::h5::Reader r(file);
  std::map<std::string, io::h5::Array> out;
  for (const std::string& name : r.list_datasets_recursive("/")) out[name] = r.read(name);
  return out;
}

// Compares the datasets whose names start with one of the prefixes, bytewise.
void expect_same_datasets(const std::string& a, const std::string& b, const std::vector<std::string>& prefixes) {
  const auto x = datasets(a), y = datasets(b);
  size_t compared = 0;
  const auto selected = [&](const std::string& name) {
    return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return name.rfind(p, 0) == 0; });
  };
  for (const auto& [name, arr] : x) {
    if (!selected(name)) continue;
    auto it = y.find(name);
    ASSERT_NE(it, y.end()) << name << " is only in " << a;
    EXPECT_EQ(arr.dtype, it->second.dtype) << name;
    EXPECT_EQ(arr.shape, it->second.shape) << name;
    EXPECT_TRUE(arr.bytes == it->second.bytes) << name << " differs between " << a << " and " << b;
    ++compared;
  }
  size_t in_b = 0;
  for (const auto& [name, arr] : y)
    if (selected(name)) ++in_b;
  EXPECT_EQ(compared, in_b) << "the same datasets on both sides";
  EXPECT_GT(compared, 10u);
}

const std::vector<std::string> kStatePrefixes = {"model/", "optimizer/", "trainer/step", "trainer/rng",
                                                 "trainer/data_index"};

// Loss and accuracy of the untrained model the run started from (the trainer seeds the global
// generator with the run's seed, then builds the model).
Scores initial_eval(const Checkpoint& ck) {
  const nn::DecoderConfig cfg = nn::gpt_family().config(ck.config["model"]);
  manual_seed(ck.config["training"]["seed"].get<uint64_t>());
  nn::DecoderModel model(cfg);
  const auto task = RunConfig::from_json(ck.config).make_task();
  return evaluate(model, *task, 2, 32, cfg.context_length);
}

// ---- every task learns --------------------------------------------------------------------------

class TaskLearns : public TrainerTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(TaskLearns, LossFallsAndAccuracyBeatsChance) {
  const std::string task = GetParam();
  const int64_t steps = task == "chars" || task == "add" ? 150 : 100;
  TrainOptions o = tiny_options(task, path("run"), steps);
  o.config.run.eval_every = steps / 2;
  const TrainResult r = Trainer(o).run();
  EXPECT_EQ(r.steps_done, steps);
  EXPECT_FALSE(r.interrupted);
  EXPECT_EQ(r.checkpoint, path("run/checkpoint.h5"));
  const Checkpoint ck = load_checkpoint(r.checkpoint);
  ASSERT_TRUE(ck.has_trainer);
  EXPECT_EQ(ck.trainer.step, steps);
  EXPECT_EQ(ck.config["task"]["name"], task);
  const int64_t V = ck.config["model"]["vocab_size"];
  const Scores before = initial_eval(ck);
  EXPECT_NEAR(before.loss, std::log(double(V)), 1.5) << "an untrained model is close to uniform";

  const Scores& after = r.final_eval;
  RecordProperty("val_loss_before", std::to_string(before.loss));
  RecordProperty("val_loss_after", std::to_string(after.loss));
  RecordProperty("token_accuracy_after", std::to_string(after.token_accuracy));
  RecordProperty("vocab_size", std::to_string(V));
  EXPECT_LT(after.loss, 0.7 * before.loss) << task << ": val loss " << before.loss << " -> " << after.loss;
  EXPECT_GT(after.token_accuracy, 2.0 / double(V)) << task << ": chance is 1/" << V;
  EXPECT_GT(after.token_accuracy, before.token_accuracy);
  EXPECT_EQ(after.has_exact_match, task != "chars");
  // The metrics rows tell the same story: validation loss falls between the two evaluations.
  ASSERT_EQ(ck.trainer.metrics.size(), 2u);
  EXPECT_LT(ck.trainer.metrics[1].val_loss, ck.trainer.metrics[0].val_loss + 1e-9);
  EXPECT_LT(ck.trainer.metrics[1].train_loss, before.loss);
  // The final evaluation is what evaluate() gives for the saved model.
  auto model = model_from_checkpoint<nn::DecoderModel>(ck, r.checkpoint);
  const auto t = RunConfig::from_json(ck.config).make_task();
  const Scores again = evaluate(*model, *t, 2, 32, model->config().context_length);
  EXPECT_DOUBLE_EQ(again.loss, after.loss);
  EXPECT_DOUBLE_EQ(again.token_accuracy, after.token_accuracy);
}

INSTANTIATE_TEST_SUITE_P(Tasks, TaskLearns, ::testing::Values("copy", "reverse", "sort", "add", "chars"));

// ---- exact resume ---------------------------------------------------------------------------------

// Sets stop_requested() once the trainer reports step `at`, as a Ctrl-C between steps would: the
// loop finishes that step, saves a checkpoint and returns.
class StopAtStep : public std::streambuf {
 public:
  StopAtStep(int64_t at, int64_t total) : needle_("step " + std::to_string(at) + "/" + std::to_string(total) + " ") {}
  const std::string& text() const { return text_; }

 protected:
  int overflow(int c) override {
    if (c != EOF) append(std::string(1, static_cast<char>(c)));
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    append(std::string(s, static_cast<size_t>(n)));
    return n;
  }

 private:
  void append(const std::string& s) {
    text_ += s;
    if (text_.find(needle_) != std::string::npos) stop_requested() = true;
  }
  std::string needle_, text_;
};

TrainOptions resume_options(const std::string& out, int64_t steps) {
  TrainOptions o = tiny_options("reverse", out, steps);
  o.model.drop_rate = 0.1;  // dropout on: the generator state must travel with the checkpoint
  o.config.run.eval_every = 7;
  o.config.run.save_every = 5;
  o.config.run.keep_last = 10;
  o.config.run.batch_size = 16;
  return o;
}

TEST_F(TrainerTest, InterruptedRunResumesBitIdentically) {
  const int64_t N = 24, k = 11;
  const TrainResult straight = Trainer(resume_options(path("straight"), N)).run();
  ASSERT_EQ(straight.steps_done, N);

  TrainOptions first = resume_options(path("resumed"), N);
  first.quiet = false;  // progress lines tell the watcher where the loop is
  first.log_every = 1;
  StopAtStep watcher(k, N);
  std::streambuf* old = std::cout.rdbuf(&watcher);
  TrainResult part;
  try {
    part = Trainer(first).run();
  } catch (...) {
    std::cout.rdbuf(old);
    throw;
  }
  std::cout.rdbuf(old);
  ASSERT_TRUE(part.interrupted) << watcher.text();
  ASSERT_EQ(part.steps_done, k);
  EXPECT_NE(watcher.text().find("interrupted: saved"), std::string::npos) << watcher.text();
  EXPECT_EQ(load_checkpoint(path("resumed/checkpoint.h5")).trainer.step, k);
  EXPECT_TRUE(fs::exists(path("resumed/checkpoint-11.h5")));

  stop_requested() = false;
  TrainOptions rest = resume_options(path("resumed"), N);
  rest.resume = true;
  rest.config.run.seed = 999;  // ignored on resume: the run's settings come from the checkpoint
  rest.model.drop_rate = 0;    // likewise
  const TrainResult resumed = Trainer(rest).run();
  EXPECT_FALSE(resumed.interrupted);
  EXPECT_EQ(resumed.steps_done, N);

  expect_same_datasets(path("straight/checkpoint.h5"), path("resumed/checkpoint.h5"), kStatePrefixes);
  // Checkpoints taken after the resume match the straight run's too.
  expect_same_datasets(path("straight/checkpoint-15.h5"), path("resumed/checkpoint-15.h5"), kStatePrefixes);
  // Validation metrics at the same steps are identical (train loss windows and timings are not).
  const Checkpoint a = load_checkpoint(path("straight/checkpoint.h5")),
                   b = load_checkpoint(path("resumed/checkpoint.h5"));
  ASSERT_EQ(a.trainer.metrics.size(), b.trainer.metrics.size());
  for (size_t i = 0; i < a.trainer.metrics.size(); ++i) {
    EXPECT_EQ(a.trainer.metrics[i].step, b.trainer.metrics[i].step);
    EXPECT_EQ(a.trainer.metrics[i].val_loss, b.trainer.metrics[i].val_loss);
    EXPECT_EQ(a.trainer.metrics[i].val_accuracy, b.trainer.metrics[i].val_accuracy);
    EXPECT_EQ(a.trainer.metrics[i].lr, b.trainer.metrics[i].lr);
    EXPECT_EQ(a.trainer.metrics[i].grad_norm, b.trainer.metrics[i].grad_norm);
  }
  EXPECT_EQ(a.config, b.config);
}

// A finished run extended with --resume --steps N equals a run of N steps when the schedule does
// not depend on the total (constant): data position, generator and optimizer state all carry over.
TEST_F(TrainerTest, ExtendedRunMatchesAStraightRun) {
  const int64_t N = 20, k = 8;
  TrainOptions o = resume_options(path("straight"), N);
  o.config.schedule.kind = optim::ScheduleKind::constant;
  Trainer(o).run();
  TrainOptions first = o;
  first.out = path("extended");
  first.config.run.steps = k;
  EXPECT_EQ(Trainer(first).run().steps_done, k);
  TrainOptions rest = first;
  rest.resume = true;
  rest.config.run.steps = N;
  EXPECT_EQ(Trainer(rest).run().steps_done, N);
  expect_same_datasets(path("straight/checkpoint.h5"), path("extended/checkpoint.h5"), kStatePrefixes);
  // The same dropout draws: without dropout the parameters would differ from a dropout run.
  TrainOptions nodrop = o;
  nodrop.out = path("nodrop");
  nodrop.model.drop_rate = 0;
  Trainer(nodrop).run();
  EXPECT_FALSE(datasets(path("straight/checkpoint.h5")).at("model/tok_emb.weight").bytes ==
               datasets(path("nodrop/checkpoint.h5")).at("model/tok_emb.weight").bytes);
}

// ---- the encoder-decoder (d2l's Transformer) through the same loop ------------------------------

TrainOptions tiny_seq2seq(const std::string& task, const std::string& out, int64_t steps) {
  TrainOptions o = tiny_options(task, out, steps);
  o.model.arch = "encoder-decoder";
  o.model.emb_dim = 32;
  o.model.n_heads = 2;
  o.model.n_layers = 2;
  o.model.ffn_hiddens = 64;
  o.model.drop_rate = 0;
  o.config.task.options.max_number = 999;
  return o;
}

TEST_F(TrainerTest, EncoderDecoderLearnsReverseAndNumbers) {
  for (const char* task : {"reverse", "numbers"}) {
    const int64_t steps = 150;
    TrainOptions o = tiny_seq2seq(task, path(task), steps);
    o.config.run.eval_every = steps / 3;
    const TrainResult r = Trainer(o).run();
    ASSERT_EQ(r.steps_done, steps);
    const Checkpoint ck = load_checkpoint(r.checkpoint);
    EXPECT_EQ(ck.config["model"]["arch"], "encoder-decoder");
    EXPECT_EQ(ck.config["task"]["name"], task);
    EXPECT_TRUE(ck.config["tokenizer"].contains("source_vocab"));
    ASSERT_EQ(ck.trainer.metrics.size(), 3u);
    // Loss falls from about log V and validation accuracy is far above chance.
    const double V = ck.config["model"]["tgt_vocab_size"].get<double>();
    EXPECT_LT(ck.trainer.metrics.back().val_loss, 0.5 * std::log(V)) << task;
    EXPECT_LT(ck.trainer.metrics.back().val_loss, ck.trainer.metrics.front().val_loss) << task;
    EXPECT_GT(r.final_eval.token_accuracy, 0.5) << task;
    // The saved model evaluates to the run's final scores.
    const RunConfig c = RunConfig::from_json(ck.config);
    const auto model = load_model(ck, r.checkpoint);
    const auto t = c.make_task();
    const Scores again = evaluate(*model, *t, 2, 32, c.batch_tokens());
    EXPECT_DOUBLE_EQ(again.loss, r.final_eval.loss) << task;
    EXPECT_DOUBLE_EQ(again.exact_match, r.final_eval.exact_match) << task;
  }
}

// Dropout on, a finished run extended with --resume equals the run made straight through.
TEST_F(TrainerTest, EncoderDecoderResumesBitIdentically) {
  const int64_t N = 16, k = 7;
  TrainOptions o = tiny_seq2seq("reverse", path("straight"), N);
  o.model.drop_rate = 0.1;
  o.config.schedule.kind = optim::ScheduleKind::constant;
  o.config.run.batch_size = 16;
  Trainer(o).run();
  TrainOptions first = o;
  first.out = path("extended");
  first.config.run.steps = k;
  EXPECT_EQ(Trainer(first).run().steps_done, k);
  TrainOptions rest = first;
  rest.resume = true;
  rest.config.run.steps = N;
  EXPECT_EQ(Trainer(rest).run().steps_done, N);
  expect_same_datasets(path("straight/checkpoint.h5"), path("extended/checkpoint.h5"), kStatePrefixes);
}

TEST_F(TrainerTest, EncoderDecoderConfigErrors) {
  TrainOptions o = tiny_seq2seq("chars", path("c"), 5);
  EXPECT_THROW(Trainer(o).run(), Error);  // chars has no source -> target pairs
  o = tiny_seq2seq("reverse", path("r"), 5);
  o.model.n_heads = 3;  // 32 hiddens do not split into 3 heads
  try {
    Trainer(o).run();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_hiddens 32 must be a positive multiple of num_heads 3"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TrainerTest, ResumeErrorsAndNothingToDo) {
  TrainOptions o = resume_options(path("r"), 5);
  o.resume = true;
  try {
    Trainer(o).run();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--resume was given but '" + path("r/checkpoint.h5") + "' does not exist"),
              std::string::npos)
        << e.what();
  }
  o.resume = false;
  Trainer(o).run();
  const auto before = datasets(path("r/checkpoint.h5"));
  o.resume = true;
  const TrainResult r = Trainer(o).run();  // already at step 5 of 5
  EXPECT_EQ(r.steps_done, 5);
  EXPECT_EQ(datasets(path("r/checkpoint.h5")).at("model/tok_emb.weight").bytes,
            before.at("model/tok_emb.weight").bytes);
  // The device is this run's choice, not the checkpoint's: a CPU run resumed on a GPU runs there (and
  // says clearly when there is none).
  o.config.run.steps = 6;
  o.config.run.device = "cuda";
  if (cuda_available()) {
    EXPECT_EQ(Trainer(o).run().steps_done, 6);
  } else {
    try {
      Trainer(o).run();
      ADD_FAILURE() << "resumed on a GPU that is not there";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
    }
  }
}

// ---- determinism ----------------------------------------------------------------------------------

TEST_F(TrainerTest, SameSeedSameCheckpointsOtherSeedOtherModel) {
  TrainOptions o = resume_options(path("a"), 12);
  Trainer(o).run();
  o.out = path("b");
  Trainer(o).run();
  // Everything but wall-clock quantities.
  expect_same_datasets(
      path("a/checkpoint.h5"), path("b/checkpoint.h5"),
      {"model/", "optimizer/", "trainer/step", "trainer/rng", "trainer/data_index", "trainer/metrics/step",
       "trainer/metrics/train_loss", "trainer/metrics/val_loss", "trainer/metrics/val_accuracy",
       "trainer/metrics/val_exact_match", "trainer/metrics/lr", "trainer/metrics/grad_norm"});
  EXPECT_EQ(load_checkpoint(path("a/checkpoint.h5")).config, load_checkpoint(path("b/checkpoint.h5")).config);
  o.out = path("c");
  o.config.run.seed = 4;
  Trainer(o).run();
  EXPECT_FALSE(datasets(path("a/checkpoint.h5")).at("model/out_head.weight").bytes ==
               datasets(path("c/checkpoint.h5")).at("model/out_head.weight").bytes);
}

// ---- bookkeeping ----------------------------------------------------------------------------------

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("checkpoint", 0) == 0) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(TrainerTest, KeepsTheLastCheckpointsOnly) {
  TrainOptions o = resume_options(path("k"), 20);
  o.config.run.save_every = 4;
  o.config.run.keep_last = 2;
  Trainer(o).run();
  EXPECT_EQ(checkpoint_files(path("k")),
            (std::vector<std::string>{"checkpoint-16.h5", "checkpoint-20.h5", "checkpoint.h5"}));
  EXPECT_EQ(load_checkpoint(path("k/checkpoint-16.h5")).trainer.step, 16);
  EXPECT_EQ(load_checkpoint(path("k/checkpoint-20.h5")).trainer.step, 20);
  EXPECT_EQ(headlab::testing::slurp(path("k/checkpoint.h5")), headlab::testing::slurp(path("k/checkpoint-20.h5")))
      << "the latest, byte for byte";
  // On resume the run's keep_last (from the checkpoint) still applies, and a file of the user's with
  // a similar name is left alone.
  std::ofstream(path("k/checkpoint-best.h5")) << "mine";
  o.config.run.steps = 26;
  o.resume = true;
  o.config.run.keep_last = 100;  // ignored on resume: the checkpoint's settings rule
  Trainer(o).run();
  EXPECT_EQ(checkpoint_files(path("k")),
            (std::vector<std::string>{"checkpoint-24.h5", "checkpoint-26.h5", "checkpoint-best.h5", "checkpoint.h5"}));
  for (const auto& e : fs::directory_iterator(path("k")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
  // keep_last 0 keeps only checkpoint.h5.
  o = resume_options(path("k0"), 8);
  o.config.run.save_every = 4;
  o.config.run.keep_last = 0;
  Trainer(o).run();
  EXPECT_EQ(checkpoint_files(path("k0")), (std::vector<std::string>{"checkpoint.h5"}));
}

std::vector<std::vector<std::string>> read_csv(const std::string& file) {
  std::ifstream in(file);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

TEST_F(TrainerTest, MetricsCsvHasTheColumnsAndOneRowPerEvaluation) {
  TrainOptions o = resume_options(path("m"), 16);
  o.config.run.eval_every = 5;
  Trainer(o).run();
  const auto rows = read_csv(path("m/metrics.csv"));
  ASSERT_EQ(rows.size(), 5u);  // header + steps 5, 10, 15, 16 (the last step is always evaluated)
  EXPECT_EQ(rows[0], (std::vector<std::string>{"step", "train_loss", "val_loss", "val_accuracy", "val_exact_match",
                                               "lr", "grad_norm", "tokens_per_s"}));
  const Checkpoint ck = load_checkpoint(path("m/checkpoint.h5"));
  const LRSchedule sched = LRSchedule::from_json(ck.config["training"]["schedule"]);
  EXPECT_EQ(sched.total, 16) << "the stored schedule is the one the run used";
  const std::vector<int64_t> steps = {5, 10, 15, 16};
  ASSERT_EQ(ck.trainer.metrics.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& row = rows[i + 1];
    ASSERT_EQ(row.size(), 8u);
    EXPECT_EQ(std::stoll(row[0]), steps[i]);
    std::vector<double> v;
    for (size_t c = 1; c < row.size(); ++c) v.push_back(std::stod(row[c]));
    for (double x : v) EXPECT_TRUE(std::isfinite(x)) << "row " << i;
    EXPECT_GT(v[0], 0);  // train_loss
    EXPECT_GT(v[1], 0);  // val_loss
    EXPECT_GE(v[2], 0);  // val_accuracy
    EXPECT_LE(v[2], 1);
    EXPECT_GE(v[3], 0);  // val_exact_match
    EXPECT_LE(v[3], 1);
    EXPECT_NEAR(v[4], sched.at(steps[i] - 1), 1e-7 * sched.lr) << "lr of the step just taken";
    EXPECT_GT(v[5], 0);  // grad_norm
    EXPECT_GT(v[6], 0);  // tokens_per_s
    const MetricRow& m = ck.trainer.metrics[i];
    EXPECT_EQ(m.step, steps[i]);
    EXPECT_NEAR(m.val_loss, v[1], 1e-6 * v[1]);
    EXPECT_NEAR(m.val_accuracy, v[2], 1e-7);
  }
}

// The message of the headlab::Error f throws ("(no error)" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(TrainerTest, RejectsBadOptionsClearly) {
  TrainOptions o = tiny_options("reverse", path("x"), 5);
  o.config.run.steps = 0;
  EXPECT_NE(error_of([&] { Trainer{o}; }).find("--steps must be positive"), std::string::npos);
  o = tiny_options("reverse", path("x"), 5);
  o.config.task.name = "juggle";
  EXPECT_NE(error_of([&] { Trainer(o).run(); }).find("juggle"), std::string::npos);
  o = tiny_options("reverse", path("x"), 5);
  o.model.context_length = 3;  // too short for a reverse example
  EXPECT_NE(error_of([&] { Trainer(o).run(); }).find("task reverse"), std::string::npos);
  o = tiny_options("reverse", path("x"), 5);
  o.model.n_heads = 5;  // 32 % 5 != 0
  EXPECT_NE(error_of([&] { Trainer(o).run(); }).find("emb_dim 32 must be divisible by n_heads 5"), std::string::npos);
  o = tiny_options("chars", path("x"), 5);
  o.config.task.options.text_path = path("missing.txt");
  EXPECT_NE(error_of([&] { Trainer(o).run(); }).find("missing.txt"), std::string::npos);
}

// ---- divergence and stale files ----------------------------------------------------------------------

bool checkpoint_is_finite(const std::string& file) {
  for (const auto& [name, t] : load_checkpoint(file).model)
    if (!t.all_finite()) return false;
  return true;
}

// lr 1e9 without clipping blows the model up within a few steps; a checkpoint every step.
TrainOptions diverging_options(const std::string& out, int64_t steps) {
  TrainOptions o = tiny_options("reverse", out, steps);
  o.config.optimizer.lr = 1e5;  // one step to |w| ~ 1e5 (below the 1e6 limit), the next to inf
  o.config.schedule.warmup = 0;
  o.config.run.grad_clip = 0;
  o.config.run.save_every = 1;
  o.config.run.keep_last = 100;
  return o;
}

// The run stops with a message naming the step and what to try, and every checkpoint on disk (saved
// each step before that) is finite.
TEST_F(TrainerTest, DivergenceStopsWithoutWritingANonFiniteCheckpoint) {
  const TrainOptions o = diverging_options(path("d"), 30);
  const std::string err = error_of([&] { Trainer(o).run(); });
  for (const char* part : {"train: step ", " diverged: ", "Nothing was saved for it", "--lr (now 100000)",
                           "--grad-clip 1", "--skip-nonfinite"})
    EXPECT_NE(err.find(part), std::string::npos) << part << "\n" << err;
  const std::vector<std::string> files = checkpoint_files(path("d"));
  ASSERT_FALSE(files.empty()) << err;
  for (const std::string& f : files) {
    EXPECT_EQ(f.find(".tmp"), std::string::npos) << f;
    EXPECT_TRUE(checkpoint_is_finite(path("d") + "/" + f)) << f;
  }
  const int64_t last_step = load_checkpoint(path("d") + "/checkpoint.h5").trainer.step;
  EXPECT_NE(err.find("train: step " + std::to_string(last_step + 1) + " diverged"), std::string::npos)
      << "the latest checkpoint is the step before the one that diverged\n"
      << err;
}

// --skip-nonfinite skips such steps (no optimizer step) and stops after --max-skipped-steps in a row.
TEST_F(TrainerTest, SkippingNonFiniteStepsIsBounded) {
  TrainOptions o = diverging_options(path("s"), 40);
  o.config.run.skip_nonfinite = true;
  o.config.run.max_skipped_steps = 3;
  const std::string err = error_of([&] { Trainer(o).run(); });
  EXPECT_NE(err.find("4 such steps in a row, more than --max-skipped-steps 3"), std::string::npos) << err;
  for (const std::string& f : checkpoint_files(path("s"))) EXPECT_TRUE(checkpoint_is_finite(path("s") + "/" + f)) << f;
  o.config.run.max_skipped_steps = 0;
  EXPECT_NE(error_of([&] { Trainer{o}; }).find("--max-skipped-steps must be positive"), std::string::npos);
}

// Temporary files of writers that no longer run are removed when a run starts in their folder; a live
// writer's, and files that only look similar, stay.
TEST_F(TrainerTest, StartRemovesStaleTemporaryFilesOnly) {
  const std::string dir = path("t");
  fs::create_directories(dir);
  auto touch = [&](const std::string& name) { std::ofstream(dir + "/" + name) << "x"; };
  const std::string dead = ".headlab-tmp-2147483000.checkpoint-5.h5", dead_csv = ".headlab-tmp-2147483001.metrics.csv",
                    live = ".headlab-tmp-" + std::to_string(::getppid()) + ".checkpoint.h5", similar = "notes.tmp",
                    other = "a.tmp.x1", users = "notes.tmp.2147483002", old_style = "checkpoint.h5.tmp.2147483003";
  for (const std::string& n : {dead, dead_csv, live, similar, other, users, old_style}) touch(n);
  TrainOptions o = tiny_options("reverse", dir, 2);
  Trainer(o).run();
  EXPECT_FALSE(fs::exists(dir + "/" + dead));
  EXPECT_FALSE(fs::exists(dir + "/" + dead_csv));
  // a user's own file that merely ends in .tmp.<dead pid> is not headlab's to remove
  for (const std::string& n : {live, similar, other, users, old_style}) EXPECT_TRUE(fs::exists(dir + "/" + n)) << n;
  EXPECT_TRUE(fs::exists(dir + "/checkpoint.h5"));
}

// Sizes this machine cannot hold are refused at once, naming the bytes and the option to change.
TEST_F(TrainerTest, ImpossibleSizesAreRefusedBeforeAllocating) {
  TrainOptions o = tiny_options("reverse", path("m"), 1);
  o.model.emb_dim = 100000000;
  o.model.n_heads = 1;
  const auto t0 = std::chrono::steady_clock::now();
  std::string err = error_of([&] { Trainer(o).run(); });
  for (const char* part : {"train: needs about ", " EiB of memory (parameters ", " PiB", "optimizer state",
                           "this machine has available", "--emb-dim (now 100000000)"})
    EXPECT_NE(err.find(part), std::string::npos) << part << "\n" << err;
  o = tiny_options("reverse", path("m"), 1);
  o.config.run.batch_size = 100000000;
  err = error_of([&] { Trainer(o).run(); });
  EXPECT_NE(err.find("--batch-size (100000000)"), std::string::npos) << err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(headlab::format_bytes(512), "512 B");
  EXPECT_EQ(headlab::format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(headlab::format_bytes(3.0 * (1 << 30)), "3.0 GiB");
}

TEST_F(TrainerTest, TaskFromRunConfig) {
  EXPECT_THROW(RunConfig::from_json(nlohmann::json::object()).make_task(), Error);
  const nn::DecoderConfig model = headlab::testing::tiny_gpt_config(headlab::testing::kTwoHeadGpt.sized_for(14, 12));
  const nlohmann::json cfg = {{"model", model.to_json()},
                              {"task", {{"name", "add"}, {"options", {{"seed", "7"}, {"n_digits", "2"}}}}}};
  const auto t = RunConfig::from_json(cfg).make_task();
  EXPECT_EQ(t->name(), "add");
  EXPECT_EQ(t->options().n_digits, 2);
  EXPECT_EQ(t->options().seed, 7u);
}

}  // namespace
