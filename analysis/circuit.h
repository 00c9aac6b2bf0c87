// Circuits of a decoder on a prompt-pair task (analysis/prompt_pairs.h): Wang et al. 2022's path patching,
// Syed et al. 2023's edge attribution patching (EAP; Hanna et al. 2024's EAP-IG) and Conmy et al. 2023's
// automatic circuit discovery (ACDC), on one graph and one forward.
//
// The graph: the residual stream is a sum of what its nodes write (the embeddings, every head, every
// feed-forward; the out_proj biases are constants, the same on every prompt) and is read by receivers
// (every head's query, key and value input (a grouped-query layer's key and value inputs per key/value group),
// every feed-forward input, the logits). Edge s -> r is sender
// s's share of receiver r's input; it exists when s sits before r. Patching edge s -> r gives r, in place
// of s's output in this run, s's output on the corrupted prompt:
//   x_r = sum over s of (patched(s, r) ? corrupt_s : out_s) + biases = resid_r - sum patched (out_s - corrupt_s)
// and everything after r computes from that as usual. Patching every edge gives the corrupted run.
// The metric is the mean logit difference answer - wrong at the last position, normalised so that the
// clean run scores 1 and the corrupted run 0 (LogitDifference::normalized).
//
// The forward is the model's own (nn/decoder.h): every receiver takes its own input through the hook
// points (per-head q/k/v inputs, hook_mlp_in), every node's output is read (and set) at hook_result and
// hook_mlp_out, and only the last position's logits are formed, along the answer - wrong direction. The
// model's head controls are not applied. K copies of the prompts run as one batch, each with its own
// patched edges, and a forward starts at the first layer any copy patches (everything before it is the
// clean run, stored once). B = prompt rows, T = tokens, C = d_model, H = heads of a layer, D = head
// size, N = nodes, R = receivers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "analysis/prompt_pairs.h"
#include "train/collectives.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// The graph of a decoder: nodes, receivers and the edges between them, in a fixed order. Where a family's
// blocks are parallel (the MLP reads the block's input), a layer's heads do not feed its MLP.
class CircuitGraph {
 public:
  explicit CircuitGraph(const nn::DecoderModel& model);
  enum class Input { q, k, v, mlp, logits };
  struct Node {
    int64_t layer = -1, head = -1;  // the embeddings: layer -1; a feed-forward: head -1
  };
  struct Receiver {
    int64_t layer = 0, head = -1;  // the logits: layer = n_layers; k and v: the key/value head (its group)
    Input input = Input::logits;
    int64_t senders = 0;     // nodes [0, senders) feed it
    int64_t first_edge = 0;  // its edges are [first_edge, first_edge + senders), sender-major
  };
  // Receivers come in groups that read the stream at one point: a layer's attention (q of every head, then
  // k and then v of every key/value head: fewer in a grouped-query layer), a layer's feed-forward, the logits.
  struct Group {
    int64_t layer = 0, first = 0, count = 0, senders = 0;
    Input input = Input::q;  // q for an attention group (q, k, v inside), else mlp or logits
  };

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Receiver>& receivers() const { return receivers_; }
  const std::vector<Group>& groups() const { return groups_; }
  int64_t node_count() const { return static_cast<int64_t>(nodes_.size()); }
  int64_t edge_count() const { return edges_; }
  int64_t n_layers() const { return n_layers_; }
  int64_t first_node_of_layer(int64_t layer) const;  // layer = n_layers: node_count()

  std::string node_name(int64_t node) const;           // "embed", "L1H3", "MLP0" (original head indices)
  std::string receiver_name(int64_t receiver) const;   // "L1H3.k", "L1G0.k" (a key/value group's), "MLP0", "logits"
  std::string receiving_name(int64_t receiver) const;  // receiver_name without its input: "L1H3", "L1G0"
  std::string edge_name(int64_t edge) const;           // "L0H2 -> L1H3.k"
  int64_t edge_sender(int64_t edge) const;
  int64_t edge_receiver(int64_t edge) const;
  int64_t edge(int64_t sender, int64_t receiver) const;  // -1 when sender does not feed receiver
  // The node a name means ("embed", "L1H3", "MLP0", original head indices) and the receivers of a name
  // ("L1H3.q", "L1H3" = its q, k and v, "MLP0", "logits"); clear errors naming `who` otherwise.
  int64_t parse_node(const std::string& name, const char* who) const;
  std::vector<int64_t> parse_receivers(const std::string& name, const char* who) const;
  // The nodes receiver r feeds: a head (its q, k or v), a grouped-query layer's heads of one group (their
  // shared k or v), a feed-forward; none for the logits.
  std::vector<int64_t> nodes_of_receiver(int64_t receiver) const;

