// Decoder inference in headlab (GPT-2, a LLaMA-family or a GPT-NeoX model), timed as ../shared/peers/
// torch_gpt2_infer.py, torch_llama_infer.py and torch_neox_infer.py time PyTorch: prefill (one no-grad forward over B x
// T tokens, every position's logits: tokens/s) and greedy decoding with the key/value cache (batch 1, --decode tokens
// after a --prefill prompt, the decoding loop timed alone: tokens/s), medians of --repeats. Also: the prefill of
// a generate call (the head on the last position only), the KV cache's bytes, loading time and resident memory for a
// --model folder, and the floors: prefill's GEMM FLOPs over the SGEMM rate measured here, decoding's weight and
// KV-cache bytes per token over the rate at which every thread reads those very bytes where they lie, measured just
// before each timed decoding (decoding is memory-bound; the rate moves with the other tenants and with the pages).
// bench/gpt2_ratios.sh and bench/llama_ratios.sh run it beside the peers and print the ratios. Usage: decoder_infer
// [--model DIR | --arch gpt|llama|qwen3|gemma3|neox [--layers L --dim C --heads H --kv-heads K --hidden F
//                       --vocab V --positions P --head-dim D (qwen3, gemma3)]] [--batch-size B] [--prefill T]
//                       [--decode N] [--threads N]
//                      [--repeats R] [--prefill-chunk N] [--save DIR] [--device cpu|cuda]
// Shapes by default: gpt is GPT-2 small (124M, tied head); llama is SmolLM-135M (30 layers, width 576, 9 query
// heads sharing 3 key/value heads, SwiGLU 1536, vocabulary 49152, tied head); neox is Pythia-160M (12 layers,
// width 768, 12 heads, MLP 3072, vocabulary 50304, rotary on 16 of 64 dims, parallel residual), as the peers';
// qwen3 is Qwen3-0.6B (28 layers, width 1024, 16 query heads of 128 sharing 8 key/value heads, q/k norms, SwiGLU
// 3072, vocabulary 151936, tied head), which the LLaMA peer runs at its nearest (heads of 64: bench/family_ratios.sh);
// gemma3 is Gemma-3-270M (18 layers, width 640, 4 query heads of 256 sharing 1 key/value head, GeGLU 2048, vocabulary
// 262144, tied head, four norms a block, q/k norms, windows of 512 on all layers but every sixth, two rotary bases).
// On a GPU every timed call ends with a device synchronisation (as the peer's do) and the floors use the
// GPU's own GEMM rate and read bandwidth.
// --prefill-chunk N: generate's prefill fills the cache N prompt tokens at a time (default: generate's own,
// nn::GenerateOptions; 0: the whole prompt at once).
// --save DIR writes the (random) model as a Hugging Face folder and exits.
// --dtype bfloat16 stores the linear layers' weights in bfloat16 (nn::to_bfloat16_weights), --dtype q8_0 or q4_k as
// ggml's blocks (nn::to_quantized_weights; the tied head too), and first states the accuracy against the same
// model in float32: the largest logit difference over the prompt, and how many of
// --agree (default 256) greedily decoded tokens are the same, on the same prompt (random ids; give a --model for
// a trained model's text to mean something).
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "backends/backend.h"
#include "bench/bench_util.h"
#include "io/families.h"
#include "io/hf_folder.h"
#include "nn/decoder_family.h"
#include "nn/generate.h"
#include "nn/layers.h"
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double median_seconds(int repeats, F&& f) {
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = clock_type::now();
    f();
    s.push_back(seconds_since(t0));
  }
  return median(s);
}

// What the floors need of a model, whatever its family.
struct Costs {
  double block_matrix_params = 0;  // the blocks' matrices: each costs 2 FLOPs per element per token
  double block_params = 0;         // everything a decoding step reads of the blocks
  double head_params = 0;          // the unembedding, read whole per token (a tied head too)
  double attn_width = 0;           // sum over layers of n_heads * head_size: q k^T and att @ v
  double kv_bytes_per_token = 0;   // keys and values of every layer, float32
};

