// Optimizers against PyTorch: the eight optim_*.h5 trajectories of tests/fixtures (SGD with momentum,
// dampening, Nesterov and weight decay; Adam with L2; AdamW), parameters after every one of ten steps
// and the final optimizer state by name, in float64 and float32; the LR schedules against
// schedules.json; clip_grad_norm against a hand computation; state save/load and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include "nn/layers.h"
#include "optim/optim.h"
#include "tests/core_test_util.h"
#include "tests/fixture_util.h"

using namespace headlab;
using namespace headlab::testing;
namespace optim = headlab::optim;
namespace io = headlab::io;
using headlab::NamedTensors;
using headlab::optim::LRSchedule;
using headlab::optim::Optimizer;
using headlab::optim::OptimizerOptions;

namespace {

class Tanh : public nn::UnaryModule {
 public:
  std::string type_name() const override { return "Tanh"; }
  Tensor forward(const Tensor& x) override { return tanh(x); }
};

// nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)): parameters 0.weight, 0.bias, 2.weight, 2.bias.
std::shared_ptr<nn::Sequential> make_mlp(DType dtype) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(4, 3));
  m->push_back(std::make_shared<Tanh>());
  m->push_back(std::make_shared<nn::Linear>(3, 2));
  m->to(dtype);
  return m;
}

std::map<std::string, Tensor> read_group(const io::h5::Reader& r, const std::string& group) {
  std::map<std::string, Tensor> out;
  for (const std::string& name : r.list_datasets_recursive(group)) out[name] = to_tensor(r.read(group + "/" + name));
  return out;
}

// The fixture's hyperparameters (PyTorch's argument names) as headlab options.
OptimizerOptions options_of(const std::string& optimizer, const nlohmann::json& hp) {
  EXPECT_FALSE(hp.at("maximize").get<bool>());
  OptimizerOptions o;
  if (optimizer == "SGD") {
    o = OptimizerOptions::defaults(optim::OptimizerKind::sgd);
    o.momentum = hp.at("momentum");
    o.dampening = hp.at("dampening");
    o.nesterov = hp.at("nesterov");
  } else {
    EXPECT_TRUE(optimizer == "Adam" || optimizer == "AdamW") << optimizer;
    EXPECT_FALSE(hp.at("amsgrad").get<bool>());
    o = OptimizerOptions::defaults(optimizer == "Adam" ? optim::OptimizerKind::adam : optim::OptimizerKind::adamw);
    o.beta1 = hp.at("betas")[0];
    o.beta2 = hp.at("betas")[1];
    o.eps = hp.at("eps");
  }
  o.lr = hp.at("lr");
  o.weight_decay = hp.at("weight_decay");
  return o;
}

struct OptimCase {
  std::string file;
  DType dtype;
  double tol;
};

std::string case_name(const ::testing::TestParamInfo<OptimCase>& info) {
  std::string n = info.param.file.substr(0, info.param.file.size() - 3);
  return n + (info.param.dtype == DType::f64 ? "_f64" : "_f32");
}

class OptimTrajectory : public ::testing::TestWithParam<OptimCase> {};