 private:
  std::vector<Node> nodes_;
  std::vector<Receiver> receivers_;
  std::vector<Group> groups_;
  bool shared_kv(const Receiver& r) const;            // a grouped-query layer's k or v
  std::vector<std::vector<int64_t>> original_heads_;  // [layer][head]
  std::vector<int64_t> kv_heads_;                     // [layer]
  int64_t n_layers_ = 0, edges_ = 0;
};

// ------------------------------------------------------------------------------------------------
// A set of patched edges: patch[e] is the fraction of edge e patched (0: as in this run; 1: the
// corrupted sender's output; between, the straight line, whose slope at 0 edge attribution estimates).
using EdgePatch = std::vector<double>;
// A node whose output is set, at every position or at one (0-based), to a value of its own whatever it
// reads: its output on the clean prompt, on the corrupted one, zero, or its mean over the prompts at
// that position (clean runs). The embeddings compute nothing: set to their clean value, the positions not
// set hold the corrupted ones (the denoising convention); set to another, the clean ones.
struct Replace {
  enum class Value { clean, corrupt, zero, mean };
  int64_t node = -1;  // -1: none
  int64_t position = -1;
  Value with = Value::clean;
};

struct CircuitOptions {
  // The activations' budget: the model's weights' size, at least 256 MB and at most 1 GiB (with edge
  // attribution's backward: 512 MB).
  int64_t chunk_rows = 0;  // prompt rows per forward; 0: as the budget allows
  int64_t max_copies = 0;  // copies per forward; 0: as the budget allows
  // Prompt rows whose clean and corrupted runs stay stored between passes (whole chunks); the others are
  // run again in every pass that reads them (one forward of both prompts a chunk), so that memory is bounded whatever
  // the rows. 0: as many as 2 GiB hold, or a quarter of the memory available at the start where that is less (shared by
  // the ranks on one machine).
  int64_t stored_rows = 0;
  // The processes sharing the work (train/collectives.h; null: this one alone). Chunks of rows go to the
  // ranks in turn, each stores and runs only its own, and every sum is allreduced, so that every rank
  // gets the single process's numbers (up to the order of the sums) and takes the same decisions.
  std::shared_ptr<train::Collectives> collectives;
};

// Direct logit attribution along each row's answer - wrong direction: node n's clean output at the last
// position through the final LayerNorm with its scale frozen at the clean run's, mean over the rows, in
// logits (whatever the task's metric). The nodes' values plus `constant` (out_proj biases, the norm's shift,
// the unembedding's bias) sum to the clean logit difference answer - wrong.
struct DirectLogitAttribution {
  std::vector<double> node;  // [node]
  double constant = 0, clean = 0;
};

// The clean and corrupted runs of a model on a task, stored (per chunk of rows: the corrupted outputs of
// every node and the clean minus corrupted ones, (N, B, T, C) each in the model's dtype; chunks past
// CircuitOptions::stored_rows are run again when read), and the patched forward over them. The model must stay alive
// and unchanged while this exists; it is put in eval mode and back.
class CircuitPatcher {
 public:
  CircuitPatcher(nn::DecoderModel& model, const PromptPairs& pairs, const CircuitOptions& options = {});
  ~CircuitPatcher();
  CircuitPatcher(const CircuitPatcher&) = delete;
  CircuitPatcher& operator=(const CircuitPatcher&) = delete;

