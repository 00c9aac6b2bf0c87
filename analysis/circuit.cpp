// Path patching, activation patching and ablation of nodes, edge attribution patching and circuit
// discovery (analysis/circuit.h), on the patcher's forward (circuit_patcher.cpp; its stored runs:
// circuit_runs.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <numeric>

#include "analysis/circuit_internal.h"

namespace headlab::analysis {

namespace {

using Input = CircuitGraph::Input;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

// ---- path patching ----
std::vector<double> path_patching(CircuitPatcher& patcher, const std::vector<int64_t>& senders,
                                  const std::vector<int64_t>& receivers) {
  const CircuitGraph& g = patcher.graph();
  HL_CHECK(!receivers.empty(), "path_patching: no receivers");
  std::vector<EdgePatch> patches;
  for (int64_t s : senders) {
    HL_CHECK(s >= 0 && s < g.node_count(), "path_patching: no node ", s);
    EdgePatch& p = patches.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
    for (int64_t r : receivers) {
      HL_CHECK(r >= 0 && r < static_cast<int64_t>(g.receivers().size()), "path_patching: no receiver ", r);
      const int64_t e = g.edge(s, r);
      if (e >= 0) p[static_cast<size_t>(e)] = 1.0;
    }
  }
  return patcher.metric(patches);
}

// ---- activation patching, both ways; ablation; direct logit attribution ----
ActivationPatching activation_patching(CircuitPatcher& patcher, const std::vector<int64_t>& nodes, bool by_position) {
  const CircuitGraph& g = patcher.graph();
  std::vector<int64_t> every_receiver(g.receivers().size());
  std::iota(every_receiver.begin(), every_receiver.end(), 0);
  ActivationPatching r;
  r.noising = path_patching(patcher, nodes, every_receiver);
  // Denoising n: every edge from a node before n carries its corrupted output, n gives its clean one, and
  // every node after n computes from what it then reads: the corrupted run with n restored. Noising n
  // at one position: the clean run with n's corrupted output there.
  const int64_t T = by_position ? patcher.positions() : 0;
  std::vector<EdgePatch> patches;
  std::vector<Replace> replaced;
  const EdgePatch none(static_cast<size_t>(g.edge_count()), 0.0);
  for (int64_t n : nodes) {
    EdgePatch p = none;
    for (int64_t e = 0; e < g.edge_count(); ++e)
      if (g.edge_sender(e) < n) p[static_cast<size_t>(e)] = 1.0;
    for (int64_t t = -1; t < T; ++t) {  // every position, then each alone
      patches.push_back(p);
      replaced.push_back({n, t, Replace::Value::clean});
    }
    for (int64_t t = 0; t < T; ++t) {
      patches.push_back(none);
      replaced.push_back({n, t, Replace::Value::corrupt});
    }
  }
  const std::vector<double> m = patcher.metric(patches, replaced);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto first = m.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(2 * T + 1));
    r.denoising.push_back(*first);
    if (!by_position) continue;
    r.denoising_by_position.emplace_back(first + 1, first + 1 + T);
    r.noising_by_position.emplace_back(first + 1 + T, first + 1 + 2 * T);
  }
  return r;
}

KeyValuePatching key_value_patching(CircuitPatcher& patcher) {
  const CircuitGraph& g = patcher.graph();
  KeyValuePatching r;
  std::vector<EdgePatch> patches;
  for (int64_t k = 0; k < static_cast<int64_t>(g.receivers().size()); ++k) {
    const CircuitGraph::Receiver& rk = g.receivers()[static_cast<size_t>(k)];
    if (rk.input != CircuitGraph::Input::k) continue;
    const std::string group = g.receiving_name(k);
    const int64_t v = g.parse_receivers(group + ".v", "key_value_patching").front();
    EdgePatch& p = patches.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
    for (int64_t receiver : {k, v}) {
      const CircuitGraph::Receiver& rc = g.receivers()[static_cast<size_t>(receiver)];
      std::fill_n(p.begin() + rc.first_edge, rc.senders, 1.0);
    }
    r.groups.push_back(group);
    r.heads.push_back(g.nodes_of_receiver(k));
  }
  r.noising = patcher.metric(patches);
  return r;
}

NodeAblation ablate_nodes(CircuitPatcher& patcher, const std::vector<int64_t>& nodes) {
  const EdgePatch none(static_cast<size_t>(patcher.graph().edge_count()), 0.0);
  std::vector<Replace> replaced;
  for (int64_t n : nodes)
    for (Replace::Value with : {Replace::Value::zero, Replace::Value::mean}) replaced.push_back({n, -1, with});
  const std::vector<double> m = patcher.metric(std::vector<EdgePatch>(replaced.size(), none), replaced);
  NodeAblation r;
  for (size_t i = 0; i < nodes.size(); ++i) r.zero.push_back(m[2 * i]), r.mean.push_back(m[2 * i + 1]);
  return r;
}

