// Tests of analysis/ on a small GPT trained here on `reverse` in a few seconds: head ablation,
// Michel et al. importance against finite differences of the gates (float64), pruned vs gated models
// (fused and wrapper, live and through pruned checkpoints), wrapper/fused agreement of every score,
// the pruning curve, attention maps, the pictures and files, the compare measurements, and the
// `headlab` commands on a pruned checkpoint.
#include "analysis/ablation.h"
#include "analysis/analysis.h"
#include "analysis/finetune.h"
#include "analysis/head_scores.h"
#include "analysis/heads_report.h"
#include "analysis/l0_gates.h"
#include "analysis/patching.h"
#include "tasks/algorithmic.h"
#include "tests/process_util.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/h5file.h"
#include "nn/generate.h"
#include "optim/optim.h"
#include "plot/plot.h"
#include "tests/core_test_util.h"
#include "tests/tiny_models.h"
#include "train/trainer.h"

// stb_image's implementation lives in Debian's libstb (-lstb, HEADLAB_STB_SHARED defined); without
// that library it is compiled here, static so that it cannot clash with anything.
#ifndef HEADLAB_STB_SHARED
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace fs = std::filesystem;
using namespace headlab;
using namespace headlab::train;
using namespace headlab::tasks;
using namespace headlab::io;
using namespace headlab::optim;
using namespace headlab::analysis;
using headlab::testing::error_of;

namespace {

#define EXPECT_ERROR_CONTAINS(stmt, needle) \
  EXPECT_NE(error_of([&] { stmt; }).find(needle), std::string::npos) << error_of([&] { stmt; })

constexpr int64_t kBatch = 32;

// The models here are tiny: one thread is fastest, and spares a machine running the suites in
// parallel (ctest -j) from OpenMP threads spinning against each other. The commands run by
// CommandsLoadPrunedCheckpoints inherit it through the environment.
const bool kOneThread = [] {
  omp_set_num_threads(1);
  setenv("OMP_NUM_THREADS", "1", 1);
  return true;
}();

TaskOptions reverse_options() {
  TaskOptions o;
  o.seed = 3;
  o.min_len = 3;
  o.max_len = 5;
  return o;
}

// A 2-layer, 4-head, emb-32 fused GPT trained on reverse for 150 AdamW steps (a few seconds; far
// enough that its heads matter), as a checkpoint. ctest runs every test in its own process, so the
// first one to get here saves it in the build folder (atomically) and the others load it; a file that
// does not load or describes another model is retrained over.
const Checkpoint& trained_checkpoint() {
  static const Checkpoint ck = [] {
    const auto task = make_task("reverse", reverse_options());
    const nn::DecoderConfig cfg = headlab::testing::tiny_gpt_config(
        headlab::testing::kFourHeadGpt.sized_for(task->vocab_size(), task->required_context_length()));
    Checkpoint c;
    c.config = {{"model", cfg.to_json()},
                {"tokenizer", {{"type", "char"}, {"vocab", task->tokenizer().vocab()}}},
                {"task", {{"name", "reverse"}, {"options", options_to_map("reverse", reverse_options())}}},
                {"training", {{"batch_size", kBatch}, {"eval_batches", 2}, {"steps", 150}, {"seed", 7}}}};
    const fs::path cache = fs::path(HEADLAB_BINARY_DIR) / "tests" / "analysis_reverse_150.h5";
    try {
      if (fs::exists(cache)) {
        Checkpoint cached = load_checkpoint(cache.string());
        if (cached.config == c.config) return cached;
      }
    } catch (const Error&) {}
    manual_seed(7);
    nn::DecoderModel model(cfg);
    model.train();
    OptimizerOptions oo = OptimizerOptions::defaults(optim::OptimizerKind::adamw);
    oo.lr = 5e-3;
    Optimizer opt(model.named_parameters(), oo);
    const int64_t T = cfg.context_length, V = cfg.vocab_size;
    for (int64_t step = 0; step < 150; ++step) {
      const Batch b = task->batch(Split::train, static_cast<uint64_t>(step), kBatch, T);
      const Tensor logits = model.forward(tensor(b.inputs, {b.B, T}));
      const Tensor loss = cross_entropy(logits.reshape({-1, V}), tensor(b.targets, {b.B * T}), kIgnoreIndex);
      loss.backward();
      clip_grad_norm(model.parameters(), 1.0);
      opt.step();
      opt.zero_grad();
    }
    c.model = snapshot_parameters(model);
    try {
      save_checkpoint(cache.string(), c);
    } catch (const Error&) {  // a read-only build folder: every test trains its own
    }
    return c;
  }();
  return ck;
}

std::shared_ptr<nn::DecoderModel> load_model(const Checkpoint& ck) {
  return model_from_checkpoint<nn::DecoderModel>(ck, "test");
}

std::unique_ptr<Task> test_task() { return make_task("reverse", reverse_options()); }

EvalSet eval_set(int64_t batches = 2, int64_t B = kBatch) {
  const auto task = test_task();
  return make_eval_set(*task, batches, B, task->required_context_length());
}

class AnalysisFiles : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.path(name); }
  headlab::testing::TempDir tmp_{"headlab_analysis"};
};

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

struct Image {
  int width = 0, height = 0;
  std::vector<Rgb> px;
  size_t not_background() const {  // the pictures are drawn on white
    return static_cast<size_t>(
        std::count_if(px.begin(), px.end(), [](Rgb c) { return !(c.r == 255 && c.g == 255 && c.b == 255); }));
  }
  size_t distinct() const {
    std::set<uint32_t> s;
    for (Rgb c : px) s.insert(static_cast<uint32_t>(c.r) << 16 | static_cast<uint32_t>(c.g) << 8 | c.b);
    return s.size();
  }
};

Image load_png(const std::string& path) {
  int w = 0, h = 0, n = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &n, 3);
  if (!data) {
    ADD_FAILURE() << "cannot decode " << path << ": " << stbi_failure_reason();
    return {};
  }
  Image img{w, h, {}};
  for (size_t i = 0; i < static_cast<size_t>(w) * static_cast<size_t>(h); ++i)
    img.px.push_back({data[3 * i], data[3 * i + 1], data[3 * i + 2]});
  stbi_image_free(data);
  return img;
}

// A picture that holds a drawing: decodes, and a fair share of it is neither background nor one colour.
void expect_drawn(const std::string& path, int min_w, int min_h) {
  const Image img = load_png(path);
  EXPECT_GE(img.width, min_w) << path;
  EXPECT_GE(img.height, min_h) << path;
  EXPECT_GT(img.not_background(), img.px.size() / 50) << path << " is (nearly) blank";
  EXPECT_GT(img.distinct(), 4u) << path;
}

std::map<std::string, Tensor> by_name_map(const NamedTensors& params) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, t] : params) m[name] = t;
  return m;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST(Analysis, EvaluateHeadsAgreesWithEvaluateAndRestoresControls) {
  auto model = load_model(trained_checkpoint());
  const auto task = test_task();
  const EvalSet data = eval_set();
  const Scores s = evaluate_heads(*model, data);
  const Scores r = evaluate(*model, *task, 2, kBatch, task->required_context_length());
  EXPECT_NEAR(s.loss, r.loss, 1e-9);
  EXPECT_DOUBLE_EQ(s.token_accuracy, r.token_accuracy);
  EXPECT_TRUE(s.has_exact_match);
  EXPECT_DOUBLE_EQ(s.exact_match, r.exact_match);
  EXPECT_EQ(s.tokens, data.tokens());
  // The model learned something: far better than chance (1/13 per token).
  EXPECT_GT(s.token_accuracy, 0.5);
  // Explicit gates of one are the same model.
  const Scores ones = evaluate_heads(*model, data, head_matrix(*model, 1.0));
  EXPECT_NEAR(ones.loss, s.loss, 1e-6);
  // Gates and offsets of a measurement do not stay behind.
  HeadMatrix g = head_matrix(*model, 1.0);
  g[0][1] = 0;
  evaluate_heads(*model, data, g);
  for (int64_t l = 0; l < model->n_layers(); ++l) {
    EXPECT_FALSE(model->attention(l).control().gates.defined());
    EXPECT_FALSE(model->attention(l).control().offsets.defined());
  }
}

TEST(Analysis, AblatingAUsedHeadChangesTheLoss) {
  auto model = load_model(trained_checkpoint());
  const EvalSet data = eval_set();
  const AblationResult a = ablate_heads(*model, data);
  ASSERT_EQ(a.heads.size(), 8u);
  double worst_zero = 0, worst_mean = 0, mean_vs_zero = 0;
  for (const auto& h : a.heads) {
    worst_zero = std::max(worst_zero, h.zero.loss - a.base.loss);
    worst_mean = std::max(worst_mean, h.mean.loss - a.base.loss);
    mean_vs_zero = std::max(mean_vs_zero, std::abs(h.mean.loss - h.zero.loss));
    EXPECT_EQ(h.original_head, h.head);
  }
  EXPECT_GT(worst_zero, 0.05) << "zeroing no head changed the loss";
  EXPECT_GT(worst_mean, 0.01);
  EXPECT_GT(mean_vs_zero, 1e-4) << "mean ablation must differ from zero ablation";
  // The head that matters most by zero ablation is among the two most important by gradient score.
  const auto top_zero =
      std::max_element(a.heads.begin(), a.heads.end(), [](auto& x, auto& y) { return x.zero.loss < y.zero.loss; });
  int higher = 0;
  for (const auto& h : a.heads)
    if (h.layer == top_zero->layer && h.importance > top_zero->importance) ++higher;
  EXPECT_LE(higher, 1);
  // Every head of every layer gated off: much worse than any single head.
  const Scores none = evaluate_heads(*model, data, head_matrix(*model, 0.0));
  EXPECT_GT(none.loss, a.base.loss + worst_zero);
}

TEST(Analysis, MeanContextsAreTheMeanOverRowsAndPositions) {
  auto model = load_model(trained_checkpoint());
  const EvalSet data = eval_set(1, 8);
  const std::vector<Tensor> means = mean_head_contexts(*model, data);
  ASSERT_EQ(means.size(), 2u);
  EXPECT_EQ(means[0].shape(), Shape({4, 8}));
  // By hand: keep the contexts of one forward and average over batch and positions.
  nn::HeadControl& hc = model->attention(1).control();
  hc.keep_context = true;
  {
    NoGradGuard ng;
    model->forward(tensor(data.batches[0].inputs, {data.batches[0].B, data.batches[0].T}));
  }
  const Tensor expected = hc.context.mean({0, 2});  // (H, D)
  hc.keep_context = false;
  EXPECT_LT(max_abs_diff(means[1], expected), 1e-6);
  // ablate_heads' mean ablation is gate 0 plus that mean as the head's offset.
  HeadMatrix g = head_matrix(*model, 1.0);
  g[1][2] = 0;
  std::vector<Tensor> offsets(2);
  offsets[1] = zeros({4, 8});
  offsets[1].select(0, 2).copy_(expected.select(0, 2));
  const Scores s = evaluate_heads(*model, data, g, offsets);
  const AblationResult a = ablate_heads(*model, data);
  EXPECT_NEAR(a.heads[6].mean.loss, s.loss, 1e-6);
  EXPECT_NE(a.heads[6].mean.loss, a.heads[6].zero.loss);
}