TEST_P(OptimTrajectory, MatchesPyTorchEveryStepAndFinalState) {
  const OptimCase& c = GetParam();
  io::h5::Reader r(fixture_path(c.file), "fixture");
  const std::string kind = r.attr_str("/", "optimizer");
  const nlohmann::json hp = nlohmann::json::parse(r.attr_str("/", "hyperparameters"));
  const OptimizerOptions opts = options_of(kind, hp);

  auto model = make_mlp(c.dtype);
  NamedTensors init;
  for (auto& [name, t] : read_group(r, "params_init")) init.emplace_back(name, t);
  model->load_parameters(init, c.file);
  const Tensor x = to_tensor(r.read("inputs/x")).to(c.dtype), y = to_tensor(r.read("inputs/y")).to(c.dtype);
  const std::vector<double> losses = r.read("losses").as<double>();
  ASSERT_EQ(losses.size(), 10u);

  Optimizer opt(model->named_parameters(), opts);
  for (int k = 1; k <= 10; ++k) {
    opt.zero_grad();
    const Tensor loss = mse_loss(model->forward(x), y);
    EXPECT_NEAR(loss.item<double>(), losses[k - 1], c.tol * std::max(1.0, std::abs(losses[k - 1])))
        << c.file << " loss of iteration " << k;
    loss.backward();
    opt.step();
    const auto expected = read_group(r, "params_step_" + std::to_string(k));
    ASSERT_EQ(expected.size(), 4u);
    for (auto& [name, p] : model->named_parameters()) {
      ASSERT_TRUE(expected.count(name)) << name;
      EXPECT_EQ(p.dtype(), c.dtype);
      EXPECT_TRUE(close_rel(p, expected.at(name), c.tol)) << c.file << " step " << k << " parameter " << name;
    }
  }

  // Final state, by PyTorch's names: /state/<param>/<exp_avg|exp_avg_sq|momentum_buffer|step>.
  std::map<std::string, Tensor> expected_state;
  std::map<std::string, double> expected_steps;
  if (r.has("state"))
    for (const std::string& name : r.list_datasets_recursive("state")) {
      const Tensor t = to_tensor(r.read("state/" + name));
      const std::string param = name.substr(0, name.rfind('/')), item = name.substr(name.rfind('/') + 1);
      if (item == "step")
        expected_steps[param] = t.item<double>();
      else
        expected_state[name] = t;
    }
  const NamedTensors state = opt.state();
  EXPECT_EQ(state.size(), expected_state.size()) << c.file;
  for (const auto& [name, t] : state) {
    ASSERT_TRUE(expected_state.count(name)) << c.file << ": headlab keeps state " << name << " that PyTorch does not";
    EXPECT_TRUE(close_rel(t, expected_state.at(name), c.tol)) << c.file << " state " << name;
  }
  if (kind == "SGD") {
    EXPECT_TRUE(expected_steps.empty());
    EXPECT_EQ(expected_state.empty(), opts.momentum == 0) << "plain SGD keeps no state";
  } else {
    EXPECT_EQ(expected_steps.size(), 4u);
  }
  for (const auto& [name, s] : opt.steps()) {
    EXPECT_EQ(s, 10) << name;
    if (expected_steps.count(name)) {
      EXPECT_EQ(static_cast<double>(s), expected_steps.at(name)) << name;
    }
  }
}

std::vector<OptimCase> optim_cases() {
  std::vector<OptimCase> out;
  for (const FixtureEntry& e : fixture_index())
    if (e.kind == "optim") {
      out.push_back({e.file, DType::f64, 1e-12});
      out.push_back({e.file, DType::f32, 1e-5});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OptimTrajectory, ::testing::ValuesIn(optim_cases()), case_name);

TEST(OptimFixtures, AllEightTrajectoriesAreListed) {
  std::vector<std::string> files;
  for (const OptimCase& c : optim_cases())
    if (c.dtype == DType::f64) files.push_back(c.file);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"optim_adam.h5", "optim_adam_wd.h5", "optim_adamw.h5",
                                             "optim_adamw_betas.h5", "optim_sgd.h5", "optim_sgd_momentum.h5",
                                             "optim_sgd_momentum_dampening.h5", "optim_sgd_nesterov_wd.h5"}));
}

// ---- behaviour beyond the fixtures -----------------------------------------------------------------

TEST(Optimizer, ParametersWithoutGradientKeepValueAndState) {
  for (const std::string kind : {"sgd", "adam", "adamw"}) {
    Tensor a = tensor(std::vector<float>{1, 2, 3}, {3}).requires_grad_();
    Tensor b = tensor(std::vector<float>{4, 5}, {2}).requires_grad_();
    OptimizerOptions o = OptimizerOptions::defaults(parse_enum<optim::OptimizerKind>(kind, "test"));
    o.momentum = kind == "sgd" ? 0.9 : 0.0;
    o.weight_decay = 0.1;  // even decoupled decay leaves a parameter without gradient alone, as PyTorch
    Optimizer opt({{"a", a}, {"b", b}}, o);
    sum(mul(a, a)).backward();
    opt.step();
    EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{4, 5})) << kind;
    EXPECT_NE(a.to_vector<float>(), (std::vector<float>{1, 2, 3})) << kind;
    const auto steps = opt.steps();
    EXPECT_EQ(steps[0], (std::pair<std::string, int64_t>{"a", 1})) << kind;
    EXPECT_EQ(steps[1], (std::pair<std::string, int64_t>{"b", 0})) << kind;
    for (const auto& [name, t] : opt.state()) {
      if (name.rfind("b/", 0) == 0) {
        EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 0})) << kind << " " << name;
      }
    }
    opt.zero_grad();
    EXPECT_FALSE(a.grad().defined()) << "zero_grad sets gradients to None";
  }
}

