// Iterative head pruning by gradient importance or measured ablation, and the head sets it leaves.
#include "analysis/pruning.h"

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

using namespace detail;

// ---- pruning ----
Criterion resolve_criterion(Criterion c, int64_t total_heads) {
  if (c != Criterion::automatic) return c;
  return total_heads <= kAblationCriterionMaxHeads ? Criterion::ablation : Criterion::gradient;
}

namespace {

// Scores with each of `heads` masked on top of `gates`: one batched pass for a decoder, a pass per head otherwise.
std::vector<Scores> zero_each(nn::Model& model, const EvalSet& data, const HeadMatrix& gates,
                              const std::vector<HeadIntervention>& heads) {
  if (auto* decoder = model.as_decoder()) {
    InterventionOptions io;
    io.base_gates = gates;
    return evaluate_interventions(*decoder, data, heads, io);
  }
  std::vector<Scores> out;
  for (const HeadIntervention& iv : heads) {
    HeadMatrix g = gates;
    g[static_cast<size_t>(iv.layer)][static_cast<size_t>(iv.head)] = 0;
    out.push_back(evaluate_heads(model, data, g));
  }
  return out;
}

}  // namespace

PruningCurve iterative_pruning(nn::Model& model, const EvalSet& data, const PruneOptions& o) {
  HL_CHECK(o.step_fraction > 0 && o.step_fraction <= 1, "iterative_pruning: step_fraction must be in (0, 1], got ",
           o.step_fraction);
  PruningCurve c;
  c.metric = o.metric;
  HeadMatrix gates = head_matrix(model, 1.0);
  c.total_heads = count_heads(gates);
  c.criterion = resolve_criterion(o.criterion, c.total_heads);
  if (c.criterion == Criterion::l0) check_matrix("iterative_pruning (l0_rank)", model, o.l0_rank);
  HL_CHECK(c.criterion != Criterion::l0 || !o.l0_rank.empty(), "iterative_pruning: the l0 criterion needs l0_rank");
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
    // (importance, tie-breaker, layer, head): least important first
    std::vector<std::tuple<double, double, int64_t, int64_t>> cand;
    std::vector<HeadIntervention> open;  // the heads that may go next
    for (size_t l = 0; l < gates.size(); ++l)
      for (size_t h = 0; h < gates[l].size(); ++h)
        if (gates[l][h] != 0 && active[l] > 1) open.push_back({static_cast<int64_t>(l), static_cast<int64_t>(h)});
    if (c.criterion == Criterion::l0) {
      for (const HeadIntervention& iv : open)
        cand.emplace_back(o.l0_rank[static_cast<size_t>(iv.layer)][static_cast<size_t>(iv.head)], 0.0, iv.layer,
                          iv.head);
    } else if (c.criterion == Criterion::gradient) {
      const Importance imp = head_importance(model, data, gates);
      for (const HeadIntervention& iv : open)
        cand.emplace_back(imp.normalized[static_cast<size_t>(iv.layer)][static_cast<size_t>(iv.head)], 0.0, iv.layer,
                          iv.head);
    } else if (!open.empty()) {  // what masking each head too costs: metric lost, then loss gained
      const std::vector<Scores> s = zero_each(model, data, gates, open);
      const Scores& now = c.steps.back().scores;
      for (size_t i = 0; i < open.size(); ++i)
        cand.emplace_back(metric_value(now, o.metric) - metric_value(s[i], o.metric), s[i].loss - now.loss,
                          open[i].layer, open[i].head);
    }
    if (cand.empty()) break;
    std::sort(cand.begin(), cand.end());
    const int64_t want =
        std::max<int64_t>(1, static_cast<int64_t>(std::floor(o.step_fraction * static_cast<double>(remaining) + 0.5)));
    PruneStep step;
    for (const auto& [score, tie, l, h] : cand) {
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

std::vector<std::pair<int64_t, int64_t>> free_heads(const AblationResult& a, Metric metric) {
  std::map<int64_t, int64_t> heads_in_layer;
  for (const HeadAblation& h : a.heads) ++heads_in_layer[h.layer];
  std::vector<std::tuple<double, double, int64_t, int64_t>> cheap;  // (metric lost, loss gained, layer, head)
  for (const HeadAblation& h : a.heads) {
    const double lost = metric_value(a.base, metric) - metric_value(h.zero, metric), gained = h.zero.loss - a.base.loss;
    if (lost <= kFreeHeadCost && gained <= kFreeHeadCost) cheap.emplace_back(lost, gained, h.layer, h.head);
  }
  std::sort(cheap.begin(), cheap.end());
  std::map<int64_t, int64_t> taken;
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& [lost, gained, l, h] : cheap)
    if (taken[l] + 1 < heads_in_layer[l]) {
      ++taken[l];
      out.emplace_back(l, h);
    }
  return out;
}

std::vector<std::vector<int64_t>> kept_after(const nn::Model& model,
                                             const std::vector<std::pair<int64_t, int64_t>>& order, int64_t k) {
  HL_CHECK(k >= 0 && k <= static_cast<int64_t>(order.size()), "kept_after: cannot remove ", k,
           " heads; the order lists ", order.size());
  std::set<std::pair<int64_t, int64_t>> removed(order.begin(), order.begin() + k);
  std::vector<std::vector<int64_t>> keep(static_cast<size_t>(model.attention_count()));
  for (int64_t l = 0; l < model.attention_count(); ++l)
    for (int64_t h = 0; h < model.heads_at(l); ++h)
      if (!removed.count({l, h})) keep[static_cast<size_t>(l)].push_back(h);
  return keep;
}

std::vector<std::vector<int64_t>> whole_kv_groups(const nn::Model& model, std::vector<std::vector<int64_t>> keep) {
  const auto* decoder = model.as_decoder();
  if (!decoder) return keep;
  for (size_t l = 0; l < keep.size(); ++l) {
    const nn::CausalMultiHead& att = decoder->attention(static_cast<int64_t>(l));
    const int64_t H = att.head_count(), Hkv = att.kv_head_count();
    if (Hkv == 0 || Hkv == H) continue;
    const int64_t G = H / Hkv;
    std::set<int64_t> groups;
    for (int64_t h : keep[l]) groups.insert(h / G);
    keep[l].clear();
    for (int64_t g : groups)
      for (int64_t h = g * G; h < (g + 1) * G; ++h) keep[l].push_back(h);
  }
  return keep;
}

HeadMatrix gates_keeping(const nn::Model& model, const std::vector<std::vector<int64_t>>& keep) {
  HeadMatrix g = head_matrix(model, 0.0);
  HL_CHECK(keep.size() == g.size(), "gates_keeping: keep lists ", keep.size(), " layers, the model has ", g.size());
  for (size_t l = 0; l < keep.size(); ++l)
    for (int64_t h : keep[l]) {
      HL_CHECK(h >= 0 && h < static_cast<int64_t>(g[l].size()), "gates_keeping: layer ", l, " has no head ", h);
      g[l][static_cast<size_t>(h)] = 1.0;
    }
  return g;
}

std::vector<BestHeadOnly> best_head_only(nn::Model& model, const EvalSet& data, Metric metric) {
  std::vector<BestHeadOnly> out;
  for (int64_t l = 0; l < model.attention_count(); ++l) {
    BestHeadOnly best;
    best.layer = l;
    for (int64_t h = 0; h < model.heads_at(l); ++h) {
      HeadMatrix gates = head_matrix(model, 1.0);
      std::fill(gates[static_cast<size_t>(l)].begin(), gates[static_cast<size_t>(l)].end(), 0.0);
      gates[static_cast<size_t>(l)][static_cast<size_t>(h)] = 1.0;
      const Scores s = evaluate_heads(model, data, gates);
      const double m = metric_value(s, metric), m_best = h == 0 ? m : metric_value(best.scores, metric);
      if (h == 0 || m > m_best || (m == m_best && s.loss < best.scores.loss)) {
        best.best_head = h;
        best.scores = s;
      }
    }
    out.push_back(best);
  }
  return out;
}

int64_t prune_count_for_metric(const PruningCurve& curve, double target) {
  int64_t n = 0;
  for (const PruneStep& s : curve.steps) {
    if (metric_value(s.scores, curve.metric) < target) break;
    n = s.pruned;
  }
  return n;
}

}  // namespace headlab::analysis