// ---- edge attribution patching ----
EdgeAttribution edge_attribution(nn::DecoderModel& model, const PromptPairs& pairs, int64_t ig_steps,
                                 const CircuitOptions& options) {
  check_pairs(model, pairs, "edge_attribution");
  HL_CHECK(ig_steps >= 0 && ig_steps <= 1000, "edge_attribution: ig_steps must be in [0, 1000], got ", ig_steps);
  const auto t0 = Clock::now();
  CircuitPatcher::Impl s(model, options);
  const CircuitGraph& g = s.graph;
  EdgeAttribution r;
  std::vector<double> raw(static_cast<size_t>(g.edge_count()), 0.0);  // sum over rows of d(logit difference)
  const int64_t step = CircuitPatcher::Impl::even_chunks(pairs.rows(), s.chunk_rows(pairs.T, true)),
                steps = std::max<int64_t>(ig_steps, 1);
  r.baseline.clean.assign(static_cast<size_t>(pairs.rows()), 0.0);
  r.baseline.corrupt.assign(static_cast<size_t>(pairs.rows()), 0.0);
  for (int64_t first = 0, chunk = 0; first < pairs.rows(); first += step, ++chunk) {
    if (chunk % s.comm->size() != s.comm->rank()) continue;  // another rank's chunk
    const Chunk c = s.make_chunk(pairs, first, std::min(step, pairs.rows() - first));
    std::copy(c.clean_ld.begin(), c.clean_ld.end(), r.baseline.clean.begin() + first);
    std::copy(c.corrupt_ld.begin(), c.corrupt_ld.end(), r.baseline.corrupt.begin() + first);
    for (int64_t k = 1; k <= steps; ++k) {
      std::vector<CircuitPatcher::Impl::Probe> probes(g.groups().size());
      CircuitPatcher::Impl::Pass p;
      p.probes = &probes;
      if (ig_steps > 0) {  // the stream entering layer 0 on the line from the corrupted embeddings to the clean
        const double alpha = static_cast<double>(k) / static_cast<double>(steps);
        p.start = sub(c.clean_resid[0], mul(c.delta.select(0, 0).reshape({c.B, c.T, s.C}), 1.0 - alpha));
      }
      const Tensor total = s.forward(c, p).sum();
      std::vector<Tensor> leaves;  // every group's, in order
      for (const CircuitPatcher::Impl::Probe& pr : probes)
        for (const Tensor* t : {&pr.input, &pr.q, &pr.k, &pr.v})
          if (t->defined()) leaves.push_back(*t);
      const std::vector<Tensor> gs = grad({total}, leaves);
      auto next = gs.begin();
      for (size_t gi = 0; gi < g.groups().size(); ++gi) {
        const CircuitPatcher::Impl::Probe& pr = probes[gi];
        const std::vector<Tensor> mine(next, next + (pr.input.defined() ? 1 : 3));
        next += static_cast<std::ptrdiff_t>(mine.size());
        const Tensor dm = s.receiver_gradients(gi, pr, mine);  // (R, width): d(sum of the rows' metric)/d(input)
        const NoGradGuard no_grad;
        const CircuitGraph::Group& grp = g.groups()[gi];
        const Tensor& stored = grp.input == Input::logits ? c.delta_last : c.delta;
        // patching s -> r moves x_r by -delta_s: effect ~ -(dm/dx_r) . delta_s, (R, width) @ (width, S);
        // a step's share of the integrated gradient: 1 / steps
        const std::vector<double> e = matmul(dm, stored.narrow(0, 0, grp.senders).mT()).to_vector<double>();
        const int64_t e0 = g.receivers()[static_cast<size_t>(grp.first)].first_edge;
        for (size_t i = 0; i < e.size(); ++i) raw[static_cast<size_t>(e0) + i] -= e[i] / static_cast<double>(steps);
      }
    }
  }
  s.comm->allreduce_sum(raw.data(), static_cast<int64_t>(raw.size()));
  gather_rows(*s.comm, r.baseline);
  finish_baseline(r.baseline);
  const double gap = r.baseline.clean_mean - r.baseline.corrupt_mean;
  HL_CHECK(gap != 0, "edge_attribution: the clean and corrupted runs score the same; nothing to attribute");
  r.effect.resize(raw.size());
  for (size_t e = 0; e < raw.size(); ++e) r.effect[e] = raw[e] / static_cast<double>(pairs.rows()) / gap;
  r.seconds = seconds_since(t0);
  return r;
}

// ---- circuit discovery ----
int64_t Circuit::kept_count() const { return std::count(kept.begin(), kept.end(), uint8_t{1}); }

