// Head analysis (ablation, Michel et al. importance, iterative and physical pruning, attention maps) and
// the wrapper-vs-fused attention measurements. Head interventions go through each layer's HeadControl
// (gates, offsets, kept contexts), saved and restored around every measurement.
// L = layers, H = heads of a layer, D = head size, B = batch, T = tokens, C = emb_dim, V = vocab.
#include "train/analysis.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>
#include <set>
#include <sstream>

#include <omp.h>

#include <array>
#include <fstream>
#include <iomanip>

#include "backends/backend.h"
#include "train/h5file.h"
#include "train/plot.h"

namespace headlab::train {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

DType model_dtype(const nn::GPTModel& m) { return m.tok_emb->weight.dtype(); }

// Saves every layer's HeadControl and restores it (and clears kept contexts) on scope exit.
class ControlGuard {
 public:
  explicit ControlGuard(nn::GPTModel& m) : m_(m), training_(m.is_training()) {
    for (int64_t l = 0; l < m.n_layers(); ++l) saved_.push_back(m.attention(l).control());
  }
  ~ControlGuard() {
    for (int64_t l = 0; l < m_.n_layers(); ++l) {
      m_.attention(l).control() = saved_[static_cast<size_t>(l)];
      m_.attention(l).control().context = Tensor();
    }
    m_.train(training_);
  }
  ControlGuard(const ControlGuard&) = delete;
  ControlGuard& operator=(const ControlGuard&) = delete;

 private:
  nn::GPTModel& m_;
  bool training_;
  std::vector<nn::HeadControl> saved_;
};

void check_matrix(const char* who, const nn::GPTModel& m, const HeadMatrix& gates) {
  if (gates.empty()) return;
  HL_CHECK(static_cast<int64_t>(gates.size()) == m.n_layers(), who, ": gates list ", gates.size(),
           " layers, the model has ", m.n_layers());
  for (int64_t l = 0; l < m.n_layers(); ++l)
    HL_CHECK(static_cast<int64_t>(gates[static_cast<size_t>(l)].size()) == m.attention(l).head_count(), who,
             ": gates of layer ", l, " list ", gates[static_cast<size_t>(l)].size(), " heads, the layer has ",
             m.attention(l).head_count());
}

// Installs gates (may be empty: none) and offsets on the model's layers; contexts are not kept.
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

std::pair<Tensor, Tensor> batch_tensors(const Batch& b, Device device) {
  return {tensor(b.inputs, {b.B, b.T}).to(device), tensor(b.targets, {b.B, b.T}).to(device)};
}

// Teacher-forced scores of the model as it stands (controls already set).
Scores run_scores(nn::GPTModel& model, const EvalSet& data) {
  NoGradGuard no_grad;
  const Device device = model.device();
  const int64_t V = model.config().vocab_size;
  double loss_sum = 0;
  Metrics total;
  for (const Batch& b : data.batches) {
    auto [idx, tgt] = batch_tensors(b, device);
    const Tensor logits = model.forward(idx);  // (B, T, V)
    loss_sum += cross_entropy(logits.reshape({-1, V}), tgt.reshape({-1}), kIgnoreIndex, Reduction::sum).item<double>();
    total += score(b, argmax(logits, -1).to_vector<int64_t>());
  }
  Scores s;
  s.tokens = total.tokens;
  s.loss = total.tokens ? loss_sum / static_cast<double>(total.tokens) : kNaN;
  s.token_accuracy = total.tokens ? total.token_accuracy : kNaN;
  s.has_exact_match = total.has_exact_match;
  s.exact_match = total.has_exact_match ? total.exact_match : kNaN;
  return s;
}

double percentile(std::vector<double> v, double q) {  // linear interpolation, as numpy's default
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// Parameter names of the model a config describes, in registration order.
std::vector<std::pair<std::string, Shape>> expected_parameters(const nn::GPTConfig& cfg) {
  NoGradGuard no_grad;
  const nn::GPTModel m(cfg);
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& [name, t] : m.named_parameters()) out.emplace_back(name, t.shape());
  return out;
}

std::map<std::string, Tensor> by_name(const NamedTensors& params) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, t] : params) m[name] = t;
  return m;
}

const Tensor& lookup(const std::map<std::string, Tensor>& m, const std::string& name, const char* who) {
  auto it = m.find(name);
  HL_CHECK(it != m.end(), who, ": parameter ", name, " is missing");
  return it->second;
}

// "trf_blocks.3.att.heads.2.W_key.weight" -> (3, "heads.2.W_key.weight"); layer -1 if not attention.
std::pair<int64_t, std::string> split_attention_name(const std::string& name) {
  static const std::string pre = "trf_blocks.";
  if (name.rfind(pre, 0) != 0) return {-1, ""};
  const size_t dot = name.find('.', pre.size());
  if (dot == std::string::npos) return {-1, ""};
  const std::string rest = name.substr(dot + 1);
  if (rest.rfind("att.", 0) != 0) return {-1, ""};
  return {std::stoll(name.substr(pre.size(), dot - pre.size())), rest.substr(4)};
}

// Rows [h*D, (h+1)*D) of every kept head, as an index tensor.
Tensor head_rows(const std::vector<int64_t>& keep, int64_t D) {
  std::vector<int64_t> rows;
  for (int64_t h : keep)
    for (int64_t i = 0; i < D; ++i) rows.push_back(h * D + i);
  return tensor(rows, {static_cast<int64_t>(rows.size())});
}

}  // namespace

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
  return run_scores(model, data);
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

