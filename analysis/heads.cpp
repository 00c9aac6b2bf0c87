// Head interventions on models (the batched engine on decoders): scores with gates and offsets, mean contexts, the
// gate-gradient importance of Michel et al. (2019), and zero/mean ablation of every head.
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

void check_matrix(const char* who, const nn::Model& m, const HeadMatrix& gates) {
  if (gates.empty()) return;
  HL_CHECK(static_cast<int64_t>(gates.size()) == m.attention_count(), who, ": gates list ", gates.size(),
           " layers, the model has ", m.attention_count());
  for (int64_t l = 0; l < m.attention_count(); ++l)
    HL_CHECK(static_cast<int64_t>(gates[static_cast<size_t>(l)].size()) == m.heads_at(l), who, ": gates of layer ", l,
             " list ", gates[static_cast<size_t>(l)].size(), " heads, the layer has ", m.heads_at(l), " (",
             m.attention_label(l), ")");
}

void set_controls(nn::Model& m, const HeadMatrix& gates, const std::vector<Tensor>& offsets) {
  const DType dt = model_dtype(m);
  const Device dev = m.device();
  for (int64_t l = 0; l < m.attention_count(); ++l) {
    nn::HeadControl& hc = m.head_control(l);
    hc.keep_context = false;
    hc.context = Tensor();
    hc.given_context = Tensor();
    hc.gates = gates.empty() ? Tensor() : tensor(gates[static_cast<size_t>(l)], {m.heads_at(l)}).to(dt).to(dev);
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

namespace {

void check_exact_match(bool has_exact_match, Metric m) {
  HL_CHECK(m != Metric::exact_match || has_exact_match,
           "analysis: exact match does not apply to this data (chars); use token_accuracy");
}

}  // namespace

void check_metric(const EvalSet& data, Metric m) { check_exact_match(data.has_exact_match, m); }

double metric_value(const Scores& s, Metric m) {
  check_exact_match(s.has_exact_match, m);
  return m == Metric::exact_match ? s.exact_match : s.token_accuracy;
}

Metric default_metric(const EvalSet& data) {
  return data.has_exact_match ? Metric::exact_match : Metric::token_accuracy;
}

HeadMatrix head_matrix(const nn::Model& model, double fill) {
  HeadMatrix m;
  for (int64_t l = 0; l < model.attention_count(); ++l) m.emplace_back(static_cast<size_t>(model.heads_at(l)), fill);
  return m;
}

int64_t count_heads(const HeadMatrix& m) {
  int64_t n = 0;
  for (const auto& row : m) n += static_cast<int64_t>(row.size());
  return n;
}

Scores evaluate_heads(nn::Model& model, const EvalSet& data, const HeadMatrix& gates,
                      const std::vector<Tensor>& offsets) {
  check_matrix("evaluate_heads", model, gates);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, gates, offsets);
  return train::evaluate(model, data.batches);
}

std::vector<Tensor> mean_head_contexts(nn::Model& model, const EvalSet& data) {
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  const int64_t L = model.attention_count();
  std::vector<Tensor> sums(static_cast<size_t>(L));
  std::vector<int64_t> counts(static_cast<size_t>(L), 0);  // positions per module (the encoder's are source positions)
  for (int64_t l = 0; l < L; ++l) model.head_control(l).keep_context = true;
  NoGradGuard no_grad;
  for (const Batch& b : data.batches) {
    model.logits(train::model_inputs(b, model.device()));
    for (int64_t l = 0; l < L; ++l) {
      const Tensor ctx = model.head_control(l).context;  // (B, H, T, D)
      const Tensor s = ctx.to(DType::f64).sum({0, 2});   // (H, D)
      Tensor& acc = sums[static_cast<size_t>(l)];
      acc = acc.defined() ? add(acc, s) : s;
      counts[static_cast<size_t>(l)] += ctx.size(0) * ctx.size(2);
    }
  }
  const DType dt = model_dtype(model);
  for (int64_t l = 0; l < L; ++l)
    sums[static_cast<size_t>(l)] =
        mul(sums[static_cast<size_t>(l)], 1.0 / static_cast<double>(counts[static_cast<size_t>(l)])).to(dt);
  return sums;
}

Importance head_importance(nn::Model& model, const EvalSet& data, const HeadMatrix& gates_in) {
  check_matrix("head_importance", model, gates_in);
  const HeadMatrix gates = gates_in.empty() ? head_matrix(model, 1.0) : gates_in;
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  const int64_t L = model.attention_count();
  const DType dt = model_dtype(model);
  const Device dev = model.device();
  std::vector<Tensor> leaves;
  for (int64_t l = 0; l < L; ++l) {
    Tensor g = tensor(gates[static_cast<size_t>(l)], {model.heads_at(l)}).to(dt).to(dev);
    g.requires_grad_(true);
    model.head_control(l).gates = g;
    leaves.push_back(g);
  }
  Importance imp;
  imp.raw = head_matrix(model, 0.0);
  int64_t n = 0;
  for (const Batch& b : data.batches) {
    const Tensor tgt = batch_tensors(b, dev).second;
    if (std::all_of(b.targets.begin(), b.targets.end(), [](int64_t t) { return t == kIgnoreIndex; })) continue;
    const Tensor logits = model.logits(train::model_inputs(b, dev));  // (B, T, V)
    const Tensor loss = cross_entropy(logits.reshape({-1, logits.size(-1)}), tgt.reshape({-1}), kIgnoreIndex);
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
    for (size_t h = 0; h < imp.raw[l].size(); ++h)
      imp.normalized[l][h] = gates[l][h] != 0 ? imp.raw[l][h] / norm : kNaN;
  }
  return imp;
}

std::vector<Batch> rotated_rows(const EvalSet& data) {
  std::vector<Batch> out = data.batches;
  for (Batch& b : out) {
    auto rotate = [&](std::vector<int64_t>& v, int64_t width) {
      if (!v.empty()) std::rotate(v.begin(), v.begin() + width, v.end());
    };
    rotate(b.inputs, b.T);
    rotate(b.targets, b.T);
    rotate(b.answer_begin, 1);
    rotate(b.answer_end, 1);
    rotate(b.source, b.S);
    rotate(b.source_valid_lens, 1);
  }
  return out;
}

namespace {

// Copies per forward so that the largest activation of a chunk, rows x T x max(4 emb, V, H T)
// elements, stays near 16M (64 MB in float32).
int64_t copies_per_forward(const nn::DecoderModel& m, int64_t B, int64_t T) {
  const nn::DecoderShape& c = m.shape();
  int64_t heads = 0;
  for (int64_t l = 0; l < m.n_layers(); ++l) heads = std::max(heads, m.attention(l).head_count());
  const int64_t per_row = T * std::max({4 * c.d_model, c.out_vocab_size, heads * T});
  return std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, B * per_row));
}

