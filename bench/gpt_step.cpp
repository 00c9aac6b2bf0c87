// One AdamW training step of the book's GPT, timed like ../shared/peers/torch_gpt_cpu.py (3 warm-up
// steps, then steps until --seconds have passed), and set against the floor: the step's GEMM FLOPs
// over the SGEMM rate measured here first (cblas_sgemm 1024^3, its fastest pass), and the CPU backend's peak bytes
// over one step above what was live before it (parameters, optimizer state).
// bench/peer_ratios.sh runs it beside the PyTorch peer and prints the ratios. On a GPU (--device cuda)
// the step ends with a device synchronisation, as the peer's does, and the floor's rate is cuBLAS's
// SGEMM at 4096^3 through headlab's matmul (TF32 as --tf32 says: off, as the peer's default).
// Usage: gpt_step [--emb-dim D --n-heads H --n-layers L --context-length T --vocab-size V
//                  --batch-size B --threads N --attention fused|wrapper --seconds S --device cpu|cuda
//                  --tf32 0|1 --attn-only 0|1 --phases 0|1 --parallel auto|ops|data]
// --parallel data (CPU): the step as headlab train runs it on --threads threads when --parallel auto picks
// data parallelism: each thread a copy of the model with its rows of the batch and single-threaded
// kernels, the gradients summed (train::allreduce_gradients) before every copy's optimizer step. The
// floor stays the same FLOPs over the SGEMM rate on --threads threads. --parallel auto (the default) chooses
// as headlab train's --parallel auto does: data where the batch splits over the CPU threads into shares of a
// multiple of 4 rows, else ops (train also caps the copies of the model at 1 GiB: these models are small).
// --phases 1 also times the step's forward, backward and optimizer step each to a synchronisation, and
// the host's time to issue a whole step (on a GPU: a step whose issue time is near its run time is
// bound by kernel launches and host work, not by the GPU).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "bench/bench_util.h"
#ifdef HEADLAB_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#include "nn/decoder_family.h"
#include "optim/optim.h"
#include "train/collectives.h"
#include "train/trainer.h"

using namespace headlab;
using headlab::bench::clock_type;
using headlab::bench::sgemm_gflops_cpu;
using headlab::bench::sgemm_gflops_device;

// Matrix-multiply FLOPs of one forward+backward (3x forward) of the model on B x T tokens.
static double step_flops(const nn::DecoderConfig& c, int64_t B) {
  const double tokens = static_cast<double>(B * c.context_length), d = static_cast<double>(c.emb_dim);
  const double per_layer_linear = 2 * tokens * (4 * d * d + (c.attn_only ? 0 : 8 * d * d));  // qkv + out_proj, FF
  const double per_layer_attn = 2 * 2 * B * static_cast<double>(c.context_length) * c.context_length * d;  // QK^T, AV
  const double head = 2 * tokens * d * static_cast<double>(c.vocab_size);
  return 3 * (c.n_layers * (per_layer_linear + per_layer_attn) + head);
}

// Medians over 20 steps of: forward, backward and optimizer each run to a synchronisation, and the host
// time to issue one whole step before its synchronisation.
static void print_phases(nn::DecoderModel& model, optim::Optimizer& opt, const Tensor& idx, const Tensor& tgt,
                         int64_t vocab, Backend& be) {
  std::vector<double> fwd, bwd, upd, issue, whole;
  const auto ms_since = [](clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count() * 1e3;
  };
  for (int i = 0; i < 20; ++i) {
    opt.zero_grad();
    auto t0 = clock_type::now();
    const Tensor loss = cross_entropy(model.forward(idx).reshape({-1, vocab}), tgt);
    be.synchronize();
    fwd.push_back(ms_since(t0));
    t0 = clock_type::now();
    loss.backward();
    be.synchronize();
    bwd.push_back(ms_since(t0));
    t0 = clock_type::now();
    opt.step();
    be.synchronize();
    upd.push_back(ms_since(t0));
    t0 = clock_type::now();
    opt.zero_grad();
    cross_entropy(model.forward(idx).reshape({-1, vocab}), tgt).backward();
    opt.step();
    issue.push_back(ms_since(t0));
    be.synchronize();
    whole.push_back(ms_since(t0));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "phases (median of 20, ms): forward %.2f, backward %.2f, optimizer %.2f; a whole step issued in %.2f, "
      "done in %.2f\n",
      median(fwd), median(bwd), median(upd), median(issue), median(whole));
}

