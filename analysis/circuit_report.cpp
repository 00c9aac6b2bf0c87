// headlab circuit's run and files (analysis/circuit_report.h).
#include "analysis/circuit_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>

#include "analysis/circuit_internal.h"
#include "analysis/files.h"
#include "analysis/stats.h"
#include "io/atomic_file.h"
#include "plot/graph.h"

namespace headlab::analysis {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Edges to check attribution on: the half with the largest |attribution|, the rest drawn at random.
std::vector<int64_t> edges_to_check(const std::vector<double>& effect, int64_t n, uint64_t seed) {
  std::vector<int64_t> order(effect.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::abs(effect[static_cast<size_t>(a)]) > std::abs(effect[static_cast<size_t>(b)]);
  });
  n = std::min(n, static_cast<int64_t>(order.size()));
  std::vector<int64_t> pick(order.begin(), order.begin() + n / 2), rest(order.begin() + n / 2, order.end());
  std::shuffle(rest.begin(), rest.end(), std::mt19937_64(seed));
  pick.insert(pick.end(), rest.begin(), rest.begin() + (n - n / 2));
  return pick;
}

std::string padded(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// The 8 labels whose value moves furthest from `none` (no effect), a line each: "  L1H3     +0.412".
std::string top_lines(const std::vector<std::string>& labels, const std::vector<double>& values, double none,
                      size_t width = 8) {
  std::vector<size_t> by(values.size());
  std::iota(by.begin(), by.end(), 0);
  std::stable_sort(by.begin(), by.end(),
                   [&](size_t x, size_t y) { return std::abs(values[x] - none) > std::abs(values[y] - none); });
  std::ostringstream o;
  for (size_t i = 0; i < std::min<size_t>(8, by.size()); ++i)
    o << "  " << padded(labels[by[i]], width) << " " << fmt_signed(values[by[i]] - none, 3) << "\n";
  return o.str();
}

std::string metric_name(const PromptPairs& pairs) {
  return pairs.probability_metric() ? "probability difference (p(years above the start) - p(the rest))"
                                    : "logit difference (answer - wrong)";
}

std::string receiver_list(const CircuitRunOptions& o) {
  std::string list;
  for (const std::string& r : o.receivers) list += (list.empty() ? "" : ", ") + r;
  return list;
}

std::string attribution_name(const CircuitRunOptions& o) {
  return o.ig_steps ? "EAP-IG (" + std::to_string(o.ig_steps) + " steps)" : std::string("EAP");
}

// The top-8 lists and the kept edges, shared by the terminal and report.md.
std::vector<std::string> node_names(const CircuitGraph& g, const std::vector<int64_t>& nodes) {
  std::vector<std::string> v;
  for (int64_t n : nodes) v.push_back(g.node_name(n));
  return v;
}
std::string path_lines(const CircuitReport& r) {
  return top_lines(node_names(r.patcher->graph(), r.senders), r.path, 1);
}
std::string noising_lines(const CircuitReport& r) {
  return top_lines(node_names(r.patcher->graph(), r.nodes), r.activation.noising, 1);
}
std::string denoising_lines(const CircuitReport& r) {
  return top_lines(node_names(r.patcher->graph(), r.nodes), r.activation.denoising, 0);
}
std::string kept_lines(const CircuitReport& r) {
  const CircuitGraph& g = r.patcher->graph();
  std::ostringstream kept;
  for (int64_t e = 0; e < g.edge_count(); ++e)
    if (r.circuit.kept[static_cast<size_t>(e)])
      kept << "  " << padded(g.edge_name(e), 24) << " attribution "
           << fmt_signed(r.eap.effect[static_cast<size_t>(e)], 3) << "\n";
  return kept.str();
}

// Path patching's senders and receivers (r.senders, r.receivers). A sender must reach a receiver: a node
// feeds only later layers' inputs and the logits, and a path that cannot exist would be reported as 0.
// By default, every head that reaches one.
void choose_path_nodes(const CircuitGraph& g, const CircuitRunOptions& o, CircuitReport& r) {
  for (const std::string& name : o.receivers) {
    const std::vector<int64_t> rs = g.parse_receivers(name, "circuit: --receivers");
    r.receivers.insert(r.receivers.end(), rs.begin(), rs.end());
  }
  const auto reaches = [&](int64_t node) {
    return std::any_of(r.receivers.begin(), r.receivers.end(), [&](int64_t rc) { return g.edge(node, rc) >= 0; });
  };
  for (const std::string& name : o.senders) {
    const int64_t node = g.parse_node(name, "circuit: --senders");
    HL_CHECK(reaches(node), "circuit: --senders ", name, " cannot reach --receivers ", receiver_list(o),
             " (a node feeds only later layers' inputs and the logits), so no path from it can be patched");
    r.senders.push_back(node);
  }
  if (!o.senders.empty()) return;
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (g.nodes()[static_cast<size_t>(n)].head >= 0 && reaches(n)) r.senders.push_back(n);
  HL_CHECK(!r.senders.empty(), "circuit: no head reaches --receivers ", receiver_list(o),
           " (a head feeds only later layers' inputs and the logits)");
}

}  // namespace

