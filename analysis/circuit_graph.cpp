// The graph of a decoder's circuits (nodes, receivers, edges and their names) and a circuit's renderings
// as JSON and Graphviz DOT (analysis/circuit.h).
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <sstream>

#include "analysis/circuit.h"

namespace headlab::analysis {

namespace {

using Input = CircuitGraph::Input;

const char* input_name(Input in) {
  switch (in) {
    case Input::q:
      return "q";
    case Input::k:
      return "k";
    case Input::v:
      return "v";
    case Input::mlp:
      return "mlp";
    case Input::logits:
      return "logits";
  }
  return "?";
}

}  // namespace

// ---- the graph ----
CircuitGraph::CircuitGraph(const nn::DecoderModel& model) : n_layers_(model.n_layers()) {
  for (int64_t l = 0; l < model.n_layers(); ++l)
    HL_CHECK(model.attention(l).kv_head_count() == model.attention(l).head_count(), "circuit: layer ", l, " has ",
             model.attention(l).head_count(), " query heads sharing ", model.attention(l).kv_head_count(),
             " key/value heads; the circuit graph of a grouped-query model (key/value groups as receivers) is not "
             "implemented yet");
  const bool mlp = model.shape().has_mlp, parallel = model.shape().parallel_residual;
  nodes_.push_back({-1, -1});  // the embeddings
  const auto add_group = [&](int64_t layer, Input input, int64_t count) {
    const auto senders = static_cast<int64_t>(nodes_.size());
    groups_.push_back({layer, static_cast<int64_t>(receivers_.size()), count, senders, input});
    for (int64_t i = 0; i < count; ++i) {
      const int64_t head = input == Input::q ? i % (count / 3) : -1;
      const Input in =
          input == Input::q ? std::array{Input::q, Input::k, Input::v}[static_cast<size_t>(i / (count / 3))] : input;
      receivers_.push_back({layer, head, in, senders, edges_});
      edges_ += senders;
    }
  };
  for (int64_t l = 0; l < n_layers_; ++l) {
    const int64_t H = model.attention(l).head_count();
    auto& orig = original_heads_.emplace_back();
    for (int64_t h = 0; h < H; ++h) orig.push_back(model.original_head(l, h));
    if (H > 0) add_group(l, Input::q, 3 * H);
    if (mlp && parallel) add_group(l, Input::mlp, 1);  // it reads the block's input: not this layer's heads
    for (int64_t h = 0; h < H; ++h) nodes_.push_back({l, h});
    if (mlp && !parallel) add_group(l, Input::mlp, 1);
    if (mlp) nodes_.push_back({l, -1});
  }
  add_group(n_layers_, Input::logits, 1);
}

int64_t CircuitGraph::first_node_of_layer(int64_t layer) const {
  HL_CHECK(layer >= 0 && layer <= n_layers_, "CircuitGraph: no layer ", layer, " (", n_layers_, " layers)");
  for (int64_t n = 1; n < node_count(); ++n)
    if (nodes_[static_cast<size_t>(n)].layer >= layer) return n;
  return node_count();
}

std::string CircuitGraph::node_name(int64_t node) const {
  const Node& n = nodes_.at(static_cast<size_t>(node));
  if (n.layer < 0) return "embed";
  if (n.head < 0) return "MLP" + std::to_string(n.layer);
  std::string s = "L";
  s.append(std::to_string(n.layer))
      .append("H")
      .append(std::to_string(original_heads_[static_cast<size_t>(n.layer)][static_cast<size_t>(n.head)]));
  return s;
}

int64_t CircuitGraph::node_of_receiver(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  if (r.input == Input::logits) return -1;
  for (int64_t n = 1; n < node_count(); ++n) {
    const Node& nd = nodes_[static_cast<size_t>(n)];
    if (nd.layer == r.layer && nd.head == r.head) return n;
  }
  HL_FAIL("CircuitGraph: receiver ", receiver, " has no node");
}

std::string CircuitGraph::receiver_name(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  if (r.input == Input::logits) return "logits";
  std::string s = node_name(node_of_receiver(receiver));
  if (r.input != Input::mlp) s.append(".").append(input_name(r.input));
  return s;
}

int64_t CircuitGraph::edge_receiver(int64_t edge) const {
  HL_CHECK(edge >= 0 && edge < edges_, "CircuitGraph: no edge ", edge, " (", edges_, " edges)");
  const auto it = std::upper_bound(receivers_.begin(), receivers_.end(), edge,
                                   [](int64_t e, const Receiver& r) { return e < r.first_edge; });
  return static_cast<int64_t>(it - receivers_.begin()) - 1;
}

int64_t CircuitGraph::edge_sender(int64_t edge) const {
  return edge - receivers_[static_cast<size_t>(edge_receiver(edge))].first_edge;
}

std::string CircuitGraph::edge_name(int64_t edge) const {
  std::string s = node_name(edge_sender(edge));
  return s.append(" -> ").append(receiver_name(edge_receiver(edge)));
}

int64_t CircuitGraph::edge(int64_t sender, int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  return sender >= 0 && sender < r.senders ? r.first_edge + sender : -1;
}

int64_t CircuitGraph::parse_node(const std::string& name, const char* who) const {
  for (int64_t n = 0; n < node_count(); ++n)
    if (node_name(n) == name) return n;
  HL_FAIL(who, ": the model has no node '", name, "' (nodes: embed, L<layer>H<head>",
          node_count() > 1 && nodes_.back().head < 0 ? ", MLP<layer>" : "", "; layers 0..", n_layers_ - 1, ")");
}

std::vector<int64_t> CircuitGraph::parse_receivers(const std::string& name, const char* who) const {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < static_cast<int64_t>(receivers_.size()); ++r) {
    const std::string rn = receiver_name(r);
    if (rn == name || (receivers_[static_cast<size_t>(r)].head >= 0 && node_name(node_of_receiver(r)) == name))
      out.push_back(r);
  }
  HL_CHECK(!out.empty(), who, ": the model has no receiver '", name,
           "' (receivers: L<layer>H<head> (its q, k and v), L<layer>H<head>.q/.k/.v, MLP<layer>, logits)");
  return out;
}