Costs costs_of(const nn::DecoderModel& m) {
  Costs c;
  for (int64_t l = 0; l < m.n_layers(); ++l) {
    for (const auto& [name, t] : m.decoder_block(l).named_parameters()) {  // weights, not blocks
      c.block_params += double(t.numel() * dtype_block(t.dtype()));
      if (t.dim() == 2) c.block_matrix_params += double(t.numel() * dtype_block(t.dtype()));
    }
    const nn::CausalMultiHead& a = m.attention(l);
    c.attn_width += double(a.head_count() * a.head_size());
    c.kv_bytes_per_token += 2.0 * double(a.kv_head_count() * a.head_size()) * sizeof(float);
  }
  c.head_params = double(m.lm_head().weight.numel() * dtype_block(m.lm_head().weight.dtype()));
  return c;
}

// What a decoding step reads, where it lies: every parameter of the blocks, the head's weight, and each key/value
// head's cached rows ((B, Hkv, capacity, D) caches; the rows written so far).
std::vector<bench::ByteSpan> token_spans(const nn::DecoderModel& m, const std::vector<nn::KVCache>& caches) {
  std::vector<bench::ByteSpan> spans;
  const auto whole = [&](const Tensor& t) {
    spans.push_back({t.raw_data(), size_t(t.numel()) * dtype_size(t.dtype())});
  };
  for (int64_t l = 0; l < m.n_layers(); ++l)
    for (const auto& [name, t] : m.decoder_block(l).named_parameters()) whole(t);
  whole(m.lm_head().weight);
  for (const nn::KVCache& c : caches)
    for (const Tensor& t : {c.keys, c.values}) {
      const int64_t heads = t.size(0) * t.size(1), row = t.size(3) * int64_t(dtype_size(t.dtype()));
      for (int64_t h = 0; h < heads; ++h)
        spans.push_back(
            {static_cast<const char*>(t.raw_data()) + h * t.size(2) * row, size_t((c.length - c.start) * row)});
    }
  return spans;
}

// GEMM FLOPs of a forward over B x T tokens with the head on `head_rows` rows per sequence.
double forward_flops(const Costs& c, double B, double T, double head_rows) {
  const double attention = 2 * 2 * (T * T / 2) * c.attn_width;  // q k^T and @ v, causal half
  return B * (T * 2 * c.block_matrix_params + attention + head_rows * 2 * c.head_params);
}

nlohmann::json random_config(const std::string& arch, const std::vector<std::pair<std::string, int64_t>>& sizes) {
  auto size = [&](const char* key, int64_t fallback) {
    for (const auto& [k, v] : sizes)
      if (k == key) return v;
    return fallback;
  };
  if (arch == "gpt") {
    nn::DecoderConfig c = bench::gpt2_small_config();  // GPT-2's head is wte, as the peer's GPT2LMHeadModel
    c.n_layers = size("layers", c.n_layers), c.emb_dim = size("dim", c.emb_dim), c.n_heads = size("heads", c.n_heads);
    c.vocab_size = size("vocab", c.vocab_size), c.context_length = size("positions", c.context_length);
    return c.to_json();
  }
  if (arch == "neox") {
    nn::DecoderConfig c = nn::neox_family().config();  // Pythia-160M's shape, the peer's default: rotary on a quarter of each head, untied
    c.n_layers = size("layers", 12), c.emb_dim = size("dim", 768), c.n_heads = size("heads", 12);
    c.hidden_dim = size("hidden", 4 * c.emb_dim), c.vocab_size = size("vocab", 50304);
    c.context_length = size("positions", 2048), c.rotary_dims = c.emb_dim / c.n_heads / 4;
    return c.to_json();
  }
  if (arch == "qwen3") {  // Qwen3-0.6B's shape: 16 heads of 128 (2,048 wide) on a stream of 1,024, tied head
    nn::DecoderConfig c = nn::qwen3_family().config();
    c.n_layers = size("layers", 28), c.emb_dim = size("dim", 1024), c.n_heads = size("heads", 16);
    c.n_kv_heads = size("kv-heads", 8), c.head_dim = size("head-dim", 128), c.hidden_dim = size("hidden", 3072);
    c.vocab_size = size("vocab", 151936), c.context_length = size("positions", 2048), c.tie_embeddings = true;
    c.rope_theta = 1e6, c.norm_eps = 1e-6;
    return c.to_json();
  }
  if (arch == "gemma3") {  // Gemma-3-270M's shape: 4 heads of 256 (1,024 wide) on a stream of 640, 1 key/value head
    nn::DecoderConfig c = nn::gemma3_family().config();
    c.n_layers = size("layers", 18), c.emb_dim = size("dim", 640), c.n_heads = size("heads", 4);
    c.n_kv_heads = size("kv-heads", 1), c.head_dim = size("head-dim", 256), c.hidden_dim = size("hidden", 2048);
    c.vocab_size = size("vocab", 262144), c.context_length = size("positions", 2048);
    c.rope_theta = 1e6, c.rope_local_theta = 1e4, c.attn_scale = 1.0 / 16, c.sliding_window = 512;
    for (int64_t l = 0; l < c.n_layers; ++l)
      if ((l + 1) % 6 != 0) c.window_layers.push_back(l);
    return c.to_json();
  }
  nn::DecoderConfig c = nn::llama_family().config();  // SmolLM-135M's shape, the peer's default
  c.n_layers = size("layers", 30), c.emb_dim = size("dim", 576), c.n_heads = size("heads", 9);
  c.n_kv_heads = size("kv-heads", 3), c.hidden_dim = size("hidden", 1536), c.vocab_size = size("vocab", 49152);
  c.context_length = size("positions", 2048), c.tie_embeddings = true;
  return c.to_json();
}

