// CUDA against CPU through the public op and module API: every case of the op registry
// (tests/op_cases.h) forward and backward in float32, random numbers, every attention module, a short
// GPT training run, and the caching allocator's baseline. One test body runs on both backends;
// without a visible GPU every test skips with the reason.
#include <gtest/gtest.h>

#include <cmath>

#include "backends/backend.h"
#include "nn/attention.h"
#include "nn/gpt.h"
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

TEST(CudaParity, TrainingTracksTheCpuAndTheAllocatorReturnsToBaseline) {
  REQUIRE_GPU();
  nn::GPTConfig cfg = tiny_gpt_config(kFourHeadGpt);
  cfg.drop_rate = 0.1;
  manual_seed(5);
  nn::GPTModel cpu_model(cfg), gpu_model(cfg);
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
