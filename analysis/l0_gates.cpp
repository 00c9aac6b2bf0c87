// Hard-concrete head gates trained with an L0 penalty on a frozen model.
#include "analysis/l0_gates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "analysis/head_control.h"
#include "optim/optim.h"

namespace headlab::analysis {

using namespace detail;

double l0_test_gate(double log_alpha) {
  const double s = 1.0 / (1.0 + std::exp(-log_alpha));
  return std::clamp(s * (kL0Zeta - kL0Gamma) + kL0Gamma, 0.0, 1.0);
}

namespace {

// clamp(x, 0, 1) with the gradient of both sides (through maximum).
Tensor clamp01(const Tensor& x) {
  const Tensor zero = zeros_like(x), minus_one = full(x.shape(), -1.0, x.dtype(), x.device());
  return neg(maximum(neg(maximum(x, zero)), minus_one));
}

// Sampled gates for B rows: (B, H) from log_alpha (H).
Tensor sample_gates(const Tensor& log_alpha, int64_t B, Generator& gen) {
  const int64_t H = log_alpha.size(0);
  const Tensor u = uniform({B, H}, 1e-6, 1 - 1e-6, gen, log_alpha.dtype(), log_alpha.device());
  const Tensor logit = add(sub(log(u), log(add(neg(u), 1.0))), log_alpha.view({1, H}));
  const Tensor s = sigmoid(mul(logit, 1.0 / kL0Beta));
  return clamp01(add(mul(s, kL0Zeta - kL0Gamma), kL0Gamma));
}

// sum_h P(z_h != 0)
Tensor expected_open(const Tensor& log_alpha) {
  return sigmoid(add(log_alpha, -kL0Beta * std::log(-kL0Gamma / kL0Zeta))).sum();
}

}  // namespace

L0Result l0_gates(nn::DecoderModel& model, const tasks::Task& task, const EvalSet& data, const L0Options& o) {
  HL_CHECK(!o.penalties.empty(), "l0_gates: no penalty strengths given");
  for (double p : o.penalties) HL_CHECK(p >= 0 && std::isfinite(p), "l0_gates: penalties must be >= 0, got ", p);
  HL_CHECK(o.steps > 0 && o.batch_size > 0 && o.lr > 0, "l0_gates: steps, batch_size and lr must be positive, got ",
           o.steps, ", ", o.batch_size, ", ", o.lr);
  ControlGuard guard(model);
  model.eval();  // frozen: no dropout, no parameter updates
  set_controls(model, {}, {});
  const int64_t L = model.n_layers(), T = model.shape().context_length, V = model.shape().out_vocab_size;
  const DType dt = model_dtype(model);
  const Device dev = model.device();
  L0Result r;
  for (double penalty : o.penalties) {
    Generator gen(o.seed);
    NamedTensors params;
    std::vector<Tensor> leaves;
    for (int64_t l = 0; l < L; ++l) {
      Tensor a = full({model.attention(l).head_count()}, o.init_log_alpha, dt, dev);
      a.requires_grad_(true);
      params.emplace_back("layer" + std::to_string(l), a);
      leaves.push_back(a);
    }
    optim::OptimizerOptions oo = optim::OptimizerOptions::defaults(optim::OptimizerKind::adam);
    oo.lr = o.lr;
    optim::Optimizer opt(params, oo);
    L0Point point;
    point.penalty = penalty;
    for (int64_t step = 0; step < o.steps; ++step) {
      const Batch b = task.batch(Split::train, static_cast<uint64_t>(step), o.batch_size, T);
      auto [idx, tgt] = train::batch_tensors(b, dev);
      Tensor open = scalar_tensor(0.0, dt, dev);
      for (int64_t l = 0; l < L; ++l) {
        model.attention(l).control().gates = sample_gates(leaves[static_cast<size_t>(l)], b.B, gen);  // (B, H)
        open = add(open, expected_open(leaves[static_cast<size_t>(l)]));
      }
      const Tensor ce = cross_entropy(model.forward(idx).reshape({-1, V}), tgt.reshape({-1}), kIgnoreIndex);
      const Tensor loss = add(ce, mul(open, penalty));
      const std::vector<Tensor> g = grad({loss}, leaves);
      for (size_t i = 0; i < leaves.size(); ++i) leaves[i].set_grad(g[i]);
      opt.step();
      opt.zero_grad();
      point.final_loss = ce.item<double>();
    }
    for (int64_t l = 0; l < L; ++l) {
      const std::vector<double> a = leaves[static_cast<size_t>(l)].to_vector<double>();
      point.log_alpha.push_back(a);
      auto& gates = point.gate.emplace_back();
      for (size_t h = 0; h < a.size(); ++h) {
        gates.push_back(l0_test_gate(a[h]));
        if (gates.back() == 0) point.closed.emplace_back(l, static_cast<int64_t>(h));
      }
      model.attention(l).control().gates = Tensor();
    }
    HeadMatrix mask = head_matrix(model, 1.0);
    for (const auto& [l, h] : point.closed) mask[static_cast<size_t>(l)][static_cast<size_t>(h)] = 0;
    point.scores = evaluate_heads(model, data, mask);
    r.points.push_back(point);
  }
  // The order: (the smallest penalty that closes the head, its log_alpha summed over every penalty:
  // the runs that did not close it still say how far it went).
  std::vector<std::tuple<double, double, int64_t, int64_t>> order;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
      const auto L_ = static_cast<size_t>(l), H_ = static_cast<size_t>(h);
      double first = std::numeric_limits<double>::infinity(), alpha = 0;
      for (const L0Point& p : r.points) {
        if (p.gate[L_][H_] == 0) first = std::min(first, p.penalty);
        alpha += p.log_alpha[L_][H_];
      }
      order.emplace_back(first, alpha, l, h);
    }
  std::sort(order.begin(), order.end());
  r.rank = head_matrix(model, 0.0);
  for (size_t i = 0; i < order.size(); ++i)
    r.rank[static_cast<size_t>(std::get<2>(order[i]))][static_cast<size_t>(std::get<3>(order[i]))] =
        static_cast<double>(i);
  return r;
}

}  // namespace headlab::analysis
