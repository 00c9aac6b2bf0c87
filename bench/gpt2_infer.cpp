// GPT-2 inference in headlab, timed as ../shared/peers/torch_gpt2_infer.py times PyTorch: prefill
// (one no-grad forward over B x T tokens, every position's logits: tokens/s) and greedy decoding
// with the key/value cache (batch 1, --decode tokens after a --prefill prompt, the prompt's own
// prefill subtracted: tokens/s), medians of --repeats. Also: the prefill of a generate call (the
// head on the last position only), loading time and resident memory for a --model folder, and the
// floors: prefill's GEMM FLOPs over the SGEMM rate measured here, decoding's weight bytes per
// token over the read bandwidth measured here (decoding is memory-bound).
// bench/gpt2_ratios.sh runs it beside the peer and prints the ratios.
// Usage: gpt2_infer [--model DIR | --n-layer L --n-head H --n-embd C --n-positions P] [--batch-size B]
//                   [--prefill T] [--decode N] [--threads N] [--repeats R] [--save DIR] [--device cpu|cuda]
// On a GPU every timed call ends with a device synchronisation (as the peer's do) and the floors use the
// GPU's own GEMM rate and read bandwidth.
// --save DIR writes the (random) model as a Hugging Face folder and exits.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "bench/bench_util.h"
#include "io/hf_gpt2.h"
#include "nn/gpt.h"
#include "ops/ops.h"

using namespace headlab;
using headlab::bench::clock_type;
using headlab::bench::seconds_since;

namespace {

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

template <typename F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = clock_type::now();
    f();
    s.push_back(seconds_since(t0));
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// GEMM FLOPs of a forward over B x T tokens with the head on `head_rows` rows per sequence.
double forward_flops(const nn::GPTConfig& c, double B, double T, double head_rows) {
  const double C = double(c.emb_dim), L = double(c.n_layers), V = double(c.vocab_size);
  const double per_token = L * (2 * C * 3 * C + 2 * C * C + 2 * 2 * C * 4 * C);  // qkv, out_proj, mlp
  const double attention = L * 2 * 2 * T * T * C / 2;                            // q k^T and @ v, causal half
  return B * (T * per_token + attention + head_rows * 2 * C * V);
}

}  // namespace

