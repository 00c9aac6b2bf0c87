// bfloat16 weights for inference: the conversion (rounding to the nearest, ties to even, as the IEEE
// definition gives it bit by bit), the linear layer that reads bfloat16 weights (against the same layer with the
// weights widened to float32 first), and nn::to_bfloat16_weights on a GPT (tied head kept, logits those of the
// float32 model whose weights were rounded the same way).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "base/bfloat16.h"
#include "nn/decoder_family.h"
#include "nn/layers.h"
#include "tests/core_test_util.h"
#include "tests/tiny_models.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

TEST(Bfloat16, RoundsToTheNearestTiesToEven) {
  EXPECT_EQ(bf16_from_float(1.0f), 0x3f80);
  EXPECT_EQ(bf16_from_float(-2.5f), 0xc020);
  EXPECT_EQ(bf16_from_float(1.0f + 0x1p-8f), 0x3f80);             // half an ulp above 1: ties to the even 1
  EXPECT_EQ(bf16_from_float(1.0f + 0x3p-8f), 0x3f82);             // 1.5 ulps: ties to the even 1 + 2 ulps
  EXPECT_EQ(bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // past the tie: up
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16_from_float(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()), 0x7f80);  // past bfloat16's largest: infinity
  EXPECT_EQ(bf16_from_float(0x1p-133f), 0x0001);                          // a subnormal kept
  EXPECT_TRUE(std::isnan(float_from_bf16(bf16_from_float(std::numeric_limits<float>::quiet_NaN()))));
  uint32_t signalling = 0x7f800001u;  // a NaN whose payload would round away: still a NaN
  float snan;
  std::memcpy(&snan, &signalling, 4);
  EXPECT_TRUE(std::isnan(float_from_bf16(bf16_from_float(snan))));
  EXPECT_EQ(float_from_bf16(0x3f81), 1.0f + 0x1p-7f);
}

// Over many random floats: the result is a nearest bfloat16, and of two nearest the one with an even last bit.
TEST(Bfloat16, EveryResultIsANearestValue) {
  Generator g(5);
  const std::vector<float> xs = randn({20000}, g).to_vector<float>();
  for (float x : xs) {
    for (float scale : {1.0f, 1e-30f, 1e30f}) {
      const float v = x * scale;
      const uint16_t h = bf16_from_float(v);
      const double got = float_from_bf16(h), below = float_from_bf16(static_cast<uint16_t>(h - 1)),
                   above = float_from_bf16(static_cast<uint16_t>(h + 1));
      const double err = std::abs(got - v);
      ASSERT_LE(err, std::abs(below - v)) << v;
      ASSERT_LE(err, std::abs(above - v)) << v;
      if (err == std::abs(below - v) || err == std::abs(above - v)) {
        ASSERT_EQ(h & 1, 0) << v;
      }
    }
  }
}

