// Zero ablation of every head of a GPT-2-small-shaped model (12 layers x 12 heads, emb 768, vocabulary
// 50257, tied head, random weights: the cost does not depend on them) on one batch of --rows x --tokens
// random tokens: the unablated model and each of the 144 heads zeroed in turn, each scored by cross
// entropy and argmax over every position, through headlab's batched intervention engine
// (analysis::evaluate_interventions: each intervention replays the model from its layer on). Prints the
// median seconds of --repeats sweeps, heads per second, the peak resident memory, and the floor: the
// sweep's GEMM FLOPs over the SGEMM rate measured here.
// bench/gpt2_heads.sh runs it beside the PyTorch hook sweep (bench/torch_head_sweep_peer.py --config gpt2).
// Usage: gpt2_heads [--rows B] [--tokens T] [--threads N] [--repeats R]
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "analysis/heads.h"
#include "autograd/engine.h"
#include "backends/backend.h"
#include "bench/bench_util.h"

using namespace headlab;
using headlab::bench::clock_type;
using headlab::bench::seconds_since;

int main(int argc, char** argv) {
  prepare_process(argv);
  int64_t B = 8, T = 128;
  int threads = 2, repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long long v = std::stoll(argv[i + 1]);
    if (k == "--rows")
      B = v;
    else if (k == "--tokens")
      T = v;
    else if (k == "--threads")
      threads = static_cast<int>(v);
    else if (k == "--repeats")
      repeats = static_cast<int>(v);
    else {
      std::fprintf(stderr, "gpt2_heads: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const nn::DecoderConfig c = bench::gpt2_small_config();
  manual_seed(1);
  nn::DecoderModel model(c);
  model.eval();
  analysis::EvalSet data;
  tasks::Batch b;
  b.B = B, b.T = T;
  for (int64_t i = 0; i < B * T; ++i) {
    b.inputs.push_back((i * 7919 + 13) % c.vocab_size);
    b.targets.push_back((i * 104729 + 7) % c.vocab_size);
  }
  data.batches.push_back(b);
  std::vector<analysis::HeadIntervention> list{{}};  // the unablated model first
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_heads; ++h) list.push_back({l, h, analysis::Ablation::zero, -1});

  const double rate = bench::sgemm_gflops_cpu();
  std::vector<double> s;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock_type::now();
    const std::vector<train::Scores> scores = analysis::evaluate_interventions(model, data, list);
    s.push_back(seconds_since(t0));
    if (scores.size() != list.size()) return 1;
  }
  std::sort(s.begin(), s.end());
  const double median = s[s.size() / 2];
  // FLOPs: the clean pass (every block and the head), and per head of layer l what the engine
  // replays: layer l from its output projection (the recorded contexts) and MLP, the later blocks, the head.
  const double C = double(c.emb_dim), V = double(c.vocab_size), N = double(B * T), L = double(c.n_layers);
  const double attention = double(B) * 2 * 2 * double(T) * double(T) * C / 2;  // q k^T and @ v, causal half
  const double qkv = N * 2 * C * 3 * C, out_proj = N * 2 * C * C, mlp = N * 16 * C * C, head = N * 2 * C * V;
  const double block = qkv + attention + out_proj + mlp;
  double flops = L * block + head;
  for (int64_t l = 0; l < c.n_layers; ++l)
    flops += double(c.n_heads) * (out_proj + mlp + (L - 1 - double(l)) * block + head);
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  std::printf("headlab threads=%d sgemm %.1f GFLOP/s\n", threads, rate);
  std::printf(
      "sweep %lld heads, batch %lld x %lld: %.2f s (median of %d), %.2f heads/s, floor %.2f s (%.0f%%), "
      "peak resident %.0f MB\n",
      static_cast<long long>(c.n_layers * c.n_heads), static_cast<long long>(B), static_cast<long long>(T), median,
      repeats, double(c.n_layers * c.n_heads) / median, flops / (rate * 1e9), 100 * flops / (rate * 1e9) / median,
      double(u.ru_maxrss) / 1024.0);
  return 0;
}