// ---- pruning ----
Criterion parse_criterion(const std::string& name) {
  if (name == "gradient") return Criterion::gradient;
  if (name == "ablation") return Criterion::ablation;
  HL_FAIL("analysis: unknown pruning criterion '", name, "' (expected gradient or ablation)");
}

const char* criterion_name(Criterion c) { return c == Criterion::gradient ? "gradient" : "ablation"; }

PruningCurve iterative_pruning(nn::GPTModel& model, const EvalSet& data, const PruneOptions& o) {
  HL_CHECK(o.step_fraction > 0 && o.step_fraction <= 1, "iterative_pruning: step_fraction must be in (0, 1], got ",
           o.step_fraction);
  PruningCurve c;
  c.metric = o.metric;
  HeadMatrix gates = head_matrix(model, 1.0);
  c.total_heads = count_heads(gates);
  PruneStep first;
  first.scores = evaluate_heads(model, data, gates);
  metric_value(first.scores, o.metric);  // throws early for exact match on chars
  c.steps.push_back(first);
  std::vector<int64_t> active(gates.size());
  for (size_t l = 0; l < gates.size(); ++l) active[l] = static_cast<int64_t>(gates[l].size());
  while (true) {
    const int64_t pruned = static_cast<int64_t>(c.order.size());
    if (metric_value(c.steps.back().scores, o.metric) < o.stop_below && pruned >= o.min_pruned) break;
    const int64_t remaining = c.total_heads - pruned;
    std::vector<std::tuple<double, int64_t, int64_t>> cand;  // (importance, layer, head)
    const Importance imp = o.criterion == Criterion::gradient ? head_importance(model, data, gates) : Importance{};
    for (size_t l = 0; l < gates.size(); ++l)
      for (size_t h = 0; h < gates[l].size(); ++h) {
        if (gates[l][h] == 0 || active[l] <= 1) continue;
        double score = 0;
        if (o.criterion == Criterion::gradient) {
          score = imp.normalized[l][h];
        } else {  // the loss increase of masking this head too
          HeadMatrix g = gates;
          g[l][h] = 0;
          score = evaluate_heads(model, data, g).loss - c.steps.back().scores.loss;
        }
        cand.emplace_back(score, static_cast<int64_t>(l), static_cast<int64_t>(h));
      }
    if (cand.empty()) break;
    std::sort(cand.begin(), cand.end());
    const int64_t want =
        std::max<int64_t>(1, static_cast<int64_t>(std::floor(o.step_fraction * static_cast<double>(remaining) + 0.5)));
    PruneStep step;
    for (const auto& [score, l, h] : cand) {
      if (static_cast<int64_t>(step.removed.size()) >= want) break;
      if (active[static_cast<size_t>(l)] <= 1) continue;  // each layer keeps one head
      gates[static_cast<size_t>(l)][static_cast<size_t>(h)] = 0.0;
      --active[static_cast<size_t>(l)];
      step.removed.emplace_back(l, h);
      c.order.emplace_back(l, h);
    }
    step.pruned = static_cast<int64_t>(c.order.size());
    step.fraction = static_cast<double>(step.pruned) / static_cast<double>(c.total_heads);
    step.scores = evaluate_heads(model, data, gates);
    c.steps.push_back(step);
  }
  return c;
}

std::vector<std::vector<int64_t>> kept_after(const nn::GPTModel& model,
                                             const std::vector<std::pair<int64_t, int64_t>>& order, int64_t k) {
  HL_CHECK(k >= 0 && k <= static_cast<int64_t>(order.size()), "kept_after: cannot remove ", k, " heads; the order lists ",
           order.size());
  std::set<std::pair<int64_t, int64_t>> removed(order.begin(), order.begin() + k);
  std::vector<std::vector<int64_t>> keep(static_cast<size_t>(model.n_layers()));
  for (int64_t l = 0; l < model.n_layers(); ++l)
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h)
      if (!removed.count({l, h})) keep[static_cast<size_t>(l)].push_back(h);
  return keep;
}

HeadMatrix gates_keeping(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep) {
  HeadMatrix g = head_matrix(model, 0.0);
  HL_CHECK(keep.size() == g.size(), "gates_keeping: keep lists ", keep.size(), " layers, the model has ", g.size());
  for (size_t l = 0; l < keep.size(); ++l)
    for (int64_t h : keep[l]) {
      HL_CHECK(h >= 0 && h < static_cast<int64_t>(g[l].size()), "gates_keeping: layer ", l, " has no head ", h);
      g[l][static_cast<size_t>(h)] = 1.0;
    }
  return g;
}

int64_t prune_count_for_metric(const PruningCurve& curve, double target) {
  int64_t n = 0;
  for (const PruneStep& s : curve.steps) {
    if (metric_value(s.scores, curve.metric) < target) break;
    n = s.pruned;
  }
  return n;
}