// The CPU kernel updates in vectorised blocks (and over threads past its grain): a parameter that is not
// a whole number of blocks, against PyTorch's update written out per element in double.
TEST(Optimizer, AdamUpdatesEveryElementOfALongParameter) {
  for (const std::string kind : {"adam", "adamw"}) {
    manual_seed(3);
    const int64_t n = 70001;  // 17 blocks of 4096 and a tail; past the kernel's parallel grain
    Tensor p = randn({n}).requires_grad_();
    const std::vector<float> start = p.to_vector<float>();
    std::vector<double> ref(start.begin(), start.end()), m(n, 0.0), v(n, 0.0);
    OptimizerOptions o = OptimizerOptions::defaults(parse_enum<optim::OptimizerKind>(kind, "test"));
    o.lr = 0.01;
    o.weight_decay = 0.1;
    Optimizer opt({{"p", p}}, o);
    for (int step = 1; step <= 3; ++step) {
      opt.zero_grad();
      const Tensor g = randn({n});
      sum(mul(p, g)).backward();  // dp = g
      opt.step();
      const std::vector<float> gv = g.to_vector<float>();
      const double bc1 = 1 - std::pow(o.beta1, step), bc2 = 1 - std::pow(o.beta2, step);
      for (int64_t i = 0; i < n; ++i) {
        double gi = gv[i];
        if (kind == "adamw")
          ref[i] *= 1 - o.lr * o.weight_decay;
        else
          gi += o.weight_decay * ref[i];
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * gi;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * gi * gi;
        ref[i] -= o.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
      }
    }
    const std::vector<float> got = p.to_vector<float>();
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << kind << " element " << i;
  }
}

// Saving state()/steps() and loading them into a fresh optimizer continues the same trajectory.
TEST(Optimizer, LoadStateContinuesBitIdentically) {
  for (const std::string kind : {"sgd", "adam", "adamw"}) {
    auto run = [&](std::shared_ptr<nn::Sequential> m, Optimizer& opt, int steps) {
      const Tensor x = tensor(std::vector<float>{0.1f, -0.2f, 0.3f, 0.4f, 1.0f, 0.5f, -0.5f, 0.25f}, {2, 4});
      const Tensor y = tensor(std::vector<float>{0.5f, -1.0f, 0.25f, 0.75f}, {2, 2});
      for (int i = 0; i < steps; ++i) {
        opt.zero_grad();
        mse_loss(m->forward(x), y).backward();
        opt.step();
      }
    };
    OptimizerOptions o = OptimizerOptions::defaults(parse_enum<optim::OptimizerKind>(kind, "test"));
    if (kind == "sgd") o.momentum = 0.9, o.nesterov = true;
    manual_seed(7);
    auto m1 = make_mlp(DType::f32);
    Optimizer o1(m1->named_parameters(), o);
    run(m1, o1, 3);
    // A second model at the same point, with state loaded from the first.
    manual_seed(99);
    auto m2 = make_mlp(DType::f32);
    m2->load_parameters(m1->named_parameters());
    Optimizer o2(m2->named_parameters(), o);
    NamedTensors saved;
    for (auto& [name, t] : o1.state()) saved.emplace_back(name, t.clone());
    o2.load_state(saved, o1.steps(), "test");
    run(m1, o1, 4);
    run(m2, o2, 4);
    const auto p1 = m1->named_parameters(), p2 = m2->named_parameters();
    for (size_t i = 0; i < p1.size(); ++i)
      EXPECT_EQ(p1[i].second.to_vector<float>(), p2[i].second.to_vector<float>()) << kind << " " << p1[i].first;
    EXPECT_EQ(o1.steps(), o2.steps());
  }
}

TEST(Optimizer, LoadStateErrorsNameTheItem) {
  Tensor a = zeros({3}).requires_grad_();
  Optimizer opt({{"a", a}}, OptimizerOptions::defaults(optim::OptimizerKind::adam));
  EXPECT_NE(error_of([&] {
              opt.load_state({{"a/exp_avg", zeros({3})}}, {{"a", 1}}, "ck");
            }).find("ck: optimizer state holds 1 tensors, expected 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              opt.load_state({{"a/exp_avg", zeros({3})}, {"a/exp_avg_sq", zeros({4})}}, {{"a", 1}}, "ck");
            }).find("ck: optimizer state a/exp_avg_sq has shape [4], expected [3]"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              opt.load_state({{"a/exp_avg", zeros({3})}, {"a/momentum", zeros({3})}}, {{"a", 1}}, "ck");
            }).find("optimizer state a/exp_avg_sq is missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              opt.load_state({{"a/exp_avg", zeros({3})}, {"a/exp_avg_sq", zeros({3})}}, {}, "ck");
            }).find("optimizer step count for a is missing"),
            std::string::npos);
}