int main(int argc, char** argv) {
  prepare_process(argv);  // headlab's threading policy (passive OpenMP waits), as the headlab command runs
  std::string model_dir;
  nn::GPTConfig c = bench::gpt2_small_config();  // GPT-2's head is wte, as the peer's GPT2LMHeadModel
  std::string save_dir;
  int64_t B = 1, prefill = 960, decode = 64;
  int threads = 2, repeats = 3;
  Device device = kCPU;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--model")
      model_dir = v;
    else if (k == "--save")
      save_dir = v;
    else if (k == "--n-layer")
      c.n_layers = std::stoll(v);
    else if (k == "--n-head")
      c.n_heads = std::stoll(v);
    else if (k == "--n-embd")
      c.emb_dim = std::stoll(v);
    else if (k == "--n-positions")
      c.context_length = std::stoll(v);
    else if (k == "--batch-size")
      B = std::stoll(v);
    else if (k == "--prefill")
      prefill = std::stoll(v);
    else if (k == "--decode")
      decode = std::stoll(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--device")
      device = Device::parse(v);
    else if (k == "--repeats")
      repeats = std::stoi(v);
    else {
      std::fprintf(stderr, "gpt2_infer: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const NoGradGuard no_grad;

  std::shared_ptr<nn::GPTModel> model;
  if (!model_dir.empty()) {
    const double before = peak_rss_mb();
    const auto t0 = clock_type::now();
    io::HfGpt2 hf = io::read_hf_gpt2(model_dir);
    c = hf.config;
    model = io::build_hf_gpt2(std::move(hf), model_dir);
    const double weights = double(model->num_parameters()) * 4 / 1048576.0;
    std::printf("load %s: %.3f s, peak resident %.0f MB (%.0f MB before loading), weights %.0f MB: %.2fx\n",
                model_dir.c_str(), seconds_since(t0), peak_rss_mb(), before, weights, peak_rss_mb() / weights);
  } else {
    model = std::make_shared<nn::GPTModel>(c);
  }
  if (!save_dir.empty()) {  // a random model of this shape as a folder (the load benchmark's input)
    io::write_hf_gpt2(save_dir, *model);
    std::printf("wrote %s\n", save_dir.c_str());
    return 0;
  }
  model->eval();
  model->to(device);
  Backend& be = backend_for(device);
  if (prefill + decode > c.context_length) {
    std::fprintf(stderr, "gpt2_infer: --prefill %lld + --decode %lld exceed the model's %lld positions\n",
                 (long long)prefill, (long long)decode, (long long)c.context_length);
    return 2;
  }
  const bool gpu = device.is_cuda();
  const double gflops = gpu ? bench::sgemm_gflops_device(device) : bench::sgemm_gflops_cpu();
  const double gbps = gpu ? bench::read_gbytes_per_s_device(device) : bench::read_gbytes_per_s();
  double params = 0;
  for (const auto& [name, t] : model->named_parameters()) params += double(t.numel());
  std::printf("headlab device=%s threads=%d params=%.0f sgemm %.1f GFLOP/s, read %.1f GB/s\n", device.str().c_str(),
              threads, params, gflops, gbps);

  const Tensor ids = randint(0, c.vocab_size, {B, prefill}).to(device);
  (void)model->forward(ids.narrow(1, 0, 8));  // warm-up
  const double pre = median_seconds(repeats, [&] {
    (void)model->forward(ids);
    be.synchronize();
  });
  const double floor = forward_flops(c, double(B), double(prefill), double(prefill)) / (gflops * 1e9);
  std::printf("prefill B=%lld T=%lld: %.1f ms, %.0f tokens/s (floor %.1f ms: %.0f%%)\n", (long long)B,
              (long long)prefill, pre * 1e3, double(B * prefill) / pre, floor * 1e3, 100 * floor / pre);

  const Tensor prompt = ids.narrow(0, 0, 1);
  auto generate_prefill = [&](std::vector<nn::KVCache>& caches) { return model->forward_cached(prompt, caches); };
  const double gen_pre = median_seconds(repeats, [&] {
    std::vector<nn::KVCache> caches(size_t(c.n_layers));
    (void)generate_prefill(caches);
    be.synchronize();
  });
  const double gen_floor = forward_flops(c, 1, double(prefill), 1) / (gflops * 1e9);
  std::printf("generate's prefill T=%lld (head on the last position): %.1f ms, %.0f tokens/s (floor %.1f ms: %.0f%%)\n",
              (long long)prefill, gen_pre * 1e3, double(prefill) / gen_pre, gen_floor * 1e3, 100 * gen_floor / gen_pre);
  if (decode > 0) {
    const double whole = median_seconds(repeats, [&] {
      std::vector<nn::KVCache> caches(size_t(c.n_layers));
      Tensor last = generate_prefill(caches);
      for (int64_t s = 0; s < decode; ++s) {
        const Tensor next = argmax(last, -1, true);  // (1, 1)
        last = model->forward_cached(next, caches);
      }
      be.synchronize();
    });
    const double dec = whole - gen_pre;
    // Per token every weight is read once (the blocks' and the head's), the embeddings one row each; a
    // tied head is wte itself, counted once in params but read whole by the head.
    const double tables = double(c.vocab_size + c.context_length) * double(c.emb_dim);
    const double head = c.tie_embeddings ? double(c.vocab_size) * double(c.emb_dim) : 0;
    const double bytes = 4.0 * (params - tables + head), floor_ms = bytes / (gbps * 1e9) * 1e3;
    std::printf(
        "decode %lld tokens after %lld (batch 1, KV cache): %.2f ms/token, %.1f tokens/s (floor %.2f ms/token: "
        "%.0f%%)\n",
        (long long)decode, (long long)prefill, dec / double(decode) * 1e3, double(decode) / dec, floor_ms,
        100 * floor_ms / (dec / double(decode) * 1e3));
  }
  std::printf("peak resident %.0f MB\n", peak_rss_mb());
  if (gpu) std::printf("peak device memory %.0f MB\n", double(be.peak_bytes()) / 1048576.0);
  return 0;
}