// ---- physical pruning and conversion ----
std::pair<nn::GPTConfig, NamedTensors> prune_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                        const std::vector<std::vector<int64_t>>& keep) {
  const char* who = "prune_parameters";
  HL_CHECK(static_cast<int64_t>(keep.size()) == cfg.n_layers, who, ": keep lists ", keep.size(),
           " layers, the model has ", cfg.n_layers);
  nn::GPTConfig out = cfg;
  out.kept_heads.assign(static_cast<size_t>(cfg.n_layers), {});
  const int64_t D = cfg.head_dim();
  std::vector<std::map<int64_t, int64_t>> renumber(keep.size());  // old local head -> new local head
  std::vector<Tensor> rows(keep.size()), cols(keep.size());
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const auto& k = keep[static_cast<size_t>(l)];
    const int64_t H = cfg.heads_in_layer(l);
    HL_CHECK(!k.empty(), who, ": layer ", l, " must keep at least one head");
    for (size_t i = 0; i < k.size(); ++i) {
      HL_CHECK(k[i] >= 0 && k[i] < H, who, ": layer ", l, " has no head ", k[i], " (it has ", H, ")");
      HL_CHECK(i == 0 || k[i] > k[i - 1], who, ": the heads kept in layer ", l, " must be sorted and distinct");
      renumber[static_cast<size_t>(l)][k[i]] = static_cast<int64_t>(i);
      out.kept_heads[static_cast<size_t>(l)].push_back(original_head(cfg, l, k[i]));
    }
    rows[static_cast<size_t>(l)] = head_rows(k, D);
  }
  out.validate();
  NamedTensors result;
  for (const auto& [name, t] : params) {
    const auto [l, rest] = split_attention_name(name);
    if (l < 0) {
      result.emplace_back(name, t);
      continue;
    }
    HL_CHECK(l < cfg.n_layers, who, ": parameter ", name, " names layer ", l, " of ", cfg.n_layers);
    const Tensor& idx = rows[static_cast<size_t>(l)];
    if (rest == "out_proj.weight") {  // (C, H*D): keep the kept heads' columns
      result.emplace_back(name, index_select(t, 1, idx.to(t.device())));
    } else if (rest == "out_proj.bias") {
      result.emplace_back(name, t);
    } else if (rest.rfind("heads.", 0) == 0) {  // wrapper: heads.{j}.<rest>, renumbered
      const size_t dot = rest.find('.', 6);
      const int64_t j = std::stoll(rest.substr(6, dot - 6));
      auto it = renumber[static_cast<size_t>(l)].find(j);
      if (it == renumber[static_cast<size_t>(l)].end()) continue;
      result.emplace_back("trf_blocks." + std::to_string(l) + ".att.heads." + std::to_string(it->second) +
                              rest.substr(dot),
                          t);
    } else {  // fused W_query/W_key/W_value weight (H*D, C) or bias (H*D): keep the kept heads' rows
      result.emplace_back(name, index_select(t, 0, idx.to(t.device())));
    }
  }
  return {out, result};
}

Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source) {
  const nn::GPTConfig cfg = nn::GPTConfig::from_json(ckpt.config.at("model"));
  auto [pcfg, params] = prune_parameters(cfg, ckpt.model, keep);
  Checkpoint out;
  out.config = ckpt.config;
  out.config["model"] = pcfg.to_json();
  nlohmann::json removed = nlohmann::json::array();
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    for (int64_t h = 0; h < cfg.n_heads; ++h) {
      const auto& k = pcfg.kept_heads[static_cast<size_t>(l)];
      if (std::find(k.begin(), k.end(), h) == k.end()) removed.push_back({l, h});
    }
  out.config["pruning"] = {{"source", source}, {"removed_heads", removed}, {"kept_heads", pcfg.kept_heads}};
  out.model = params;
  out.has_optimizer = false;
  out.has_trainer = ckpt.has_trainer;
  out.trainer = ckpt.trainer;
  return out;
}

std::shared_ptr<nn::GPTModel> prune_model(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep) {
  NamedTensors params;
  for (auto& [name, t] : model.named_parameters()) params.emplace_back(name, t.detach().to(kCPU).clone());
  auto [cfg, pruned] = prune_parameters(model.config(), params, keep);
  auto m = std::make_shared<nn::GPTModel>(cfg);
  m->to(model_dtype(model));
  m->load_parameters(pruned, "prune_model");
  m->to(model.device());
  m->train(model.is_training());
  return m;
}

std::pair<nn::GPTConfig, NamedTensors> convert_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                          const std::string& attention) {
  const char* who = "convert_parameters";
  HL_CHECK(attention == "fused" || attention == "wrapper", who, ": attention must be 'fused' or 'wrapper', got '",
           attention, "'");
  nn::GPTConfig out = cfg;
  out.attention = attention;
  if (attention == cfg.attention) return {out, params};
  const auto src = by_name(params);
  const int64_t D = cfg.head_dim();
  NamedTensors result;
  for (const auto& [name, shape] : expected_parameters(out)) {
    const auto [l, rest] = split_attention_name(name);
    const std::string prefix = "trf_blocks." + std::to_string(l) + ".att.";
    Tensor value;
    if (l >= 0 && attention == "wrapper" && rest.rfind("heads.", 0) == 0) {
      // heads.{j}.W_query.weight <- rows [j*D, (j+1)*D) of the fused W_query.weight (bias alike)
      const size_t dot = rest.find('.', 6);
      const int64_t j = std::stoll(rest.substr(6, dot - 6));
      value = lookup(src, prefix + rest.substr(dot + 1), who).narrow(0, j * D, D).contiguous();
    } else if (l >= 0 && attention == "fused" && rest.rfind("W_", 0) == 0) {
      std::vector<Tensor> parts;
      for (int64_t j = 0; j < cfg.heads_in_layer(l); ++j)
        parts.push_back(lookup(src, prefix + "heads." + std::to_string(j) + "." + rest, who));
      value = cat(parts, 0);
    } else {
      value = lookup(src, name, who);
    }
    HL_CHECK(value.shape() == shape, who, ": ", name, " came out with shape ", shape_str(value.shape()), ", expected ",
             shape_str(shape));
    result.emplace_back(name, value);
  }
  return {out, result};
}