// Converts the model's linear weights to `dtype` and prints its accuracy against itself in float32 (a prompt of
// the first min(prefill, context - agree) of fixed random ids): the largest logit difference, the mean KL divergence
// of the next-token distributions, greedy agreement. Returns the bytes saved.
double stored_weights_accuracy(nn::DecoderModel& model, const std::string& dtype, int64_t prefill, int64_t agree) {
  const int64_t context = model.shape().context_length, vocab = model.lm_head().weight.size(0);
  const int64_t T = std::max<int64_t>(1, std::min(prefill, context - agree));
  Generator g(7);
  const Tensor ids = randint(0, vocab, {1, T}, g).to(model.device());
  const std::vector<int64_t> prompt = ids.to(kCPU).to_vector<int64_t>();
  nn::GenerateOptions greedy;
  greedy.max_new_tokens = std::min(agree, context - T);
  const Tensor ref = model.forward(ids).to(kCPU);
  const std::vector<int64_t> ref_tokens = nn::generate(model, prompt, greedy);
  const auto saved = static_cast<double>(dtype == "bfloat16" ? nn::to_bfloat16_weights(model)
                                          : nn::to_quantized_weights(model, dtype == "q8_0" ? DType::q8_0 : DType::q4_k));
  const Tensor got = model.forward(ids).to(kCPU);
  const std::vector<int64_t> got_tokens = nn::generate(model, prompt, greedy);
  size_t same = 0, first_diff = ref_tokens.size();
  for (size_t i = 0; i < ref_tokens.size() && i < got_tokens.size(); ++i) {
    same += ref_tokens[i] == got_tokens[i];
    if (ref_tokens[i] != got_tokens[i] && first_diff == ref_tokens.size()) first_diff = i;
  }
  const double max_diff = amax(abs(sub(got, ref))).item<float>(),
               spread = std::sqrt(var(ref, {-1}).mean().item<float>());
  const Tensor log_p = log_softmax(ref, -1), log_q = log_softmax(got, -1);  // KL(float32 || stored)
  const double kl = sum(mul(exp(log_p), sub(log_p, log_q)), {-1}).mean().item<float>();
  std::printf(
      "%s weights (%.0f MB saved) against float32: largest logit difference %.3g over %lld positions (the "
      "logits' standard deviation %.3g), mean KL %.3g nats; greedy decoding: %zu of %zu tokens the same, the first "
      "difference at %lld\n",
      dtype.c_str(), saved / 1048576.0, max_diff, (long long)T, spread, kl, same, ref_tokens.size(),
      first_diff == ref_tokens.size() ? -1LL : (long long)first_diff);
  return saved;
}

}  // namespace