void check_interventions(const nn::DecoderModel& m, const EvalSet& data, const std::vector<HeadIntervention>& list,
                         const InterventionOptions& o) {
  const char* who = "evaluate_interventions";
  check_matrix(who, m, o.base_gates);
  HL_CHECK(!data.batches.empty(), who, ": the evaluation data has no batches");
  bool patch = false;
  for (const HeadIntervention& iv : list) {
    if (iv.layer == -1) continue;
    HL_CHECK(iv.layer >= 0 && iv.layer < m.n_layers(), who, ": layer ", iv.layer, " is out of range for ", m.n_layers(),
             " layers");
    HL_CHECK(iv.head >= 0 && iv.head < m.attention(iv.layer).head_count(), who, ": layer ", iv.layer, " has no head ",
             iv.head, " (it has ", m.attention(iv.layer).head_count(), ")");
    HL_CHECK(iv.position >= -1 && iv.position < data.batches.front().T, who, ": position ", iv.position,
             " is out of range for ", data.batches.front().T, " tokens");
    patch = patch || iv.kind == Ablation::patch;
  }
  if (!patch) return;
  HL_CHECK(o.source && o.source->size() == data.batches.size(), who, ": patching needs a source batch per data batch (",
           data.batches.size(), "), got ", o.source ? o.source->size() : 0);
  for (size_t i = 0; i < data.batches.size(); ++i)
    HL_CHECK((*o.source)[i].B == data.batches[i].B && (*o.source)[i].T == data.batches[i].T, who, ": source batch ", i,
             " is ", (*o.source)[i].B, " x ", (*o.source)[i].T, ", the data batch ", data.batches[i].B, " x ",
             data.batches[i].T);
}

// One run under the base gates: every layer's input x_l (B, T, C) and head contexts (B, H_l, T, D),
// and the logits (B, T, V).
struct Recorded {
  std::vector<Tensor> inputs, contexts;
  Tensor last;  // the residual stream after the last block (B, T, C)
};
Recorded record(nn::DecoderModel& m, const HeadMatrix& base_gates, const Tensor& idx) {
  set_controls(m, base_gates, {});
  Recorded r;
  Tensor x = m.embed(idx);
  for (int64_t l = 0; l < m.n_layers(); ++l) {
    nn::HeadControl& hc = m.attention(l).control();
    hc.keep_context = true;
    r.inputs.push_back(x);
    x = m.run_blocks(x, l, l + 1);
    r.contexts.push_back(hc.context);
    hc.keep_context = false;
    hc.context = Tensor();
  }
  r.last = x;
  return r;
}

