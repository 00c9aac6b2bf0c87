// headlab circuit as one call that the command and the Python module make (analysis/circuit.h): edge
// attribution patching over every edge, checked against real patching on a sample of edges, path patching
// of the chosen senders into the chosen receivers, activation patching of every node both ways, and
// circuit discovery; then circuit.json, circuit.dot and its pictures, the CSV files and report.md. Under
// MPI the ranks share the prompt rows and hold the same figures; one of them writes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "analysis/circuit.h"
#include "analysis/table.h"

namespace headlab::analysis {

struct CircuitRunOptions {
  CircuitOptions engine;             // chunking and the ranks sharing the rows
  int64_t ig_steps = 0;              // edge attribution with integrated gradients over this many steps (0: EAP)
  int64_t check_edges = 64;          // edges whose attribution is checked against real patching
  double tau = 0.01;                 // discovery's threshold
  bool plain_acdc = false;           // discovery one edge a forward in ACDC's order
  bool by_position = false;          // activation patching at each position alone too
  std::vector<std::string> senders;  // path patching's senders (names; empty: every head)
  std::vector<std::string> receivers = {"logits"};
  uint64_t seed = 1;               // the edges checked at random
  std::string checkpoint, source;  // the model's path and where the pairs came from, for the report
};

struct CircuitReport {
  std::shared_ptr<CircuitPatcher> patcher;  // its graph and baseline name everything below
  EdgeAttribution eap;
  double setup_seconds = 0;      // the stored runs
  std::vector<int64_t> checked;  // edges patched for real
  std::vector<double> patched;   // [edge]: metric change when patched alone (NaN where not checked)
  double correlation = 0;        // attribution against real patching, Pearson r
  std::vector<int64_t> senders, receivers;
  std::vector<double> path;  // [sender]: metric with its output corrupted into the receivers only
  double path_seconds = 0;
  std::vector<int64_t> nodes;  // every node but the embeddings
  ActivationPatching activation;
  Circuit circuit;
};

// Why a circuit's normalised score cannot be read as a share of the model's behaviour, or "": it lies
// outside [0, 1] by more than kCircuitScoreSlack (the circuit "above" the model, or below the corrupted run).
inline constexpr double kCircuitScoreSlack = 0.1;
std::string circuit_warning(double metric);

// `say` receives the terminal's text as each part is found.
CircuitReport run_circuit(nn::DecoderModel& model, const PromptPairs& pairs, const CircuitRunOptions& options,
                          const Say& say = {});
// circuit.json, circuit.dot, circuit.png, circuit.svg, edges.csv, path_patching.csv,
// activation_patching.csv (and its by-position twin) and report.md into `out`; returns what it wrote.
std::vector<std::string> write_circuit_files(const std::string& out, const PromptPairs& pairs,
                                             const CircuitRunOptions& options, const CircuitReport& r);

}  // namespace headlab::analysis