TEST(Optimizer, OptionsDefaultsJsonAndChecks) {
  EXPECT_EQ(OptimizerOptions::defaults(optim::OptimizerKind::adamw).weight_decay, 0.01);  // PyTorch's defaults
  EXPECT_EQ(OptimizerOptions::defaults(optim::OptimizerKind::adam).weight_decay, 0.0);
  EXPECT_EQ(OptimizerOptions::defaults(optim::OptimizerKind::adam).lr, 1e-3);
  EXPECT_EQ(OptimizerOptions::defaults(optim::OptimizerKind::sgd).weight_decay, 0.0);
  OptimizerOptions o = OptimizerOptions::defaults(optim::OptimizerKind::sgd);
  o.lr = 0.05, o.momentum = 0.8, o.dampening = 0.1, o.weight_decay = 0.02;
  const OptimizerOptions back = OptimizerOptions::from_json(nlohmann::json::parse(o.to_json().dump()));
  EXPECT_EQ(back.to_json(), o.to_json());
  EXPECT_NE(error_of([] {
              OptimizerOptions::from_json({{"kind", "rmsprop"}});
            }).find("optimizer: kind: expected one of 'sgd', 'adam', 'adamw', got 'rmsprop'"),
            std::string::npos);
  Tensor p = zeros({2}).requires_grad_();
  OptimizerOptions bad = OptimizerOptions::defaults(optim::OptimizerKind::sgd);
  bad.nesterov = true;
  EXPECT_NE(error_of([&] {
              Optimizer({{"p", p}}, bad);
            }).find("nesterov momentum requires momentum > 0"),
            std::string::npos);
  bad = OptimizerOptions::defaults(optim::OptimizerKind::adam);
  bad.beta1 = 1.0;
  EXPECT_NE(error_of([&] {
              Optimizer({{"p", p}}, bad);
            }).find("optimizer: beta1 must be in [0, 1), got 1"),
            std::string::npos);
  bad = OptimizerOptions::defaults(optim::OptimizerKind::adam);
  bad.lr = -1;
  EXPECT_NE(error_of([&] {
              Optimizer({{"p", p}}, bad);
            }).find("optimizer: lr must be >= 0, got -1"),
            std::string::npos);
  Tensor ids = zeros({2}, DType::i64);
  EXPECT_NE(error_of([&] {
              Optimizer({{"ids", ids}}, OptimizerOptions());
            }).find("parameter ids is not floating point"),
            std::string::npos);
}

// ---- learning-rate schedules ----------------------------------------------------------------------