Checkpoint convert_checkpoint(const Checkpoint& ckpt, const std::string& attention) {
  const nn::GPTConfig cfg = nn::GPTConfig::from_json(ckpt.config.at("model"));
  auto [ccfg, params] = convert_parameters(cfg, ckpt.model, attention);
  Checkpoint out;
  out.config = ckpt.config;
  out.config["model"] = ccfg.to_json();
  out.model = params;
  out.has_trainer = ckpt.has_trainer;
  out.trainer = ckpt.trainer;
  return out;  // optimizer state is per parameter name, which changed
}

// ---- timing and comparisons ----
namespace {
TimeStats summarize(const std::vector<double>& t) {
  TimeStats s;
  s.repeats = static_cast<int64_t>(t.size());
  s.median = percentile(t, 0.5);
  s.p25 = percentile(t, 0.25);
  s.p75 = percentile(t, 0.75);
  s.min = *std::min_element(t.begin(), t.end());
  s.max = *std::max_element(t.begin(), t.end());
  return s;
}
}  // namespace

std::vector<TimeStats> time_interleaved(const std::vector<std::function<void()>>& fns, Device device, int64_t warmup,
                                        int64_t repeats) {
  HL_CHECK(repeats > 0, "time_interleaved: repeats must be positive, got ", repeats);
  Backend& be = backend_for(device);
  for (int64_t i = 0; i < warmup; ++i)
    for (const auto& fn : fns) fn();
  be.synchronize();
  std::vector<std::vector<double>> t(fns.size());
  for (int64_t i = 0; i < repeats; ++i)
    for (size_t k = 0; k < fns.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[k]();
      be.synchronize();
      t[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<TimeStats> out;
  for (const auto& v : t) out.push_back(summarize(v));
  return out;
}

TimeStats time_call(const std::function<void()>& fn, Device device, int64_t warmup, int64_t repeats) {
  return time_interleaved({fn}, device, warmup, repeats).front();
}

double rank_correlation(const std::vector<double>& x_in, const std::vector<double>& y_in) {
  HL_CHECK(x_in.size() == y_in.size(), "rank_correlation: ", x_in.size(), " and ", y_in.size(), " values");
  std::vector<double> x, y;
  for (size_t i = 0; i < x_in.size(); ++i)
    if (!std::isnan(x_in[i]) && !std::isnan(y_in[i])) x.push_back(x_in[i]), y.push_back(y_in[i]);
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * static_cast<double>(i + j);
      i = j + 1;
    }
    return r;
  };
  if (x.size() < 2) return kNaN;
  const std::vector<double> rx = ranks(x), ry = ranks(y);
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(rx.begin(), rx.end(), 0.0) / n, my = std::accumulate(ry.begin(), ry.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < rx.size(); ++i) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : kNaN;
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

// ---- attention maps ----
AttentionMaps attention_maps(nn::GPTModel& model, const std::vector<int64_t>& ids) {
  const nn::GPTConfig& cfg = model.config();
  const int64_t T = static_cast<int64_t>(ids.size());
  HL_CHECK(T > 0, "attention_maps: the input is empty");
  HL_CHECK(T <= cfg.context_length, "attention_maps: ", T, " tokens exceed context_length ", cfg.context_length);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  AttentionMaps m;
  m.ids = ids;
  m.layers = cfg.n_layers;
  m.heads = cfg.n_heads;
  m.T = T;
  m.weights.assign(static_cast<size_t>(m.layers * m.heads * T * T), std::numeric_limits<float>::quiet_NaN());
  for (int64_t l = 0; l < m.layers; ++l) model.attention(l).keep_attention_weights(true);
  {
    NoGradGuard no_grad;
    model.forward(tensor(ids, {1, T}).to(model.device()));
  }
  for (int64_t l = 0; l < m.layers; ++l) {
    nn::CausalMultiHead& att = model.attention(l);
    const std::vector<float> w = att.last_attention_weights().to_vector<float>();  // (1, H_l, T, T)
    att.keep_attention_weights(false);
    std::vector<int64_t> kept;
    for (int64_t h = 0; h < att.head_count(); ++h) {
      const int64_t oh = original_head(cfg, l, h);
      kept.push_back(oh);
      std::copy(w.begin() + h * T * T, w.begin() + (h + 1) * T * T, m.weights.begin() + (l * m.heads + oh) * T * T);
    }
    m.kept.push_back(kept);
  }
  return m;
}

std::vector<int64_t> greedy_continue(nn::GPTModel& model, std::vector<int64_t> ids, int64_t max_new, int64_t end_id) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  const int64_t ctx = model.config().context_length;
  for (int64_t i = 0; i < max_new && static_cast<int64_t>(ids.size()) < ctx; ++i) {
    const int64_t n = static_cast<int64_t>(ids.size());
    const Tensor logits = model.forward(tensor(ids, {1, n}).to(model.device()));  // (1, n, V)
    const int64_t next = argmax(logits.select(1, n - 1).select(0, 0), 0).item<int64_t>();
    ids.push_back(next);
    if (next == end_id) break;
  }
  model.train(was_training);
  return ids;
}