std::string circuit_warning(double metric) {
  if (metric >= -kCircuitScoreSlack && metric <= 1 + kCircuitScoreSlack) return "";
  std::ostringstream os;
  os << "the circuit alone scores " << fmt(metric, 3);
  if (metric > 1)
    os << ", above the full model's 1: a subgraph beats its model only by leaving out what works against the task, "
          "so read its edges as that, not as a share of what the model does";
  else
    os << ", below the corrupted run's 0: the kept edges do not carry the task; no circuit was found";
  return os.str();
}

CircuitReport run_circuit(nn::DecoderModel& model, const PromptPairs& pairs, const CircuitRunOptions& o,
                          const Say& say) {
  const auto tell = [&](const std::string& text) {
    if (say) say(text);
  };
  CircuitReport r;
  // Before any output: a wrong name or prompts the model cannot read must not come after results.
  check_pairs(model, pairs, "circuit");
  choose_path_nodes(CircuitGraph(model), o, r);
  plot::check_graphviz("circuit");  // the circuit's pictures come last
  const nn::DecoderShape& shape = model.shape();
  const train::Collectives* comm = o.engine.collectives.get();
  tell("headlab circuit: " + o.checkpoint + " (" + std::to_string(shape.n_layers) + " layers x " +
       std::to_string(shape.n_heads) + " heads" + (shape.has_mlp ? "" : ", attention only") + ")\nprompt pairs: " +
       std::to_string(pairs.rows()) + " rows of " + std::to_string(pairs.T) + " tokens (" + o.source + ")\n" +
       (comm && comm->size() > 1
            ? "ranks: " + std::to_string(comm->size()) + " (" + comm->name() + "), the rows shared\n"
            : std::string()));
  // Edge attribution, then the stored runs the patching reads.
  r.eap = edge_attribution(model, pairs, o.ig_steps, o.engine);
  const auto t_setup = Clock::now();
  r.patcher = std::make_shared<CircuitPatcher>(model, pairs, o.engine);
  r.setup_seconds = seconds_since(t_setup);
  CircuitPatcher& patcher = *r.patcher;
  const CircuitGraph& g = patcher.graph();
  const LogitDifference& base = patcher.baseline();
  tell(metric_name(pairs) + " at the last position: clean " + fmt(base.clean_mean, 4) + ", corrupted " +
       fmt(base.corrupt_mean, 4) + "; metrics below are normalised (clean 1, corrupted 0)\ngraph: " +
       std::to_string(g.node_count()) + " nodes, " + std::to_string(g.edge_count()) + " edges\n" + attribution_name(o) +
       " over every edge: " + fmt(r.eap.seconds, 2) + " s\n" + stored_runs_text(patcher));
  if (const std::string w = base.warning(pairs.probability_metric()); !w.empty()) tell("warning: " + w + "\n");

  // Attribution against real patching on a sample of edges.
  r.checked = edges_to_check(r.eap.effect, o.check_edges, o.seed);
  r.patched.assign(static_cast<size_t>(g.edge_count()), std::nan(""));
  r.correlation = std::nan("");
  if (!r.checked.empty()) {
    std::vector<EdgePatch> patches;
    for (int64_t e : r.checked) {
      EdgePatch& p = patches.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
      p[static_cast<size_t>(e)] = 1.0;
    }
    const std::vector<double> m = patcher.metric(patches);
    std::vector<double> estimated, real;
    for (size_t i = 0; i < r.checked.size(); ++i) {
      r.patched[static_cast<size_t>(r.checked[i])] = m[i] - 1.0;
      estimated.push_back(r.eap.effect[static_cast<size_t>(r.checked[i])]);
      real.push_back(m[i] - 1.0);
    }
    r.correlation = pearson_correlation(estimated, real);
    tell("attribution against patching each of " + std::to_string(r.checked.size()) +
         " edges (the largest half, the rest at random): Pearson r = " + fmt(r.correlation, 3) + "\n");
  }

  // Path patching.
  const auto t_path = Clock::now();
  r.path = path_patching(patcher, r.senders, r.receivers);
  r.path_seconds = seconds_since(t_path);
  tell("\npath patching, each sender's corrupted output into " + receiver_list(o) + " only (" +
       std::to_string(r.senders.size()) + " senders, " + fmt(r.path_seconds, 2) + " s); the largest changes:\n" +
       path_lines(r));

  // Activation patching of each head and MLP, both ways.
  for (int64_t n = 1; n < g.node_count(); ++n) r.nodes.push_back(n);
  r.activation = activation_patching(patcher, r.nodes, o.by_position);
  std::ostringstream os;
  os << "\nactivation patching, noising: each node's output corrupted in the clean run; the largest changes:\n"
     << noising_lines(r)
     << "activation patching, denoising: each node's clean output restored in the corrupted run; the most "
        "recovered:\n"
     << denoising_lines(r);
  if (o.by_position) {  // node x position: the pairs that recover most
    std::vector<std::tuple<double, size_t, int64_t>> cells;
    for (size_t i = 0; i < r.nodes.size(); ++i)
      for (int64_t t = 0; t < pairs.T; ++t)
        cells.emplace_back(r.activation.denoising_by_position[i][static_cast<size_t>(t)], i, t);
    std::stable_sort(cells.begin(), cells.end(),
                     [](const auto& x, const auto& y) { return std::abs(std::get<0>(x)) > std::abs(std::get<0>(y)); });
    os << "denoising at one position (0-based, of " << pairs.T << "); the most recovered:\n";
    for (size_t i = 0; i < std::min<size_t>(8, cells.size()); ++i)
      os << "  "
         << padded(g.node_name(r.nodes[std::get<1>(cells[i])]) + " @" + std::to_string(std::get<2>(cells[i])), 12)
         << " " << fmt_signed(std::get<0>(cells[i]), 3) << "\n";
  }
  tell(os.str());

  // Discovery.
  DiscoveryOptions d;
  d.tau = o.tau;
  d.plain_acdc = o.plain_acdc;
  r.circuit = discover_circuit(patcher, r.eap.effect, d);
  const Circuit& c = r.circuit;
  std::ostringstream found;
  found << "\ncircuit (tau " << o.tau << ", " << (o.plain_acdc ? "plain ACDC order" : "attribution order")
        << "): " << c.kept_count() << " of " << g.edge_count() << " edges; the circuit alone scores "
        << fmt(c.metric, 3) << " of the full model's 1; " << c.forwards << " patched forwards (" << c.tests
        << " patch sets; plain ACDC: " << g.edge_count() + 2 << "), " << fmt(c.seconds, 2) << " s\n"
        << kept_lines(r);
  if (const std::string w = circuit_warning(c.metric); !w.empty()) found << "warning: " << w << "\n";
  tell(found.str());
  return r;
}

