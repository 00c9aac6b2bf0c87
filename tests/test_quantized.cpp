// Weights kept as ggml's blocks for inference (DType::q8_0, DType::q4_k): float16 (the blocks' scales) rounded as
// IEEE defines it, bit by bit; the quantizers (Q8_0 as ggml's reference writes it, Q4_K within its steps); the
// linear layer that reads the blocks as they are, against the same layer over the widened weights (every path:
// GEMV rows, widened panels, bias or none); nn::to_quantized_weights on a LLaMA-family model (its tied head too);
// the real stories260K with Q8_0 weights against itself in float32; convert --dtype writing the blocks to a
// checkpoint that generate reads as they are.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "backends/quant_blocks.h"
#include "base/float16.h"
#include "nn/decoder_family.h"
#include "nn/layers.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "tests/shared_models.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

TEST(Float16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = float_from_f16(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(float_from_f16(f16_from_float(f)))) << h;
      continue;
    }
    ASSERT_EQ(f16_from_float(f), h) << h << " (" << f << ")";
  }
}

// Between two neighbouring finite halves, the midpoint (exact in float32) goes to the one with an even mantissa, and
// the floats just either side of it to the nearer; past the largest half's midpoint, infinity.
TEST(Float16, RoundsToTheNearestTiesToEven) {
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float lo = float_from_f16(static_cast<uint16_t>(h)), hi = float_from_f16(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;
    ASSERT_EQ(f16_from_float(mid), (h & 1) ? h + 1 : h) << h;
    ASSERT_EQ(f16_from_float(std::nextafter(mid, hi)), h + 1) << h;
    ASSERT_EQ(f16_from_float(std::nextafter(mid, lo)), h) << h;
    ASSERT_EQ(f16_from_float(-mid), ((h & 1) ? h + 1 : h) | 0x8000u) << h;
  }
  EXPECT_EQ(f16_from_float(65504.0f), 0x7bffu);
  EXPECT_EQ(f16_from_float(65519.99f), 0x7bffu);
  EXPECT_EQ(f16_from_float(65520.0f), 0x7c00u);
  EXPECT_EQ(f16_from_float(-1e9f), 0xfc00u);
  EXPECT_EQ(f16_from_float(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(f16_from_float(1e-9f), 0u);  // under half the smallest subnormal (2^-25)
  EXPECT_EQ(f16_from_float(0x1p-25f), 0u);  // the tie: to zero, the even
  EXPECT_EQ(f16_from_float(std::nextafter(0x1p-25f, 1.0f)), 1u);
}

std::vector<float> gaussian(int64_t n, uint64_t seed) {
  Generator g(seed);
  return randn({n}, g).to_vector<float>();
}

std::vector<float> widen(DType block, const std::vector<std::byte>& q, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  if (block == DType::q8_0)
    quant::dequantize_q8_0(q.data(), out.data(), n / 32);
  else
    quant::dequantize_q4_k(q.data(), out.data(), n / 256);
  return out;
}

// Q8_0 by its definition (ggml's quantize_row_q8_0_ref): d = max |x| / 127 stored as float16, q = round(x * (1 / d)).
TEST(QuantBlocks, Q8_0IsGgmlsReferenceQuantizer) {
  std::vector<float> x = gaussian(32 * 64, 3);
  for (int i = 0; i < 32; ++i) x[32 + i] = 0.0f;  // a zero block: d = 0, q = 0
  std::vector<std::byte> q(64 * 34);
  quant::quantize_q8_0(x.data(), q.data(), 64);
  for (int b = 0; b < 64; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.0f;
    uint16_t stored;
    std::memcpy(&stored, &q[34 * b], 2);
    ASSERT_EQ(stored, f16_from_float(d)) << b;
    for (int i = 0; i < 32; ++i) {
      const auto qi = static_cast<int8_t>(q[34 * b + 2 + i]);
      ASSERT_EQ(qi, d == 0 ? 0 : std::lround(x[32 * b + i] * (1.0f / d))) << b << ", " << i;
    }
  }
  const std::vector<float> y = widen(DType::q8_0, q, 32 * 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[32 + i], 0.0f);
}

// Each block type's error on Gaussian weights, as a share of their spread: Q8_0 about 1/127 of a block's largest,
// Q4_K a sixteenth of a sub-block's range (and its scales in 6 bits).
TEST(QuantBlocks, ErrorsAreWithinTheirSteps) {
  const int64_t n = 256 * 512;
  const std::vector<float> x = gaussian(n, 5);
  for (const DType block : {DType::q8_0, DType::q4_k}) {
    std::vector<std::byte> q(static_cast<size_t>(n / dtype_block(block)) * dtype_size(block));
    if (block == DType::q8_0)
      quant::quantize_q8_0(x.data(), q.data(), n / 32);
    else
      quant::quantize_q4_k(x.data(), q.data(), n / 256);
    const std::vector<float> y = widen(block, q, n);
    double se = 0, worst = 0;
    for (int64_t i = 0; i < n; ++i) se += (y[i] - x[i]) * (y[i] - x[i]), worst = std::max<double>(worst, std::fabs(y[i] - x[i]));
    const double rms = std::sqrt(se / static_cast<double>(n));
    std::printf("%s on N(0, 1): rms error %.4f, largest %.4f\n", dtype_name(block), rms, worst);
    if (block == DType::q8_0) {
      EXPECT_LT(rms, 0.008);
      EXPECT_LT(worst, 0.025);  // half a step of the largest block (|x| < 5.5: 5.5 / 127 / 2)
    } else {
      EXPECT_LT(rms, 0.1);
      EXPECT_LT(worst, 0.5);
    }
  }
}

TEST(QuantizedLinear, MatchesTheWidenedWeight) {
  const NoGradGuard no_grad;
  Generator g(9);
  for (const DType block : {DType::q8_0, DType::q4_k}) {
    for (const int64_t rows : {1, 3, 4, 5, 64}) {
      for (const int64_t N : {7, 300, 1100}) {
        for (const bool with_bias : {true, false}) {
          const int64_t K = 512;
          const Tensor x = randn({rows, K}, g), q = quantize(randn({N, K}, g), block);
          ASSERT_EQ(q.shape(), (Shape{N, K / dtype_block(block)}));
          ASSERT_EQ(q.dtype(), block);
          const Tensor b = with_bias ? randn({N}, g) : Tensor();
          const Tensor got = linear(x, q, b), ref = linear(x, dequantize(q), b);
          EXPECT_EQ(got.dtype(), DType::f32);
          EXPECT_TRUE(all_close(got, ref, 1e-4, 1e-5))
              << dtype_name(block) << ": " << rows << " x " << N << (with_bias ? " bias" : "");
        }
      }
    }
  }
  const Tensor x3 = randn({2, 5, 64}, g), q = quantize(randn({6, 64}, g), DType::q8_0);  // leading dims, strides
  EXPECT_TRUE(all_close(linear(x3.transpose(0, 1), q), linear(x3.transpose(0, 1), dequantize(q)), 1e-5, 1e-5));
}

TEST(QuantizedLinear, RefusesWhatBlocksCannotDo) {
  Generator g(2);
  EXPECT_ERROR(quantize(randn({4, 48}, g), DType::q8_0), "whole blocks of 32");
  EXPECT_ERROR(quantize(randn({4, 64}, g), DType::bf16), "q8_0 or q4_k");
  EXPECT_ERROR(quantize(randn({64}, g), DType::q8_0), "2-D");
  EXPECT_ERROR(quantize(full({2, 32}, std::nan("")), DType::q8_0), "NaN");
  EXPECT_ERROR(dequantize(randn({2, 32}, g)), "expected q8_0 or q4_k");
  const Tensor q = quantize(randn({4, 64}, g), DType::q8_0);
  Tensor x = randn({2, 64}, g).requires_grad_();
  EXPECT_ERROR(linear(x, q), "for inference");
  EXPECT_ERROR(linear(randn({2, 64}, g, DType::f64), q), "float32 input");
  EXPECT_ERROR(linear(randn({2, 32}, g), q), "expected last dim 64");
  EXPECT_ERROR(q.to(DType::f32), "dequantize()");
  EXPECT_ERROR(randn({2, 32}, g).to(DType::q4_k), "quantize()");
  EXPECT_ERROR(q.to_vector<float>(), "dequantize()");
  EXPECT_ERROR(add(q, q), "q8_0");
  EXPECT_ERROR(matmul(randn({2, 4}, g), q), "q8_0");
  const NoGradGuard no_grad;
  EXPECT_EQ(linear(x, q).shape(), (Shape{2, 4}));
}

// A LLaMA-family model (tied head) quantized in place: every linear weight and the tied table in blocks, the rest
// float32; its logits are those of the float32 model holding the widened weights, and near the original's.
TEST(QuantizedWeights, LlamaModelQuantizedInPlace) {
  for (const DType block : {DType::q8_0, DType::q4_k}) {
    nn::DecoderConfig cfg = nn::llama_family().config();
    cfg.n_layers = 2, cfg.emb_dim = 256, cfg.n_heads = 4, cfg.n_kv_heads = 2, cfg.hidden_dim = 512;
    cfg.vocab_size = 96, cfg.context_length = 32, cfg.tie_embeddings = true;
    nn::DecoderModel model(cfg), widened(cfg);
    model.eval(), widened.eval();
    widened.load_parameters(model.named_parameters());
    const Tensor ids = randint(0, cfg.vocab_size, {2, cfg.context_length});
    const NoGradGuard no_grad;
    const Tensor original = model.forward(ids);
    const int64_t params = model.num_parameters();
    const int64_t saved = nn::to_quantized_weights(model, block);
    EXPECT_EQ(model.num_parameters(), params);
    int64_t blocks_bytes = 0, float_weights = 0;
    for (const auto& [name, t] : model.named_parameters()) {
      const bool matrix = t.dim() == 2;  // every matrix of this model is a linear weight or the tied table
      EXPECT_EQ(is_block_quantized(t.dtype()), matrix) << name;
      if (!matrix) continue;
      EXPECT_FALSE(t.requires_grad()) << name;
      blocks_bytes += t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
      float_weights += t.numel() * dtype_block(t.dtype());
      // q4_k where the rows hold whole super-blocks (256); the table of width 256 too
      EXPECT_EQ(t.dtype(), block) << name;
    }
    EXPECT_EQ(saved, 4 * float_weights - blocks_bytes);
    NamedTensors wide = widened.named_parameters();
    for (auto& [name, t] : wide)
      if (is_block_quantized(model.parameter(name).dtype())) t.copy_(dequantize(model.parameter(name)));
    const Tensor got = model.forward(ids);
    EXPECT_TRUE(all_close(got, widened.forward(ids), 1e-4, 1e-4)) << dtype_name(block);
    const double diff = amax(abs(sub(got, original))).item<float>(), spread = std::sqrt(var(original).item<float>());
    EXPECT_LT(diff, (block == DType::q8_0 ? 0.05 : 0.5) * spread) << dtype_name(block);
  }
  // a width that is no multiple of 256: q4_k falls back to q8_0 (llama.cpp's rule), one of no 32 stays float32
  nn::Linear a(96, 8), b(40, 8);
  nn::to_quantized_weights(a, DType::q4_k);
  nn::to_quantized_weights(b, DType::q4_k);
  EXPECT_EQ(a.weight.dtype(), DType::q8_0);
  EXPECT_EQ(b.weight.dtype(), DType::f32);
}

// The real model with Q8_0 weights (its feed-forward's down projection, 172 wide, stays float32) against itself in
// float32 over the published story: logits, the next-token distributions' KL, and the greedy story.
TEST(Stories260K, Q8_0WeightsStayCloseToFloat32) {
  if (!std::filesystem::exists(kStories260KDir + "/stories260K.bin"))
    GTEST_SKIP() << kStories260KDir << " is absent (../shared/models)";
  const StoredWeightsRun r =
      stories260k_with_stored_weights([](nn::DecoderModel& m) { return nn::to_quantized_weights(m, DType::q8_0); });
  EXPECT_GT(r.saved, 0);
  size_t same = 0;
  while (same < r.story_after.size() && same < r.story_before.size() && r.story_after[same] == r.story_before[same])
    ++same;
  const Tensor log_p = log_softmax(r.logits_before, -1), log_q = log_softmax(r.logits_after, -1);
  const double kl = sum(mul(exp(log_p), sub(log_p, log_q)), {-1}).mean().item<float>();
  const double diff = amax(abs(sub(r.logits_after, r.logits_before))).item<float>(),
               spread = std::sqrt(var(r.logits_before).item<float>());
  std::printf(
      "stories260K, q8_0 weights: largest logit difference %.3g over %lld positions (logits' standard deviation "
      "%.3g), mean KL %.3g nats; greedy: the first %zu of %zu tokens the same\n",
      diff, static_cast<long long>(r.logits_before.size(1)), spread, kl, same, r.story_before.size());
  EXPECT_LT(diff, 0.1 * spread);
  EXPECT_LT(kl, 1e-3);
}

// convert --dtype q8_0 writes the blocks (the file well under the float32 one), inspect names them, and generate
// reads them as they are: the story generate --dtype q8_0 writes from the original file, token for token.
TEST(QuantizedCheckpoint, ConvertWritesBlocksThatGenerateReadsAsTheyAre) {
  const std::string dir = kStories260KDir, model = dir + "/stories260K.bin", tok = dir + "/tok512.bin";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << dir << " is absent (../shared/models)";
  const TempDir tmp("quantized_ckpt");
  const std::string bin = std::string(HEADLAB_BINARY_DIR) + "/headlab";
  const auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), args.begin(), args.end());
    const ProcessResult r = run_process(argv, tmp.dir());
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  };
  run({"convert", model, "--tokenizer", tok, "--dtype", "q8_0", "--out", tmp.path("q8.h5")});
  run({"convert", model, "--tokenizer", tok, "--out", tmp.path("f32.h5")});
  const auto q8 = std::filesystem::file_size(tmp.path("q8.h5")), f32 = std::filesystem::file_size(tmp.path("f32.h5"));
  std::printf("stories260K checkpoints: float32 %ju bytes, q8_0 %ju\n", static_cast<uintmax_t>(f32),
              static_cast<uintmax_t>(q8));
  EXPECT_LT(static_cast<double>(q8), 0.55 * static_cast<double>(f32));  // 172-wide down projections stay float32
  const std::string shown = run({"inspect", tmp.path("q8.h5")});
  EXPECT_NE(shown.find("[512, 64] q8_0"), std::string::npos) << shown;  // the tied table
  const std::vector<std::string> prompt{"--prompt", "Once upon a time", "--max-new-tokens", "48"};
  std::vector<std::string> from_blocks{"generate", tmp.path("q8.h5")}, quantized{"generate", model, "--tokenizer", tok,
                                                                                  "--dtype", "q8_0"};
  from_blocks.insert(from_blocks.end(), prompt.begin(), prompt.end());
  quantized.insert(quantized.end(), prompt.begin(), prompt.end());
  const std::string a = run(from_blocks), b = run(quantized);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}

}  // namespace
