// CUDA against CPU through the public op and module API: every op's forward and backward, every
// attention module, a short GPT training run, and the caching allocator's baseline. One test body
// runs on both backends; without a visible GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "backends/backend.h"
#include "nn/attention.h"
#include "nn/gpt.h"
#include "optim/optim.h"

using namespace headlab;

namespace {

const Device kCuda{Device::cuda, 0};

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (!cuda_available())                                                                   \
      GTEST_SKIP() << (cuda_built() ? "no CUDA device is visible" : "built without CUDA"); \
  } while (0)

// |a - b| <= atol + rtol * |b| elementwise; reports the worst element.
void expect_close(const Tensor& a, const Tensor& b, const std::string& what, double rtol = 1e-5, double atol = 1e-5) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double excess = std::abs(va[i] - vb[i]) - (atol + rtol * std::abs(vb[i]));
    if (excess > worst) { worst = excess; at = i; }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " cuda " << va[at] << " vs cpu " << vb[at];
}

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn on CPU inputs and on their CUDA copies, with the same upstream gradient, and compares the
// outputs and every input gradient.
void check_op(const std::string& name, const OpFn& fn, const std::vector<Tensor>& cpu_inputs) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& t : cpu_inputs) {
    Tensor c = t.detach().clone(), g = t.detach().to(kCuda);
    if (is_floating(t.dtype())) {
      c.requires_grad_();
      g.requires_grad_();
    }
    cpu.push_back(c);
    gpu.push_back(g);
  }
  const Tensor out_cpu = fn(cpu), out_gpu = fn(gpu);
  ASSERT_EQ(out_gpu.device(), kCuda) << name;
  expect_close(out_gpu, out_cpu, name + " forward");
  if (!out_cpu.requires_grad()) return;
  Generator gen(7);
  const Tensor dout = randn(out_cpu.shape(), gen, out_cpu.dtype());
  out_cpu.backward(dout);
  out_gpu.backward(dout.to(kCuda));
  for (size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i].grad().defined()) expect_close(gpu[i].grad(), cpu[i].grad(), name + " grad of input " + std::to_string(i));
}

Tensor rnd(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, g);
}

}  // namespace

TEST(CudaParity, ElementwiseAndReductions) {
  REQUIRE_GPU();
  const Tensor a = rnd({3, 4, 5}, 1), b = rnd({4, 5}, 2), pos = add(abs(rnd({3, 4, 5}, 3)), 0.5);
  check_op("add", [](auto& x) { return add(x[0], x[1]); }, {a, b});
  check_op("sub", [](auto& x) { return sub(x[0], x[1]); }, {a, b});
  check_op("mul", [](auto& x) { return mul(x[0], x[1]); }, {a, b});
  check_op("div", [](auto& x) { return div(x[0], x[1]); }, {a, pos});
  check_op("maximum", [](auto& x) { return maximum(x[0], x[1]); }, {a, b});
  check_op("affine", [](auto& x) { return affine(x[0], 2.5, -1.0); }, {a});
  check_op("exp", [](auto& x) { return exp(x[0]); }, {a});
  check_op("log", [](auto& x) { return log(x[0]); }, {pos});
  check_op("sqrt", [](auto& x) { return sqrt(x[0]); }, {pos});
  check_op("rsqrt", [](auto& x) { return rsqrt(x[0]); }, {pos});
  check_op("pow", [](auto& x) { return pow(x[0], 3.0); }, {a});
  check_op("abs", [](auto& x) { return abs(x[0]); }, {a});
  check_op("tanh", [](auto& x) { return tanh(x[0]); }, {a});
  check_op("sigmoid", [](auto& x) { return sigmoid(x[0]); }, {a});
  check_op("relu", [](auto& x) { return relu(x[0]); }, {a});
  check_op("gelu", [](auto& x) { return gelu(x[0], false); }, {a});
  check_op("gelu_tanh", [](auto& x) { return gelu(x[0], true); }, {a});
  check_op("sum", [](auto& x) { return sum(x[0], {0, 2}, true); }, {a});
  check_op("mean", [](auto& x) { return mean(x[0], {1}); }, {a});
  check_op("amax", [](auto& x) { return amax(x[0], {2}); }, {a});
  check_op("var", [](auto& x) { return var(x[0], {0, 1}); }, {a});
  check_op("argmax", [](auto& x) { return argmax(x[0], 1); }, {a});
  check_op("where", [](auto& x) { return where(gt(x[0], x[1]), x[0], x[1]); }, {a, b});
  check_op("masked_fill", [](auto& x) { return masked_fill(x[0], lt(x[1], zeros({}, DType::f32, x[1].device())), 9.0); },
           {a, b});
  check_op("triu", [](auto& x) { return triu(x[0], 1); }, {a});
}