// ---- wrapper vs fused ----
CompareConfig parse_compare_config(const std::string& spec) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
  HL_CHECK(parts.size() == 6, "compare: config '", spec, "' must be name,B,T,d_in,d_out,heads");
  CompareConfig c;
  c.name = parts[0];
  int64_t* fields[] = {&c.B, &c.T, &c.d_in, &c.d_out, &c.heads};
  const char* names[] = {"B", "T", "d_in", "d_out", "heads"};
  for (int i = 0; i < 5; ++i) {
    size_t used = 0;
    try {
      *fields[i] = std::stoll(parts[static_cast<size_t>(i) + 1], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HL_CHECK(used > 0 && used == parts[static_cast<size_t>(i) + 1].size() && *fields[i] > 0, "compare: config '", spec,
             "': ", names[i], " must be a positive integer, got '", parts[static_cast<size_t>(i) + 1], "'");
  }
  HL_CHECK(c.d_out % c.heads == 0, "compare: config '", spec, "': d_out ", c.d_out, " must be divisible by heads ",
           c.heads);
  return c;
}

std::vector<CompareConfig> peer_compare_grid() {
  return {{"seed-toy", 2, 6, 3, 2, 2},
          {"small", 32, 64, 128, 128, 4},
          {"medium", 8, 256, 256, 256, 8},
          {"gpt2-ctx256", 8, 256, 768, 768, 12}};
}

double attention_flops_forward(const CompareConfig& c) {
  const double B = static_cast<double>(c.B), T = static_cast<double>(c.T), di = static_cast<double>(c.d_in),
               d = static_cast<double>(c.d_out);
  return 2 * B * T * di * 3 * d + 2 * 2 * B * T * T * d + 2 * B * T * d * d;
}

CompareResult compare_attention(const CompareConfig& c, const CompareOptions& o) {
  HL_CHECK(c.B > 0 && c.T > 0 && c.d_in > 0 && c.d_out > 0 && c.heads > 0 && c.d_out % c.heads == 0,
           "compare: config '", c.name, "' needs positive sizes and d_out divisible by heads");
  Backend& be = backend_for(o.device);
  Generator gen(o.seed);
  manual_seed(o.seed);  // module initialisation draws from the default generator
  auto wrapper = std::make_shared<nn::MultiHeadAttentionWrapper>(c.d_in, c.d_out / c.heads, c.T, 0.0, c.heads, false,
                                                                 true, c.d_out);
  wrapper->to(o.device);
  wrapper->eval();
  std::shared_ptr<nn::CausalMultiHeadAttention> fused = nn::wrapper_to_fused(*wrapper);
  fused->eval();
  const Tensor x = randn({c.B, c.T, c.d_in}, gen).to(o.device);
  const Tensor dy = randn({c.B, c.T, c.d_out}, gen).to(o.device);

  CompareResult r;
  r.config = c;
  const Tensor xg = x.detach().requires_grad_(true);
  auto fwd = [&](nn::CausalMultiHead& m) -> std::function<void()> {
    return [&m, &x] {
      NoGradGuard no_grad;
      Tensor y = m.forward(x);
    };
  };
  auto fwd_bwd = [&](nn::CausalMultiHead& m) -> std::function<void()> {
    return [&m, &xg] {
      m.zero_grad();
      xg.zero_grad();
      m.forward(xg).sum().backward();  // the peer's loss
    };
  };
  // Both forms timed in turn within each repeat, so a busy machine slows them alike.
  const auto tf = time_interleaved({fwd(*wrapper), fwd(*fused)}, o.device, o.warmup, o.repeats);
  const auto tb = time_interleaved({fwd_bwd(*wrapper), fwd_bwd(*fused)}, o.device, o.warmup, o.repeats);
  auto peak = [&](const std::function<void()>& fn) {
    wrapper->zero_grad();
    fused->zero_grad();
    xg.zero_grad();
    be.synchronize();
    const size_t before = be.bytes_in_use();
    be.reset_peak();
    fn();
    be.synchronize();
    return static_cast<int64_t>(be.peak_bytes()) - static_cast<int64_t>(before);
  };
  int form = 0;
  for (auto* m : {static_cast<nn::CausalMultiHead*>(wrapper.get()), static_cast<nn::CausalMultiHead*>(fused.get())}) {
    FormMeasurement& fm = form == 0 ? r.wrapper : r.fused;
    fm.params = m->num_parameters();
    fm.flops_forward = attention_flops_forward(c);
    fm.flops_backward = 2 * fm.flops_forward;
    fm.forward = tf[static_cast<size_t>(form)];
    fm.forward_backward = tb[static_cast<size_t>(form)];
    fm.peak_forward = peak(fwd(*m));
    fm.peak_forward_backward = peak(fwd_bwd(*m));  // includes the parameter and input gradients it creates
    ++form;
  }
  wrapper->zero_grad();
  fused->zero_grad();

  // The gap: same weights, same x, same dL/dy.
  const Tensor xw = x.detach().requires_grad_(true), xf = x.detach().requires_grad_(true);
  const Tensor yw = wrapper->forward(xw), yf = fused->forward(xf);
  const Tensor dxw = grad({yw}, {xw}, {dy})[0], dxf = grad({yf}, {xf}, {dy})[0];
  r.max_abs_out = amax(abs(sub(yw.detach(), yf.detach()))).item<double>();
  r.max_abs_dx = amax(abs(sub(dxw, dxf))).item<double>();
  return r;
}

// ---- files ----
namespace {

// A CSV number: 10 significant digits, "nan" for NaN.
std::string num(double v) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  HL_CHECK(f.good(), "analysis: cannot write '", path, "' (does the folder exist?)");
  f << text;
  f.close();
  HL_CHECK(f.good(), "analysis: writing '", path, "' failed (disk full?)");
}

}  // namespace

