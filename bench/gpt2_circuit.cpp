// Circuit analyses on a GPT-2-small-shaped model (12 x 12 heads, emb 768, vocabulary 50257, qkv bias,
// tied head, random weights: the cost does not depend on them) with --rows prompt pairs of --tokens
// tokens (IOI's shape: 64 x 15), one phase a process so that each peak resident memory is its own:
//   --phase eap: edge attribution patching over every edge (analysis::edge_attribution);
//   --phase path: the stored clean and corrupted runs, then path patching of all 144 heads as senders
//                 to the logits (analysis::path_patching); each repeat prints its two parts' seconds;
//   --phase discover: edge attribution, then circuit discovery in its order (tau 0.01; random weights,
//                 so what it measures is the search's cost, not a circuit).
// Prints the phase's seconds (median of --repeats), the peak resident memory and the floor (the
// phase's GEMM FLOPs over the SGEMM rate measured here; discovery: none given). bench/gpt2_circuit.sh
// runs the first two beside the PyTorch hook implementation (bench/torch_circuit_peer.py).
// Usage: gpt2_circuit --phase eap|path|discover [--rows B] [--tokens T] [--threads N] [--repeats R] [--chunk-rows N]
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "analysis/circuit.h"
#include "backends/backend.h"
#include "bench/bench_util.h"

using namespace headlab;
using headlab::bench::clock_type;
using headlab::bench::seconds_since;

int main(int argc, char** argv) {
  prepare_process(argv);
  int64_t B = 64, T = 15;
  int threads = 2, repeats = 3;
  std::string phase;
  analysis::CircuitOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--phase")
      phase = v;
    else if (k == "--rows")
      B = std::stoll(v);
    else if (k == "--tokens")
      T = std::stoll(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--repeats")
      repeats = std::stoi(v);
    else if (k == "--chunk-rows")
      options.chunk_rows = std::stoll(v);
    else {
      std::fprintf(stderr, "gpt2_circuit: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (phase != "eap" && phase != "path" && phase != "discover") {
    std::fprintf(stderr, "gpt2_circuit: --phase eap, path or discover\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const nn::DecoderConfig c = bench::gpt2_small_config();
  manual_seed(1);
  nn::DecoderModel model(c);
  model.eval();
  analysis::PromptPairs pairs;
  pairs.T = T;
  for (int64_t i = 0; i < B * T; ++i) {
    pairs.clean.push_back((i * 7919 + 13) % c.vocab_size);
    pairs.corrupt.push_back((i * 104729 + 7) % c.vocab_size);
  }
  for (int64_t r = 0; r < B; ++r) pairs.answer.push_back(r * 31 % c.vocab_size), pairs.wrong.push_back(r * 37 + 1);

  const double rate = bench::sgemm_gflops_cpu();
  // FLOPs of one forward over the rows (the head only at the last position, along one direction).
  const double C = double(c.emb_dim), N = double(B * T), L = double(c.n_layers);
  const double attention = double(B) * 2 * 2 * double(T) * double(T) * C / 2;
  const double block = N * 2 * C * 3 * C + attention + N * 2 * C * C + N * 16 * C * C;
  double flops = 0;
  std::vector<double> s;
  int64_t edges = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock_type::now();
    if (phase == "eap") {
      const analysis::EdgeAttribution a = analysis::edge_attribution(model, pairs, 0, options);
      edges = static_cast<int64_t>(a.effect.size());
      // two recorded forwards, one forward and its backward (2x), the scores: every receiver's gradient
      // against its senders' differences (layer l: 36 q/k/v receivers of 1 + 13 l senders, the MLP's 13 more)
      flops = 2 * L * block + 3 * L * block;
      for (int64_t l = 0; l < c.n_layers; ++l) {
        const double before = 1 + 13 * double(l);
        flops += 2 * N * C * (36 * before + before + 12);
      }
    } else if (phase == "discover") {
      // Edge attribution orders the search; ACDC's plain order would test every edge, one a forward.
      const analysis::EdgeAttribution a = analysis::edge_attribution(model, pairs, 0, options);
      analysis::CircuitPatcher patcher(model, pairs, options);
      const analysis::Circuit circuit = analysis::discover_circuit(patcher, a.effect);
      edges = patcher.graph().edge_count();
      // A patch set is one forward over every prompt row (split in chunks and copies as memory allows).
      std::printf(
          "discovery, tau 0.01: %lld of %lld edges kept, circuit alone %.3f; %lld patch sets tested "
          "(plain ACDC: %lld), search %.1f s\n",
          static_cast<long long>(circuit.kept_count()), static_cast<long long>(edges), circuit.metric,
          static_cast<long long>(circuit.tests), static_cast<long long>(edges + 2), circuit.seconds);
    } else {
      analysis::CircuitPatcher patcher(model, pairs, options);
      const double stored = seconds_since(t0);
      std::vector<int64_t> senders;
      for (int64_t n = 0; n < patcher.graph().node_count(); ++n)
        if (patcher.graph().nodes()[static_cast<size_t>(n)].head >= 0) senders.push_back(n);
      const std::vector<double> m =
          analysis::path_patching(patcher, senders, patcher.graph().parse_receivers("logits", "bench"));
      edges = static_cast<int64_t>(m.size());
      std::printf("path: the stored runs %.2f s, the %lld senders' patched forwards %.2f s\n", stored,
                  static_cast<long long>(edges), seconds_since(t0) - stored);
      flops = 2 * L * block;  // the stored runs; each sender then costs the final norm at the last position
    }
    s.push_back(seconds_since(t0));
  }
  std::sort(s.begin(), s.end());
  const double median = s[s.size() / 2];
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  std::printf("headlab threads=%d sgemm %.1f GFLOP/s\n", threads, rate);
  char floor[32] = "floor n/a";
  if (flops > 0) std::snprintf(floor, sizeof floor, "floor %.2f s", flops / (rate * 1e9));
  std::printf("%s (%lld %s), %lld pairs x %lld tokens: %.2f s (median of %d), %s, peak resident %.0f MB\n",
              phase.c_str(), static_cast<long long>(edges), phase == "path" ? "senders" : "edges",
              static_cast<long long>(B), static_cast<long long>(T), median, repeats, floor,
              double(u.ru_maxrss) / 1024.0);
  return 0;
}