std::vector<std::string> write_circuit_files(const std::string& out, const PromptPairs& pairs,
                                             const CircuitRunOptions& o, const CircuitReport& r) {
  const CircuitGraph& g = r.patcher->graph();
  const LogitDifference& base = r.patcher->baseline();
  const auto write = [&](const std::string& name, const std::string& text) {
    io::write_file_atomic((std::filesystem::path(out) / name).string(), text, "circuit");
  };
  const std::string dot = circuit_dot(g, r.circuit);
  write("circuit.json", circuit_json(g, r.circuit, base));
  write("circuit.dot", dot);
  for (const char* format : {"png", "svg"})
    write(std::string("circuit.") + format, plot::render_dot(dot, format, "circuit"));
  std::string csv = "edge,sender,receiver,attribution,patched_effect,kept\n";
  for (int64_t e = 0; e < g.edge_count(); ++e) {
    const auto i = static_cast<size_t>(e);
    csv += g.edge_name(e) + "," + g.node_name(g.edge_sender(e)) + "," + g.receiver_name(g.edge_receiver(e)) + "," +
           fmt_sci(r.eap.effect[i], 6) + "," + (std::isnan(r.patched[i]) ? std::string() : fmt_sci(r.patched[i], 6)) +
           "," + (r.circuit.kept[i] ? "1" : "0") + "\n";
  }
  write("edges.csv", csv);
  std::string path_csv = "sender,metric,effect\n";
  for (size_t i = 0; i < r.senders.size(); ++i)
    path_csv += g.node_name(r.senders[i]) + "," + fmt(r.path[i], 6) + "," + fmt_signed(r.path[i] - 1, 6) + "\n";
  write("path_patching.csv", path_csv);
  const ActivationPatching& act = r.activation;
  std::string node_csv = "node,noising,noising_effect,denoising\n";
  for (size_t i = 0; i < r.nodes.size(); ++i)
    node_csv += g.node_name(r.nodes[i]) + "," + fmt(act.noising[i], 6) + "," + fmt_signed(act.noising[i] - 1, 6) + "," +
                fmt(act.denoising[i], 6) + "\n";
  write("activation_patching.csv", node_csv);
  std::vector<std::string> wrote = {
      "circuit.json",           "circuit.dot", "circuit.png", "circuit.svg", "edges.csv", "path_patching.csv",
      "activation_patching.csv"};
  if (o.by_position) {
    std::string by_position = "node,position,noising,denoising\n";
    for (size_t i = 0; i < r.nodes.size(); ++i)
      for (int64_t t = 0; t < pairs.T; ++t)
        by_position += g.node_name(r.nodes[i]) + "," + std::to_string(t) + "," +
                       fmt(act.noising_by_position[i][static_cast<size_t>(t)], 6) + "," +
                       fmt(act.denoising_by_position[i][static_cast<size_t>(t)], 6) + "\n";
    write("activation_patching_by_position.csv", by_position);
    wrote.push_back("activation_patching_by_position.csv");
  }
  const Circuit& c = r.circuit;
  std::ostringstream md;
  md << "# Circuit of " << o.checkpoint << "\n\nPrompt pairs: " << pairs.rows() << " rows of " << pairs.T << " tokens ("
     << o.source << "). Metric: the " << metric_name(pairs) << " at the last position, clean "
     << fmt(base.clean_mean, 4) << ", corrupted " << fmt(base.corrupt_mean, 4)
     << "; normalised so that the clean run is 1 and the corrupted run 0.\n\n";
  for (const std::string& w : {base.warning(pairs.probability_metric()), circuit_warning(c.metric)})
    if (!w.empty()) md << "**Warning:** " << w << ".\n\n";
  md << "## Circuit\n\n![circuit](circuit.png)\n\n"
     << c.kept_count() << " of " << g.edge_count() << " edges (tau " << o.tau
     << "); the circuit alone, every other edge patched to its corrupted sender, scores **" << fmt(c.metric, 3)
     << "** of the full model's 1. Search: " << c.forwards << " patched forwards (" << c.tests
     << " patch sets; plain ACDC tests every edge: " << g.edge_count() + 2 << "), " << fmt(c.seconds, 2)
     << " s.\n\n```\n"
     << kept_lines(r) << "```\n\n"
     << "## Edge attribution\n\n"
     << (o.ig_steps ? "EAP-IG, " + std::to_string(o.ig_steps) + " steps" : std::string("EAP")) << " over all "
     << g.edge_count() << " edges in " << fmt(r.eap.seconds, 2) << " s; against real patching of " << r.checked.size()
     << " edges: Pearson r = " << fmt(r.correlation, 3) << " (edges.csv has both).\n\n"
     << "## Path patching into " << receiver_list(o) << "\n\n"
     << r.senders.size() << " senders in " << fmt(r.path_seconds, 2) << " s (stored runs: " << fmt(r.setup_seconds, 2)
     << " s); the largest changes of the metric:\n\n```\n"
     << path_lines(r) << "```\n\n## Activation patching\n\nNoising: each node's output replaced by its corrupted "
     << "output for every receiver, in the clean run; the largest changes of the metric:\n\n```\n"
     << noising_lines(r) << "```\n\nDenoising: each node's clean output restored in the corrupted run, every later "
     << "node recomputed; the largest recoveries (1: all of the clean behaviour):\n\n```\n"
     << denoising_lines(r) << "```\n\nBoth per node in activation_patching.csv.\n";
  write("report.md", md.str());
  wrote.push_back("report.md");
  return wrote;
}

}  // namespace headlab::analysis