// Scores x, the residual stream after the last block (B, T, C), into sum a few rows at a time, so that
// a large vocabulary's logits are never whole (GPT-2's for 8 x 128 tokens: 200 MB, and as much again
// inside the loss).
void add_scores(nn::DecoderModel& m, const Batch& b, const Tensor& x, const Tensor& targets, train::ScoreSum& sum) {
  constexpr int64_t kLogits = int64_t{1} << 23;  // per chunk: 32 MB of float32
  const int64_t rows = std::max<int64_t>(1, kLogits / (b.T * m.shape().out_vocab_size));
  if (rows >= b.B) return sum.add(b, m.unembed(x), targets);
  for (int64_t r0 = 0; r0 < b.B; r0 += rows) {
    const int64_t n = std::min(rows, b.B - r0);
    sum.add(b.rows(r0, n), m.unembed(x.narrow(0, r0, n)), targets.narrow(0, r0, n));
  }
}

// t (B, ...) repeated c times along a new leading axis, flattened: (c*B, ...).
Tensor repeat_rows(const Tensor& t, int64_t c) {
  Shape shape = t.shape(), expanded = t.shape();
  expanded.insert(expanded.begin(), c);
  shape[0] *= c;
  return t.unsqueeze(0).expand(expanded).reshape(shape);
}

}  // namespace

std::vector<Scores> evaluate_interventions(nn::DecoderModel& model, const EvalSet& data,
                                           const std::vector<HeadIntervention>& list, const InterventionOptions& o) {
  check_interventions(model, data, list, o);
  ControlGuard guard(model);
  model.eval();
  NoGradGuard no_grad;
  const int64_t L = model.n_layers();
  const DType dt = model_dtype(model);
  const Device dev = model.device();
  const HeadMatrix base = o.base_gates.empty() ? head_matrix(model, 1.0) : o.base_gates;
  auto uses = [&](Ablation kind) {
    return std::any_of(list.begin(), list.end(), [&](auto& iv) { return iv.layer >= 0 && iv.kind == kind; });
  };
  const std::vector<Tensor> means = uses(Ablation::mean) && o.means.empty() ? mean_head_contexts(model, data) : o.means;
  // Interventions by layer: the copies of layer l start from the recorded input of layer l and
  // its recorded contexts, so only the output projection onwards is recomputed.
  std::vector<std::vector<size_t>> by_layer(static_cast<size_t>(L));
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].layer >= 0) by_layer[static_cast<size_t>(list[i].layer)].push_back(i);
  std::vector<train::ScoreSum> sums(list.size());
  for (size_t bi = 0; bi < data.batches.size(); ++bi) {
    const Batch& b = data.batches[bi];
    const int64_t B = b.B, T = b.T;
    auto [idx, tgt] = batch_tensors(b, dev);
    const Recorded clean = record(model, base, idx);
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].layer < 0) add_scores(model, b, clean.last, tgt, sums[i]);
    const Recorded source =
        uses(Ablation::patch) ? record(model, base, batch_tensors((*o.source)[bi], dev).first) : Recorded{};
    const int64_t chunk = o.max_copies > 0 ? o.max_copies : copies_per_forward(model, B, T);
    for (int64_t l = 0; l < L; ++l) {
      const std::vector<size_t>& ids = by_layer[static_cast<size_t>(l)];
      const int64_t n = static_cast<int64_t>(ids.size()), H = model.attention(l).head_count(),
                    D = model.attention(l).head_size();
      for (int64_t first = 0; first < n; first += chunk) {
        const int64_t c = std::min(chunk, n - first);
        // Copy k's rows [k*B, (k+1)*B): gates (c*B, H, T) from the base gates, 0 where intervened;
        // offsets (c*B, H, T, D) where a copy needs them.
        std::vector<double> gates(static_cast<size_t>(c * B * H * T));
        for (int64_t r = 0; r < c * B; ++r)
          for (int64_t h = 0; h < H; ++h)
            std::fill_n(gates.begin() + (r * H + h) * T, T, base[static_cast<size_t>(l)][static_cast<size_t>(h)]);
        Tensor offsets;
        for (int64_t k = 0; k < c; ++k) {
          const HeadIntervention& iv = list[ids[static_cast<size_t>(first + k)]];
          const int64_t t0 = iv.position < 0 ? 0 : iv.position, nt = iv.position < 0 ? T : 1;
          for (int64_t r = k * B; r < (k + 1) * B; ++r)
            std::fill_n(gates.begin() + (r * H + iv.head) * T + t0, nt, 0.0);
          if (iv.kind == Ablation::zero) continue;
          if (!offsets.defined()) offsets = zeros({c * B, H, T, D}, dt, dev);
          Tensor dst = offsets.narrow(0, k * B, B).select(1, iv.head).narrow(1, t0, nt);  // (B, nt, D)
          if (iv.kind == Ablation::mean)
            dst.copy_(means[static_cast<size_t>(l)].select(0, iv.head).to(dt).view({1, 1, D}).expand({B, nt, D}));
          else
            dst.copy_(source.contexts[static_cast<size_t>(l)].select(1, iv.head).narrow(1, t0, nt));
        }
        nn::HeadControl& hc = model.attention(l).control();
        const nn::HeadControl saved = hc;
        hc.gates = tensor(gates, {c * B, H, T}).to(dt).to(dev);
        hc.offsets = offsets;
        hc.given_context = repeat_rows(clean.contexts[static_cast<size_t>(l)], c);
        Tensor x = model.run_blocks(repeat_rows(clean.inputs[static_cast<size_t>(l)], c), l, l + 1);
        hc = saved;
        x = model.run_blocks(x, l + 1, L);
        for (int64_t k = 0; k < c; ++k)  // copy k's rows
          add_scores(model, b, x.narrow(0, k * B, B), tgt, sums[ids[static_cast<size_t>(first + k)]]);
      }
    }
  }
  std::vector<Scores> out;
  for (const train::ScoreSum& s : sums) out.push_back(s.scores());
  return out;
}