// The batched pass (every intervention a copy of the data in one forward) against one pass per head.
TEST(Analysis, BatchedAblationEqualsOnePassPerHead) {
  auto model = load_model(trained_checkpoint());
  const EvalSet data = eval_set(2, 8);
  const AblationResult a = ablate_heads(*model, data);
  const std::vector<Tensor> means = mean_head_contexts(*model, data);
  const std::vector<Batch> others = rotated_rows(data);
  const double tok = 1.0 / static_cast<double>(data.tokens());
  auto expect_same = [&](const Scores& batched, const Scores& ref, const std::string& what) {
    EXPECT_NEAR(batched.loss, ref.loss, 2e-5) << what;
    EXPECT_NEAR(batched.token_accuracy, ref.token_accuracy, 1.5 * tok) << what;  // a near-tie may flip
    EXPECT_NEAR(batched.exact_match, ref.exact_match, 1.0 / 16 + 1e-9) << what;
    EXPECT_EQ(batched.tokens, ref.tokens) << what;
  };
  // Patching by hand, batch by batch: the head's context on the source rows (keep_context), then
  // gates (B, H, T) with 0 where patched and that context as the offset there.
  auto patched_by_hand = [&](int64_t layer, int64_t head, int64_t position) {
    train::ScoreSum sum;
    nn::HeadControl& hc = model->attention(layer).control();
    for (size_t i = 0; i < data.batches.size(); ++i) {
      NoGradGuard ng;
      hc.keep_context = true;
      model->forward(tensor(others[i].inputs, {others[i].B, others[i].T}));
      const Tensor src = hc.context;  // (B, H, T, D)
      hc = nn::HeadControl{};
      const int64_t B = data.batches[i].B, T = data.batches[i].T;
      const int64_t t0 = position < 0 ? 0 : position, nt = position < 0 ? T : 1;
      hc.gates = ones({B, 4, T});
      hc.gates.select(1, head).narrow(1, t0, nt).fill_(0.0);
      hc.offsets = zeros(src.shape());
      hc.offsets.select(1, head).narrow(1, t0, nt).copy_(src.select(1, head).narrow(1, t0, nt));
      auto [idx, tgt] = batch_tensors(data.batches[i], kCPU);
      sum.add(data.batches[i], model->forward(idx), tgt);
      hc = nn::HeadControl{};
    }
    return sum.scores();
  };
  expect_same(a.base, evaluate_heads(*model, data), "base");
  ASSERT_EQ(a.heads.size(), 8u);
  for (const HeadAblation& h : a.heads) {
    const std::string name = head_label(h.layer, h.head);
    HeadMatrix g = head_matrix(*model, 1.0);
    g[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)] = 0;
    expect_same(h.zero, evaluate_heads(*model, data, g), name + " zero");
    std::vector<Tensor> offsets(2);
    offsets[static_cast<size_t>(h.layer)] = zeros({4, 8});
    offsets[static_cast<size_t>(h.layer)].select(0, h.head).copy_(
        means[static_cast<size_t>(h.layer)].select(0, h.head));
    expect_same(h.mean, evaluate_heads(*model, data, g, offsets), name + " mean");
    expect_same(h.resample, patched_by_hand(h.layer, h.head, -1), name + " resample");
    EXPECT_NE(h.resample.loss, h.zero.loss) << name;
  }
  // Chunking changes nothing: one copy per forward gives the same scores as all copies at once.
  std::vector<HeadIntervention> list = {{},
                                        {0, 1, Ablation::zero, -1},
                                        {1, 2, Ablation::mean, -1},
                                        {1, 3, Ablation::patch, -1},
                                        {0, 2, Ablation::patch, 3}};
  InterventionOptions o;
  o.source = &others;
  const std::vector<Scores> all = evaluate_interventions(*model, data, list, o);
  o.max_copies = 1;
  const std::vector<Scores> one = evaluate_interventions(*model, data, list, o);
  for (size_t i = 0; i < list.size(); ++i) expect_same(all[i], one[i], "chunk " + std::to_string(i));
  expect_same(all[4], patched_by_hand(0, 2, 3), "patch at position 3");
  EXPECT_NE(all[4].loss, all[0].loss);
  // Bad interventions name the function and what was wrong.
  EXPECT_ERROR_CONTAINS(evaluate_interventions(*model, data, {{2, 0, Ablation::zero, -1}}),
                        "evaluate_interventions: layer 2 is out of range for 2 layers");
  EXPECT_ERROR_CONTAINS(evaluate_interventions(*model, data, {{1, 4, Ablation::zero, -1}}),
                        "evaluate_interventions: layer 1 has no head 4 (it has 4)");
  EXPECT_ERROR_CONTAINS(evaluate_interventions(*model, data, {{1, 0, Ablation::patch, -1}}),
                        "evaluate_interventions: patching needs a source batch per data batch (2), got 0");
  EXPECT_ERROR_CONTAINS(evaluate_interventions(*model, data, {{1, 0, Ablation::zero, 99}}),
                        "evaluate_interventions: position 99 is out of range");
}

// Fine-tuning a pruned checkpoint: starts from the pruned weights (its "before" is the pruned model's
// score), trains on the task, and lowers the loss that pruning raised.
// A vocabulary so large that one row's logits pass the engine's chunk (2^23 floats): the engine scores
// them a row at a time and gets what one pass per head gets.
TEST(Analysis, BatchedAblationScoresALargeVocabularyRowByRow) {
  nn::DecoderConfig c;
  c.vocab_size = 1 << 17, c.context_length = 64, c.emb_dim = 8, c.n_heads = 2, c.n_layers = 2;
  manual_seed(5);
  nn::DecoderModel model(c);
  model.eval();
  EvalSet data;
  Batch b;
  b.B = 3, b.T = 64;
  for (int64_t i = 0; i < b.B * b.T; ++i) {
    b.inputs.push_back((i * 7919 + 1) % c.vocab_size);
    b.targets.push_back((i * 104729 + 2) % c.vocab_size);
  }
  data.batches = {b};
  const std::vector<Scores> got =
      evaluate_interventions(model, data, {{}, {0, 1, Ablation::zero, -1}, {1, 0, Ablation::zero, -1}});
  EXPECT_NEAR(got[0].loss, evaluate_heads(model, data).loss, 1e-5);
  for (const auto& [layer, head, i] : {std::tuple{0, 1, 1}, std::tuple{1, 0, 2}}) {
    HeadMatrix g = head_matrix(model, 1.0);
    g[size_t(layer)][size_t(head)] = 0;
    EXPECT_NEAR(got[size_t(i)].loss, evaluate_heads(model, data, g).loss, 1e-5) << layer << "." << head;
    EXPECT_EQ(got[size_t(i)].tokens, 3 * 64);
  }
}

// Composition scores against the C x C products formed directly (norm1's scale folded in by hand).
TEST(Analysis, CompositionScoresEqualTheDirectProducts) {
  nn::DecoderConfig c;
  c.vocab_size = 11, c.context_length = 8, c.emb_dim = 12, c.n_heads = 3, c.n_layers = 3, c.qkv_bias = true;
  manual_seed(9);
  nn::DecoderModel model(c);
  {
    NoGradGuard ng;  // a LayerNorm scale other than ones, so that folding it matters
    for (int64_t l = 0; l < 3; ++l) model.block(l)->norm1->weight.copy_(add(rand({12}), 0.5));
  }
  const std::vector<CompositionScore> got = composition_scores(model);
  ASSERT_EQ(got.size(), size_t(3 * 3 * 3));  // layer pairs (0,1), (0,2), (1,2) x 3 x 3 heads
  const auto f64 = [](const Tensor& t) { return t.detach().to(DType::f64); };
  // Head h of layer l: W_Q, W_K, W_V (C, D) with norm1's scale on their rows, W_O (D, C).
  const auto mats = [&](int64_t l, int64_t h) {
    const auto& a = *model.block(l)->att;
    const auto* f = dynamic_cast<const nn::CausalMultiHeadAttention*>(&a);
    const Tensor gamma = f64(model.block(l)->norm1->weight).unsqueeze(1);
    const auto rows = [&](const Tensor& w) { return mul(f64(w).narrow(0, h * 4, 4).transpose(0, 1), gamma); };
    return std::array<Tensor, 4>{rows(f->W_query->weight), rows(f->W_key->weight), rows(f->W_value->weight),
                                 f64(f->out_proj->weight).narrow(1, h * 4, 4).transpose(0, 1)};
  };
  const auto fro = [](const Tensor& t) { return std::sqrt(sum(mul(t, t)).item<double>()); };
  const auto score = [&](const Tensor& a, const Tensor& b) { return fro(matmul(a, b)) / (fro(a) * fro(b)); };
  for (const CompositionScore& s : got) {
    const auto [Qa, Ka, Va, Oa] = mats(s.layer_a, s.head_a);
    const auto [Qb, Kb, Vb, Ob] = mats(s.layer_b, s.head_b);
    const Tensor ov_a = matmul(Va, Oa), qk_b = matmul(Qb, Kb.transpose(0, 1)), ov_b = matmul(Vb, Ob);
    const std::string pair = std::to_string(s.layer_a) + "." + std::to_string(s.head_a) + " -> " +
                             std::to_string(s.layer_b) + "." + std::to_string(s.head_b);
    EXPECT_NEAR(s.q, score(ov_a, qk_b), 1e-9) << pair;
    EXPECT_NEAR(s.k, score(ov_a, qk_b.transpose(0, 1)), 1e-9) << pair;
    EXPECT_NEAR(s.v, score(ov_a, ov_b), 1e-9) << pair;
    EXPECT_LT(s.layer_a, s.layer_b);
  }
}

// The ICL score against the cross entropy at the two positions computed by hand; an observation of
// HeadsOverTime holds head_types' scores of the same rows.
TEST(Analysis, IclScoreAndHeadsOverTimeMatchTheirParts) {
  nn::DecoderConfig c;
  c.vocab_size = 7, c.context_length = 40, c.emb_dim = 8, c.n_heads = 2, c.n_layers = 2;
  manual_seed(2);
  nn::DecoderModel model(c);
  model.eval();
  tasks::TaskOptions to;
  to.text = std::string(400, 'a') + "bcdefg bcdefg abcabc gfedcb " + std::string(200, 'b');
  const auto task = tasks::make_task("chars", to);
  EXPECT_EQ(icl_positions(40), (std::pair<int64_t, int64_t>{4, 39}));
  const EvalSet data = make_eval_set(*task, 1, 3, 40);
  const HeadsAtStep s = icl_score(model, data, 4, 39);
  const Batch& b = data.batches[0];
  double early = 0, late = 0;
  {
    NoGradGuard ng;
    const Tensor logp = model.forward(tensor(b.inputs, {3, 40})).log_softmax(-1);  // (3, 40, V)
    for (int64_t r = 0; r < 3; ++r) {
      early -= logp.select(0, r).select(0, 4).select(0, b.target(r, 4)).item<double>() / 3;
      late -= logp.select(0, r).select(0, 39).select(0, b.target(r, 39)).item<double>() / 3;
    }
  }
  EXPECT_NEAR(s.loss_early, early, 1e-5);
  EXPECT_NEAR(s.loss_late, late, 1e-5);
  EXPECT_NEAR(s.icl, late - early, 1e-5);

  double all = 0;  // the mean loss over every position
  {
    NoGradGuard ng;
    const Tensor logp = model.forward(tensor(b.inputs, {3, 40})).log_softmax(-1);
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t t = 0; t < 40; ++t) all -= logp.select(0, r).select(0, t).select(0, b.target(r, t)).item<double>();
  }
  EXPECT_NEAR(s.loss, all / 120, 1e-5);

  HeadsOverTime watch(3, 3);
  watch.observe(model, *task, 40, 0);
  watch.observe(model, *task, 40, 5);
  ASSERT_EQ(watch.history().size(), 2u);
  HeadTypeOptions o;
  o.induction_rows = 3;
  const HeadTypes direct = head_types(model, data, o);
  ASSERT_EQ(watch.history()[1].heads.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(watch.history()[1].heads[i].induction, direct.heads[i].induction, 1e-12);
    EXPECT_NEAR(watch.history()[1].heads[i].previous_token, direct.heads[i].previous_token, 1e-12);
  }
  EXPECT_NEAR(watch.history()[1].icl, s.icl, 1e-9);
  const std::string csv = watch.csv();
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 2 * 4) << csv;
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "step,layer,head,previous_token,induction,duplicate_token,loss,icl_score,token_accuracy,exact_match");
  EXPECT_NEAR(watch.history()[1].token_accuracy, evaluate(model, data.batches).token_accuracy, 1e-9);
}