int main(int argc, char** argv) {
  prepare_process(argv);  // headlab's threading policy (a bounded OpenMP spin), as the headlab command runs
  std::string model_dir, save_dir, arch = "gpt";
  std::vector<std::pair<std::string, int64_t>> sizes;
  int64_t B = 1, prefill = 960, decode = 64, chunk = nn::GenerateOptions{}.prefill_chunk;
  int threads = 2, repeats = 3;
  int64_t agree = 256;
  std::string dtype = "float32";
  Device device = kCPU;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--model")
      model_dir = v;
    else if (k == "--save")
      save_dir = v;
    else if (k == "--arch")
      arch = v;
    else if (k == "--layers" || k == "--dim" || k == "--heads" || k == "--kv-heads" || k == "--hidden" ||
             k == "--vocab" || k == "--positions" || k == "--head-dim")
      sizes.emplace_back(k.substr(2), std::stoll(v));
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
    else if (k == "--dtype")
      dtype = v;
    else if (k == "--agree")
      agree = std::stoll(v);
    else if (k == "--repeats")
      repeats = std::stoi(v);
    else if (k == "--prefill-chunk")
      chunk = std::stoll(v);
    else {
      std::fprintf(stderr, "decoder_infer: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (dtype != "float32" && dtype != "bfloat16" && dtype != "q8_0" && dtype != "q4_k") {
    std::fprintf(stderr, "decoder_infer: --dtype is float32, bfloat16, q8_0 or q4_k, not %s\n", dtype.c_str());
    return 2;
  }
  if (arch != "gpt" && arch != "llama" && arch != "qwen3" && arch != "gemma3" && arch != "neox") {
    std::fprintf(stderr, "decoder_infer: --arch is gpt, llama, qwen3, gemma3 or neox, not %s\n", arch.c_str());
    return 2;
  }
  omp_set_num_threads(threads);
  const NoGradGuard no_grad;

  std::shared_ptr<nn::Model> built;
  if (!model_dir.empty()) {
    const double before = peak_rss_mb();
    const auto t0 = clock_type::now();
    built = io::build_folder_model(io::family_of_folder(model_dir).folder->read(model_dir), model_dir);
    const double weights = double(built->num_parameters()) * 4 / 1048576.0;
    std::printf("load %s: %.3f s, peak resident %.0f MB (%.0f MB before loading), weights %.0f MB: %.2fx\n",
                model_dir.c_str(), seconds_since(t0), peak_rss_mb(), before, weights, peak_rss_mb() / weights);
  } else {
    built = io::make_model(random_config(arch, sizes));
  }
  if (!save_dir.empty()) {  // a random model of this shape as a folder (the load benchmark's input)
    io::family_of(built->config_json()).folder->write(save_dir, *built, {});
    std::printf("wrote %s\n", save_dir.c_str());
    return 0;
  }
  auto& model = dynamic_cast<nn::DecoderModel&>(*built);
  model.eval();
  model.to(device);
  Backend& be = backend_for(device);
  const int64_t context = model.shape().context_length, vocab = model.lm_head().weight.size(0);
  if (prefill + decode > context) {
    std::fprintf(stderr, "decoder_infer: --prefill %lld + --decode %lld exceed the model's %lld positions\n",
                 (long long)prefill, (long long)decode, (long long)context);
    return 2;
  }
  const double saved = dtype != "float32" ? stored_weights_accuracy(model, dtype, prefill, agree) : 0;
  const bool gpu = device.is_cuda();
  const double gflops = gpu ? bench::sgemm_gflops_device(device) : bench::sgemm_gflops_cpu();
  const bench::ReadBandwidth cpu_read = gpu ? bench::ReadBandwidth{} : bench::read_bandwidth_cpu();
  const double gbps = gpu ? bench::read_gbytes_per_s_device(device) : cpu_read.best();
  const Costs costs = costs_of(model);
  std::printf("headlab %s device=%s threads=%d params=%lld sgemm %.1f GFLOP/s (OpenBLAS %s), read %.1f GB/s",
              model.type_name().c_str(), device.str().c_str(), threads, (long long)model.num_parameters(), gflops,
              openblas_get_corename(), gbps);
  if (!gpu) std::printf(" (a fresh 1 GiB: threads reading %.1f, sgemv %.1f)", cpu_read.sum_gbps, cpu_read.gemv_gbps);
  std::printf("\n");

  const Tensor ids = randint(0, vocab, {B, prefill}).to(device);
  (void)model.forward(ids.narrow(1, 0, 8));  // warm-up
  const double pre = median_seconds(repeats, [&] {
    (void)model.forward(ids);
    be.synchronize();
  });
  const double floor = forward_flops(costs, double(B), double(prefill), double(prefill)) / (gflops * 1e9);
  std::printf("prefill B=%lld T=%lld: %.1f ms, %.0f tokens/s (floor %.1f ms: %.0f%%)\n", (long long)B,
              (long long)prefill, pre * 1e3, double(B * prefill) / pre, floor * 1e3, 100 * floor / pre);

  const Tensor prompt = ids.narrow(0, 0, 1);
  auto generate_prefill = [&](std::vector<nn::KVCache>& caches) {
    for (nn::KVCache& c : caches) c.expected = prefill + decode;  // as generate sizes its caches
    return model.forward_cached(prompt, caches, chunk);
  };
  const double gen_pre = median_seconds(repeats, [&] {
    std::vector<nn::KVCache> caches(size_t(model.n_layers()));
    (void)generate_prefill(caches);
    be.synchronize();
  });
  const double gen_floor = forward_flops(costs, 1, double(prefill), 1) / (gflops * 1e9);
  std::printf(
      "generate's prefill T=%lld in chunks of %lld (head on the last position): %.1f ms, %.0f tokens/s (floor "
      "%.1f ms: %.0f%%)\n",
      (long long)prefill, (long long)chunk, gen_pre * 1e3, double(prefill) / gen_pre, gen_floor * 1e3,
      100 * gen_floor / gen_pre);
  if (decode > 0) {
    // Per token every weight of the blocks and the head is read once, the embedding one row, and the keys
    // and values of every earlier position (the mean over the decoded tokens).
    const double mean_positions = double(prefill) + double(decode) / 2;
    const double bytes =
        4.0 * (costs.block_params + costs.head_params) - saved + costs.kv_bytes_per_token * mean_positions;
    // Each repeat: generate's prefill, then (CPU) the floor's read rate on the bytes a token reads where they lie,
    // then the decoding it bounds, timed alone. The percentage is the median of each repeat's floor over its time.
    std::vector<double> per_token, floors, shares;
    double held = 0;  // the caches' bytes at the end (capacity, which grows by doubling)
    for (int r = 0; r < repeats; ++r) {
      std::vector<nn::KVCache> caches(size_t(model.n_layers()));
      Tensor last = generate_prefill(caches);
      be.synchronize();
      const double rate = gpu ? gbps : bench::read_spans_gbps(token_spans(model, caches), 3);
      const auto t0 = clock_type::now();
      for (int64_t s = 0; s < decode; ++s) {
        const Tensor next = argmax(last, -1, true);  // (1, 1)
        last = model.forward_cached(next, caches);
      }
      be.synchronize();
      per_token.push_back(seconds_since(t0) / double(decode) * 1e3);
      floors.push_back(bytes / (rate * 1e9) * 1e3);
      shares.push_back(floors.back() / per_token.back());
      held = 0;
      for (const nn::KVCache& c : caches)
        held += double(c.keys.numel() + c.values.numel()) * double(dtype_size(c.keys.dtype()));
    }
    const double ms = median(per_token), floor_ms = median(floors);
    std::printf("kv cache: %.0f bytes per token (%.1f MB for %lld tokens; %.1f MB held)\n", costs.kv_bytes_per_token,
                costs.kv_bytes_per_token * double(prefill + decode) / 1048576.0, (long long)(prefill + decode),
                held / 1048576.0);
    std::printf(
        "decode %lld tokens after %lld (batch 1, KV cache): %.2f ms/token, %.1f tokens/s (floor %.2f ms/token: "
        "%.0f%%; %.1f MB a token read at %.1f GB/s%s)\n",
        (long long)decode, (long long)prefill, ms, 1e3 / ms, floor_ms, 100 * median(shares), bytes / 1e6,
        bytes / floor_ms / 1e6, gpu ? "" : " where they lie, beside each repeat");
  }
  std::printf("peak resident %.0f MB%s\n", peak_rss_mb(), gpu ? "" : " (with the read-bandwidth measure's 1 GiB)");
  if (gpu) std::printf("peak device memory %.0f MB\n", double(be.peak_bytes()) / 1048576.0);
  return 0;
}