  const CircuitGraph& graph() const;
  const LogitDifference& baseline() const;  // per row, clean and corrupted, from this forward
  // The normalised metric of each patch (1: clean, 0: corrupted), as many forwards as the copies take.
  std::vector<double> metric(const std::vector<EdgePatch>& patches);
  // The same with copy k's node replaced[k].node set to its value replaced[k].with (at
  // replaced[k].position only when that is >= 0) whatever it reads, everything after it recomputed.
  std::vector<double> metric(const std::vector<EdgePatch>& patches, const std::vector<Replace>& replaced);
  double metric(const EdgePatch& patch) { return metric(std::vector<EdgePatch>{patch}).front(); }
  // Every node's direct logit attribution (above), from the stored clean run.
  DirectLogitAttribution direct_logit_attribution() const;
  int64_t forwards() const;     // patched forwards this process ran so far (one per copy and chunk of rows)
  int64_t rerun_rows() const;   // rows whose clean and corrupted runs were run again, not stored, so far
  int64_t stored_rows() const;  // rows whose runs this process keeps (all its rows: none are run again)
  int64_t own_rows() const;     // rows this process runs (under MPI, its share)
  int64_t positions() const;    // tokens per prompt

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A line for the terminal when some of this process's rows are run again in every pass ("" when all are stored).
std::string stored_runs_text(const CircuitPatcher& patcher);

// ------------------------------------------------------------------------------------------------
// Path patching (Wang et al. 2022): the normalised metric with sender s's output replaced by its
// corrupted one on its edges into the receivers only, everything else as in the clean run; one value
// per sender. A sender that feeds none of the receivers scores the clean metric (1).
std::vector<double> path_patching(CircuitPatcher& patcher, const std::vector<int64_t>& senders,
                                  const std::vector<int64_t>& receivers);

// Activation patching of whole nodes both ways, one value per node on the normalised metric: noising
// (node n's output corrupted for every receiver in the clean run; 1: no effect) and denoising (the
// corrupted run with n's clean output restored and everything after it recomputed; 0: no effect, 1: the
// clean behaviour back). Heimersheim and Nanda (2024) on why the two answer different questions.
// by_position: both also at each position alone (a copy per node and position).
struct ActivationPatching {
  std::vector<double> noising, denoising;
  std::vector<std::vector<double>> noising_by_position, denoising_by_position;  // [node][position], when asked for
};
ActivationPatching activation_patching(CircuitPatcher& patcher, const std::vector<int64_t>& nodes,
                                       bool by_position = false);

// Activation patching of keys and values per key/value group (a grouped-query layer's groups; in a multi-head
// layer every head is its own group): noising, the normalised metric with the group's key and value inputs
// taken from the corrupted prompt (every edge into its k and v receivers patched; the same as patching hook_k
// and hook_v at that key/value head), everything after recomputed; 1: no effect. groups: "L1G0" ("L1H3").
struct KeyValuePatching {
  std::vector<std::string> groups;
  std::vector<std::vector<int64_t>> heads;  // [group]: the query heads that read it (nodes)
  std::vector<double> noising;
};
KeyValuePatching key_value_patching(CircuitPatcher& patcher);

// Ablation of whole nodes in the clean run, the normalised metric with node n's output set to zero, or to
// its mean over the prompts at each position (Wang et al.'s mean ablation), everything after it
// recomputed. Resample ablation from the corrupted prompts is activation patching's noising.
struct NodeAblation {
  std::vector<double> zero, mean;
};
NodeAblation ablate_nodes(CircuitPatcher& patcher, const std::vector<int64_t>& nodes);

// Edge attribution patching (Syed et al. 2023): every edge's effect on the normalised metric when
// patched, estimated to first order from one clean forward and backward: -(dm/dx_r) . (out_s - corrupt_s),
// summed over the positions. ig_steps > 0: EAP-IG (Hanna et al. 2024), the gradient averaged over the
// straight line from the corrupted embeddings to the clean ones (steps k/ig_steps, k = 1..ig_steps).
// Streams chunks of rows, so that its memory is one chunk's.
struct EdgeAttribution {
  std::vector<double> effect;  // [edge], in normalised metric units (patching it: metric + effect)
  LogitDifference baseline;
  double seconds = 0;
};
EdgeAttribution edge_attribution(nn::DecoderModel& model, const PromptPairs& pairs, int64_t ig_steps = 0,
                                 const CircuitOptions& options = {});

// ------------------------------------------------------------------------------------------------
// Automatic circuit discovery: ACDC's greedy pruning, an edge removed (patched) for good when the metric
// falls by less than tau (on the normalised scale) below its value before, with real patching. ACDC
// visits the edges one at a time from the logits back; here they are visited from the smallest
// |attribution| up, in groups that are patched together and split in halves only when a group fails
// (moves the metric by tau or more either way: edges that matter can cancel out together), so that the
// many edges that do nothing cost a few forwards. plain_acdc: one edge a forward in ACDC's
// order (receivers from the logits back, their senders from the last), for comparison.
struct DiscoveryOptions {
  double tau = 0.01;
  bool plain_acdc = false;
  int64_t first_group = 16;  // edges in the first group tried
};
struct Circuit {
  std::vector<uint8_t> kept;        // [edge]: 1 in the circuit
  std::vector<double> attribution;  // [edge], what ordered the search
  double metric = 0;                // normalised metric of the circuit alone (every other edge patched)
  int64_t forwards = 0;             // patched forwards the search used (copies x chunks)
  int64_t tests = 0;                // patch sets the search evaluated
  double seconds = 0;
  int64_t kept_count() const;
};
Circuit discover_circuit(CircuitPatcher& patcher, const std::vector<double>& attribution,
                         const DiscoveryOptions& options = {});

// The circuit as JSON: {"nodes": [...], "edges": [{"sender", "receiver", "input", "attribution"}], "metric", ...}
// and as Graphviz DOT (edges coloured by the receiver's input: q, k, v, mlp, logits).
std::string circuit_json(const CircuitGraph& graph, const Circuit& circuit, const LogitDifference& baseline);
std::string circuit_dot(const CircuitGraph& graph, const Circuit& circuit);

}  // namespace headlab::analysis