// Prompt pairs from JSONL in a chars model's tokenizer, every malformed row refused naming its line; the
// induction generator's rows; the logit difference against the logits read by hand.
TEST(Analysis, PromptPairsReadGenerateAndScore) {
  tasks::TaskOptions to;
  to.text = "abcdefgh abcdefgh xyz";
  const auto task = tasks::make_task("chars", to);
  const std::string dir = ::testing::TempDir() + "prompt_pairs_test";
  fs::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir + "/" + name) << body;
    return dir + "/" + name;
  };
  const PromptPairs p =
      read_prompt_pairs(write("ok.jsonl",
                              "{\"clean\": \"abc a\", \"corrupt\": \"xyz x\", \"answer\": \"b\", \"wrong\": \"y\"}\n\n"
                              "{\"clean\": \"hgf h\", \"corrupt\": \"abc a\", \"answer\": \"g\", \"wrong\": \"b\"}\n"),
                        *task);
  ASSERT_EQ(p.rows(), 2);
  EXPECT_EQ(p.T, 5);
  EXPECT_EQ(p.clean, (std::vector<int64_t>{1, 2, 3, 0, 1, 8, 7, 6, 0, 8}));  // " " is 0, a..h 1..8
  EXPECT_EQ(p.answer, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(p.wrong, (std::vector<int64_t>{10, 2}));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"clean\": \"abc\"", "bad.jsonl:1: not JSON"},
      {std::string("{}\0{\"clean\": 1}", 15), "bad.jsonl:1: not JSON (a NUL byte at offset 2"},
      {"[1, 2]", "bad.jsonl:1 is not a JSON object"},
      {"{\"clean\": \"ab\", \"corrupt\": \"xy\", \"answer\": \"a\"}", "bad.jsonl:1 has no string field 'wrong'"},
      {"{\"clean\": \"ab\", \"corrupt\": \"xy\", \"answer\": 3, \"wrong\": \"b\"}", "has no string field 'answer'"},
      {"{\"clean\": \"ab\", \"corrupt\": \"xy\", \"answer\": \"ab\", \"wrong\": \"b\"}",
       "bad.jsonl:1: answer must be one token; it is 2: \"a\" \"b\""},
      {"{\"clean\": \"ab\", \"corrupt\": \"xyz\", \"answer\": \"a\", \"wrong\": \"b\"}",
       "clean has 2 tokens, corrupt 3"},
      {"{\"clean\": \"ab\", \"corrupt\": \"xy\", \"answer\": \"a\", \"wrong\": \"b\"}\n"
       "{\"clean\": \"abc\", \"corrupt\": \"xyz\", \"answer\": \"a\", \"wrong\": \"b\"}",
       "bad.jsonl:2: prompts of 3 tokens, but the rows before have 2"},
      {"{\"clean\": \"ab\", \"corrupt\": \"xy\", \"answer\": \"Q\", \"wrong\": \"b\"}", "bad.jsonl:1: answer: "},
      {"\n  \n", "has no rows"}};
  for (const auto& row : bad)  // (not a structured binding: clang 14 cannot capture one in the macro's lambda)
    EXPECT_ERROR_CONTAINS(read_prompt_pairs(write("bad.jsonl", row.first), *task), row.second);
  EXPECT_ERROR_CONTAINS(read_prompt_pairs(dir + "/none.jsonl", *task), "does not exist");
  EXPECT_ERROR_CONTAINS(read_prompt_pairs(dir + "/ok.jsonl", *tasks::make_task("reverse", {})), "needs a text model");

  const PromptPairs ind = induction_prompt_pairs(7, 50, 4, 3);
  ASSERT_EQ(ind.rows(), 50);
  EXPECT_EQ(ind.T, 7);
  for (int64_t r = 0; r < 50; ++r) {
    const auto* c = ind.clean.data() + r * 7;
    const auto* k = ind.corrupt.data() + r * 7;
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_EQ(c[4 + t], c[t]);
      EXPECT_EQ(k[4 + t], k[t]);
    }
    EXPECT_EQ(ind.answer[static_cast<size_t>(r)], c[3]);
    EXPECT_EQ(ind.wrong[static_cast<size_t>(r)], k[3]);
    EXPECT_NE(ind.answer[static_cast<size_t>(r)], ind.wrong[static_cast<size_t>(r)]);
  }

  nn::DecoderConfig c;
  c.vocab_size = 7, c.context_length = 8, c.emb_dim = 8, c.n_heads = 2, c.n_layers = 1;
  manual_seed(4);
  nn::DecoderModel model(c);
  const LogitDifference d = logit_difference(model, ind);
  EXPECT_TRUE(model.is_training());  // its mode is left as it was
  ASSERT_EQ(d.clean.size(), 50u);
  model.eval();
  double mean = 0;
  for (int64_t r = 0; r < 50; ++r) {
    NoGradGuard ng;
    const std::vector<int64_t> row(ind.corrupt.begin() + r * 7, ind.corrupt.begin() + (r + 1) * 7);
    const Tensor last = model.forward(tensor(row, {1, 7})).select(0, 0).select(0, 6);
    const double expected = last.select(0, ind.answer[static_cast<size_t>(r)]).item<double>() -
                            last.select(0, ind.wrong[static_cast<size_t>(r)]).item<double>();
    EXPECT_NEAR(d.corrupt[static_cast<size_t>(r)], expected, 1e-5) << r;
    mean += expected / 50;
  }
  EXPECT_NEAR(d.corrupt_mean, mean, 1e-5);
  EXPECT_DOUBLE_EQ(d.normalized(d.clean_mean), 1.0);
  EXPECT_DOUBLE_EQ(d.normalized(d.corrupt_mean), 0.0);
  PromptPairs too_long = ind;
  too_long.T = 9;
  EXPECT_ERROR_CONTAINS(logit_difference(model, too_long), "prompts of 9 tokens do not fit the model's context of 8");
}

namespace {

double logistic(double step, double middle, double width, double high, double low) {
  return low + (high - low) / (1 + std::exp((step - middle) / width));
}

// A history observed every `every` steps up to `last`, its measure (the ICL score; the loss where `task`, the ICL
// score then NaN as a task's is) from f(step, i), and two heads: L0H0's previous-token score rising with the
// measure's fall, L1H1's induction score staying low.
std::vector<HeadsAtStep> history_of(int64_t every, int64_t last, const std::function<double(double, int64_t)>& f,
                                    bool task = false) {
  std::vector<HeadsAtStep> h;
  for (int64_t step = 0, i = 0; step <= last; step += every, ++i) {
    HeadsAtStep s;
    s.step = step;
    const double v = f(static_cast<double>(step), i);
    (task ? s.loss : s.icl) = v;
    if (task) s.icl = s.loss_early = s.loss_late = std::nan("");
    if (!task) s.loss = 3 + v;
    s.token_accuracy = 0.9 - v / 3, s.exact_match = task ? 0.8 - v / 3 : std::nan("");
    HeadTypeScores a, b;
    a.layer = 0, a.head = a.original_head = 0, a.previous_token = 0.5 - v / 4, a.induction = 0.02;
    b.layer = 1, b.head = b.original_head = 1, b.previous_token = 0.1, b.induction = 0.05, b.duplicate_token = 0.1;
    s.heads = {a, b};
    h.push_back(s);
  }
  return h;
}

double wiggle(int64_t i) { return 0.01 * std::sin(12.9898 * static_cast<double>(i)); }  // a plateau's small noise

}  // namespace

// A phase change is a sharp fall between plateaus, whatever the cadence of the observations: a clean S-curve
// is one, observed every 50 steps or every 10 (where no single interval falls 0.1 nats: one interval's fall
// against the median change missed it); the loss of a task (its ICL score NaN) has its S-curve found after the
// first fast fall, which has no plateau before it; a slow slide, noise and too few observations are none.
TEST(HeadsOverTime, PhaseChangeIsASharpFallBetweenPlateaus) {
  const auto s_curve = [](double width) {
    return [width](double step, int64_t i) { return logistic(step, 500, width, 0.0, -1.8) + wiggle(i); };
  };
  PhaseChange p = find_phase_change(history_of(50, 1000, s_curve(15)));
  EXPECT_EQ(p.measure, PhaseMeasure::icl);
  ASSERT_TRUE(p.found && p.sharp);
  EXPECT_GE(p.from, 400);
  EXPECT_LE(p.to, 600);
  EXPECT_LT(p.from, 500);
  EXPECT_GT(p.to, 500);
  EXPECT_GT(p.fall, 1.4);
  EXPECT_NEAR(p.whole_fall, 1.8, 0.05);
  EXPECT_GE(p.contrast, kPhaseChangeRatio);
  EXPECT_LT(p.moved, 0.05);
  EXPECT_NEAR(p.first, 0.0, 0.02);
  EXPECT_NEAR(p.last, -1.8, 0.02);
  EXPECT_NEAR(p.loss_from - p.loss_to, p.fall, 1e-9);
  // The heads: L0H0's previous-token score grew most, across the phase change too; the strongest induction
  // head is L1H1 at 0.05, which never reached the threshold.
  EXPECT_STREQ(p.grew_most.kind->name, "previous-token");
  EXPECT_EQ(p.grew_most.layer, 0);
  EXPECT_NEAR(p.grew_most.last - p.grew_most.first, 0.45, 0.01);
  EXPECT_NEAR(p.grew_most.to - p.grew_most.from, p.fall / 4, 1e-9);
  EXPECT_EQ(p.strongest_induction.layer, 1);
  EXPECT_EQ(p.strongest_induction.head, 1);
  EXPECT_DOUBLE_EQ(p.strongest_induction.last, 0.05);
  EXPECT_EQ(p.first_induction_step, -1);

  // A wider S-curve observed every 10 steps: its steepest interval falls 0.09 nats.
  const std::vector<HeadsAtStep> fine = history_of(10, 1000, s_curve(50));
  EXPECT_LT(fine[50].icl - fine[51].icl, kPhaseChangeNats);
  p = find_phase_change(fine);
  ASSERT_TRUE(p.sharp);
  EXPECT_LT(p.from, 500);
  EXPECT_GT(p.to, 500);
  EXPECT_GT(p.fall, 1.2);

  // A task's loss: a fast first fall, a plateau, the S-curve at 600, a plateau; the ICL score NaN throughout.
  p = find_phase_change(history_of(
      50, 1000,
      [](double step, int64_t i) { return 1.5 * std::exp(-step / 20) + logistic(step, 600, 20, 1.9, 0.1) + wiggle(i); },
      true));
  EXPECT_EQ(p.measure, PhaseMeasure::loss);
  ASSERT_TRUE(p.sharp);
  EXPECT_GE(p.from, 450);
  EXPECT_LE(p.to, 750);
  EXPECT_GT(p.fall, 1.4);
  EXPECT_TRUE(std::isfinite(p.first) && std::isfinite(p.last));

  // The loss of `headlab train --task add --track-heads 50 --steps 1500` (observations to step 700): a first
  // drop, a plateau of 150 steps, the fall from step 200 to 450 and a plateau; that of `--task sort` (600 steps)
  // falls from the start and slows down: no phase change.
  const std::vector<double> add = {2.750804, 1.534814, 1.398664, 1.389353, 1.339831, 1.118342, 0.725471, 0.318173,
                                   0.080082, 0.015416, 0.005069, 0.002912, 0.002150, 0.001740, 0.001493},
                            sort = {2.738152, 1.185963, 0.338690, 0.234196, 0.157010, 0.128755, 0.101966,
                                    0.045273, 0.026855, 0.018069, 0.013174, 0.012011, 0.010192};
  p = find_phase_change(history_of(
      50, 700, [&](double, int64_t i) { return add[static_cast<size_t>(i)]; }, true));
  ASSERT_TRUE(p.sharp) << p.contrast;
  EXPECT_EQ(p.from, 200);
  EXPECT_GE(p.to, 400);
  EXPECT_LE(p.to, 450);
  EXPECT_NEAR(p.fall, 1.339831 - (p.to == 400 ? 0.080082 : 0.015416), 1e-9);
  p = find_phase_change(history_of(
      50, 600, [&](double, int64_t i) { return sort[static_cast<size_t>(i)]; }, true));
  EXPECT_TRUE(p.found);
  EXPECT_FALSE(p.sharp) << p.from << " -> " << p.to << ", " << p.contrast << " x";
  EXPECT_EQ(p.from, 0);  // the steepest fall, reported as such
  EXPECT_EQ(p.to, 50);

  // A slow slide: it falls fastest somewhere, but as fast before and after.
  p = find_phase_change(history_of(50, 1000, [](double step, int64_t i) { return -1.5 * step / 1000 + wiggle(i); }));
  EXPECT_TRUE(p.found);
  EXPECT_FALSE(p.sharp);
  EXPECT_GT(p.contrast, 0);
  EXPECT_LT(p.contrast, kPhaseChangeRatio);
  // Noise of 0.2 nats: falls of more than 0.1 nats everywhere, none sharp (20 draws).
  for (unsigned seed = 0; seed < 20; ++seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> noise(0, 0.2);
    p = find_phase_change(history_of(25, 1000, [&](double, int64_t) { return noise(gen); }));
    EXPECT_TRUE(p.found) << seed;
    EXPECT_FALSE(p.sharp) << seed << ": " << p.from << " -> " << p.to << ", " << p.contrast << " x";
  }
  // Too few observations: a perfect step over 5 has no 3 observations of plateau on either side; 2 do not
  // even make an interval to compare; a rising measure never falls.
  const double step_values[] = {0, 0, -1.5, -1.5, -1.5};
  p = find_phase_change(history_of(100, 400, [&](double, int64_t i) { return step_values[i]; }));
  EXPECT_TRUE(p.found);
  EXPECT_FALSE(p.sharp);
  EXPECT_EQ(p.contrast, 0);
  EXPECT_EQ(p.from, 100);
  EXPECT_EQ(p.to, 200);
  EXPECT_FALSE(find_phase_change(history_of(100, 100, s_curve(15))).found);
  EXPECT_FALSE(find_phase_change(history_of(50, 1000, [](double step, int64_t) { return step / 1000; })).found);
  EXPECT_EQ(find_phase_change({}).strongest_induction.layer, -1);
}