TEST(CudaParity, ShapesIndexingAndLinearAlgebra) {
  REQUIRE_GPU();
  const Tensor a = rnd({2, 3, 4, 5}, 4), m = rnd({5, 6}, 5), w = rnd({7, 5}, 6), bias = rnd({7}, 7);
  check_op("matmul broadcast", [](auto& x) { return matmul(x[0], x[1]); }, {a, m});
  check_op("matmul transposed", [](auto& x) { return matmul(x[0], x[0].mT()); }, {a});
  check_op("matmul heads view", [](auto& x) { return matmul(x[0].transpose(1, 2), x[0].transpose(1, 2).mT()); }, {a});
  check_op("linear", [](auto& x) { return linear(x[0], x[1], x[2]); }, {a, w, bias});
  check_op("permute+contiguous", [](auto& x) { return x[0].permute({3, 1, 0, 2}).contiguous(); }, {a});
  check_op("slice", [](auto& x) { return x[0].slice(3, 1, 5, 2); }, {a});
  check_op("expand", [](auto& x) { return mul(x[0].narrow(0, 0, 1).expand({2, 3, 4, 5}), x[0]); }, {a});
  check_op("cat", [](auto& x) { return cat({x[0], x[0].narrow(1, 0, 2)}, 1); }, {a});
  check_op("stack", [](auto& x) { return stack({x[0], mul(x[0], 2.0)}, 0); }, {a});
  check_op("index_select", [](auto& x) { return index_select(x[0], 2, tensor(std::vector<int64_t>{3, 0, 3}, {}, x[0].device())); },
           {a});
  check_op("embedding", [](auto& x) { return embedding(x[0], tensor(std::vector<int64_t>{1, 4, 1, 6}, {2, 2}, x[0].device())); },
           {w});
  check_op("repeat_interleave", [](auto& x) { return repeat_interleave(x[0], 2, 1); }, {a});
}

TEST(CudaParity, NeuralNetworkOps) {
  REQUIRE_GPU();
  const Tensor s = rnd({2, 3, 4, 4}, 8), x = rnd({6, 10}, 9), g = rnd({10}, 10), b = rnd({10}, 11);
  check_op("softmax", [](auto& in) { return softmax(in[0], 1); }, {s});
  check_op("log_softmax", [](auto& in) { return log_softmax(in[0], -1); }, {s});
  check_op("causal_softmax", [](auto& in) { return causal_softmax(in[0], 0.5); }, {s});
  check_op("masked_softmax", [](auto& in) {
    return masked_softmax(in[0].reshape({6, 4, 4}), tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 2}, {}, in[0].device()), 0.7);
  }, {s});
  check_op("layer_norm", [](auto& in) { return layer_norm(in[0], in[1], in[2]); }, {x, g, b});
  check_op("dropout", [](auto& in) {
    Generator gen(3);  // the same counter-based mask on both devices
    return dropout(in[0], 0.3, true, gen);
  }, {x});
  check_op("cross_entropy", [](auto& in) {
    return cross_entropy(in[0], tensor(std::vector<int64_t>{1, -100, 9, 0, 3, 3}, {}, in[0].device()));
  }, {x});
  check_op("mse_loss", [](auto& in) { return mse_loss(in[0], in[1]); }, {x, mul(x, 0.5)});
}

TEST(CudaParity, RandomNumbersMatchTheCpu) {
  REQUIRE_GPU();
  Generator a(42), b(42);
  expect_close(rand({1000}, a, DType::f32, kCuda), rand({1000}, b), "rand", 0, 0);
  expect_close(randn({1001}, a, DType::f32, kCuda), randn({1001}, b), "randn", 1e-6, 1e-6);
  expect_close(randint(0, 50, {999}, a, kCuda), randint(0, 50, {999}, b), "randint", 0, 0);
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
    const Tensor gates = tensor(std::vector<float>{1.0f, 0.25f});
    check_op(wrapper ? "wrapper" : "fused", [&](auto& in) {
      return (in[0].device() == kCuda ? gpu_m : cpu_m)->forward(in[0], in[1]);
    }, {rnd({2, 5, 8}, 12), gates});
  }
  manual_seed(2);
  nn::MultiHeadAttention d2l(5, 3, 4, 8, 2, 0.0, true);
  nn::MultiHeadAttention d2l_gpu(5, 3, 4, 8, 2, 0.0, true);
  d2l_gpu.load_parameters(d2l.named_parameters());
  d2l_gpu.to(kCuda);
  check_op("d2l MultiHeadAttention", [&](auto& in) {
    const bool on_gpu = in[0].device() == kCuda;
    const Tensor vl = tensor(std::vector<int64_t>{2, 0}, {}, in[0].device());
    return (on_gpu ? d2l_gpu : d2l).forward(in[0], in[1], in[2], vl);
  }, {rnd({2, 3, 3}, 13), rnd({2, 4, 5}, 14), rnd({2, 4, 4}, 15)});
}

TEST(CudaParity, TrainingTracksTheCpuAndTheAllocatorReturnsToBaseline) {
  REQUIRE_GPU();
  nn::GPTConfig cfg;
  cfg.vocab_size = 13; cfg.context_length = 12; cfg.emb_dim = 32; cfg.n_heads = 4; cfg.n_layers = 2; cfg.drop_rate = 0.1;
  manual_seed(5);
  nn::GPTModel cpu_model(cfg), gpu_model(cfg);
  gpu_model.load_parameters(cpu_model.named_parameters());
  gpu_model.to(kCuda);
  optim::Optimizer cpu_opt(cpu_model.named_parameters(), optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw));
  optim::Optimizer gpu_opt(gpu_model.named_parameters(), optim::OptimizerOptions::defaults(optim::OptimizerKind::adamw));
  Generator data(9);
  Backend& cuda = backend_for(kCuda);
  size_t baseline = 0;
  for (int step = 0; step < 20; ++step) {
    const Tensor idx = randint(0, cfg.vocab_size, {4, cfg.context_length}, data);
    const Tensor tgt = randint(0, cfg.vocab_size, {4 * cfg.context_length}, data);
    default_generator().set_state(100 + step, 0);
    const Tensor loss_cpu = cross_entropy(cpu_model.forward(idx).reshape({-1, cfg.vocab_size}), tgt);
    default_generator().set_state(100 + step, 0);  // the same dropout masks on the GPU
    const Tensor loss_gpu = cross_entropy(gpu_model.forward(idx.to(kCuda)).reshape({-1, cfg.vocab_size}), tgt.to(kCuda));
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
