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
  // A node's output is what it adds to the stream; through a post norm (Gemma 2/3, OLMo-2) the heads' results are
  // not that, and patching one sender's share of a normed sum is not defined here.
  HL_CHECK(!model.shape().post_norms, "prompt pairs: ", model.type_name(),
           " norms each attention's and MLP's output before the stream adds it (post norms), so its heads' outputs "
           "are not terms of the stream; path patching over post-norm models (circuit, heads --task) is not "
           "supported yet");
  HL_CHECK(!model.shape().post_ln, "prompt pairs: ", model.type_name(),
           " norms the stream after every residual add (post-LN), so a head's output is not a term of the stream "
           "the next layers read; path patching over post-LN models (circuit, heads --task) is not supported yet");
  const bool mlp = model.shape().has_mlp, parallel = model.shape().parallel_residual;
  nodes_.push_back({-1, -1});  // the embeddings
  const auto add_group = [&](int64_t layer, Input input, std::initializer_list<std::pair<Input, int64_t>> parts) {
    const auto senders = static_cast<int64_t>(nodes_.size());
    const auto first = static_cast<int64_t>(receivers_.size());
    for (const auto& [in, count] : parts)
      for (int64_t i = 0; i < count; ++i) {
        receivers_.push_back({layer, in == Input::mlp || in == Input::logits ? -1 : i, in, senders, edges_});
        edges_ += senders;
      }
    groups_.push_back({layer, first, static_cast<int64_t>(receivers_.size()) - first, senders, input});
  };
  for (int64_t l = 0; l < n_layers_; ++l) {
    const int64_t H = model.attention(l).head_count(), Hkv = model.attention(l).kv_head_count();
    auto& orig = original_heads_.emplace_back();
    for (int64_t h = 0; h < H; ++h) orig.push_back(model.original_head(l, h));
    kv_heads_.push_back(Hkv);
    if (H > 0) add_group(l, Input::q, {{Input::q, H}, {Input::k, Hkv}, {Input::v, Hkv}});
    if (mlp && parallel)
      add_group(l, Input::mlp, {{Input::mlp, 1}});  // it reads the block's input: not this layer's heads
    for (int64_t h = 0; h < H; ++h) nodes_.push_back({l, h});
    if (mlp && !parallel) add_group(l, Input::mlp, {{Input::mlp, 1}});
    if (mlp) nodes_.push_back({l, -1});
  }
  add_group(n_layers_, Input::logits, {{Input::logits, 1}});
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

bool CircuitGraph::shared_kv(const Receiver& r) const {
  if (r.input != Input::k && r.input != Input::v) return false;
  const auto l = static_cast<size_t>(r.layer);
  return kv_heads_[l] != static_cast<int64_t>(original_heads_[l].size());
}

std::vector<int64_t> CircuitGraph::nodes_of_receiver(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  if (r.input == Input::logits) return {};
  // A key/value receiver of a grouped-query layer feeds its group's query heads: heads [g * n, (g + 1) * n).
  int64_t lo = r.head, hi = r.head + 1;
  if (shared_kv(r)) {
    const int64_t n = static_cast<int64_t>(original_heads_[static_cast<size_t>(r.layer)].size()) /
                      kv_heads_[static_cast<size_t>(r.layer)];
    lo = r.head * n, hi = lo + n;
  }
  std::vector<int64_t> out;
  for (int64_t n = 1; n < node_count(); ++n) {
    const Node& nd = nodes_[static_cast<size_t>(n)];
    if (nd.layer == r.layer && (r.input == Input::mlp ? nd.head < 0 : nd.head >= lo && nd.head < hi)) out.push_back(n);
  }
  HL_CHECK(!out.empty(), "CircuitGraph: receiver ", receiver, " has no node");
  return out;
}

std::string CircuitGraph::receiving_name(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  if (r.input == Input::logits) return "logits";
  if (shared_kv(r)) return std::string("L").append(std::to_string(r.layer)).append("G").append(std::to_string(r.head));
  return node_name(nodes_of_receiver(receiver).front());
}

std::string CircuitGraph::receiver_name(int64_t receiver) const {
  const Receiver& r = receivers_.at(static_cast<size_t>(receiver));
  std::string s = receiving_name(receiver);
  if (r.input != Input::mlp && r.input != Input::logits) s.append(".").append(input_name(r.input));
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
  // A head's name means everything it reads: its queries, and its keys and values (its group's, when shared);
  // a group's name ("L1G0") its keys and values.
  std::vector<int64_t> out;
  for (int64_t r = 0; r < static_cast<int64_t>(receivers_.size()); ++r) {
    const Receiver& rc = receivers_[static_cast<size_t>(r)];
    bool match = receiver_name(r) == name || (rc.head >= 0 && receiving_name(r) == name);
    for (int64_t n : rc.head >= 0 && !match ? nodes_of_receiver(r) : std::vector<int64_t>{})
      match = match || node_name(n) == name;
    if (match) out.push_back(r);
  }
  HL_CHECK(!out.empty(), who, ": the model has no receiver '", name,
           "' (receivers: L<layer>H<head> (what it reads: q, k and v), L<layer>H<head>.q/.k/.v, and in grouped-query "
           "layers L<layer>G<group> (its k and v), L<layer>G<group>.k/.v; MLP<layer>, logits)");
  return out;
}

// ---- output ----
namespace {

// The circuit's kept edges (sender node, receiving node or -1 for the logits, the input fed) and the nodes
// they touch: what both renderings draw.
struct KeptEdges {
  struct Edge {
    int64_t edge, sender, receiver;
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
    const int64_t s = g.edge_sender(e), r = g.edge_receiver(e);
    k.edges.push_back({e, s, r, g.receivers()[static_cast<size_t>(r)].input});
    k.used[static_cast<size_t>(s)] = 1;
    const std::vector<int64_t> fed = g.nodes_of_receiver(r);
    for (int64_t n : fed) k.used[static_cast<size_t>(n)] = 1;
    k.logits = k.logits || fed.empty();
  }
  return k;
}

}  // namespace

std::string circuit_json(const CircuitGraph& g, const Circuit& c, const LogitDifference& baseline) {
  const KeptEdges k = kept_edges(g, c);
  nlohmann::json edges = nlohmann::json::array();
  for (const KeptEdges::Edge& e : k.edges)
    edges.push_back({{"sender", g.node_name(e.sender)},
                     {"receiver", g.receiving_name(e.receiver)},
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
    // A grouped-query layer's keys and values reach every head of the group: an edge to each, labelled by group.
    const std::vector<int64_t> fed = g.nodes_of_receiver(e.receiver);
    const bool shared = fed.size() > 1 && e.input != Input::mlp;
    for (const std::string& to : fed.empty() ? std::vector<std::string>{"logits"} : [&] {
           std::vector<std::string> names;
           for (int64_t n : fed) names.push_back(g.node_name(n));
           return names;
         }()) {
      o << "  \"" << g.node_name(e.sender) << "\" -> \"" << to << "\" [color=\"" << colours[static_cast<int>(e.input)]
        << "\"";
      if (e.input == Input::q || e.input == Input::k || e.input == Input::v)
        o << ", label=\"" << (shared ? g.receiving_name(e.receiver) + "." : std::string()) << input_name(e.input)
          << "\"";
      o << "];\n";
    }
  }
  o << "}\n";
  return o.str();
}

}  // namespace headlab::analysis