// The summary and the charts say what was tracked: on a task no NaN ICL score and no induction head (none
// reached the threshold), the loss's phase change named, the head score that grew most; on text the ICL
// score and the strongest induction head. The charts: a panel per head score with every head a line, the
// phase change's stretch marked on each, and the loss over step + 1 so that step 0 shows on its log axis.
TEST(HeadsOverTime, SummaryAndChartsSayWhatWasTracked) {
  const auto task_loss = [](double step, int64_t i) { return logistic(step, 500, 15, 2.0, 0.1) + wiggle(i); };
  const std::vector<HeadsAtStep> task = history_of(50, 1000, task_loss, true);
  const std::string md = heads_over_time_md(task, "sort", 64);
  for (const char* absent : {"nan", "induction head", "ICL score", "no phase change"})
    EXPECT_EQ(md.find(absent), std::string::npos) << absent << "\n" << md;
  for (const char* present :
       {"- tracked: the loss of the sort task's answers on 64 validation rows", "token accuracy", "exact match",
        "- phase change: the loss fell", "- head score that grew most: previous-token, L0H0"})
    EXPECT_NE(md.find(present), std::string::npos) << present << "\n" << md;
  std::vector<HeadsAtStep> induced = task;  // a head that reached the threshold is named on a task too
  for (HeadsAtStep& s : induced) s.heads[1].induction = s.step >= 600 ? 0.7 : 0.05;
  EXPECT_NE(
      heads_over_time_md(induced, "sort", 64).find("strongest induction head at the end: L1H1, induction score 0.700"),
      std::string::npos);
  const std::string text = heads_over_time_md(
      history_of(50, 1000, [](double step, int64_t i) { return logistic(step, 500, 15, 0.0, -0.5) + wiggle(i); }),
      "chars", 64);
  for (const char* present : {"in-context-learning score", "- phase change: the ICL score fell",
                              "strongest induction head at the end: L1H1, induction score 0.050 (0.050 -> 0.050 across "
                              "the phase change; under 0.4, where heads labels a head induction)",
                              "reached 0.4: never"})
    EXPECT_NE(text.find(present), std::string::npos) << present << "\n" << text;

  const std::vector<plot::LineChart> charts = heads_over_time_charts(task, "sort");
  ASSERT_EQ(charts.size(), 5u);  // previous-token, induction, duplicate-token, accuracy, loss
  const PhaseChange p = find_phase_change(task);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NE(charts[c].title.find(kTrackedScores[c].name), std::string::npos) << charts[c].title;
    ASSERT_EQ(charts[c].series.size(), 2u);  // every head
    EXPECT_EQ(charts[c].series[0].y.size(), task.size());
    EXPECT_EQ(charts[c].series[0].name, c == 0 ? "L0H0" : "");
  }
  EXPECT_DOUBLE_EQ(charts[0].series[0].y.back(), task.back().heads[0].previous_token);
  for (size_t c = 0; c < 4; ++c) {
    ASSERT_EQ(charts[c].x_marks.size(), 2u) << c;
    EXPECT_EQ(charts[c].x_marks[0].x, static_cast<double>(p.from));
    EXPECT_EQ(charts[c].x_marks[1].x, static_cast<double>(p.to));
  }
  for (const plot::Series& line : charts[3].series)  // no NaN ICL score drawn: the answers' accuracy
    EXPECT_TRUE(line.name == "token accuracy" || line.name == "exact match") << line.name;
  const plot::LineChart& loss = charts[4];
  EXPECT_TRUE(loss.log_x);
  EXPECT_NE(loss.x_label.find("step + 1"), std::string::npos);
  ASSERT_EQ(loss.series[0].x.size(), task.size());  // step 0 as 1
  EXPECT_EQ(loss.series[0].x.front(), 1.0);
  EXPECT_DOUBLE_EQ(loss.series[0].y.front(), task.front().loss);
  EXPECT_EQ(loss.x_marks[0].x, static_cast<double>(p.from + 1));
  const headlab::testing::TempDir dir("heads_over_time");  // and it draws
  plot::save_line_charts(charts, dir.path("h.png"));
  expect_drawn(dir.path("h.png"), 2000, 400);
}

// train --task sort --track-heads through the command: the csv, png and md, and the lines printed after
// training, have no NaN and claim no induction head; the md says the loss of the answers was tracked.
TEST(HeadsOverTime, TrackingATaskModelReportsItsLossNotANanIclScore) {
  const fs::path exe = fs::path(HEADLAB_BINARY_DIR) / "headlab";
  if (!fs::exists(exe)) GTEST_SKIP() << exe << " is not built (cmake --build <dir> --target headlab_cli)";
  const headlab::testing::TempDir dir("heads_over_time_sort");
  const headlab::testing::ProcessResult r = headlab::testing::run_process(
      {exe.string(),     "train", "--task",        "sort", "--emb-dim",    "16", "--n-heads",    "2",
       "--n-layers",     "2",     "--steps",       "6",    "--batch-size", "8",  "--eval-every", "6",
       "--eval-batches", "1",     "--track-heads", "2",    "--threads",    "1",  "--out",        dir.path("run")},
      dir.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string md = headlab::testing::slurp(dir.path("run/heads_over_time.md")),
                    csv = headlab::testing::slurp(dir.path("run/heads_over_time.csv"));
  const std::string printed = r.out.substr(r.out.find("heads over time:"));
  for (const std::string& text : {md, csv, printed}) {
    EXPECT_EQ(text.find("nan"), std::string::npos) << text;
    EXPECT_EQ(text.find("induction head"), std::string::npos) << text;
  }
  EXPECT_NE(md.find("- tracked: the loss of the sort task's answers"), std::string::npos) << md;
  EXPECT_NE(printed.find("- tracked: the loss of the sort task's answers"), std::string::npos) << printed;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 4 * 4) << csv;  // steps 0, 2, 4, 6 x 4 heads
  EXPECT_NE(csv.find("\n6,1,1,"), std::string::npos) << csv;
  expect_drawn(dir.path("run/heads_over_time.png"), 2000, 400);
}

TEST_F(AnalysisFiles, FinetuningRecoversWhatPruningCost) {
  const Checkpoint& ck = trained_checkpoint();
  auto model = load_model(ck);
  const EvalSet data = eval_set(2, 16);
  const Scores unpruned = evaluate_heads(*model, data);
  const Checkpoint pruned = prune_checkpoint(ck, {{0}, {3}});  // 6 of 8 heads gone
  FinetuneOptions o;
  o.steps = 60;
  o.out = path("ft");
  const FinetuneResult r = finetune(pruned, data, o);
  EXPECT_NEAR(r.before.loss, evaluate_heads(*model_from_checkpoint<nn::DecoderModel>(pruned, "pruned"), data).loss, 1e-9);
  EXPECT_GT(r.before.loss, unpruned.loss + 0.05) << "pruning six heads should cost something";
  EXPECT_LT(r.after.loss, r.before.loss - 0.02) << "before " << r.before.loss << ", after " << r.after.loss;
  const Checkpoint out = load_checkpoint(r.checkpoint);
  EXPECT_EQ(out.config["model"]["kept_heads"], pruned.config["model"]["kept_heads"]);
  EXPECT_EQ(out.trainer.step, 60);
  o.steps = 0;
  EXPECT_ERROR_CONTAINS(finetune(pruned, data, o), "finetune: the number of steps must be positive, got 0");
}

// Activation patching against patching by hand, and a dead head (zero out_proj columns) that no
// patch can move.
TEST(Analysis, PatchingEqualsPatchingByHandAndADeadHeadDoesNothing) {
  auto model = load_model(trained_checkpoint());
  const auto task = test_task();
  const auto& algo = dynamic_cast<const AlgorithmicTask&>(*task);
  const EvalSet clean = eval_set(2, 8);
  std::vector<Batch> corrupted;
  for (size_t i = 0; i < clean.batches.size(); ++i) corrupted.push_back(algo.corrupt(clean.batches[i], i));
  {  // plant a dead head: L1H0's out_proj columns zero
    NoGradGuard ng;
    dynamic_cast<nn::CausalMultiHeadAttention&>(model->attention(1)).out_proj->weight.narrow(1, 0, 8).zero_();
  }
  const PatchingResult r = patch_heads(*model, clean, corrupted, true);
  EXPECT_GT(r.corrupted.loss, r.clean.loss + 0.5) << "changing a prompt digit must break the clean answer";
  EXPECT_EQ(r.tokens, clean.tokens());
  // By hand: the head's context recorded on the source batch, gate 0 and that context as its offset.
  auto by_hand = [&](const std::vector<Batch>& run_on, const std::vector<Batch>& source, int64_t l, int64_t h) {
    train::ScoreSum sum;
    nn::HeadControl& hc = model->attention(l).control();
    for (size_t i = 0; i < run_on.size(); ++i) {
      NoGradGuard ng;
      hc.keep_context = true;
      model->forward(tensor(source[i].inputs, {source[i].B, source[i].T}));
      Tensor off = zeros(hc.context.shape());
      off.select(1, h).copy_(hc.context.select(1, h));
      hc = nn::HeadControl{};
      hc.gates = ones({4});
      hc.gates.narrow(0, h, 1).fill_(0.0);
      hc.offsets = off;
      sum.add(clean.batches[i], model->forward(tensor(run_on[i].inputs, {run_on[i].B, run_on[i].T})),
              tensor(clean.batches[i].targets, {clean.batches[i].B, clean.batches[i].T}));
      hc = nn::HeadControl{};
    }
    return sum.scores();
  };
  ASSERT_EQ(r.heads.size(), 8u);
  double strongest = 0;
  for (const HeadPatching& p : r.heads) {
    const std::string name = head_label(p.layer, p.head);
    EXPECT_NEAR(p.noised.loss, by_hand(clean.batches, corrupted, p.layer, p.head).loss, 2e-5) << name;
    EXPECT_NEAR(p.denoised.loss, by_hand(corrupted, clean.batches, p.layer, p.head).loss, 2e-5) << name;
    EXPECT_NEAR(p.noising, (p.noised.loss - r.clean.loss) / (r.corrupted.loss - r.clean.loss), 1e-12);
    ASSERT_EQ(p.denoising_by_position.size(), static_cast<size_t>(clean.batches[0].T));
    strongest = std::max(strongest, p.denoising);
  }
  EXPECT_GT(strongest, 0.1) << "some head carries the corrupted digit";
  const HeadPatching& dead = r.heads[4];  // L1H0
  EXPECT_NEAR(dead.noising, 0.0, 1e-5);
  EXPECT_NEAR(dead.denoising, 0.0, 1e-5);
  for (double e : dead.denoising_by_position) EXPECT_NEAR(e, 0.0, 1e-5);
  EXPECT_ERROR_CONTAINS(patch_heads(*model, clean, {corrupted[0]}),
                        "patch_heads: 1 corrupted batches for 2 clean ones");
}