nlohmann::json schedules_json() {
  std::ifstream in(fixture_path("schedules.json"));
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

TEST(LRSchedule, WarmupCosineMatchesTheFixture) {
  const nlohmann::json j = schedules_json();
  const auto& w = j.at("warmup_cosine");
  LRSchedule s;
  s.kind = optim::ScheduleKind::cosine;
  s.lr = w.at("lr");
  s.min_lr = w.at("min_lr");
  s.warmup = w.at("warmup_steps");
  s.total = w.at("total_steps");
  const auto steps = j.at("steps").get<std::vector<int64_t>>();
  const auto lrs = w.at("lrs").get<std::vector<double>>();
  ASSERT_EQ(steps.size(), 41u);
  ASSERT_EQ(lrs.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_NEAR(s.at(steps[i]), lrs[i], 1e-15) << "t = " << steps[i];
  EXPECT_DOUBLE_EQ(s.at(0), 0.002);
  EXPECT_DOUBLE_EQ(s.at(4), 0.01);
  EXPECT_DOUBLE_EQ(s.at(40), 0.001);
  EXPECT_DOUBLE_EQ(s.at(1000), 0.001);  // past total: stays at min_lr
  // JSON round trip keeps the schedule.
  const LRSchedule back = LRSchedule::from_json(nlohmann::json::parse(s.to_json().dump()));
  for (int64_t t = 0; t <= 40; ++t) EXPECT_EQ(back.at(t), s.at(t));
}

TEST(LRSchedule, StepLRMatchesTheFixture) {
  const nlohmann::json j = schedules_json();
  const auto& st = j.at("step_lr");
  LRSchedule s;
  s.kind = optim::ScheduleKind::step;
  s.lr = st.at("lr");
  s.step_size = st.at("step_size");
  s.gamma = st.at("gamma");
  const auto steps = j.at("steps").get<std::vector<int64_t>>();
  const auto lrs = st.at("lrs").get<std::vector<double>>();
  ASSERT_EQ(lrs.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_NEAR(s.at(steps[i]), lrs[i], 1e-15) << "t = " << steps[i];
  EXPECT_DOUBLE_EQ(s.at(40), 0.00625);
}

TEST(LRSchedule, ConstantNoWarmupAndBadKind) {
  LRSchedule c;
  c.kind = optim::ScheduleKind::constant;
  c.lr = 0.3;
  c.warmup = 10;  // ignored by constant
  EXPECT_EQ(c.at(0), 0.3);
  EXPECT_EQ(c.at(12345), 0.3);
  LRSchedule cos;
  cos.lr = 1.0;
  cos.min_lr = 0.0;
  cos.warmup = 0;
  cos.total = 10;
  EXPECT_DOUBLE_EQ(cos.at(0), 1.0);  // no warmup: the peak at t = 0
  EXPECT_NEAR(cos.at(5), 0.5, 1e-15);
  EXPECT_NEAR(cos.at(10), 0.0, 1e-15);
  EXPECT_NE(error_of([] {
              LRSchedule::from_json({{"kind", "linear"}});
            }).find("schedule: kind: expected one of 'constant', 'cosine', 'step', got 'linear'"),
            std::string::npos);
}

// ---- gradient clipping --------------------------------------------------------------------------

TEST(ClipGradNorm, ScalesToMaxNormAndReturnsTheNormBefore) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = zeros({2, 2}, dt).requires_grad_(), b = zeros({3}, dt).requires_grad_(),
           c = zeros({4}, dt).requires_grad_();
    const std::vector<double> ga = {3, -4, 1, 2}, gb = {0.5, -2, 6};
    a.set_grad(tensor(ga, {2, 2}).to(dt));
    b.set_grad(tensor(gb, {3}).to(dt));
    // c has no gradient: it counts for nothing and stays without one.
    double sq = 0;
    for (double v : ga) sq += v * v;
    for (double v : gb) sq += v * v;
    const double norm = std::sqrt(sq);  // sqrt(9+16+1+4+0.25+4+36) = sqrt(70.25) = 8.381...
    const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
    EXPECT_NEAR(optim::grad_norm({a, b, c}), norm, tol * norm);
    EXPECT_NEAR(optim::clip_grad_norm({a, b, c}, 100.0), norm, tol * norm);
    EXPECT_EQ(a.grad().to_vector<double>(), ga) << "below max_norm nothing changes";
    const double max_norm = 2.0;
    EXPECT_NEAR(optim::clip_grad_norm({a, b, c}, max_norm), norm, tol * norm);
    const double coef = max_norm / (norm + 1e-6);  // PyTorch's clip_coef
    const auto ca = a.grad().to_vector<double>(), cb = b.grad().to_vector<double>();
    for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ca[i], ga[i] * coef, tol * 8);
    for (size_t i = 0; i < gb.size(); ++i) EXPECT_NEAR(cb[i], gb[i] * coef, tol * 8);
    EXPECT_NEAR(optim::grad_norm({a, b, c}), max_norm, 1e-5);
    EXPECT_FALSE(c.grad().defined());
  }
  EXPECT_EQ(optim::grad_norm({zeros({2}).requires_grad_()}), 0.0);
  EXPECT_NE(error_of([] { optim::clip_grad_norm({}, 0.0); }).find("clip_grad_norm: max_norm must be positive"),
            std::string::npos);
}

// The norm a caller passes decides the scale (data parallelism takes it from the allreduce's buffer).
TEST(ClipGradNorm, WithAGivenNormScalesByItsCoefficientOnly) {
  Tensor a = zeros({3}).requires_grad_();
  const std::vector<double> ga = {1, -2, 4};
  a.set_grad(tensor(ga, {3}));
  optim::clip_grads_with_norm({a}, 1.0, 0.5);  // coefficient above 1: unchanged
  EXPECT_EQ(a.grad().to_vector<double>(), ga);
  optim::clip_grads_with_norm({a}, 1.0, std::nan(""));  // a non-finite norm leaves them for the caller's check
  EXPECT_EQ(a.grad().to_vector<double>(), ga);
  optim::clip_grads_with_norm({a}, 1.0, 10.0);
  const auto got = a.grad().to_vector<double>();
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(got[i], ga[i] * (1.0 / (10.0 + 1e-6)), 1e-6);
  EXPECT_NE(error_of([&] { optim::clip_grads_with_norm({a}, -1.0, 1.0); }).find("max_norm must be positive"),
            std::string::npos);
}

}  // namespace