namespace {

// Patches the edges that cannot matter: into a node none of whose outputs is kept, and out of a node
// (other than the embeddings) none of whose inputs is kept (its output is then its corrupted one).
void remove_dangling(const CircuitGraph& g, EdgePatch& patched) {
  const int64_t N = g.node_count();
  for (bool changed = true; changed;) {
    changed = false;
    std::vector<uint8_t> has_in(static_cast<size_t>(N), 0), has_out(static_cast<size_t>(N), 0);
    for (int64_t e = 0; e < g.edge_count(); ++e) {
      if (patched[static_cast<size_t>(e)] != 0) continue;
      has_out[static_cast<size_t>(g.edge_sender(e))] = 1;
      for (int64_t n : g.nodes_of_receiver(g.edge_receiver(e))) has_in[static_cast<size_t>(n)] = 1;
    }
    for (int64_t e = 0; e < g.edge_count(); ++e) {
      if (patched[static_cast<size_t>(e)] != 0) continue;
      const int64_t s = g.edge_sender(e);
      const std::vector<int64_t> fed =
          g.nodes_of_receiver(g.edge_receiver(e));  // shared keys: useless when none outputs
      const bool no_output = !fed.empty() && std::none_of(fed.begin(), fed.end(),
                                                          [&](int64_t n) { return has_out[static_cast<size_t>(n)]; });
      if ((s > 0 && !has_in[static_cast<size_t>(s)]) || no_output) {
        patched[static_cast<size_t>(e)] = 1.0;
        changed = true;
      }
    }
  }
}

}  // namespace

Circuit discover_circuit(CircuitPatcher& patcher, const std::vector<double>& attribution,
                         const DiscoveryOptions& options) {
  const CircuitGraph& g = patcher.graph();
  const int64_t E = g.edge_count();
  HL_CHECK(static_cast<int64_t>(attribution.size()) == E, "discover_circuit: the attribution lists ",
           attribution.size(), " edges, the graph has ", E);
  HL_CHECK(std::isfinite(options.tau) && options.tau >= 0, "discover_circuit: tau must be a number >= 0, got ",
           options.tau);
  HL_CHECK(options.first_group >= 1, "discover_circuit: the first group must hold >= 1 edge");
  const auto t0 = Clock::now();
  const int64_t forwards0 = patcher.forwards();
  Circuit c;
  c.attribution = attribution;
  EdgePatch patched(static_cast<size_t>(E), 0.0);
  double current = patcher.metric(patched);
  ++c.tests;
  // Patches `edges` on top of what is patched, for good when the metric falls by less than tau (ACDC's
  // rule for one edge); a group must also not raise it by tau, since edges that matter can cancel out
  // when patched together (an induction head's query and key both corrupted still find the match).
  const auto try_patch = [&](const std::vector<int64_t>& edges) {
    EdgePatch candidate = patched;
    for (int64_t e : edges) candidate[static_cast<size_t>(e)] = 1.0;
    const double m = patcher.metric(candidate);
    ++c.tests;
    if (current - m >= options.tau || (edges.size() > 1 && m - current >= options.tau)) return false;
    patched = std::move(candidate);
    current = m;
    return true;
  };
  std::vector<int64_t> order(static_cast<size_t>(E));
  if (options.plain_acdc) {  // receivers from the logits back, each one's senders from the last
    size_t i = 0;
    for (auto r = static_cast<int64_t>(g.receivers().size()) - 1; r >= 0; --r) {
      const CircuitGraph::Receiver& rc = g.receivers()[static_cast<size_t>(r)];
      for (int64_t s = rc.senders - 1; s >= 0; --s) order[i++] = rc.first_edge + s;
    }
    for (int64_t e : order) try_patch({e});
  } else {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return std::abs(attribution[static_cast<size_t>(a)]) < std::abs(attribution[static_cast<size_t>(b)]);
    });
    // A group that fails is split in halves until single edges fail: those are kept.
    const std::function<bool(size_t, size_t)> test = [&](size_t lo, size_t hi) {
      if (try_patch(std::vector<int64_t>(order.begin() + static_cast<std::ptrdiff_t>(lo),
                                         order.begin() + static_cast<std::ptrdiff_t>(hi))))
        return true;
      if (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        test(lo, mid);
        test(mid, hi);
      }
      return false;
    };
    size_t group = static_cast<size_t>(options.first_group);
    for (size_t lo = 0; lo < order.size();) {
      const size_t hi = std::min(order.size(), lo + group);
      group = test(lo, hi) ? group * 2 : std::max<size_t>(1, group / 2);
      lo = hi;
    }
  }
  remove_dangling(g, patched);
  c.metric = patcher.metric(patched);
  ++c.tests;
  c.kept.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) c.kept[static_cast<size_t>(e)] = patched[static_cast<size_t>(e)] == 0 ? 1 : 0;
  c.forwards = patcher.forwards() - forwards0;
  c.seconds = seconds_since(t0);
  return c;
}

}  // namespace headlab::analysis