// Learned L0 gates on a model with a planted dead head (zero out_proj columns): no penalty closes
// nothing (the dead head's loss gradient is exactly 0), a moderate one closes the dead head and keeps
// the head that matters most; the dead head comes first in the pruning order.
TEST(Analysis, L0GatesCloseAPlantedDeadHead) {
  EXPECT_EQ(l0_test_gate(10.0), 1.0);
  EXPECT_EQ(l0_test_gate(-10.0), 0.0);
  EXPECT_NEAR(l0_test_gate(0.0), 0.5 * (kL0Zeta - kL0Gamma) + kL0Gamma, 1e-15);
  auto model = load_model(trained_checkpoint());
  const AblationResult before = ablate_heads(*model, eval_set(1, 16));
  const auto top = std::max_element(before.heads.begin(), before.heads.end(),
                                    [](auto& x, auto& y) { return x.zero.loss < y.zero.loss; });
  const int64_t dead_layer = top->layer == 1 ? 0 : 1, dead_head = 1;  // never the top head
  {
    NoGradGuard ng;
    dynamic_cast<nn::CausalMultiHeadAttention&>(model->attention(dead_layer))
        .out_proj->weight.narrow(1, 8 * dead_head, 8)
        .zero_();
  }
  L0Options o;
  o.penalties = {0.0, 0.03};
  o.steps = 120;
  o.batch_size = 16;
  const L0Result r = l0_gates(*model, *test_task(), eval_set(1, 16), o);
  ASSERT_EQ(r.points.size(), 2u);
  EXPECT_TRUE(r.points[0].closed.empty());
  const auto& closed = r.points[1].closed;
  EXPECT_NE(std::find(closed.begin(), closed.end(), std::make_pair(dead_layer, dead_head)), closed.end());
  EXPECT_EQ(std::find(closed.begin(), closed.end(), std::make_pair(top->layer, top->head)), closed.end());
  EXPECT_EQ(r.rank[static_cast<size_t>(dead_layer)][static_cast<size_t>(dead_head)], 0.0);
  for (int64_t l = 0; l < 2; ++l) EXPECT_FALSE(model->attention(l).control().gates.defined());
  // The l0 criterion prunes in that order.
  PruneOptions po;
  po.criterion = Criterion::l0;
  po.l0_rank = r.rank;
  po.stop_below = -1;
  const PruningCurve c = iterative_pruning(*model, eval_set(1, 16), po);
  ASSERT_FALSE(c.order.empty());
  EXPECT_EQ(c.order.front(), std::make_pair(dead_layer, dead_head));
  po.l0_rank = {};
  EXPECT_ERROR_CONTAINS(iterative_pruning(*model, eval_set(1, 16), po), "the l0 criterion needs l0_rank");
}

// Head types against naive loops over attention_maps, and on a planted model: head 0 of layer 0 a
// previous-token head built by hand (positions one-hot, W_query shifting them by one), head 1
// uniform (zero W_query and W_key).
TEST(Analysis, HeadTypesMatchNaiveLoopsAndFindPlantedHeads) {
  auto model = load_model(trained_checkpoint());
  const auto task = test_task();
  const auto& algo = dynamic_cast<const AlgorithmicTask&>(*task);
  const EvalSet data = eval_set(1, 4);
  HeadTypeOptions o;
  o.separator_id = algo.sep_id();
  o.induction_rows = 3;
  const HeadTypes ht = head_types(*model, data, o);
  ASSERT_EQ(ht.heads.size(), 8u);
  // Naive: per row, attention_maps of its valid tokens; the same sums by hand.
  const Batch& b = data.batches[0];
  std::vector<double> prev(8), first(8), sep(8), ent(8);
  int64_t queries = 0, sep_queries = 0;
  for (int64_t row = 0; row < b.B; ++row) {
    const int64_t len = b.answer_end[static_cast<size_t>(row)] + 1;
    std::vector<int64_t> ids(b.inputs.begin() + row * b.T, b.inputs.begin() + row * b.T + len);
    const AttentionMaps m = attention_maps(*model, ids);
    const int64_t s = std::find(ids.begin(), ids.end(), algo.sep_id()) - ids.begin();
    queries += len - 1;
    sep_queries += len - 1 - s;
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t q = 1; q < len; ++q) {
        auto at = [&](int64_t k) {
          return static_cast<double>(m.weights[static_cast<size_t>(((i * len) + q) * len + k)]);
        };
        prev[static_cast<size_t>(i)] += at(q - 1);
        first[static_cast<size_t>(i)] += at(0);
        if (q > s) sep[static_cast<size_t>(i)] += at(s);
        for (int64_t k = 0; k <= q; ++k) ent[static_cast<size_t>(i)] -= at(k) > 0 ? at(k) * std::log(at(k)) : 0;
      }
  }
  EXPECT_EQ(ht.queries, queries);
  EXPECT_EQ(ht.separator_queries, sep_queries);
  for (size_t i = 0; i < 8; ++i) {
    const HeadTypeScores& h = ht.heads[i];
    EXPECT_NEAR(h.previous_token, prev[i] / static_cast<double>(queries), 1e-5) << i;
    EXPECT_NEAR(h.first_token, first[i] / static_cast<double>(queries), 1e-5) << i;
    EXPECT_NEAR(h.separator, sep[i] / static_cast<double>(sep_queries), 1e-5) << i;
    EXPECT_NEAR(h.entropy, ent[i] / static_cast<double>(queries), 1e-4) << i;
    EXPECT_GE(h.induction, 0.0);
  }
  // The planted model: tokens embed to 0, positions to large one-hot vectors, so that norm1 passes
  // a one-hot code of the position; head 0's query is the previous position's code.
  nn::DecoderConfig cfg;
  cfg.vocab_size = 5;
  cfg.context_length = 12;
  cfg.emb_dim = 32;
  cfg.n_heads = 2;  // head size 16 >= context
  cfg.n_layers = 1;
  manual_seed(3);
  nn::DecoderModel planted(cfg);
  {
    NoGradGuard ng;
    planted.tok_emb->weight.zero_();
    planted.pos_emb->weight.zero_();
    for (int64_t t = 0; t < 12; ++t) planted.pos_emb->weight.select(0, t).narrow(0, t, 1).fill_(10.0);
    auto& att = dynamic_cast<nn::CausalMultiHeadAttention&>(planted.attention(0));
    att.W_query->weight.zero_();
    att.W_key->weight.zero_();
    for (int64_t i = 0; i < 11; ++i) att.W_query->weight.select(0, i).narrow(0, i + 1, 1).fill_(30.0);  // q_i = x_{i+1}
    for (int64_t i = 0; i < 12; ++i) att.W_key->weight.select(0, i).narrow(0, i, 1).fill_(30.0);
  }
  EvalSet random;
  Batch& rows = random.batches.emplace_back();
  rows.B = 2;
  rows.T = 12;
  rows.inputs.assign(24, 1);
  rows.targets.assign(24, 0);
  HeadTypeOptions po;
  po.induction_rows = 2;
  const HeadTypes p = head_types(planted, random, po);
  ASSERT_EQ(p.heads.size(), 2u);
  EXPECT_GT(p.heads[0].previous_token, 0.99);
  EXPECT_EQ(p.heads[0].label, "previous-token");
  EXPECT_NEAR(p.heads[1].entropy_normalized, 1.0, 1e-6);  // uniform over every key it may see
  EXPECT_EQ(p.heads[1].label, "broad");
  EXPECT_TRUE(std::isnan(p.heads[0].separator));
  // Keeping one row's weights at a time (what GPT-2's long rows need) changes nothing but float32
  // round-off: with fewer rows the GEMMs take other kernels (OpenBLAS's small-matrix ones on AVX-512
  // CPUs), which round differently (seen: 8e-9).
  HeadTypeOptions one_row = o;
  one_row.rows_per_forward = 1;
  const HeadTypes chunked = head_types(*model, data, one_row);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(chunked.heads[i].previous_token, ht.heads[i].previous_token, 1e-6) << i;
    EXPECT_NEAR(chunked.heads[i].entropy, ht.heads[i].entropy, 1e-6) << i;
    EXPECT_NEAR(chunked.heads[i].induction, ht.heads[i].induction, 1e-6) << i;
    EXPECT_NEAR(chunked.heads[i].duplicate_token, ht.heads[i].duplicate_token, 1e-6) << i;
  }
  po.induction_half = 7;
  EXPECT_ERROR_CONTAINS(head_types(planted, random, po), "head_types: repeated sequences of 2 x 7 tokens do not fit");
}

// The planted induction circuit of tiny_models.h: head_types must label the two heads, induction_pairs
// must pair them, and ablating L1H0 must cost nearly all of what copying from the context is worth on
// repeated random tokens.
TEST(Analysis, PlantedInductionCircuitIsFoundScoredAndCostsItsLossWhenAblated) {
  constexpr int64_t V = headlab::testing::kPlantedVocab, T = headlab::testing::kPlantedContext;
  const auto planted = headlab::testing::planted_induction_gpt();
  nn::DecoderModel& model = *planted;
  EvalSet text;  // any rows: the pattern scores are not what this test is about
  Batch& rows = text.batches.emplace_back();
  rows.B = 2, rows.T = T;
  for (int64_t i = 0; i < 2 * T; ++i) rows.inputs.push_back(i * 7 % V), rows.targets.push_back((i + 1) * 7 % V);
  HeadTypeOptions o;
  o.induction_rows = 16;
  const HeadTypes ht = head_types(model, text, o);
  ASSERT_EQ(ht.heads.size(), 4u);
  EXPECT_GT(ht.heads[0].previous_token, 0.95);
  EXPECT_EQ(ht.heads[0].label.substr(0, 14), "previous-token");
  EXPECT_GT(ht.heads[2].induction, 0.6);
  EXPECT_NE(ht.heads[2].label.find("induction"), std::string::npos) << ht.heads[2].label;
  for (size_t i : {0u, 1u, 3u}) EXPECT_LT(ht.heads[i].induction, 0.3) << i;

  const std::vector<CompositionScore> comp = composition_scores(model);
  const std::vector<InductionPair> pairs = induction_pairs(ht, comp);
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0].induction.layer, 1);
  EXPECT_EQ(pairs[0].induction.head, 0);
  EXPECT_EQ(pairs[0].partner.layer, 0);
  EXPECT_EQ(pairs[0].partner.head, 0);
  double k_spare = 0, k_random = 0;  // L0H1 -> L1H0 (writes where L1H0 never reads); L0H0 -> L1H1 (random)
  for (const CompositionScore& c : comp) {
    if (c.head_a == 1 && c.head_b == 0) k_spare = c.k;
    if (c.head_a == 0 && c.head_b == 1) k_random = c.k;
  }
  EXPECT_LT(k_spare, 1e-6);
  EXPECT_NEAR(pairs[0].k_mean, (pairs[0].k.k + k_spare) / 2, 1e-12);
  EXPECT_GT(pairs[0].k.k, k_random);
  EXPECT_NE(induction_pairs_text(ht, comp).find("induction head L1H0"), std::string::npos);

  // Copying from the context: the second copies are predicted, until L1H0 is ablated.
  const EvalSet repeated = repeated_tokens_set(V, 16, T / 2, 3);
  ASSERT_EQ(repeated.batches[0].scored_targets(), 16 * (T / 2 - 1));
  EXPECT_EQ(repeated.batches[0].target(0, T / 2), repeated.batches[0].input(0, 1));
  EXPECT_EQ(repeated.batches[0].target(0, T / 2 - 1), kIgnoreIndex);
  const AblationResult abl = ablate_heads(model, repeated);
  EXPECT_LT(abl.base.loss, 1.0);
  ASSERT_EQ(abl.heads.size(), 4u);
  EXPECT_GT(abl.heads[2].zero.loss, std::log(double(V)) - 0.5);  // near uniform guessing without it
  EXPECT_GT(abl.heads[2].mean.loss - abl.base.loss, 2.0);
  EXPECT_GT(abl.heads[0].mean.loss - abl.base.loss, 1.0);  // the circuit's other half: L1H0's keys need it
  for (size_t i : {1u, 3u}) EXPECT_LT(abl.heads[i].mean.loss - abl.base.loss, 0.1) << i;
}