TEST(Bfloat16, TensorsConvertBothWaysAndRefuseTheRest) {
  const Tensor x = f32({1.0f, 1.0f + 0x1p-8f, -3.0f, 0.1f, 1e-3f, 65504.0f}, {2, 3});
  const Tensor h = x.to(DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(std::string(dtype_name(h.dtype())), "bfloat16");
  std::vector<double> expected;
  for (float v : x.to_vector<float>()) expected.push_back(float_from_bf16(bf16_from_float(v)));
  EXPECT_TRUE(all_close(h.to(DType::f32), expected, 0, 0));
  EXPECT_TRUE(all_close(h.to(DType::f64), expected, 0, 0));
  EXPECT_TRUE(all_close(x.to(DType::f64).to(DType::bf16), expected, 0, 0));
  EXPECT_TRUE(all_close(x.transpose(0, 1).to(DType::bf16).transpose(0, 1), expected, 0, 0));  // a strided source
  EXPECT_TRUE(
      all_close(h.transpose(0, 1).contiguous().transpose(0, 1), expected, 0, 0));  // bfloat16 to bfloat16, strided
  EXPECT_ERROR(i64({1, 2}).to(DType::bf16), "bfloat16");
  EXPECT_ERROR(h.to(DType::i64), "bfloat16");
  EXPECT_ERROR(add(h, h), "bfloat16");
}

// x @ w^T + b with w in bfloat16: the float32 layer over the widened weight, up to the order of the sums.
// Rows 1 to 4 take the GEMV path, more the banded GEMM (N 1100 crosses a band of 1024 features).
TEST(Bfloat16, LinearMatchesTheWidenedWeight) {
  const NoGradGuard no_grad;
  Generator g(9);
  for (const int64_t rows : {1, 3, 4, 5, 64}) {
    for (const int64_t N : {7, 300, 1100}) {
      for (const bool with_bias : {true, false}) {
        const int64_t K = 260;
        const Tensor x = randn({rows, K}, g), w = randn({N, K}, g).to(DType::bf16);
        const Tensor b = with_bias ? randn({N}, g) : Tensor();
        const Tensor got = linear(x, w, b), ref = linear(x, w.to(DType::f32), b);
        EXPECT_EQ(got.dtype(), DType::f32);
        EXPECT_TRUE(all_close(got, ref, 1e-4, 1e-5)) << rows << " x " << N << (with_bias ? " bias" : "");
      }
    }
  }
  const Tensor x3 = randn({2, 5, 16}, g), w = randn({6, 16}, g).to(DType::bf16);  // leading dims, strided input
  EXPECT_TRUE(all_close(linear(x3.transpose(0, 1), w), linear(x3.transpose(0, 1), w.to(DType::f32)), 1e-5, 1e-5));
}

TEST(Bfloat16, LinearIsForInference) {
  Generator g(2);
  const Tensor w = randn({4, 3}, g).to(DType::bf16);
  Tensor x = randn({2, 3}, g).requires_grad_();
  EXPECT_ERROR(linear(x, w), "for inference");
  EXPECT_ERROR(linear(randn({2, 3}, g, DType::f64), w), "float32 input");
  const NoGradGuard no_grad;
  EXPECT_EQ(linear(x, w).shape(), (Shape{2, 4}));
}

// A GPT's linear weights to bfloat16: the embeddings, norms, biases and a tied head stay float32, and the logits
// are the float32 model's once its linear weights are rounded the same way.
TEST(Bfloat16, GptWeightsConvertedForInference) {
  for (const bool tied : {false, true}) {
    nn::DecoderConfig cfg = tiny_gpt_config(kThreeHeadGpt);
    cfg.tie_embeddings = tied;
    nn::DecoderModel model(cfg), rounded(cfg);
    model.eval(), rounded.eval();
    rounded.load_parameters(model.named_parameters());
    const Tensor ids = randint(0, cfg.vocab_size, {2, cfg.context_length});
    const int64_t saved = nn::to_bfloat16_weights(model);
    int64_t converted = 0;
    for (const auto& [name, t] : model.named_parameters()) {
      const bool linear_weight = name.find("W_") != std::string::npos ||
                                 name.find("out_proj.weight") != std::string::npos ||
                                 (name.find("ff.layers.") != std::string::npos && name.ends_with(".weight")) ||
                                 (!tied && name == "out_head.weight");
      EXPECT_EQ(t.dtype(), linear_weight ? DType::bf16 : DType::f32) << name;
      EXPECT_FALSE(linear_weight && t.requires_grad()) << name;
      if (linear_weight) converted += t.numel();
    }
    EXPECT_EQ(saved, 2 * converted);
    NoGradGuard no_grad;
    NamedTensors params = rounded.named_parameters();
    for (auto& [name, t] : params)
      if (model.parameter(name).dtype() == DType::bf16) t.copy_(t.to(DType::bf16).to(DType::f32));
    EXPECT_TRUE(all_close(model.forward(ids), rounded.forward(ids), 1e-5, 1e-5)) << (tied ? "tied" : "untied");
  }
}

}  // namespace
