// headlab circuit: which heads pass what to whom on a prompt-pair task (analysis/circuit.h). Edge
// attribution patching over every edge (checked against real patching on a sample), path patching of
// the chosen senders into the chosen receivers, activation patching of every node (noising and
// denoising), and circuit discovery; writes circuit.json, circuit.dot, circuit.png, circuit.svg, edges.csv,
// path_patching.csv, activation_patching.csv and report.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

#include "analysis/circuit.h"
#include "analysis/stats.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "plot/graph.h"
#include "train/collectives.h"

namespace headlab::cli {

namespace {

struct CircuitArgs {
  std::string path, out;
  PromptPairArgs pairs;
  int64_t ig_steps = 0, check_edges = 64, chunk_rows = 0;
  double tau = 0.01;
  bool plain_acdc = false, by_position = false;
  std::vector<std::string> senders, receivers = {"logits"};
  uint64_t seed = 1;
  int threads = 0;
};

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

}  // namespace

Action add_circuit(CLI::App& app) {
  auto a = std::make_shared<CircuitArgs>();
  app.add_option("checkpoint", a->path, "checkpoint file (.h5) or Hugging Face GPT-2 folder")
      ->type_name(kInputFile)
      ->required();
  add_prompt_pair_options(app, a->pairs);
  app.add_option("--out", a->out, "output folder (default: <checkpoint folder>/circuit)")->type_name(kOutputDir);
  app.add_option("--tau", a->tau, "discovery: an edge goes when the normalised metric falls by less than this")
      ->check(in_range(0, 10))
      ->capture_default_str();
  app.add_option("--ig-steps", a->ig_steps,
                 "edge attribution with integrated gradients over this many steps (EAP-IG; 0: EAP)")
      ->check(in_range(0, 1000))
      ->capture_default_str();
  app.add_flag("--by-position", a->by_position,
               "noising and denoising also at each position alone (activation_patching_by_position.csv; copies "
               "per node and position)");
  app.add_flag("--plain-acdc", a->plain_acdc, "discovery one edge a forward in ACDC's order (for comparison; slow)");
  app.add_option("--senders", a->senders, "path patching: sender nodes (embed, L<l>H<h>, MLP<l>; default: every head)")
      ->delimiter(',');
  app.add_option("--receivers", a->receivers,
                 "path patching: receivers (logits, L<l>H<h> = its q, k and v, L<l>H<h>.q/.k/.v, MLP<l>)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--chunk-rows", a->chunk_rows, "prompt rows a forward (0: as a memory budget of ~256 MB allows)")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--check-edges", a->check_edges, "edges whose attribution is checked against real patching")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  add_seed_option(app, a->seed, "the generated prompt pairs and the edges checked");
  add_threads_option(app, a->threads);
  return [a] {
    using Clock = std::chrono::steady_clock;
    const auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
    // Under mpirun the ranks share the prompt rows (CircuitOptions::collectives); rank 0 prints and writes.
    const std::shared_ptr<train::Collectives> comm = train::world();
    set_threads(a->threads, comm->local_size());
    const bool writer = comm->rank() == 0;
    std::ostream null_stream(nullptr);
    std::ostream& say = writer ? std::cout : null_stream;
    analysis::CircuitOptions copt;
    copt.collectives = comm;
    copt.chunk_rows = a->chunk_rows;
    const Loaded in = load("circuit", a->path, "cpu");
    nn::GPTModel& model = in.gpt("circuit");
    const nn::GPTConfig& cfg = model.config();
    const MadePairs made = make_prompt_pairs(a->pairs, in, a->seed, "circuit");
    const analysis::PromptPairs& pairs = made.pairs;
    const std::string& source = made.source;
    const std::string home = in.from_folder ? a->path : std::filesystem::path(a->path).parent_path().string();
    const std::string out = a->out.empty() ? join_path(home, "circuit") : a->out;
    std::optional<io::FolderLock> lock;
    if (writer) lock.emplace(make_locked_dir(out, "circuit"));
    say << "headlab circuit: " << a->path << " (" << cfg.n_layers << " layers x " << cfg.n_heads << " heads"
        << (cfg.attn_only ? ", attention only" : "") << ")\nprompt pairs: " << pairs.rows() << " rows of " << pairs.T
        << " tokens (" << source << ")\n"
        << (comm->size() > 1 ? "ranks: " + std::to_string(comm->size()) + " (" + comm->name() + "), the rows shared\n"
                             : std::string());

    // Edge attribution, then the stored runs the patching reads.
    const analysis::EdgeAttribution eap = analysis::edge_attribution(model, pairs, a->ig_steps, copt);
    const auto t_setup = Clock::now();
    analysis::CircuitPatcher patcher(model, pairs, copt);
    const double setup_seconds = since(t_setup);
    const analysis::CircuitGraph& g = patcher.graph();
    const analysis::LogitDifference& base = patcher.baseline();
    const std::string metric_name = pairs.probability_metric()
                                        ? "probability difference (p(years above the start) - p(the rest))"
                                        : "logit difference (answer - wrong)";
    say << metric_name << " at the last position: clean " << fmt(base.clean_mean, 4) << ", corrupted "
        << fmt(base.corrupt_mean, 4) << "; metrics below are normalised (clean 1, corrupted 0)\n"
        << "graph: " << g.node_count() << " nodes, " << g.edge_count() << " edges\n"
        << (a->ig_steps ? "EAP-IG (" + std::to_string(a->ig_steps) + " steps)" : std::string("EAP")) << " over "
        << "every edge: " << fmt(eap.seconds, 2) << " s\n";

    // Attribution against real patching on a sample of edges.
    const std::vector<int64_t> checked = edges_to_check(eap.effect, a->check_edges, a->seed);
    std::vector<double> actual(static_cast<size_t>(g.edge_count()), std::nan(""));
    double correlation = std::nan("");
    if (!checked.empty()) {
      std::vector<analysis::EdgePatch> patches;
      for (int64_t e : checked) {
        analysis::EdgePatch& p = patches.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
        p[static_cast<size_t>(e)] = 1.0;
      }
      const std::vector<double> m = patcher.metric(patches);
      std::vector<double> est, real;
      for (size_t i = 0; i < checked.size(); ++i) {
        actual[static_cast<size_t>(checked[i])] = m[i] - 1.0;
        est.push_back(eap.effect[static_cast<size_t>(checked[i])]);
        real.push_back(m[i] - 1.0);
      }
      correlation = analysis::pearson_correlation(est, real);
      say << "attribution against patching each of " << checked.size()
          << " edges (the largest half, the rest at random): Pearson r = " << fmt(correlation, 3) << "\n";
    }

    // Path patching.
    std::vector<int64_t> senders, receivers;
    if (a->senders.empty()) {
      for (int64_t n = 0; n < g.node_count(); ++n)
        if (g.nodes()[static_cast<size_t>(n)].head >= 0) senders.push_back(n);
    }
    for (const std::string& s : a->senders) senders.push_back(g.parse_node(s, "circuit: --senders"));
    for (const std::string& r : a->receivers) {
      const std::vector<int64_t> rs = g.parse_receivers(r, "circuit: --receivers");
      receivers.insert(receivers.end(), rs.begin(), rs.end());
    }
    const auto t_path = Clock::now();
    const std::vector<double> path = analysis::path_patching(patcher, senders, receivers);
    const double path_seconds = since(t_path);
    std::string receiver_list;
    for (const std::string& r : a->receivers) receiver_list += (receiver_list.empty() ? "" : ", ") + r;
    std::vector<size_t> by_effect(path.size());
    std::iota(by_effect.begin(), by_effect.end(), 0);
    std::stable_sort(by_effect.begin(), by_effect.end(),
                     [&](size_t x, size_t y) { return std::abs(path[x] - 1) > std::abs(path[y] - 1); });
    std::ostringstream path_top;
    for (size_t i = 0; i < std::min<size_t>(8, by_effect.size()); ++i)
      path_top << "  " << pad(g.node_name(senders[by_effect[i]]), 8) << " " << fmt_signed(path[by_effect[i]] - 1, 3)
               << "\n";
    say << "\npath patching, each sender's corrupted output into " << receiver_list << " only (" << senders.size()
        << " senders, " << fmt(path_seconds, 2) << " s); the largest changes:\n"
        << path_top.str();

    // Activation patching of each head and MLP, both ways.
    std::vector<int64_t> nodes;
    for (int64_t n = 1; n < g.node_count(); ++n) nodes.push_back(n);
    const analysis::ActivationPatching act = analysis::activation_patching(patcher, nodes, a->by_position);
    // The 8 nodes that move the metric most from `none` (the value with no effect), as lines.
    const auto top_nodes = [&](const std::vector<double>& v, double none) {
      std::vector<size_t> by(nodes.size());
      std::iota(by.begin(), by.end(), 0);
      std::stable_sort(by.begin(), by.end(),
                       [&](size_t x, size_t y) { return std::abs(v[x] - none) > std::abs(v[y] - none); });
      std::ostringstream o;
      for (size_t i = 0; i < std::min<size_t>(8, by.size()); ++i)
        o << "  " << pad(g.node_name(nodes[by[i]]), 8) << " " << fmt_signed(v[by[i]] - none, 3) << "\n";
      return o.str();
    };
    const std::string noising_top = top_nodes(act.noising, 1), denoising_top = top_nodes(act.denoising, 0);
    say << "\nactivation patching, noising: each node's output corrupted in the clean run; the largest changes:\n"
        << noising_top
        << "activation patching, denoising: each node's clean output restored in the corrupted run; the most "
           "recovered:\n"
        << denoising_top;
    std::string by_position_csv;
    if (a->by_position) {  // node x position; the pairs that recover most, on the terminal
      std::vector<std::tuple<double, size_t, int64_t>> cells;
      by_position_csv = "node,position,noising,denoising\n";
      for (size_t i = 0; i < nodes.size(); ++i)
        for (int64_t t = 0; t < pairs.T; ++t) {
          const double v = act.denoising_by_position[i][static_cast<size_t>(t)];
          cells.emplace_back(v, i, t);
          by_position_csv += g.node_name(nodes[i]) + "," + std::to_string(t) + "," +
                             fmt(act.noising_by_position[i][static_cast<size_t>(t)], 6) + "," + fmt(v, 6) + "\n";
        }
      std::stable_sort(cells.begin(), cells.end(), [](const auto& x, const auto& y) {
        return std::abs(std::get<0>(x)) > std::abs(std::get<0>(y));
      });
      say << "denoising at one position (0-based, of " << pairs.T << "); the most recovered:\n";
      for (size_t i = 0; i < std::min<size_t>(8, cells.size()); ++i)
        say << "  " << pad(g.node_name(nodes[std::get<1>(cells[i])]) + " @" + std::to_string(std::get<2>(cells[i])), 12)
            << " " << fmt_signed(std::get<0>(cells[i]), 3) << "\n";
    }

    // Discovery.
    analysis::DiscoveryOptions dopt;
    dopt.tau = a->tau;
    dopt.plain_acdc = a->plain_acdc;
    const analysis::Circuit circuit = analysis::discover_circuit(patcher, eap.effect, dopt);
    std::ostringstream kept;
    for (int64_t e = 0; e < g.edge_count(); ++e)
      if (circuit.kept[static_cast<size_t>(e)])
        kept << "  " << pad(g.edge_name(e), 24) << " attribution " << fmt_signed(eap.effect[static_cast<size_t>(e)], 3)
             << "\n";
    say << "\ncircuit (tau " << a->tau << ", " << (a->plain_acdc ? "plain ACDC order" : "attribution order")
        << "): " << circuit.kept_count() << " of " << g.edge_count() << " edges; the circuit alone scores "
        << fmt(circuit.metric, 3) << " of the full model's 1; " << circuit.forwards << " patched forwards ("
        << circuit.tests << " patch sets; plain ACDC: " << g.edge_count() + 2 << "), " << fmt(circuit.seconds, 2)
        << " s\n"
        << kept.str();

    if (!writer) return 0;
    // Files.
    const std::string dot = analysis::circuit_dot(g, circuit);
    write_text(join_path(out, "circuit.json"), analysis::circuit_json(g, circuit, base), "circuit");
    write_text(join_path(out, "circuit.dot"), dot, "circuit");
    for (const char* format : {"png", "svg"})
      write_text(join_path(out, std::string("circuit.") + format), plot::render_dot(dot, format, "circuit"), "circuit");
    std::string csv = "edge,sender,receiver,attribution,patched_effect,kept\n";
    for (int64_t e = 0; e < g.edge_count(); ++e) {
      const auto i = static_cast<size_t>(e);
      csv += g.edge_name(e) + "," + g.node_name(g.edge_sender(e)) + "," + g.receiver_name(g.edge_receiver(e)) + "," +
             fmt_sci(eap.effect[i], 6) + "," + (std::isnan(actual[i]) ? std::string() : fmt_sci(actual[i], 6)) + "," +
             (circuit.kept[i] ? "1" : "0") + "\n";
    }
    write_text(join_path(out, "edges.csv"), csv, "circuit");
    std::string pcsv = "sender,metric,effect\n";
    for (size_t i = 0; i < senders.size(); ++i)
      pcsv += g.node_name(senders[i]) + "," + fmt(path[i], 6) + "," + fmt_signed(path[i] - 1, 6) + "\n";
    write_text(join_path(out, "path_patching.csv"), pcsv, "circuit");
    std::string ncsv = "node,noising,noising_effect,denoising\n";
    for (size_t i = 0; i < nodes.size(); ++i)
      ncsv += g.node_name(nodes[i]) + "," + fmt(act.noising[i], 6) + "," + fmt_signed(act.noising[i] - 1, 6) + "," +
              fmt(act.denoising[i], 6) + "\n";
    write_text(join_path(out, "activation_patching.csv"), ncsv, "circuit");
    if (a->by_position) write_text(join_path(out, "activation_patching_by_position.csv"), by_position_csv, "circuit");
    std::ostringstream md;
    md << "# Circuit of " << a->path << "\n\nPrompt pairs: " << pairs.rows() << " rows of " << pairs.T << " tokens ("
       << source << "). Metric: the " << metric_name << " at the last position, clean " << fmt(base.clean_mean, 4)
       << ", corrupted " << fmt(base.corrupt_mean, 4)
       << "; normalised so that the clean run is 1 and the corrupted run 0.\n\n"
       << "## Circuit\n\n![circuit](circuit.png)\n\n"
       << circuit.kept_count() << " of " << g.edge_count() << " edges (tau " << a->tau
       << "); the circuit alone, every other edge patched to its corrupted sender, scores **" << fmt(circuit.metric, 3)
       << "** of the full model's 1. Search: " << circuit.forwards << " patched forwards (" << circuit.tests
       << " patch sets; plain ACDC tests every edge: " << g.edge_count() + 2 << "), " << fmt(circuit.seconds, 2)
       << " s.\n\n```\n"
       << kept.str() << "```\n\n"
       << "## Edge attribution\n\n"
       << (a->ig_steps ? "EAP-IG, " + std::to_string(a->ig_steps) + " steps" : std::string("EAP")) << " over all "
       << g.edge_count() << " edges in " << fmt(eap.seconds, 2) << " s; against real patching of " << checked.size()
       << " edges: Pearson r = " << fmt(correlation, 3) << " (edges.csv has both).\n\n"
       << "## Path patching into " << receiver_list << "\n\n"
       << senders.size() << " senders in " << fmt(path_seconds, 2) << " s (stored runs: " << fmt(setup_seconds, 2)
       << " s); the largest changes of the metric:\n\n```\n"
       << path_top.str() << "```\n\n## Activation patching\n\nNoising: each node's output replaced by its corrupted "
       << "output for every receiver, in the clean run; the largest changes of the metric:\n\n```\n"
       << noising_top << "```\n\nDenoising: each node's clean output restored in the corrupted run, every later "
       << "node recomputed; the largest recoveries (1: all of the clean behaviour):\n\n```\n"
       << denoising_top << "```\n\nBoth per node in activation_patching.csv.\n";
    write_text(join_path(out, "report.md"), md.str(), "circuit");
    std::cout << "\nwrote " << out
              << "/{circuit.json, circuit.dot, circuit.png, circuit.svg, edges.csv, path_patching.csv, "
                 "activation_patching.csv, "
              << (a->by_position ? "activation_patching_by_position.csv, " : "") << "report.md}\n";
    return 0;
  };
}

}  // namespace headlab::cli