std::string head_label(int64_t layer, int64_t head) { return "L" + std::to_string(layer) + "H" + std::to_string(head); }

std::string removed_heads_str(const PruneStep& s, const nn::GPTConfig& cfg) {
  std::string out;
  for (const auto& [l, h] : s.removed) {
    if (!out.empty()) out += " ";
    out += head_label(l, original_head(cfg, l, h));
  }
  return out;
}

std::string token_label(const std::string& t) {
  if (t == " ") return "sp";
  if (t == "\n") return "\\n";
  if (t == "\t") return "\\t";
  std::string out;
  for (unsigned char c : t) out += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
  return out.empty() ? "?" : out;
}

void save_heads_csv(const std::string& path, const AblationResult& a) {
  const bool ex = a.base.has_exact_match;
  std::ostringstream os;
  os << "layer,head,importance,importance_raw,zero_delta_loss,zero_delta_accuracy,"
     << (ex ? "zero_delta_exact_match," : "") << "mean_delta_loss,mean_delta_accuracy"
     << (ex ? ",mean_delta_exact_match" : "") << "\n";
  for (const auto& h : a.heads) {
    os << h.layer << ',' << h.original_head << ',' << num(h.importance) << ',' << num(h.importance_raw) << ','
       << num(h.zero.loss - a.base.loss) << ',' << num(h.zero.token_accuracy - a.base.token_accuracy) << ',';
    if (ex) os << num(h.zero.exact_match - a.base.exact_match) << ',';
    os << num(h.mean.loss - a.base.loss) << ',' << num(h.mean.token_accuracy - a.base.token_accuracy);
    if (ex) os << ',' << num(h.mean.exact_match - a.base.exact_match);
    os << "\n";
  }
  write_text(path, os.str());
}

void save_pruning_csv(const std::string& path, const PruningCurve& c, const nn::GPTConfig& cfg) {
  HL_CHECK(!c.steps.empty(), "save_pruning_csv: the curve is empty");
  const bool ex = c.steps.front().scores.has_exact_match;
  std::ostringstream os;
  os << "step,heads_pruned,fraction_pruned,loss,token_accuracy" << (ex ? ",exact_match" : "") << ",removed\n";
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const auto& s = c.steps[i];
    os << i << ',' << s.pruned << ',' << num(s.fraction) << ',' << num(s.scores.loss) << ','
       << num(s.scores.token_accuracy);
    if (ex) os << ',' << num(s.scores.exact_match);
    os << ',' << removed_heads_str(s, cfg) << "\n";
  }
  write_text(path, os.str());
}

void save_importance_png(const std::string& path, const AblationResult& a, const nn::GPTConfig& cfg) {
  plot::Heatmap m;
  m.title = "head importance (Michel et al. 2019): mean abs dL/dgate, normalised per layer";
  m.x_label = "head";
  m.y_label = "layer";
  m.colorbar_label = "importance";
  m.rows = cfg.n_layers;
  m.cols = cfg.n_heads;
  m.values.assign(static_cast<size_t>(m.rows * m.cols), kNaN);  // heads pruned before: grey
  for (const auto& h : a.heads) m.values[static_cast<size_t>(h.layer * m.cols + h.original_head)] = h.importance;
  for (int64_t l = 0; l < m.rows; ++l) m.row_labels.push_back(std::to_string(l));
  for (int64_t h = 0; h < m.cols; ++h) m.col_labels.push_back(std::to_string(h));
  m.vmin = 0.0;
  m.annotate = true;
  plot::save_heatmap(m, path);
}

void save_pruning_png(const std::string& path, const PruningCurve& c, double stop_below) {
  HL_CHECK(!c.steps.empty(), "save_pruning_png: the curve is empty");
  plot::LineChart ch;
  ch.title = "iterative head pruning (importance recomputed after each step)";
  ch.x_label = "fraction of heads pruned";
  ch.y_label = "score on the evaluation data";
  ch.width = 900;
  ch.height = 560;
  plot::Series acc{"token accuracy", {}, {}}, ex{"exact match", {}, {}}, thr{"stop threshold", {}, {}};
  for (const auto& s : c.steps) {
    acc.x.push_back(s.fraction);
    acc.y.push_back(s.scores.token_accuracy);
    if (s.scores.has_exact_match) {
      ex.x.push_back(s.fraction);
      ex.y.push_back(s.scores.exact_match);
    }
  }
  ch.series.push_back(acc);
  if (!ex.x.empty()) ch.series.push_back(ex);
  if (stop_below > 0) {
    thr.x = {0.0, c.steps.back().fraction > 0 ? c.steps.back().fraction : 1.0};
    thr.y = {stop_below, stop_below};
    ch.series.push_back(thr);
  }
  plot::save_line_chart(ch, path);
}

