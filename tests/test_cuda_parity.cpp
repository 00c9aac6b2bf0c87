// CUDA against CPU through the public op and module API: every case of the op registry
// (tests/op_cases.h) forward and backward in float32, random numbers, every attention module, a short
// GPT training run, and the caching allocator's baseline. One test body runs on both backends;
// without a visible GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "backends/backend.h"
#include "nn/attention.h"
#include "nn/decoder_family.h"
#include "optim/optim.h"
#include "tests/op_cases.h"
#include "tests/tiny_models.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

const Device kCuda{Device::cuda, 0};

#define REQUIRE_GPU()                                                                                           \
  do {                                                                                                          \
    if (!cuda_available()) GTEST_SKIP() << (cuda_built() ? "no CUDA device is visible" : "built without CUDA"); \
  } while (0)

}  // namespace

class CudaParityOp : public ::testing::TestWithParam<OpCase> {};

TEST_P(CudaParityOp, Float32) {
  REQUIRE_GPU();
  const OpCase& c = GetParam();
  check_case_against_cpu(c, kCuda, DType::f32, c.cuda_rtol, c.cuda_atol);
}

INSTANTIATE_TEST_SUITE_P(Registry, CudaParityOp, ::testing::ValuesIn(cuda_op_cases()), op_case_name);

TEST(CudaParity, RandomNumbersMatchTheCpu) {
  REQUIRE_GPU();
  Generator a(42), b(42);
  expect_close_on_devices(rand({1000}, a, DType::f32, kCuda), rand({1000}, b), "rand", 0, 0);
  expect_close_on_devices(randn({1001}, a, DType::f32, kCuda), randn({1001}, b), "randn", 1e-6, 1e-6);
  expect_close_on_devices(randint(0, 50, {999}, a, kCuda), randint(0, 50, {999}, b), "randint", 0, 0);
}

TEST(CudaParity, AttentionModules) {
  REQUIRE_GPU();
  for (bool wrapper : {false, true}) {
    manual_seed(1);
    std::shared_ptr<nn::CausalMultiHead> cpu_m, gpu_m;
    if (wrapper) {
      auto w = std::make_shared<nn::MultiHeadAttentionWrapper>(8, 4, 6, 0.0, 2, true, true);
      cpu_m = w;
      gpu_m = nn::fused_to_wrapper(*nn::wrapper_to_fused(*w));
    } else {
      auto f = std::make_shared<nn::CausalMultiHeadAttention>(8, 8, 6, 0.0, 2, true);
      cpu_m = f;
      gpu_m = nn::wrapper_to_fused(*nn::fused_to_wrapper(*f));
    }
    gpu_m->to(kCuda);
    // x (2, 5, 8) and the gates of the two heads
    const OpCase module{
        wrapper ? "wrapper" : "fused",
        [&](const std::vector<Tensor>& in) { return (in[0].device() == kCuda ? gpu_m : cpu_m)->forward(in[0], in[1]); },
        {val({2, 5, 8}), lit({1.0, 0.25}, {2})}};
    check_case_against_cpu(module, kCuda, DType::f32, 1e-5, 1e-5);
  }
  manual_seed(2);
  nn::MultiHeadAttention d2l(5, 3, 4, 8, 2, 0.0, true);
  nn::MultiHeadAttention d2l_gpu(5, 3, 4, 8, 2, 0.0, true);
  d2l_gpu.load_parameters(d2l.named_parameters());
  d2l_gpu.to(kCuda);
  // queries (2, 3, 3), keys (2, 4, 5), values (2, 4, 4), valid_lens (2,) with a fully masked row
  const OpCase d2l_module{"d2l_MultiHeadAttention",
                          [&](const std::vector<Tensor>& in) {
                            return (in[0].device() == kCuda ? d2l_gpu : d2l).forward(in[0], in[1], in[2], in[3]);
                          },
                          {val({2, 3, 3}), val({2, 4, 5}, 0.23, -0.6), val({2, 4, 4}, 0.19, -0.4), idx({2, 0}, {2})}};
  check_case_against_cpu(d2l_module, kCuda, DType::f32, 1e-5, 1e-5);
}

