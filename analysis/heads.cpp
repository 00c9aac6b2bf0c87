// Head interventions on GPT models: scores with gates and offsets, mean contexts, the gate-gradient
// importance of Michel et al. (2019), and zero/mean ablation of every head.
#include "analysis/heads.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "analysis/head_control.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

namespace detail {

void check_matrix(const char* who, const nn::GPTModel& m, const HeadMatrix& gates) {
  if (gates.empty()) return;
  HL_CHECK(static_cast<int64_t>(gates.size()) == m.n_layers(), who, ": gates list ", gates.size(),
           " layers, the model has ", m.n_layers());
  for (int64_t l = 0; l < m.n_layers(); ++l)
    HL_CHECK(static_cast<int64_t>(gates[static_cast<size_t>(l)].size()) == m.attention(l).head_count(), who,
             ": gates of layer ", l, " list ", gates[static_cast<size_t>(l)].size(), " heads, the layer has ",
             m.attention(l).head_count());
}

void set_controls(nn::GPTModel& m, const HeadMatrix& gates, const std::vector<Tensor>& offsets) {
  const DType dt = model_dtype(m);
  const Device dev = m.device();
  for (int64_t l = 0; l < m.n_layers(); ++l) {
    nn::HeadControl& hc = m.attention(l).control();
    hc.keep_context = false;
    hc.context = Tensor();
    hc.gates = gates.empty() ? Tensor()
                             : tensor(gates[static_cast<size_t>(l)], {m.attention(l).head_count()}).to(dt).to(dev);
    const bool has_offset = static_cast<size_t>(l) < offsets.size() && offsets[static_cast<size_t>(l)].defined();
    hc.offsets = has_offset ? offsets[static_cast<size_t>(l)].to(dt).to(dev) : Tensor();
  }
}

}  // namespace detail

using namespace detail;
using train::batch_tensors;

// ---- evaluation data and scores ----
int64_t EvalSet::tokens() const {
  int64_t n = 0;
  for (const Batch& b : batches)
    for (int64_t t : b.targets) n += t != kIgnoreIndex;
  return n;
}

EvalSet make_eval_set(const Task& task, int64_t batches, int64_t batch_size, int64_t T, Split split) {
  HL_CHECK(batches > 0, "analysis: the number of evaluation batches must be positive, got ", batches);
  HL_CHECK(batch_size > 0, "analysis: the batch size must be positive, got ", batch_size);
  task.check_context_length(T);
  EvalSet s;
  for (int64_t i = 0; i < batches; ++i) s.batches.push_back(task.batch(split, static_cast<uint64_t>(i), batch_size, T));
  s.has_exact_match = s.batches.front().has_answers;
  return s;
}

Metric parse_metric(const std::string& name) {
  if (name == "exact_match" || name == "exact") return Metric::exact_match;
  if (name == "token_accuracy" || name == "accuracy" || name == "token") return Metric::token_accuracy;
  HL_FAIL("analysis: unknown metric '", name, "' (expected exact_match or token_accuracy)");
}

const char* metric_name(Metric m) { return m == Metric::exact_match ? "exact_match" : "token_accuracy"; }

double metric_value(const Scores& s, Metric m) {
  if (m == Metric::exact_match) {
    HL_CHECK(s.has_exact_match, "analysis: exact match does not apply to this data (chars); use token_accuracy");
    return s.exact_match;
  }
  return s.token_accuracy;
}

Metric default_metric(const EvalSet& data) {
  return data.has_exact_match ? Metric::exact_match : Metric::token_accuracy;
}

HeadMatrix head_matrix(const nn::GPTModel& model, double fill) {
  HeadMatrix m;
  for (int64_t l = 0; l < model.n_layers(); ++l)
    m.emplace_back(static_cast<size_t>(model.attention(l).head_count()), fill);
  return m;
}

int64_t count_heads(const HeadMatrix& m) {
  int64_t n = 0;
  for (const auto& row : m) n += static_cast<int64_t>(row.size());
  return n;
}

int64_t original_head(const nn::GPTConfig& cfg, int64_t layer, int64_t head) {
  if (cfg.kept_heads.empty()) return head;
  return cfg.kept_heads.at(static_cast<size_t>(layer)).at(static_cast<size_t>(head));
}

Scores evaluate_heads(nn::GPTModel& model, const EvalSet& data, const HeadMatrix& gates,
                      const std::vector<Tensor>& offsets) {
  check_matrix("evaluate_heads", model, gates);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, gates, offsets);
  return train::evaluate(model, data.batches);
}

std::vector<Tensor> mean_head_contexts(nn::GPTModel& model, const EvalSet& data) {
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  const int64_t L = model.n_layers();
  std::vector<Tensor> sums(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) model.attention(l).control().keep_context = true;
  NoGradGuard no_grad;
  int64_t count = 0;
  for (const Batch& b : data.batches) {
    model.forward(batch_tensors(b, model.device()).first);
    for (int64_t l = 0; l < L; ++l) {
      const Tensor ctx = model.attention(l).control().context;  // (B, H, T, D)
      const Tensor s = ctx.to(DType::f64).sum({0, 2});             // (H, D)
      Tensor& acc = sums[static_cast<size_t>(l)];
      acc = acc.defined() ? add(acc, s) : s;
    }
    count += b.B * b.T;
  }
  const DType dt = model_dtype(model);
  for (Tensor& s : sums) s = mul(s, 1.0 / static_cast<double>(count)).to(dt);
  return sums;
}