TEST(Analysis, ImportanceMatchesFiniteDifferencesOfTheGates) {
  auto model = load_model(trained_checkpoint());
  model->to(DType::f64);
  const EvalSet data = eval_set(2, 6);
  // At full gates and with one head already masked (the state pruning recomputes scores in).
  HeadMatrix partial = head_matrix(*model, 1.0);
  partial[0][1] = 0;
  for (const HeadMatrix& at : {head_matrix(*model, 1.0), partial}) {
    const Importance imp = head_importance(*model, data, at);
    for (size_t l = 0; l < 2; ++l) {
      double sq = 0;
      for (size_t h = 0; h < 4; ++h) {
        const double eps = 1e-5;
        double expected = 0;
        for (const Batch& b : data.batches) {
          EvalSet one;
          one.batches = {b};
          HeadMatrix plus = at, minus = at;
          plus[l][h] += eps;
          minus[l][h] -= eps;
          const double fd =
              (evaluate_heads(*model, one, plus).loss - evaluate_heads(*model, one, minus).loss) / (2 * eps);
          expected += std::abs(fd) / static_cast<double>(data.batches.size());
        }
        EXPECT_NEAR(imp.raw[l][h], expected, 1e-7 + 1e-5 * expected) << "layer " << l << " head " << h;
        if (at[l][h] != 0) sq += imp.raw[l][h] * imp.raw[l][h];
      }
      for (size_t h = 0; h < 4; ++h) {
        if (at[l][h] == 0) {
          EXPECT_TRUE(std::isnan(imp.normalized[l][h]));
        } else {
          EXPECT_NEAR(imp.normalized[l][h], imp.raw[l][h] / std::sqrt(sq), 1e-12);
        }
      }
    }
  }
}

TEST(Analysis, PrunedModelsEqualGatedModels) {
  const EvalSet data = eval_set(1);
  const std::vector<std::vector<int64_t>> keep = {{1, 3}, {2}};
  for (const std::string form : {"fused", "wrapper"}) {
    SCOPED_TRACE(form);
    const Checkpoint ck = convert_checkpoint(trained_checkpoint(), parse_enum<nn::AttentionForm>(form, "test"));
    auto model = load_model(ck);
    const HeadMatrix gates = gates_keeping(*model, keep);
    auto pruned = prune_model(*model, keep);
    EXPECT_EQ(pruned->config().kept_heads, keep);
    EXPECT_LT(max_logit_difference(*model, gates, *pruned, data), 2e-5);
    // Each removed head takes 3 * (C x D) projection weights and a (C x D) block of out_proj.
    EXPECT_EQ(model->num_parameters() - pruned->num_parameters(), 5 * 4 * 32 * 8);
    // Through a checkpoint file, as every command loads it.
    const std::string path =
        (fs::temp_directory_path() / ("headlab_pruned_" + std::to_string(::getpid()) + form + ".h5")).string();
    save_checkpoint(path, prune_checkpoint(ck, keep, "test"));
    const Checkpoint loaded = load_checkpoint(path);
    fs::remove(path);
    EXPECT_EQ(loaded.config["model"]["kept_heads"], nlohmann::json(keep));
    EXPECT_EQ(loaded.config["pruning"]["removed_heads"], nlohmann::json::parse("[[0,0],[0,2],[1,0],[1,1],[1,3]]"));
    auto reloaded = load_model(loaded);
    EXPECT_LT(max_logit_difference(*model, gates, *reloaded, data), 2e-5);
    const auto names = by_name_map(loaded.model);
    if (form == "fused") {
      EXPECT_EQ(names.at("trf_blocks.0.att.W_query.weight").shape(), Shape({16, 32}));
      EXPECT_EQ(names.at("trf_blocks.1.att.W_value.weight").shape(), Shape({8, 32}));
      EXPECT_EQ(names.at("trf_blocks.0.att.out_proj.weight").shape(), Shape({32, 16}));
    } else {
      EXPECT_TRUE(names.count("trf_blocks.0.att.heads.1.W_key.weight"));
      EXPECT_FALSE(names.count("trf_blocks.0.att.heads.2.W_key.weight"));
      EXPECT_FALSE(names.count("trf_blocks.1.att.heads.1.W_key.weight"));
      // Renumbered: layer 0's new head 1 is the old head 3.
      const auto orig = by_name_map(ck.model);
      EXPECT_EQ(max_abs_diff(names.at("trf_blocks.0.att.heads.1.W_key.weight"),
                             orig.at("trf_blocks.0.att.heads.3.W_key.weight")),
                0.0);
      EXPECT_EQ(names.at("trf_blocks.1.att.out_proj.weight").shape(), Shape({32, 8}));
    }
    // Pruning a pruned model again: indices are local, kept_heads stay original.
    auto twice = prune_model(*pruned, {{1}, {0}});
    EXPECT_EQ(twice->config().kept_heads, (std::vector<std::vector<int64_t>>{{3}, {2}}));
    EXPECT_LT(max_logit_difference(*model, gates_keeping(*model, {{3}, {2}}), *twice, data), 2e-5);
  }
}

TEST(Analysis, PruningWithQkvBiasEqualsGating) {
  const EvalSet data = eval_set(1, 4);
  for (const std::string form : {"fused", "wrapper"}) {
    const nn::DecoderConfig cfg =
        headlab::testing::tiny_gpt_config(headlab::testing::kThreeHeadGpt.sized_for(13, 12),
                                          parse_enum<nn::AttentionForm>(form, "test"), /*qkv_bias=*/true);
    manual_seed(11);
    nn::DecoderModel model(cfg);
    model.eval();
    const std::vector<std::vector<int64_t>> keep = {{0, 2}, {1}};
    auto pruned = prune_model(model, keep);
    EXPECT_LT(max_logit_difference(model, gates_keeping(model, keep), *pruned, data), 2e-5) << form;
  }
}

TEST(Analysis, SurgeryLeavesTheRandomStreamAlone) {
  // Pruning and converting build modules (which draws initial values); the caller's stream stays put,
  // so a fine-tuning run after pruning sees the random numbers it would have seen.
  const Checkpoint& ck = trained_checkpoint();
  auto model = load_model(ck);
  manual_seed(77);
  Generator& g = default_generator();
  g.reserve(10);
  const uint64_t offset = g.offset();
  const Checkpoint pruned = prune_checkpoint(ck, {{0, 1}, {2}});
  const Checkpoint converted = convert_checkpoint(ck, nn::AttentionForm::wrapper);
  prune_model(*model, {{3}, {0, 1}});
  EXPECT_EQ(g.seed(), 77u);
  EXPECT_EQ(g.offset(), offset);
  EXPECT_EQ(pruned.config["model"]["kept_heads"], nlohmann::json::parse("[[0,1],[2]]"));
  EXPECT_EQ(converted.config["model"]["attention"], "wrapper");
}

TEST(Analysis, WrapperAndFusedCheckpointsGiveTheSameScores) {
  const Checkpoint& fused_ck = trained_checkpoint();
  const Checkpoint wrapper_ck = convert_checkpoint(fused_ck, nn::AttentionForm::wrapper);
  EXPECT_EQ(wrapper_ck.config["model"]["attention"], "wrapper");
  // Round trip is exact.
  const auto back = by_name_map(convert_checkpoint(wrapper_ck, nn::AttentionForm::fused).model);
  for (const auto& [name, t] : fused_ck.model) EXPECT_EQ(max_abs_diff(t, back.at(name)), 0.0) << name;
  auto f = load_model(fused_ck), w = load_model(wrapper_ck);
  const EvalSet data = eval_set();
  EXPECT_LT(max_logit_difference(*f, {}, *w, data), 2e-5);
  const AblationResult af = ablate_heads(*f, data), aw = ablate_heads(*w, data);
  EXPECT_NEAR(af.base.loss, aw.base.loss, 1e-5);
  ASSERT_EQ(af.heads.size(), aw.heads.size());
  for (size_t i = 0; i < af.heads.size(); ++i) {
    EXPECT_NEAR(af.heads[i].importance, aw.heads[i].importance, 1e-3 * af.heads[i].importance + 1e-6) << i;
    EXPECT_NEAR(af.heads[i].importance_raw, aw.heads[i].importance_raw, 1e-3 * af.heads[i].importance_raw + 1e-7);
    EXPECT_NEAR(af.heads[i].zero.loss, aw.heads[i].zero.loss, 1e-5);
    EXPECT_NEAR(af.heads[i].mean.loss, aw.heads[i].mean.loss, 1e-5);
    EXPECT_NEAR(af.heads[i].zero.token_accuracy, aw.heads[i].zero.token_accuracy, 1e-3);
  }
  auto ranking = [](const AblationResult& a) {
    std::vector<size_t> idx(a.heads.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t x, size_t y) { return a.heads[x].importance > a.heads[y].importance; });
    return idx;
  };
  EXPECT_EQ(ranking(af), ranking(aw));
  PruneOptions po;
  po.criterion = Criterion::gradient;
  po.metric = Metric::token_accuracy;
  po.stop_below = -1;  // never below: prune until every layer has one head left
  const PruningCurve cf = iterative_pruning(*f, data, po), cw = iterative_pruning(*w, data, po);
  EXPECT_EQ(cf.order, cw.order);
}

// free_heads: the heads whose zero ablation alone costs at most kFreeHeadCost of the metric and the
// loss, cheapest first, never a whole layer.
TEST(Analysis, FreeHeadsCostNothingAloneAndLeaveEveryLayerAHead) {
  AblationResult a;
  a.base.loss = 0.1;
  a.base.token_accuracy = 1.0;
  a.base.exact_match = 1.0;
  a.base.has_exact_match = true;
  const auto head = [&](int64_t l, int64_t h, double dloss, double dexact) {
    HeadAblation x;
    x.layer = l, x.head = h, x.original_head = h;
    x.zero = a.base;
    x.zero.loss += dloss;
    x.zero.exact_match += dexact;
    return x;
  };
  a.heads = {head(0, 0, 0.0004, 0), head(0, 1, 0.0002, 0), head(1, 0, 0.5, -0.3), head(1, 1, 0.0009, 0),
             head(1, 2, 0.0001, -0.002)};
  // L0H0 and L0H1 are free, but layer 0 keeps one (the dearer, L0H0); L1H2 loses 0.2% exact match.
  EXPECT_EQ(free_heads(a, Metric::exact_match), (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 1}}));
  // By token accuracy (unchanged everywhere) L1H2 is free, and the cheapest.
  EXPECT_EQ(free_heads(a, Metric::token_accuracy), (std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {0, 1}, {1, 1}}));
}