void save_attention_h5(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens,
                       const std::string& prompt, const std::string& checkpoint) {
  HL_CHECK(static_cast<int64_t>(tokens.size()) == maps.T, "save_attention_h5: ", tokens.size(), " tokens for ", maps.T,
           " positions");
  h5::Writer w(path, "attention file");
  w.set_attr("/", "format", "headlab-attention");
  w.set_attr("/", "checkpoint", checkpoint);
  w.set_attr("/", "prompt", prompt);
  w.set_attr("/", "tokens", nlohmann::json(tokens).dump());
  w.write_f32("weights", {maps.layers, maps.heads, maps.T, maps.T}, maps.weights.data());
  w.set_attr("weights", "dims", "layer, head (original index; NaN where pruned), query, key");
  w.write<int64_t>("token_ids", {maps.T}, maps.ids);
  std::vector<int64_t> kept(static_cast<size_t>(maps.layers * maps.heads), 0);
  for (int64_t l = 0; l < maps.layers; ++l)
    for (int64_t h : maps.kept[static_cast<size_t>(l)]) kept[static_cast<size_t>(l * maps.heads + h)] = 1;
  w.write<int64_t>("kept", {maps.layers, maps.heads}, kept);
  w.commit();
}

void save_attention_png(const std::string& path, const AttentionMaps& maps, const std::vector<std::string>& tokens) {
  HL_CHECK(static_cast<int64_t>(tokens.size()) == maps.T, "save_attention_png: ", tokens.size(), " tokens for ",
           maps.T, " positions");
  std::vector<std::string> labels;
  std::string text;
  for (const auto& t : tokens) {
    labels.push_back(token_label(t));
    text += t;
  }
  plot::HeatmapGrid g;
  g.title = "attention weights: " + token_label(text);
  g.x_label = "key";
  g.y_label = "query";
  g.colorbar_label = "attention weight";
  g.vmin = 0;
  g.vmax = 1;
  size_t cols = 1;
  for (const auto& k : maps.kept) cols = std::max(cols, k.size());
  g.grid_rows = maps.layers;
  g.grid_cols = static_cast<int64_t>(cols);
  const int64_t T = maps.T;
  for (int64_t l = 0; l < maps.layers; ++l) {
    const auto& kept = maps.kept[static_cast<size_t>(l)];
    for (size_t i = 0; i < cols; ++i) {
      plot::Heatmap m;
      m.rows = T;
      m.cols = T;
      m.row_labels = labels;
      m.col_labels = labels;
      if (i < kept.size()) {
        const int64_t h = kept[i];
        m.title = "layer " + std::to_string(l) + " head " + std::to_string(h);
        const float* w = maps.weights.data() + (l * maps.heads + h) * T * T;
        m.values.assign(w, w + T * T);
      } else {  // a pruned model's layer with fewer heads than the widest layer
        m.title = "layer " + std::to_string(l) + " (pruned)";
        m.values.assign(static_cast<size_t>(T * T), kNaN);
      }
      g.panels.push_back(m);
    }
  }
  plot::save_heatmap_grid(g, path);
}

std::string compare_csv(const std::vector<CompareResult>& rows, const CompareOptions& o) {
  std::ostringstream os;
  os << "config,B,T,d_in,d_out,heads,form,params,gflop_forward,gflop_forward_backward,"
        "forward_ms_median,forward_ms_p25,forward_ms_p75,forward_ms_min,forward_ms_max,forward_gflops,"
        "forward_backward_ms_median,forward_backward_ms_p25,forward_backward_ms_p75,forward_backward_ms_min,"
        "forward_backward_ms_max,forward_backward_gflops,peak_forward_bytes,peak_forward_backward_bytes,"
        "max_abs_diff_output,max_abs_diff_input_grad,repeats,device,threads\n";
  for (const auto& r : rows) {
    const auto& c = r.config;
    for (int f = 0; f < 2; ++f) {
      const FormMeasurement& m = f == 0 ? r.wrapper : r.fused;
      const double fb = m.flops_forward + m.flops_backward;
      os << c.name << ',' << c.B << ',' << c.T << ',' << c.d_in << ',' << c.d_out << ',' << c.heads << ','
         << (f == 0 ? "wrapper" : "fused") << ',' << m.params << ',' << num(m.flops_forward / 1e9) << ','
         << num(fb / 1e9) << ',' << num(m.forward.median * 1e3) << ',' << num(m.forward.p25 * 1e3) << ','
         << num(m.forward.p75 * 1e3) << ',' << num(m.forward.min * 1e3) << ',' << num(m.forward.max * 1e3) << ','
         << num(m.flops_forward / m.forward.median / 1e9) << ',' << num(m.forward_backward.median * 1e3) << ','
         << num(m.forward_backward.p25 * 1e3) << ',' << num(m.forward_backward.p75 * 1e3) << ','
         << num(m.forward_backward.min * 1e3) << ',' << num(m.forward_backward.max * 1e3) << ','
         << num(fb / m.forward_backward.median / 1e9) << ',' << m.peak_forward << ',' << m.peak_forward_backward << ','
         << num(r.max_abs_out) << ',' << num(r.max_abs_dx) << ',' << o.repeats << ',' << o.device.str() << ','
         << omp_get_max_threads() << '\n';
    }
  }
  return os.str();
}