namespace {

// Per-head passes for models without the batched engine (the encoder-decoder): zero and mean
// ablation through gates and offsets; resample needs per-row contexts of another batch and is left NaN.
std::vector<Scores> ablate_one_by_one(nn::Model& model, const EvalSet& data) {
  const std::vector<Tensor> means = mean_head_contexts(model, data);
  std::vector<Scores> out = {evaluate_heads(model, data)};
  for (int64_t l = 0; l < model.attention_count(); ++l)
    for (int64_t h = 0; h < model.heads_at(l); ++h) {
      HeadMatrix gates = head_matrix(model, 1.0);
      gates[static_cast<size_t>(l)][static_cast<size_t>(h)] = 0;
      out.push_back(evaluate_heads(model, data, gates));
      std::vector<Tensor> offsets(static_cast<size_t>(model.attention_count()));
      Tensor o = zeros_like(means[static_cast<size_t>(l)]);  // (H, D): the head's mean context, 0 elsewhere
      o.select(0, h).copy_(means[static_cast<size_t>(l)].select(0, h));
      offsets[static_cast<size_t>(l)] = o;
      out.push_back(evaluate_heads(model, data, gates, offsets));
      out.emplace_back();  // resample: not computed
    }
  return out;
}

}  // namespace

AblationResult ablate_heads(nn::Model& model, const EvalSet& data) {
  AblationResult r;
  r.importance = head_importance(model, data);
  std::vector<HeadIntervention> list = {HeadIntervention{}};  // the unablated model first
  for (int64_t l = 0; l < model.attention_count(); ++l)
    for (int64_t h = 0; h < model.heads_at(l); ++h)
      for (Ablation kind : {Ablation::zero, Ablation::mean, Ablation::patch}) list.push_back({l, h, kind, -1});
  std::vector<Scores> s;
  if (auto* decoder = model.as_decoder()) {
    const std::vector<Batch> others = rotated_rows(data);
    InterventionOptions o;
    o.source = &others;
    s = evaluate_interventions(*decoder, data, list, o);
  } else {
    s = ablate_one_by_one(model, data);
  }
  r.base = s[0];
  for (size_t i = 1; i < list.size(); i += 3) {
    HeadAblation a;
    a.layer = list[i].layer;
    a.head = list[i].head;
    a.original_head = model.original_head(a.layer, a.head);
    a.importance = r.importance.normalized[static_cast<size_t>(a.layer)][static_cast<size_t>(a.head)];
    a.importance_raw = r.importance.raw[static_cast<size_t>(a.layer)][static_cast<size_t>(a.head)];
    a.zero = s[i];
    a.mean = s[i + 1];
    a.resample = s[i + 2];
    r.heads.push_back(a);
  }
  return r;
}

double max_logit_difference(nn::Model& a, const HeadMatrix& gates_a, nn::Model& b, const EvalSet& data) {
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
    const Tensor la = a.logits(train::model_inputs(batch, a.device()));
    const Tensor lb = b.logits(train::model_inputs(batch, b.device()));
    const Tensor diff = sub(la.to(kCPU).to(DType::f64), lb.to(kCPU).to(DType::f64));
    worst = std::max(worst, amax(abs(diff)).item<double>());
  }
  return worst;
}

}  // namespace headlab::analysis