Importance head_importance(nn::GPTModel& model, const EvalSet& data, const HeadMatrix& gates_in) {
  check_matrix("head_importance", model, gates_in);
  const HeadMatrix gates = gates_in.empty() ? head_matrix(model, 1.0) : gates_in;
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  const int64_t L = model.n_layers(), V = model.config().vocab_size;
  const DType dt = model_dtype(model);
  const Device dev = model.device();
  std::vector<Tensor> leaves;
  for (int64_t l = 0; l < L; ++l) {
    Tensor g = tensor(gates[static_cast<size_t>(l)], {model.attention(l).head_count()}).to(dt).to(dev);
    g.requires_grad_(true);
    model.attention(l).control().gates = g;
    leaves.push_back(g);
  }
  Importance imp;
  imp.raw = head_matrix(model, 0.0);
  int64_t n = 0;
  for (const Batch& b : data.batches) {
    auto [idx, tgt] = batch_tensors(b, dev);
    if (std::all_of(b.targets.begin(), b.targets.end(), [](int64_t t) { return t == kIgnoreIndex; })) continue;
    const Tensor logits = model.forward(idx);
    const Tensor loss = cross_entropy(logits.reshape({-1, V}), tgt.reshape({-1}), kIgnoreIndex);
    const std::vector<Tensor> g = grad({loss}, leaves);
    for (int64_t l = 0; l < L; ++l) {
      const std::vector<double> v = g[static_cast<size_t>(l)].to_vector<double>();
      for (size_t h = 0; h < v.size(); ++h) imp.raw[static_cast<size_t>(l)][h] += std::abs(v[h]);
    }
    ++n;
  }
  HL_CHECK(n > 0, "head_importance: the evaluation data has no scored tokens");
  imp.normalized = imp.raw;
  for (size_t l = 0; l < imp.raw.size(); ++l) {
    double sq = 0;
    for (size_t h = 0; h < imp.raw[l].size(); ++h) {
      imp.raw[l][h] /= static_cast<double>(n);
      if (gates[l][h] != 0) sq += imp.raw[l][h] * imp.raw[l][h];
    }
    const double norm = std::sqrt(sq) + 1e-20;  // the paper's code adds 1e-20 too
    for (size_t h = 0; h < imp.raw[l].size(); ++h) imp.normalized[l][h] = gates[l][h] != 0 ? imp.raw[l][h] / norm : kNaN;
  }
  return imp;
}

AblationResult ablate_heads(nn::GPTModel& model, const EvalSet& data) {
  AblationResult r;
  r.base = evaluate_heads(model, data);
  r.importance = head_importance(model, data);
  const std::vector<Tensor> means = mean_head_contexts(model, data);
  const int64_t L = model.n_layers();
  for (int64_t l = 0; l < L; ++l) {
    const int64_t H = model.attention(l).head_count();
    for (int64_t h = 0; h < H; ++h) {
      HeadAblation a;
      a.layer = l;
      a.head = h;
      a.original_head = original_head(model.config(), l, h);
      a.importance = r.importance.normalized[static_cast<size_t>(l)][static_cast<size_t>(h)];
      a.importance_raw = r.importance.raw[static_cast<size_t>(l)][static_cast<size_t>(h)];
      HeadMatrix gates = head_matrix(model, 1.0);
      gates[static_cast<size_t>(l)][static_cast<size_t>(h)] = 0.0;
      a.zero = evaluate_heads(model, data, gates);
      std::vector<Tensor> offsets(static_cast<size_t>(L));
      const Tensor& mean_l = means[static_cast<size_t>(l)];  // (H, D)
      Tensor off = zeros(mean_l.shape(), mean_l.dtype(), mean_l.device());
      {
        NoGradGuard no_grad;
        off.select(0, h).copy_(mean_l.select(0, h));
      }
      offsets[static_cast<size_t>(l)] = off;
      a.mean = evaluate_heads(model, data, gates, offsets);
      r.heads.push_back(a);
    }
  }
  return r;
}

double max_logit_difference(nn::GPTModel& a, const HeadMatrix& gates_a, nn::GPTModel& b, const EvalSet& data) {
  check_matrix("max_logit_difference", a, gates_a);
  ControlGuard ga(a);
  ControlGuard gb(b);
  a.eval();
  b.eval();
  set_controls(a, gates_a, {});
  set_controls(b, {}, {});
  NoGradGuard no_grad;
  double worst = 0;
  for (const Batch& batch : data.batches) {
    const Tensor la = a.forward(batch_tensors(batch, a.device()).first);
    const Tensor lb = b.forward(batch_tensors(batch, b.device()).first);
    const Tensor diff = sub(la.to(kCPU).to(DType::f64), lb.to(kCPU).to(DType::f64));
    worst = std::max(worst, amax(abs(diff)).item<double>());
  }
  return worst;
}

}  // namespace headlab::analysis