namespace {
nlohmann::json time_json(const TimeStats& t) {
  return {{"median_ms", t.median * 1e3}, {"p25_ms", t.p25 * 1e3}, {"p75_ms", t.p75 * 1e3},
          {"min_ms", t.min * 1e3},       {"max_ms", t.max * 1e3}, {"repeats", t.repeats}};
}
}  // namespace

nlohmann::json compare_json(const std::vector<CompareResult>& rows, const CompareOptions& o) {
  nlohmann::json j = {{"device", o.device.str()},
                      {"threads", omp_get_max_threads()},
                      {"warmup", o.warmup},
                      {"repeats", o.repeats},
                      {"seed", o.seed},
                      {"flops", "GEMM FLOPs, 2 per multiply-add; forward_backward = forward + 2 x forward"},
                      {"peak_bytes", "backend peak during the call minus the bytes in use before it"},
                      {"configs", nlohmann::json::array()}};
  for (const auto& r : rows) {
    const auto& c = r.config;
    nlohmann::json e = {{"name", c.name},   {"B", c.B},
                        {"T", c.T},         {"d_in", c.d_in},
                        {"d_out", c.d_out}, {"heads", c.heads},
                        {"max_abs_diff_output", r.max_abs_out}, {"max_abs_diff_input_grad", r.max_abs_dx}};
    for (int f = 0; f < 2; ++f) {
      const FormMeasurement& m = f == 0 ? r.wrapper : r.fused;
      const double fb = m.flops_forward + m.flops_backward;
      e[f == 0 ? "wrapper" : "fused"] = {{"params", m.params},
                                         {"gflop_forward", m.flops_forward / 1e9},
                                         {"gflop_forward_backward", fb / 1e9},
                                         {"forward", time_json(m.forward)},
                                         {"forward_backward", time_json(m.forward_backward)},
                                         {"forward_gflops", m.flops_forward / m.forward.median / 1e9},
                                         {"forward_backward_gflops", fb / m.forward_backward.median / 1e9},
                                         {"peak_forward_bytes", m.peak_forward},
                                         {"peak_forward_backward_bytes", m.peak_forward_backward}};
    }
    j["configs"].push_back(e);
  }
  return j;
}

void save_compare_png(const std::string& path, const std::vector<CompareResult>& rows, const std::string& x_choice,
                      const Device& device) {
  HL_CHECK(!rows.empty(), "save_compare_png: nothing to draw");
  using Key = std::array<int64_t, 4>;  // heads, tokens, d_out, batch
  auto key = [](const CompareConfig& c) { return Key{c.heads, c.T, c.d_out, c.B}; };
  const char* dim_names[] = {"heads", "tokens", "emb dim (d_out)", "batch"};
  const char* short_names[] = {"H", "T", "d", "B"};
  size_t xd = 0;
  if (x_choice == "auto") {
    size_t best = 0;
    for (size_t d = 0; d < 4; ++d) {
      std::set<int64_t> vals;
      for (const auto& r : rows) vals.insert(key(r.config)[d]);
      if (vals.size() > best) best = vals.size(), xd = d;
    }
  } else {
    const std::map<std::string, size_t> dims = {{"heads", 0}, {"tokens", 1}, {"emb", 2}, {"batch", 3}};
    HL_CHECK(dims.count(x_choice), "save_compare_png: x must be auto, heads, tokens, emb or batch, got '", x_choice, "'");
    xd = dims.at(x_choice);
  }
  // One set of lines per combination of the other dimensions.
  std::map<Key, std::vector<const CompareResult*>> groups;
  for (const auto& r : rows) {
    Key k = key(r.config);
    k[xd] = 0;
    groups[k].push_back(&r);
  }
  plot::LineChart ch;
  ch.x_label = dim_names[xd];
  ch.y_label = "time per call, ms (median)";
  ch.log_x = true;
  ch.log_y = true;
  ch.width = 1000;
  ch.height = 640;
  std::ostringstream title;
  title << "wrapper vs fused attention (" << device.str() << "): time against " << dim_names[xd];
  if (groups.size() == 1) {
    const Key k = groups.begin()->first;
    title << " (";
    bool first = true;
    for (size_t d = 0; d < 4; ++d)
      if (d != xd) {
        title << (first ? "" : ", ") << short_names[d] << "=" << k[d];
        first = false;
      }
    title << ")";
  }
  ch.title = title.str();
  for (const auto& [k, members] : groups) {
    std::vector<const CompareResult*> sorted = members;
    std::sort(sorted.begin(), sorted.end(), [&](auto* a, auto* b) { return key(a->config)[xd] < key(b->config)[xd]; });
    std::string suffix;
    if (groups.size() > 1)
      for (size_t d = 0; d < 4; ++d)
        if (d != xd) suffix.append(" ").append(short_names[d]).append(std::to_string(k[d]));
    for (int form = 0; form < 2; ++form)
      for (int pass = 0; pass < 2; ++pass) {
        plot::Series s;
        s.name = std::string(form == 0 ? "wrapper" : "fused") + (pass == 0 ? " forward" : " fwd+bwd") + suffix;
        for (const CompareResult* r : sorted) {
          const FormMeasurement& m = form == 0 ? r->wrapper : r->fused;
          s.x.push_back(static_cast<double>(key(r->config)[xd]));
          s.y.push_back((pass == 0 ? m.forward.median : m.forward_backward.median) * 1e3);
        }
        ch.series.push_back(s);
      }
  }
  plot::save_line_chart(ch, path);
}

}  // namespace headlab::train