TEST(Analysis, IterativePruningCurve) {
  auto model = load_model(trained_checkpoint());
  const EvalSet data = eval_set();
  PruneOptions po;
  po.criterion = Criterion::gradient;
  po.metric = Metric::token_accuracy;
  po.stop_below = -1;  // never below: run until every layer has one head
  const PruningCurve c = iterative_pruning(*model, data, po);
  EXPECT_EQ(c.total_heads, 8);
  ASSERT_EQ(c.steps.size(), 7u);  // 10% of <= 8 heads rounds to one head per step; 6 can go
  EXPECT_EQ(c.steps[0].pruned, 0);
  EXPECT_EQ(c.order.size(), 6u);
  const std::set<std::pair<int64_t, int64_t>> distinct(c.order.begin(), c.order.end());
  EXPECT_EQ(distinct.size(), 6u);
  for (size_t i = 1; i < c.steps.size(); ++i) {
    EXPECT_EQ(c.steps[i].pruned, static_cast<int64_t>(i));
    EXPECT_NEAR(c.steps[i].fraction, static_cast<double>(i) / 8, 1e-12);
    ASSERT_EQ(c.steps[i].removed.size(), 1u);
    // The step's scores are those of the gated model.
    const auto keep = kept_after(*model, c.order, static_cast<int64_t>(i));
    EXPECT_NEAR(evaluate_heads(*model, data, gates_keeping(*model, keep)).loss, c.steps[i].scores.loss, 1e-9);
  }
  const auto keep = kept_after(*model, c.order, 6);
  EXPECT_EQ(keep[0].size(), 1u);
  EXPECT_EQ(keep[1].size(), 1u);
  // The first head removed is the least important one at full gates.
  const Importance imp = head_importance(*model, data);
  double lowest = 1e300;
  for (const auto& row : imp.normalized)
    for (double v : row) lowest = std::min(lowest, v);
  EXPECT_DOUBLE_EQ(imp.normalized[static_cast<size_t>(c.order[0].first)][static_cast<size_t>(c.order[0].second)],
                   lowest);

  // Stopping at a threshold: the run is the full curve up to the first step below it.
  PruneOptions stop = po;
  stop.stop_below = c.steps[3].scores.token_accuracy + 1e-9;
  const PruningCurve s = iterative_pruning(*model, data, stop);
  size_t first_below = 0;
  while (c.steps[first_below].scores.token_accuracy >= stop.stop_below) ++first_below;
  ASSERT_EQ(s.steps.size(), first_below + 1);
  for (size_t i = 0; i < s.steps.size(); ++i) EXPECT_EQ(s.steps[i].scores.loss, c.steps[i].scores.loss);
  // The ablation criterion masks first the head whose zeroing costs least: the least metric lost,
  // then the least loss gained (the slow reference: one zero ablation per head).
  PruneOptions by_ablation = po;
  by_ablation.criterion = Criterion::ablation;
  by_ablation.min_pruned = 1;
  by_ablation.stop_below = 2;  // stop after the first step
  const PruningCurve ca = iterative_pruning(*model, data, by_ablation);
  EXPECT_EQ(ca.criterion, Criterion::ablation);
  ASSERT_EQ(ca.order.size(), 1u);
  const AblationResult abl = ablate_heads(*model, data);
  const auto cost = [&](const HeadAblation& h) {
    return std::make_pair(abl.base.token_accuracy - h.zero.token_accuracy, h.zero.loss - abl.base.loss);
  };
  const auto cheapest =
      std::min_element(abl.heads.begin(), abl.heads.end(), [&](auto& x, auto& y) { return cost(x) < cost(y); });
  EXPECT_EQ(ca.order[0], std::make_pair(cheapest->layer, cheapest->head));
  EXPECT_NEAR(ca.steps[1].scores.loss, cheapest->zero.loss, 1e-9);
  // auto is ablation for this 8-head model, gradient past kAblationCriterionMaxHeads.
  PruneOptions by_default = by_ablation;
  by_default.criterion = Criterion::automatic;
  EXPECT_EQ(iterative_pruning(*model, data, by_default).order, ca.order);
  EXPECT_EQ(resolve_criterion(Criterion::automatic, 8), Criterion::ablation);
  EXPECT_EQ(resolve_criterion(Criterion::automatic, kAblationCriterionMaxHeads + 1), Criterion::gradient);
  EXPECT_EQ(resolve_criterion(Criterion::gradient, 8), Criterion::gradient);
  // prune_count_for_metric: the most heads whose step keeps the metric at or above the target.
  EXPECT_EQ(prune_count_for_metric(c, 2.0), 0);
  EXPECT_EQ(prune_count_for_metric(c, -1.0), 6);
}

TEST_F(AnalysisFiles, AttentionMapsAndPictures) {
  const Checkpoint& ck = trained_checkpoint();
  auto model = load_model(ck);
  const auto task = test_task();
  const Prompt p = task->encode_prompt("3141");
  nn::GenerateOptions gen;
  gen.max_new_tokens = p.answer_length + 1;
  gen.end_id = task->end_id();
  gen.keep_end = true;
  std::vector<int64_t> ids = p.ids;
  for (int64_t id : nn::generate(*model, p.ids, gen)) ids.push_back(id);
  EXPECT_GT(ids.size(), p.ids.size());
  const AttentionMaps maps = attention_maps(*model, ids);
  const int64_t T = maps.T;
  EXPECT_EQ(T, static_cast<int64_t>(ids.size()));
  ASSERT_EQ(maps.weights.size(), static_cast<size_t>(2 * 4 * T * T));
  for (int64_t lh = 0; lh < 8; ++lh)
    for (int64_t q = 0; q < T; ++q) {
      double row = 0;
      for (int64_t k = 0; k < T; ++k) {
        const float w = maps.weights[static_cast<size_t>((lh * T + q) * T + k)];
        if (k > q) {
          EXPECT_EQ(w, 0.0f);  // causal
        }
        row += w;
      }
      EXPECT_NEAR(row, 1.0, 1e-5);
    }
  std::vector<std::string> tokens;
  for (int64_t id : ids) tokens.push_back(task->tokenizer().decode({id}));
  save_attention_png(path("attention.png"), maps, tokens);
  expect_drawn(path("attention.png"), 400, 300);
  save_attention_h5(path("attention.h5"), maps, tokens, "3141", "test");
  {
    io::h5::Reader r(path("attention.h5"));
    const io::h5::Array w = r.read("weights");
    EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 4, T, T}));
    EXPECT_EQ(w.as<float>(), maps.weights);
    EXPECT_EQ(nlohmann::json::parse(r.attr_str("/", "tokens")).get<std::vector<std::string>>(), tokens);
    EXPECT_EQ(r.read("token_ids").as<int64_t>(), ids);
  }
  // A pruned model: its heads keep their original indices, the others are NaN.
  auto pruned = prune_model(*model, {{0, 3}, {1}});
  const AttentionMaps pm = attention_maps(*pruned, ids);
  EXPECT_EQ(pm.kept, (std::vector<std::vector<int64_t>>{{0, 3}, {1}}));
  EXPECT_TRUE(std::isnan(pm.weights[static_cast<size_t>(1 * T * T)]));  // layer 0 head 1
  EXPECT_EQ(pm.weights[static_cast<size_t>(3 * T * T)], maps.weights[static_cast<size_t>(3 * T * T)]);  // head 3
  save_attention_png(path("attention_pruned.png"), pm, tokens);
  expect_drawn(path("attention_pruned.png"), 400, 300);

  // The ablation pictures and tables.
  const EvalSet data = eval_set(1);
  const AblationResult a = ablate_heads(*model, data);
  save_importance_png(path("importance.png"), a, *model);
  expect_drawn(path("importance.png"), 300, 200);
  PruneOptions po;
  po.metric = Metric::exact_match;
  po.stop_below = 0.9 * a.base.exact_match;
  const PruningCurve c = iterative_pruning(*model, data, po);
  save_pruning_png(path("pruning.png"), c, po.stop_below);
  const Image img = load_png(path("pruning.png"));
  EXPECT_EQ(img.width, 900);
  EXPECT_EQ(img.height, 560);
  expect_drawn(path("pruning.png"), 900, 560);
  HeadColumn label{"label", {{"a", "b", "c", "d"}, {"e", "f", "g", "h"}}};
  save_heads_csv(path("heads.csv"), a, {label});
  save_pruning_csv(path("pruning.csv"), c, *model);
  std::ifstream hf(path("heads.csv"));
  std::string header;
  std::getline(hf, header);
  EXPECT_EQ(header,
            "layer,head,importance,importance_raw,zero_delta_loss,zero_delta_accuracy,zero_delta_exact_match,"
            "mean_delta_loss,mean_delta_accuracy,mean_delta_exact_match,resample_delta_loss,resample_delta_accuracy,"
            "resample_delta_exact_match,label");
  int rows = 0;
  std::string last;
  for (std::string line; std::getline(hf, line); last = line) ++rows;
  EXPECT_EQ(rows, 8);
  EXPECT_EQ(last.substr(0, 4), "1,3,");
  EXPECT_EQ(last.substr(last.size() - 2), ",h");
  EXPECT_ERROR_CONTAINS(save_heads_csv(path("bad.csv"), a, {HeadColumn{"x", {{"1"}}}}),
                        "save_heads_csv: column x has no value for layer 0 head 1");
  std::ifstream pf(path("pruning.csv"));
  std::getline(pf, header);
  EXPECT_EQ(header, "step,heads_pruned,fraction_pruned,loss,token_accuracy,exact_match,removed");
}

TEST_F(AnalysisFiles, CompareOnATinyGrid) {
  const std::vector<CompareConfig> grid = {
      parse_compare_config("toy,2,6,3,2,2"), {"sweep", 2, 8, 16, 16, 1}, {"sweep", 2, 8, 16, 16, 4}};
  CompareOptions o;
  o.repeats = 3;
  o.warmup = 1;
  std::vector<CompareResult> rows;
  for (const auto& c : grid) rows.push_back(compare_attention(c, o));
  for (const auto& r : rows) {
    const auto& c = r.config;
    SCOPED_TRACE(c.name + " H=" + std::to_string(c.heads));
    const int64_t params = 3 * c.d_in * c.d_out + c.d_out * c.d_out + c.d_out;
    EXPECT_EQ(r.wrapper.params, params);
    EXPECT_EQ(r.fused.params, params);
    EXPECT_DOUBLE_EQ(r.fused.flops_forward, attention_flops_forward(c));
    EXPECT_DOUBLE_EQ(r.fused.flops_backward, 2 * r.fused.flops_forward);
    EXPECT_LT(r.max_abs_out, 1e-5);
    EXPECT_LT(r.max_abs_dx, 1e-5);
    for (const FormMeasurement* m : {&r.wrapper, &r.fused}) {
      EXPECT_GT(m->forward.min, 0);
      EXPECT_LE(m->forward.min, m->forward.p25);
      EXPECT_LE(m->forward.p25, m->forward.median);
      EXPECT_LE(m->forward.median, m->forward.p75);
      EXPECT_LE(m->forward.p75, m->forward.max);
      EXPECT_EQ(m->forward_backward.repeats, 3);
      EXPECT_GT(m->peak_forward, 0);
      EXPECT_GT(m->peak_forward_backward, 0);
    }
  }
  EXPECT_DOUBLE_EQ(attention_flops_forward(grid[0]),
                   2.0 * 2 * 6 * 3 * 3 * 2 + 4.0 * 2 * 6 * 6 * 2 + 2.0 * 2 * 6 * 2 * 2);
  std::istringstream csv(compare_csv(rows, o));
  std::string header;
  std::getline(csv, header);
  for (const char* col :
       {"config", "heads", "form", "params", "gflop_forward", "forward_ms_median", "forward_ms_p25", "forward_ms_p75",
        "forward_ms_min", "forward_ms_max", "forward_gflops", "forward_backward_ms_median", "forward_backward_gflops",
        "peak_forward_bytes", "peak_forward_backward_bytes", "max_abs_diff_output", "max_abs_diff_input_grad"})
    EXPECT_NE(("," + header + ",").find(std::string(",") + col + ","), std::string::npos) << col;
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 6);
  const nlohmann::json j = compare_json(rows, o);
  ASSERT_EQ(j["configs"].size(), 3u);
  EXPECT_EQ(j["configs"][0]["wrapper"]["params"], rows[0].wrapper.params);
  EXPECT_TRUE(j["configs"][2]["fused"]["forward"].contains("median_ms"));
  EXPECT_LT(j["configs"][2]["max_abs_diff_output"].get<double>(), 1e-5);
  save_compare_png(path("compare.png"), {rows[1], rows[2]}, "auto", kCPU);
  const Image img = load_png(path("compare.png"));
  EXPECT_EQ(img.width, 1000);
  EXPECT_EQ(img.height, 640);
  expect_drawn(path("compare.png"), 1000, 640);
}

// The PyTorch peer's JSON line (bench/torch_mha_peer.py) lands in the result and in the CSV and JSON.
TEST(Analysis, CompareReadsThePyTorchPeersLine) {
  CompareResult r;
  r.config = parse_compare_config("tiny,2,8,16,16,2");
  const std::string line =
      R"({"name": "tiny", "B": 2, "T": 8, "d_in": 16, "d_out": 16, "heads": 2, "torch": "1.13.1", "repeats": 3,)"
      R"( "wrapper": {"forward": {"median": 2.0, "p25": 1.5, "p75": 2.5}, "forward_backward": {"median": 6.0, "p25": 5.0, "p75": 7.0}},)"
      R"( "fused": {"forward": {"median": 1.0, "p25": 0.5, "p75": 1.5}, "forward_backward": {"median": 3.0, "p25": 2.0, "p75": 4.0}}})";
  attach_torch_peer(r, line);
  ASSERT_TRUE(r.torch_wrapper && r.torch_fused);
  EXPECT_DOUBLE_EQ(r.torch_wrapper->forward.median, 2e-3);
  EXPECT_DOUBLE_EQ(r.torch_wrapper->forward_backward.p75, 7e-3);
  EXPECT_DOUBLE_EQ(r.torch_fused->forward_backward.median, 3e-3);
  EXPECT_EQ(r.torch_fused->forward.repeats, 3);
  EXPECT_EQ(r.torch_version, "1.13.1");
  std::istringstream csv(compare_csv({r}, CompareOptions{}));
  std::string header, wrapper_row;
  std::getline(csv, header);
  std::getline(csv, wrapper_row);
  EXPECT_NE(header.find(",torch_forward_ms_median,torch_forward_backward_ms_median"), std::string::npos) << header;
  EXPECT_NE(wrapper_row.find(",2,6"), std::string::npos) << wrapper_row;
  EXPECT_DOUBLE_EQ(
      compare_json({r}, CompareOptions{})["configs"][0]["fused"]["torch"]["forward"]["median_ms"].get<double>(), 1.0);

  CompareResult other;
  other.config = parse_compare_config("tiny,2,16,16,16,2");  // T differs from the peer's line
  EXPECT_ERROR_CONTAINS(attach_torch_peer(other, line), "the PyTorch peer measured B=2 T=8");
  EXPECT_ERROR_CONTAINS(attach_torch_peer(r, "Traceback (most recent call last):"),
                        "cannot read the PyTorch peer's output");
  EXPECT_ERROR_CONTAINS(attach_torch_peer(r, R"({"B": 2, "T": 8, "d_in": 16, "d_out": 16, "heads": 2})"),
                        "cannot read the PyTorch peer's output for config 'tiny'");
}