// Milliseconds per step of --parallel data over `threads` threads, timed as run() times a step.
static double data_parallel_ms(const nn::DecoderConfig& cfg, const Tensor& idx, const Tensor& tgt, int threads,
                               double seconds) {
  const int64_t B = idx.size(0), T = cfg.context_length, rows = B / threads;
  HL_CHECK(B % threads == 0, "gpt_step: --parallel data: --batch-size ", B, " does not split over ", threads,
           " threads");
  double ms = 0;
  train::run_on_threads(threads, train::single_process(), [&](const std::shared_ptr<train::Collectives>& comm) {
    const int r = comm->rank();
    manual_seed(0);
    nn::DecoderModel model(cfg);
    optim::Optimizer opt(model.named_parameters(), optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw));
    const std::vector<Tensor> params = model.parameters();
    const Tensor my_idx = slice(idx, 0, r * rows, (r + 1) * rows).contiguous();          // (rows, T)
    const Tensor my_tgt = slice(tgt, 0, r * rows * T, (r + 1) * rows * T).contiguous();  // (rows T)
    std::vector<float> go(1);
    // Thread 0 decides whether another step follows; the flag travels in the step's one allreduce.
    const auto step = [&](bool more) {
      opt.zero_grad();
      const Tensor logits = model.forward(my_idx).reshape({-1, cfg.vocab_size});
      (cross_entropy(logits, my_tgt) * (1.0 / threads)).backward();  // the threads' sum: the batch's mean
      go[0] = r == 0 && more ? 1.0f : 0.0f;
      train::allreduce_gradients(*comm, params, go);
      opt.step();
      return go[0] > 0;
    };
    for (int i = 0; i < 3; ++i) step(true);
    int n = 0;
    const auto t0 = clock_type::now();
    const auto elapsed = [&] { return std::chrono::duration<double>(clock_type::now() - t0).count(); };
    while (step(elapsed() < seconds || n < 2)) ++n;
    ++n;
    if (r == 0) ms = elapsed() / n * 1e3;
  });
  return ms;
}