// The CUDA fused attention kernels at sizes that cross their tiles (64 rows a block, up to 64 keys a
// shared tile; register widths 32, 64, 128 and 256), every mask, dropout, Tq != Tk and D != Dv: against
// the composite path on the GPU in float64 (to rounding) and the CPU's fused kernel in float32. Head
// sizes past 256 take the composite path and must agree all the same.
struct FusedAttentionCase {
  int64_t B, H, Tq, Tk, D, Dv;
  AttentionMask::Kind mask;
  bool per_row_lengths;
  double dropout;
  bool heads_inside = false;  // inputs (B, T, H, D) seen as (B, H, T, D), as a module's projections give them
};

// The fused kernels at every size, not only where the automatic choice takes them.
struct AlwaysFused {
  AlwaysFused() { set_fused_attention(FusedAttention::always); }
  ~AlwaysFused() { set_fused_attention(FusedAttention::automatic); }
};

// out and the gradients of q, k, v (from one fixed upstream gradient) of one attention call.
std::vector<Tensor> attention_results(const FusedAttentionCase& c, DType dt, Device dev, bool composite) {
  Generator g(11);
  const auto input = [&](int64_t T, int64_t D) {
    if (!c.heads_inside) return randn({c.B, c.H, T, D}, g, dt).to(dev).requires_grad_();
    return randn({c.B, T, c.H, D}, g, dt).to(dev).transpose(1, 2).detach().requires_grad_();
  };
  Tensor q = input(c.Tq, c.D), k = input(c.Tk, c.D), v = input(c.Tk, c.Dv);
  const Tensor dout = randn({c.B, c.H, c.Tq, c.Dv}, g, dt).to(dev);
  AttentionMask m;
  m.kind = c.mask;
  if (c.mask == AttentionMask::Kind::lengths) {
    // Lengths from 0 (an empty row) to Tk.
    m.valid_lens = (c.per_row_lengths ? randint(0, c.Tk + 1, {c.B, c.Tq}, g) : randint(0, c.Tk + 1, {c.B}, g)).to(dev);
  }
  Generator drop(5);
  const Tensor out = composite ? scaled_dot_product_attention_composite(q, k, v, m, c.dropout, c.dropout > 0, drop)
                               : scaled_dot_product_attention(q, k, v, m, c.dropout, c.dropout > 0, drop);
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

TEST(CudaParity, FusedAttentionKernelsAgainstTheCompositePathAndTheCpu) {
  REQUIRE_GPU();
  const AlwaysFused always;
  using K = AttentionMask::Kind;
  const std::vector<FusedAttentionCase> cases = {
      {2, 3, 150, 150, 64, 64, K::causal, false, 0.0},
      {2, 2, 70, 130, 80, 48, K::lengths, true, 0.0},
      {3, 2, 65, 65, 16, 16, K::lengths, false, 0.0},
      {1, 2, 129, 100, 32, 32, K::none, false, 0.0},
      {2, 2, 100, 100, 64, 64, K::causal, false, 0.3},
      {1, 1, 90, 90, 200, 130, K::causal, false, 0.0},
      {1, 2, 40, 50, 300, 300, K::none, false, 0.0},  // past the kernel's 256: the composite path
      // A few query rows (decoding): the kernel that splits the keys across blocks; with dropout, the row kernel.
      {1, 12, 1, 961, 64, 64, K::none, false, 0.0},
      {2, 3, 5, 700, 32, 32, K::lengths, true, 0.0},
      {1, 2, 16, 16, 128, 96, K::causal, false, 0.0},
      {1, 2, 12, 300, 128, 96, K::lengths, true, 0.0},
      {1, 1, 3, 40, 200, 130, K::none, false, 0.0},
      {2, 2, 4, 129, 16, 16, K::lengths, false, 0.0},
      {1, 2, 4, 200, 64, 64, K::none, false, 0.2},
  };
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (const FusedAttentionCase& c : cases) {
    char what[128];
    std::snprintf(what, sizeof what, "B%lld H%lld Tq%lld Tk%lld D%lld Dv%lld mask %d dropout %.1f", (long long)c.B,
                  (long long)c.H, (long long)c.Tq, (long long)c.Tk, (long long)c.D, (long long)c.Dv, int(c.mask),
                  c.dropout);
    const auto fused64 = attention_results(c, DType::f64, kCuda, false);
    const auto composite64 = attention_results(c, DType::f64, kCuda, true);
    const auto fused32 = attention_results(c, DType::f32, kCuda, false);
    const auto cpu32 = attention_results(c, DType::f32, kCPU, false);
    for (int i = 0; i < 4; ++i) {
      expect_close_on_devices(fused64[i], composite64[i], std::string(what) + " f64 fused vs composite " + names[i],
                              1e-10, 1e-12);
      expect_close_on_devices(fused32[i], cpu32[i], std::string(what) + " f32 cuda vs cpu " + names[i], 1e-5, 1e-5);
    }
  }
}

// The tensor-core tiles (float32 without dropout, head sizes up to 128: cuda_attention_mma.cu) against the
// composite path in float64, by the normwise relative error |got - ref| / |ref| of the output and each
// gradient: 3xTF32 keeps float32's accuracy (3e-7 to 4e-6 on an H200), which one TF32 pass (about 1e-3)
// would not. Tiles crossed and ragged, every mask, Tq != Tk, D != Dv, each tile width (32, 64, 128), strided
// views; dQ summed with atomics (the default) and in its own pass (deterministic), which must repeat bit for bit.
struct DeterministicAttention {
  explicit DeterministicAttention(bool on) { set_deterministic_attention(on); }
  ~DeterministicAttention() { set_deterministic_attention(false); }
};

TEST(CudaParity, TensorCoreAttentionMatchesFloat64) {
  REQUIRE_GPU();
  const AlwaysFused always;
  using K = AttentionMask::Kind;
  const std::vector<FusedAttentionCase> cases = {
      {2, 3, 150, 150, 64, 64, K::causal, false, 0.0},       {1, 2, 200, 130, 8, 8, K::lengths, true, 0.0},
      {2, 2, 97, 97, 100, 72, K::none, false, 0.0},          {1, 4, 300, 300, 128, 128, K::causal, false, 0.0},
      {1, 2, 17, 300, 64, 64, K::lengths, false, 0.0},       {2, 2, 64, 64, 32, 32, K::causal, false, 0.0},
      {2, 3, 130, 130, 64, 64, K::causal, false, 0.0, true}, {1, 2, 70, 260, 48, 40, K::none, false, 0.0, true},
  };
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (const FusedAttentionCase& c : cases) {
    char what[128];
    std::snprintf(what, sizeof what, "B%lld H%lld Tq%lld Tk%lld D%lld Dv%lld mask %d%s", (long long)c.B, (long long)c.H,
                  (long long)c.Tq, (long long)c.Tk, (long long)c.D, (long long)c.Dv, int(c.mask),
                  c.heads_inside ? " heads inside" : "");
    const auto ref = attention_results(c, DType::f64, kCuda, true);
    for (const bool deterministic : {false, true}) {
      const DeterministicAttention mode(deterministic);
      const auto got = attention_results(c, DType::f32, kCuda, false);
      for (int i = 0; i < 4; ++i) {
        const std::string at = std::string(what) + (deterministic ? " deterministic " : " ") + names[i];
        const std::vector<double> x = got[i].to(DType::f64).to_vector<double>(), y = ref[i].to_vector<double>();
        ASSERT_EQ(x.size(), y.size()) << at;
        double diff = 0, norm = 0;
        for (size_t e = 0; e < x.size(); ++e) diff += (x[e] - y[e]) * (x[e] - y[e]), norm += y[e] * y[e];
        const double rel = std::sqrt(diff / norm);
        std::printf("tensor-core attention %s: relative error %.2e\n", at.c_str(), rel);
        EXPECT_LT(rel, 1e-5) << at;
        expect_close_on_devices(got[i].to(DType::f64), ref[i], at, 1e-4, 1e-4);
      }
      if (deterministic) {  // the same bits again: every gradient element has one writer
        const auto again = attention_results(c, DType::f32, kCuda, false);
        for (int i = 0; i < 4; ++i) expect_close_on_devices(again[i], got[i], std::string(what) + " repeated", 0, 0);
      }
    }
  }
}

// The LLaMA family (RMSNorm, rotary in both layouts, SwiGLU, grouped-query and multi-query attention, Qwen2's
// biases) and GPT-NeoX (partial rotary, parallel residual) on the GPU against the CPU: the logits of a batch
// long enough for the tensor-core tiles, every parameter's gradient of a loss on them, and greedy decoding
// with the key/value cache (a prompt of 70, then one token a step).
TEST(CudaParity, DecoderFamiliesTrackTheCpu) {
  REQUIRE_GPU();
  std::vector<std::pair<std::string, std::function<std::shared_ptr<nn::DecoderModel>()>>> models;
  for (const int64_t kv : {4, 2, 1})
    for (const bool interleaved : {false, true}) {
      nn::DecoderConfig c = nn::llama_family().config();
      c.vocab_size = 37, c.context_length = 80, c.emb_dim = 32, c.n_heads = 4, c.n_kv_heads = kv, c.n_layers = 2;
      c.hidden_dim = 40, c.rope_theta = 500.0, c.rope_interleaved = interleaved, c.qkv_bias = kv == 2;
      models.emplace_back("llama kv " + std::to_string(kv) + (interleaved ? " interleaved" : " halves"),
                          [c] { return std::make_shared<nn::DecoderModel>(c); });
    }
  for (const bool parallel : {true, false}) {
    nn::DecoderConfig c = nn::neox_family().config();
    c.vocab_size = 37, c.context_length = 80, c.emb_dim = 32, c.n_heads = 4, c.n_layers = 2, c.hidden_dim = 48;
    c.rotary_dims = 4, c.parallel_residual = parallel;
    models.emplace_back(std::string("neox") + (parallel ? " parallel" : " sequential"),
                        [c] { return std::make_shared<nn::DecoderModel>(c); });
  }
  {  // the newer families' parts: Qwen3's per-head q/k norms, a sliding window on layer 1 (shorter than the prompt),
     // GPT-Neo's unscaled scores and local layer
    nn::DecoderConfig q = nn::qwen3_family().config();
    q.vocab_size = 37, q.context_length = 80, q.emb_dim = 32, q.n_heads = 4, q.n_kv_heads = 2, q.head_dim = 12;
    q.n_layers = 2, q.hidden_dim = 40, q.sliding_window = 9, q.window_layers = {1};
    models.emplace_back("qwen3 with a window", [q] { return std::make_shared<nn::DecoderModel>(q); });
    nn::DecoderConfig n = nn::gpt_neo_family().config();
    n.vocab_size = 37, n.context_length = 80, n.emb_dim = 32, n.n_heads = 4, n.n_layers = 2, n.hidden_dim = 48;
    n.sliding_window = 16, n.window_layers = {1};
    models.emplace_back("gpt_neo", [n] { return std::make_shared<nn::DecoderModel>(n); });
  }
  for (const auto& [name, make] : models) {
    SCOPED_TRACE(name);
    manual_seed(31);
    const std::shared_ptr<nn::DecoderModel> cpu = make(), gpu = make();
    gpu->load_parameters(cpu->named_parameters());
    gpu->to(kCuda);
    Generator g(3);
    const Tensor idx = randint(0, 37, {2, 75}, g), tgt = randint(0, 37, {2 * 75}, g);
    const Tensor logits_cpu = cpu->forward(idx), logits_gpu = gpu->forward(idx.to(kCuda));
    expect_close_on_devices(logits_gpu, logits_cpu, name + " logits", 1e-4, 1e-4);
    cross_entropy(logits_cpu.reshape({-1, 37}), tgt).backward();
    cross_entropy(logits_gpu.reshape({-1, 37}), tgt.to(kCuda)).backward();
    const NamedTensors pc = cpu->named_parameters(), pg = gpu->named_parameters();
    ASSERT_EQ(pc.size(), pg.size());
    for (size_t i = 0; i < pc.size(); ++i)
      expect_close_on_devices(pg[i].second.grad(), pc[i].second.grad(), name + " grad " + pc[i].first, 1e-4, 1e-4);
    const NoGradGuard no_grad;
    std::vector<nn::KVCache> caches_cpu(2), caches_gpu(2);
    Tensor next_cpu = idx.narrow(0, 0, 1).narrow(1, 0, 70), next_gpu = next_cpu.to(kCuda);
    for (int step = 0; step < 6; ++step) {
      const Tensor last_cpu = cpu->forward_cached(next_cpu, caches_cpu),
                   last_gpu = gpu->forward_cached(next_gpu, caches_gpu);
      expect_close_on_devices(last_gpu, last_cpu, name + " cached logits, step " + std::to_string(step), 1e-4, 1e-4);
      next_cpu = argmax(last_cpu, -1, true), next_gpu = argmax(last_gpu, -1, true);
      ASSERT_EQ(next_gpu.to(kCPU).item<int64_t>(), next_cpu.item<int64_t>()) << "step " << step;
    }
  }
}

TEST(CudaParity, TrainingTracksTheCpuAndTheAllocatorReturnsToBaseline) {
  REQUIRE_GPU();
  nn::DecoderConfig cfg = tiny_gpt_config(kFourHeadGpt);
  cfg.drop_rate = 0.1;
  manual_seed(5);
  nn::DecoderModel cpu_model(cfg), gpu_model(cfg);
  gpu_model.load_parameters(cpu_model.named_parameters());
  gpu_model.to(kCuda);
  optim::Optimizer cpu_opt(cpu_model.named_parameters(),
                           optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw));
  optim::Optimizer gpu_opt(gpu_model.named_parameters(),
                           optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw));
  Generator data(9);
  Backend& cuda = backend_for(kCuda);
  size_t baseline = 0;
  for (int step = 0; step < 20; ++step) {
    const Tensor idx = randint(0, cfg.vocab_size, {4, cfg.context_length}, data);
    const Tensor tgt = randint(0, cfg.vocab_size, {4 * cfg.context_length}, data);
    default_generator().set_state(100 + step, 0);
    const Tensor loss_cpu = cross_entropy(cpu_model.forward(idx).reshape({-1, cfg.vocab_size}), tgt);
    default_generator().set_state(100 + step, 0);  // the same dropout masks on the GPU
    const Tensor loss_gpu =
        cross_entropy(gpu_model.forward(idx.to(kCuda)).reshape({-1, cfg.vocab_size}), tgt.to(kCuda));
    EXPECT_NEAR(loss_gpu.item<double>(), loss_cpu.item<double>(), 1e-4 * (1 + std::abs(loss_cpu.item<double>())))
        << "step " << step;
    loss_cpu.backward();
    loss_gpu.backward();
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    cuda.synchronize();
    if (step == 1) baseline = cuda.bytes_in_use();
    if (step > 1) {
      EXPECT_EQ(cuda.bytes_in_use(), baseline) << "step " << step << ": device memory grew";
    }
  }
}