// ---- output ----
namespace {

// The circuit's kept edges (sender node, receiving node or -1 for the logits, the input fed) and the nodes
// they touch: what both renderings draw.
struct KeptEdges {
  struct Edge {
    int64_t edge, sender, node;
    Input input;
  };
  std::vector<Edge> edges;
  std::vector<uint8_t> used;  // [node]
  bool logits = false;
};

KeptEdges kept_edges(const CircuitGraph& g, const Circuit& c) {
  KeptEdges k;
  k.used.assign(static_cast<size_t>(g.node_count()), 0);
  for (int64_t e = 0; e < g.edge_count(); ++e) {
    if (!c.kept[static_cast<size_t>(e)]) continue;
    const int64_t s = g.edge_sender(e), r = g.edge_receiver(e), n = g.node_of_receiver(r);
    k.edges.push_back({e, s, n, g.receivers()[static_cast<size_t>(r)].input});
    k.used[static_cast<size_t>(s)] = 1;
    if (n >= 0) k.used[static_cast<size_t>(n)] = 1;
    k.logits = k.logits || n < 0;
  }
  return k;
}

std::string receiving_name(const CircuitGraph& g, int64_t node) { return node >= 0 ? g.node_name(node) : "logits"; }

}  // namespace

std::string circuit_json(const CircuitGraph& g, const Circuit& c, const LogitDifference& baseline) {
  const KeptEdges k = kept_edges(g, c);
  nlohmann::json edges = nlohmann::json::array();
  for (const KeptEdges::Edge& e : k.edges)
    edges.push_back({{"sender", g.node_name(e.sender)},
                     {"receiver", receiving_name(g, e.node)},
                     {"input", input_name(e.input)},
                     {"attribution", c.attribution[static_cast<size_t>(e.edge)]}});
  nlohmann::json nodes = nlohmann::json::array();
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (k.used[static_cast<size_t>(n)]) nodes.push_back(g.node_name(n));
  if (k.logits) nodes.push_back("logits");
  nlohmann::json j;
  j["nodes"] = nodes;
  j["edges"] = edges;
  j["metric"] = {{"circuit", c.metric},
                 {"full_model", 1.0},
                 {"clean_logit_difference", baseline.clean_mean},
                 {"corrupt_logit_difference", baseline.corrupt_mean}};
  j["graph_edges"] = g.edge_count();
  j["kept_edges"] = c.kept_count();
  j["search"] = {{"forwards", c.forwards}, {"tests", c.tests}, {"seconds", c.seconds}};
  return j.dump(2) + "\n";
}

std::string circuit_dot(const CircuitGraph& g, const Circuit& c) {
  static const char* colours[] = {"#1f77b4", "#2ca02c", "#d62728", "#7f7f7f", "#000000"};  // by Input
  const KeptEdges k = kept_edges(g, c);
  std::ostringstream o;
  o << "digraph circuit {\n  rankdir=BT;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#f4f4f4\", "
       "fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n";
  std::vector<std::vector<std::string>> by_layer(static_cast<size_t>(g.n_layers() + 2));
  for (int64_t n = 0; n < g.node_count(); ++n)
    if (k.used[static_cast<size_t>(n)])
      by_layer[static_cast<size_t>(g.nodes()[static_cast<size_t>(n)].layer + 1)].push_back(g.node_name(n));
  if (k.logits) by_layer.back().push_back("logits");
  for (const auto& names : by_layer) {
    if (names.empty()) continue;
    o << "  { rank=same;";
    for (const std::string& nm : names) o << " \"" << nm << "\";";
    o << " }\n";
  }
  for (const KeptEdges::Edge& e : k.edges) {
    o << "  \"" << g.node_name(e.sender) << "\" -> \"" << receiving_name(g, e.node) << "\" [color=\""
      << colours[static_cast<int>(e.input)] << "\"";
    if (e.input == Input::q || e.input == Input::k || e.input == Input::v)
      o << ", label=\"" << input_name(e.input) << "\"";
    o << "];\n";
  }
  o << "}\n";
  return o.str();
}

}  // namespace headlab::analysis