// Grouped-query and multi-query configs: the same weights in both forms (the wrapper's heads of a group share one
// W_key/W_value), fewer key/value parameters, FLOPs and cache bytes; the peer's line must name the same kv_heads.
TEST(Analysis, CompareAcrossKeyValueHeads) {
  CompareOptions o;
  o.repeats = 1;
  o.warmup = 0;
  const CompareConfig mha = parse_compare_config("t,2,8,16,16,4");
  EXPECT_EQ(mha.kv(), 4);
  for (const int64_t kv : {4, 2, 1}) {
    SCOPED_TRACE("kv " + std::to_string(kv));
    const CompareConfig c = parse_compare_config("t,2,8,16,16,4," + std::to_string(kv));
    EXPECT_EQ(c.kv(), kv);
    const CompareResult r = compare_attention(c, o);
    const int64_t params = 16 * 16 + 2 * 16 * (kv * 4) + 16 * 16 + 16;  // W_query, W_key and W_value, out_proj
    EXPECT_EQ(r.wrapper.params, params);
    EXPECT_EQ(r.fused.params, params);
    EXPECT_EQ(r.kv_cache_bytes_per_token, 2 * kv * 4 * 4);
    EXPECT_LT(r.max_abs_out, 1e-5);
    EXPECT_LT(r.max_abs_dx, 1e-5);
    // Projections 2*B*T*d_in*(d_out + 2*kv*D); the wrapper's heads each project their group's keys and values.
    EXPECT_DOUBLE_EQ(r.fused.flops_forward, attention_flops_forward(mha) - 2.0 * 2 * 8 * 16 * 2 * (4 - kv) * 4);
    EXPECT_DOUBLE_EQ(r.wrapper.flops_forward, attention_flops_forward(mha));
    std::istringstream csv(compare_csv({r}, o));
    std::string header, row;
    std::getline(csv, header);
    std::getline(csv, row);
    EXPECT_EQ(header.substr(0, 56), "config,B,T,d_in,d_out,heads,kv_heads,form,params,kv_cach");
    const std::string starts = "t,2,8,16,16,4," + std::to_string(kv) + ",wrapper," + std::to_string(params) + "," +
                               std::to_string(32 * kv) + ",";
    EXPECT_EQ(row.rfind(starts, 0), 0u) << row;
    EXPECT_EQ(compare_json({r}, o)["configs"][0]["kv_heads"], kv);
  }
  EXPECT_ERROR_CONTAINS(parse_compare_config("t,2,8,16,16,4,3"), "kv_heads 3 must divide heads 4");
  EXPECT_ERROR_CONTAINS(parse_compare_config("t,2,8,16,16,4,0"), "kv_heads must be a positive integer, got '0'");
  CompareResult r;
  r.config = parse_compare_config("t,2,8,16,16,4,2");
  EXPECT_ERROR_CONTAINS(attach_torch_peer(r, R"({"B": 2, "T": 8, "d_in": 16, "d_out": 16, "heads": 4})"),
                        "heads=4 kv_heads=4 for config 't'");
}

TEST(Analysis, RankCorrelation) {
  EXPECT_DOUBLE_EQ(rank_correlation({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(rank_correlation({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  EXPECT_NEAR(rank_correlation({1, 2, 3}, {1, 3, 2}), 0.5, 1e-12);
  EXPECT_NEAR(rank_correlation({1, 1, 2}, {1, 2, 3}), std::sqrt(0.75), 1e-12);  // ties share ranks
  EXPECT_TRUE(std::isnan(rank_correlation({1, 1}, {1, 2})));
  // Pearson's on the values: (1,1) (2,3) (3,2) -> 0.5; a NaN pair is skipped; a constant side gives NaN.
  EXPECT_NEAR(analysis::pearson_correlation({1, 2, 3, NAN}, {1, 3, 2, 7}), 0.5, 1e-12);
  EXPECT_NEAR(analysis::pearson_correlation({0, 1, 10}, {0, 1, 2}), 0.9078412990, 1e-9);  // not the ranks' 1
  EXPECT_TRUE(std::isnan(analysis::pearson_correlation({2, 2, 2}, {1, 2, 3})));
}

TEST(Analysis, Errors) {
  const nlohmann::json cfg = trained_checkpoint().config["model"];
  const NamedTensors& p = trained_checkpoint().model;
  EXPECT_ERROR_CONTAINS(prune_parameters(cfg, p, {{0}, {}}), "layer 1 must keep at least one head");
  EXPECT_ERROR_CONTAINS(prune_parameters(cfg, p, {{2, 1}, {0}}), "sorted and distinct");
  EXPECT_ERROR_CONTAINS(prune_parameters(cfg, p, {{4}, {0}}), "layer 0 has no head 4");
  EXPECT_ERROR_CONTAINS(prune_parameters(cfg, p, {{0}}), "keep lists 1 layers, the model has 2");
  EXPECT_ERROR_CONTAINS(parse_compare_config("x,1,2,3"), "must be name,B,T,d_in,d_out,heads");
  EXPECT_ERROR_CONTAINS(parse_compare_config("x,1,2,3,4,3"), "d_out 4 must be divisible by heads 3");
  EXPECT_ERROR_CONTAINS(parse_compare_config("x,1,two,3,4,2"), "T must be a positive integer, got 'two'");
  Scores chars;
  EXPECT_ERROR_CONTAINS(metric_value(chars, Metric::exact_match), "exact match does not apply");
  auto model = load_model(trained_checkpoint());
  EXPECT_ERROR_CONTAINS(evaluate_heads(*model, eval_set(1, 2), {{1, 1}, {1, 1, 1, 1}}),
                        "gates of layer 0 list 2 heads, the layer has 4");
}

// The commands on a pruned checkpoint: ablate writes everything, and eval, generate, inspect,
// attention and ablate all load pruned.h5. Needs the headlab binary of this build.
TEST_F(AnalysisFiles, CommandsLoadPrunedCheckpoints) {
  const fs::path exe = fs::path(HEADLAB_BINARY_DIR) / "headlab";
  if (!fs::exists(exe)) GTEST_SKIP() << exe << " is not built (cmake --build <dir> --target headlab_cli)";
  for (const std::string form : {"fused", "wrapper"}) {
    SCOPED_TRACE(form);
    const std::string ck = path(form + ".h5"), out = path("ablate_" + form);
    save_checkpoint(ck, convert_checkpoint(trained_checkpoint(), parse_enum<nn::AttentionForm>(form, "test")));
    auto run = [&](const std::string& args) {
      const std::string cmd = exe.string() + " " + args + " > " + path("log.txt") + " 2>&1";
      const int rc = std::system(cmd.c_str());
      std::ifstream f(path("log.txt"));
      std::stringstream ss;
      ss << f.rdbuf();
      EXPECT_EQ(rc, 0) << cmd << "\n" << ss.str();
      return ss.str();
    };
    const bool finetune = form == "fused";  // once is enough: the form does not matter to the trainer
    const std::string log =
        run("ablate " + ck + " --out " + out + " --prune 3 --batches 1 --batch-size 16 --repeats 2 --threads 1" +
            (finetune ? " --finetune 30 --finetune-curve" : ""));
    if (finetune) {  // the pruned model trained further, and every point of the curve too
      EXPECT_NE(log.find("fine-tuned 30 steps"), std::string::npos) << log;
      const Checkpoint ft = load_checkpoint((fs::path(out) / "finetune" / "checkpoint.h5").string());
      EXPECT_EQ(ft.trainer.step, 30);
      EXPECT_EQ(ft.config["model"]["kept_heads"],
                load_checkpoint((fs::path(out) / "pruned.h5").string()).config["model"]["kept_heads"]);
      EXPECT_TRUE(fs::exists(fs::path(out) / "finetune" / "pruned_0" / "checkpoint.h5"));
      std::ifstream csv(fs::path(out) / "pruning.csv");
      std::string header;
      std::getline(csv, header);
      EXPECT_NE(header.find(",finetuned_loss,finetuned_token_accuracy,finetuned_exact_match,removed"),
                std::string::npos)
          << header;
    }
    // By default a model this small is pruned by measured ablation, and both outputs say so.
    EXPECT_NE(log.find("pruning curve (ablation (auto: 8 heads <= 64) criterion"), std::string::npos) << log;
    std::ifstream report(fs::path(out) / "report.md");
    const std::string md((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
    EXPECT_NE(md.find("| pruning | ablation (auto: 8 heads <= 64) criterion; metric exact_match"), std::string::npos);
    for (const char* f :
         {"heads.csv", "pruning.csv", "report.md", "importance.png", "pruning.png", "pruned.h5", "attention.html"})
      EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
    const std::string pruned = (fs::path(out) / "pruned.h5").string();
    const Checkpoint pc = load_checkpoint(pruned);
    int64_t kept = 0;
    for (const auto& layer : pc.config["model"]["kept_heads"]) kept += static_cast<int64_t>(layer.size());
    EXPECT_EQ(kept, 5);
    EXPECT_NE(run("eval " + pruned + " --batches 1").find("exact match"), std::string::npos);
    run("generate " + pruned + " --prompt 123");
    EXPECT_NE(run("inspect " + pruned).find("kept_heads"), std::string::npos);
    run("attention " + pruned + " --prompt 123 --out " + out);
    EXPECT_TRUE(fs::exists(fs::path(out) / "attention.png"));
    run("ablate " + pruned + " --out " + out + "/again --batches 1 --batch-size 16");
    EXPECT_TRUE(fs::exists(fs::path(out) / "again" / "report.md"));
    // headlab heads on the pruned model: every analysis, a row per kept head, original head labels.
    const std::string heads_log =
        run("heads " + pruned + " --out " + out + "/heads --batches 1 --batch-size 16 --by-position");
    EXPECT_NE(heads_log.find("the components sum to"), std::string::npos) << heads_log;
    for (const char* f :
         {"heads.csv", "report.md", "ablation.png", "dla.png", "patching.png", "types.png", "attention.html"})
      EXPECT_TRUE(fs::exists(fs::path(out) / "heads" / f)) << f;
    std::ifstream csv(fs::path(out) / "heads" / "heads.csv");
    std::string header, line;
    std::getline(csv, header);
    EXPECT_NE(header.find(",dla_logit_vs_mean,dla_logit,patch_noising,patch_denoising,previous_token,first_token,"
                          "separator,entropy,entropy_normalized,induction,duplicate_token,self_token,next_token,"
                          "repeated_zero_delta_loss,"
                          "repeated_mean_delta_loss,label"),
              std::string::npos)
        << header;
    int rows = 0;
    while (std::getline(csv, line)) ++rows;
    EXPECT_EQ(rows, 5);
    std::ifstream heads_md(fs::path(out) / "heads" / "report.md");
    const std::string heads_report((std::istreambuf_iterator<char>(heads_md)), std::istreambuf_iterator<char>());
    for (const char* section : {"## Ablation", "## Direct logit attribution", "## Activation patching",
                                "### Denoising by position", "## Head types"})
      EXPECT_NE(heads_report.find(section), std::string::npos) << section;
  }
}