static int run(int argc, char** argv) {
  nn::DecoderConfig cfg;
  cfg.vocab_size = 64;
  cfg.context_length = 64;
  cfg.emb_dim = 128;
  cfg.n_heads = 4;
  cfg.n_layers = 2;
  int64_t B = 32;
  int threads = 2;
  double seconds = 2.0;
  Device device = kCPU;
  bool tf32 = false;
  bool phases = false;
  std::string parallel = "auto";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--emb-dim")
      cfg.emb_dim = std::stoll(v);
    else if (k == "--n-heads")
      cfg.n_heads = std::stoll(v);
    else if (k == "--n-layers")
      cfg.n_layers = std::stoll(v);
    else if (k == "--context-length")
      cfg.context_length = std::stoll(v);
    else if (k == "--vocab-size")
      cfg.vocab_size = std::stoll(v);
    else if (k == "--batch-size")
      B = std::stoll(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--attention")
      cfg.attention = parse_enum<nn::AttentionForm>(v, "gpt_step: --attention");
    else if (k == "--seconds")
      seconds = std::stod(v);
    else if (k == "--device")
      device = Device::parse(v);
    else if (k == "--phases")
      phases = std::stoi(v) != 0;
    else if (k == "--tf32")
      tf32 = std::stoi(v) != 0;
    else if (k == "--parallel")
      parallel = v;
    else if (k == "--attn-only")
      cfg.attn_only = std::stoi(v) != 0;
    else {
      std::fprintf(stderr, "gpt_step: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  omp_set_num_threads(threads);
#ifdef HEADLAB_HAS_CUDA
  if (device.is_cuda()) cuda_set_allow_tf32(tf32);
#endif
  const double peak = device.is_cuda() ? sgemm_gflops_device(device) : sgemm_gflops_cpu();
  manual_seed(0);
  nn::DecoderModel model(cfg);
  model.to(device);
  optim::Optimizer opt(model.named_parameters(), optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw));
  Generator gen(1);
  const Tensor idx = randint(0, cfg.vocab_size, {B, cfg.context_length}, gen).to(device);
  const Tensor tgt = randint(0, cfg.vocab_size, {B * cfg.context_length}, gen).to(device);
  Backend& be = backend_for(device);
  auto step = [&] {
    opt.zero_grad();
    const Tensor logits = model.forward(idx).reshape({-1, cfg.vocab_size});
    cross_entropy(logits, tgt).backward();
    opt.step();
    be.synchronize();
  };
  if (parallel != "auto" && parallel != "ops" && parallel != "data") {
    std::fprintf(stderr, "gpt_step: --parallel is auto, ops or data, got %s\n", parallel.c_str());
    return 2;
  }
  if (parallel == "auto")
    parallel = !device.is_cuda() && threads > 1 && B % threads == 0 && (B / threads) % 4 == 0 ? "data" : "ops";
  double ms = 0, peak_mib = -1;  // (peak: the ops step's, from the backend's counters)
  if (parallel == "data") {
    HL_CHECK(!device.is_cuda(), "gpt_step: --parallel data runs on the CPU");
    ms = data_parallel_ms(cfg, idx, tgt, threads, seconds);
  } else {
    for (int i = 0; i < 3; ++i) step();
    const size_t live = be.bytes_in_use();
    be.reset_peak();
    step();
    peak_mib = static_cast<double>(be.peak_bytes() - live) / (1 << 20);
    int n = 0;
    const auto t0 = clock_type::now();
    while (std::chrono::duration<double>(clock_type::now() - t0).count() < seconds || n < 3) {
      step();
      ++n;
    }
    ms = std::chrono::duration<double>(clock_type::now() - t0).count() / n * 1e3;
  }
  const double flops = step_flops(cfg, B);
  std::printf("headlab %s%s device=%s threads=%d parallel=%s tf32=%d sgemm=%.0f GFLOP/s (OpenBLAS %s)\n",
              enum_name(cfg.attention), cfg.attn_only ? " attn-only" : "", device.str().c_str(), threads,
              parallel.c_str(), tf32 ? 1 : 0, peak, openblas_get_corename());
  std::printf(
      "V=%lld T=%lld d=%lld h=%lld L=%lld B=%lld params=%lld: %.1f ms/step, %.0f tokens/s, "
      "%.1f GFLOP/step, %.0f GFLOP/s = %.0f%% of sgemm (floor %.1f ms)",
      (long long)cfg.vocab_size, (long long)cfg.context_length, (long long)cfg.emb_dim, (long long)cfg.n_heads,
      (long long)cfg.n_layers, (long long)B, (long long)model.num_parameters(), ms, B * cfg.context_length / ms * 1e3,
      flops / 1e9, flops / ms / 1e6, 100 * flops / ms / 1e6 / peak, flops / peak / 1e6);
  if (peak_mib >= 0) std::printf(", step peak %.1f MiB", peak_mib);
  std::printf("\n");
  if (phases && parallel == "ops") print_phases(model, opt, idx, tgt, cfg.vocab_size, be);
  return 0;
}

int main(int argc, char** argv) {
  prepare_process(argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 1;
  }
}
