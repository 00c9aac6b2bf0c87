// Sparse autoencoder training steps, timed as ../shared/peers/torch_sae_train.py times them: --tokens random N(0, 1)
// rows of width --d-in in memory, batches of --batch-size taken in order, one warm-up step, then --repeats passes of
// --steps steps each, their tokens/s; the last batch's explained variance, L0, the latents that never fired, and
// the peak RSS. The step is train::SaeTrainer's (the one `headlab sae train` runs). The floor: the step's GEMM FLOPs
// over the SGEMM rate measured here first (dense: 2 R d_in d_sae a product, five products a ReLU step; TopK: the
// encoder's product only, its decoder and gradients being R k d_in each).
// bench/sae_ratios.sh runs it beside the peer. Usage: sae_train [--d-in D --expansion E --arch relu|topk --k K
//   --l1 L --lr LR --batch-size B --tokens N --steps S --repeats R --threads T]
#include <omp.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "train/sae.h"

using namespace headlab;

static int run(int argc, char** argv) {
  int64_t d_in = 512, expansion = 16, k = 32, batch = 4096, tokens = 65536, steps = 8, repeats = 3, threads = 2;
  double l1 = 5.0, lr = 3e-4;
  std::string arch = "topk";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* v = argv[i + 1];
    if (key == "--d-in")
      d_in = std::stoll(v);
    else if (key == "--expansion")
      expansion = std::stoll(v);
    else if (key == "--arch")
      arch = v;
    else if (key == "--k")
      k = std::stoll(v);
    else if (key == "--l1")
      l1 = std::stod(v);
    else if (key == "--lr")
      lr = std::stod(v);
    else if (key == "--batch-size")
      batch = std::stoll(v);
    else if (key == "--tokens")
      tokens = std::stoll(v);
    else if (key == "--steps")
      steps = std::stoll(v);
    else if (key == "--repeats")
      repeats = std::stoll(v);
    else if (key == "--threads")
      threads = std::stoll(v);
    else {
      std::fprintf(stderr, "sae_train: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  omp_set_num_threads(static_cast<int>(threads));
  const double gflops = bench::sgemm_gflops_cpu();

  manual_seed(0);
  const Tensor X = randn({tokens, d_in});
  nn::SaeConfig c;
  c.d_in = d_in, c.d_sae = d_in * expansion, c.arch = parse_enum<nn::SaeArch>(arch, "--arch"), c.k = k;
  nn::SparseAutoencoder sae(c);
  train::SaeTrainOptions opts;
  opts.adam.lr = lr;
  opts.loss.l1 = l1;
  train::SaeTrainer trainer(sae, opts);
  trainer.init_b_dec(X, train::BdecInit::mean);  // the peer's b_dec = X.mean(0)

  const auto batch_at = [&](int64_t s) {
    const int64_t o = (s * batch) % std::max<int64_t>(1, tokens - batch + 1);
    return narrow(X, 0, o, batch);
  };
  const Tensor first = batch_at(0);
  trainer.step(first, first);
  std::vector<double> rates;
  train::SaeStepStats last;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto t0 = bench::clock_type::now();
    for (int64_t s = 0; s < steps; ++s) {
      const Tensor x = batch_at(s);
      last = trainer.step(x, x);
    }
    rates.push_back(static_cast<double>(steps * batch) / bench::seconds_since(t0));
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double products = c.arch == nn::SaeArch::topk ? 1 : 5;
  const double floor_s = products * 2.0 * static_cast<double>(batch * d_in * c.d_sae) / (gflops * 1e9);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("sae %s d_in %lld d_sae %lld batch %lld: %.0f tokens/s (passes", arch.c_str(), (long long)d_in,
              (long long)c.d_sae, (long long)batch, median);
  for (size_t i = 0; i < rates.size(); ++i) std::printf("%s %.0f", i ? "," : "", rates[i]);
  std::printf(
      "); explained variance %.4f, L0 %.1f, dead %.3f, peak RSS %.0f MB; step: %.1f ms (floor %.1f ms at %.0f "
      "GFLOP/s)\n",
      last.explained_variance, last.l0, static_cast<double>(trainer.never_fired()) / static_cast<double>(c.d_sae),
      static_cast<double>(ru.ru_maxrss) / 1024.0, 1e3 * static_cast<double>(batch) / median, 1e3 * floor_s, gflops);
  return 0;
}

int main(int argc, char** argv) {
  prepare_process(argv);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sae_train: %s\n", e.what());
    return 1;
  }
}
