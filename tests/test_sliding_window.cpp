// Sliding-window attention (AttentionMask::within; DecoderConfig's sliding_window and window_layers: Mistral,
// Qwen2's and Qwen3's windowed layers): the op against a mask written out here, a windowed decoder's cached
// decoding (whose cache drops what no query can see) against its full forward at every position, the per-head form
// and the kept pattern against the fused form, and the Hugging Face layout written and read back. The folders
// against the float64 twin are tests/test_llama.cpp's LlamaFolders (mistral_window, qwen2_window, qwen3_window);
// the gradients are the op registry's (tests/op_cases.h: sdpa_*_window*).
#include <gtest/gtest.h>

#include <fstream>
#include <limits>

#include "analysis/surgery.h"
#include "io/families.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/family_checks.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::max_diff;
using headlab::testing::TempDir;
using headlab::testing::tokens;

namespace {

// A llama whose layer 1 sees 3 positions (itself and two before), layer 0 every one; or every layer windowed.
nn::DecoderConfig windowed_config(bool every_layer, nn::AttentionForm form = nn::AttentionForm::fused) {
  nn::DecoderConfig c = nn::llama_family().config();
  c.vocab_size = 29, c.context_length = 20, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = 2, c.n_layers = 2;
  c.hidden_dim = 32, c.sliding_window = 3, c.attention = form;
  if (!every_layer) c.window_layers = {1};
  return c;
}

}  // namespace

// Row i of a causal mask within w sees keys (i - w, i]; a per-row length's window ends at that length.
TEST(SlidingWindow, TheOpHidesExactlyTheKeysBeforeTheWindow) {
  Generator g(3);
  const Tensor q = randn({2, 3, 7, 4}, g, DType::f64), k = randn({2, 3, 7, 4}, g, DType::f64),
               v = randn({2, 3, 7, 5}, g, DType::f64);
  const auto reference = [&](const std::vector<int64_t>& ends, int64_t window, int64_t Tq) {
    // ends: each (b, i)'s visible end; keys [end - window, end) are seen
    Tensor scores = mul(matmul(q.narrow(2, 7 - Tq, Tq), k.mT()), 0.5);  // (2, 3, Tq, 7)
    std::vector<uint8_t> hide;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < 7; ++j) {
          const int64_t end = ends[static_cast<size_t>(b * Tq + i)];
          hide.push_back(j >= end || j < end - window);
        }
    const Tensor mask = tensor(std::vector<double>(hide.begin(), hide.end()), {2, 1, Tq, 7});
    scores = masked_fill(scores, gt(mask, zeros({}, DType::f64)), -std::numeric_limits<double>::infinity());
    return matmul(softmax(scores, -1), v);
  };
  std::vector<int64_t> causal_ends;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 7; ++i) causal_ends.push_back(i + 1);
  EXPECT_LT(
      max_diff(scaled_dot_product_attention(q, k, v, AttentionMask::causal().within(3)), reference(causal_ends, 3, 7)),
      1e-12);
  // a cached chunk of 3 queries after 4 positions: lengths 5, 6, 7 within 2
  const std::vector<int64_t> ends{5, 6, 7, 5, 6, 7};
  EXPECT_LT(max_diff(scaled_dot_product_attention(q.narrow(2, 4, 3), k, v,
                                                  AttentionMask::lengths(tensor(ends, {2, 3})).within(2)),
                     reference(ends, 2, 3)),
            1e-12);
  // a window as long as the keys hides nothing: the plain causal result, through the fused kernel
  EXPECT_LT(max_diff(scaled_dot_product_attention(q, k, v, AttentionMask::causal().within(7)),
                     scaled_dot_product_attention(q, k, v, AttentionMask::causal())),
            1e-12);
  EXPECT_ERROR(scaled_dot_product_attention(q, k, v, AttentionMask::causal().within(-1)), "window must be >= 0");
}

// Decoding one token at a time and in chunks equals the full forward at every position; the windowed layer's cache
// stays within about twice its window while the full layer's holds every position.
TEST(SlidingWindow, CachedDecodingEqualsTheFullForwardAndTheCacheStaysSmall) {
  for (const bool every : {false, true}) {
    manual_seed(5);
    nn::DecoderModel m(windowed_config(every));
    m.eval();
    const NoGradGuard no_grad;
    const Tensor idx = tokens(2, 20, 29, 8);
    const Tensor full = m.forward(idx);
    std::vector<nn::KVCache> caches(2);
    Tensor last = m.forward_cached(idx.narrow(1, 0, 2), caches);
    EXPECT_LT(max_diff(last, full.select(1, 1)), 2e-5);
    for (int64_t t = 2; t < 20; ++t) {
      last = m.forward_cached(idx.narrow(1, t, 1), caches);
      EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "every " << every << " position " << t;
      EXPECT_LE(caches[1].length - caches[1].start, 6) << t;  // 2 x the window of 3
    }
    EXPECT_EQ(caches[1].length, 20);
    if (!every) {
      EXPECT_EQ(caches[0].start, 0);
    }
    for (const int64_t chunk : {1, 2, 5, 7}) {  // a prompt in chunks: the window across each chunk's edge
      std::vector<nn::KVCache> chunked(2);
      EXPECT_LT(max_diff(m.forward_cached(idx, chunked, chunk), full.select(1, 19)), 2e-5) << "chunk " << chunk;
    }
  }
}

// The wrapper's heads and the fused form's kept pattern apply the same window; the pattern is zero before it.
TEST(SlidingWindow, PerHeadFormAndKeptPatternAgreeWithTheFusedForm) {
  manual_seed(9);
  nn::DecoderModel fused(windowed_config(false));
  fused.eval();
  const std::unique_ptr<nn::DecoderModel> w = headlab::testing::wrapper_of(fused);
  nn::DecoderModel& wrapper = *w;
  const NoGradGuard no_grad;
  const Tensor idx = tokens(2, 12, 29, 2);
  const Tensor want = fused.forward(idx);
  EXPECT_LT(max_diff(wrapper.forward(idx), want), 1e-5);
  fused.keep_attention_weights(true);
  EXPECT_LT(max_diff(fused.forward(idx), want), 1e-5);
  const Tensor pattern = fused.attention_weights(1);                                // (2, 4, 12, 12)
  EXPECT_EQ(pattern.select(2, 8).narrow(2, 0, 6).abs().sum().item<double>(), 0.0);  // row 8 sees keys 6..8 only
  EXPECT_GT(pattern.select(2, 8).narrow(2, 6, 3).sum().item<double>(), 0.0);
  EXPECT_GT(fused.attention_weights(0).select(2, 8).narrow(2, 0, 6).sum().item<double>(), 0.0);  // layer 0: all
}

// export writes Mistral's layout (a window on every layer) or Qwen2's (layer_types, with biases) and reads back the
// same config and weights; a llama with windows on some layers and neither has no layout: refused by name.
TEST(SlidingWindow, ExportWritesMistralOrQwen2AndReadsBack) {
  for (const bool every : {true, false}) {
    TempDir dir("window_export");
    manual_seed(6);
    nn::DecoderConfig c = windowed_config(every);
    c.qkv_bias = !every;  // Qwen2's
    nn::DecoderModel m(c);
    io::family_named("llama", "test").folder->write(dir.path("out"), m, {});
    std::ifstream in(dir.path("out") + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j.at("model_type"), every ? "mistral" : "qwen2");
    EXPECT_EQ(j.at("sliding_window"), 3);
    auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
    EXPECT_EQ(back->config_json(), m.config_json());
    const Tensor idx = tokens(1, 15, 29, 3);
    const NoGradGuard no_grad;
    m.eval();
    EXPECT_EQ(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), m.forward(idx)), 0.0);
  }
  TempDir dir("window_refused");
  nn::DecoderModel partial(windowed_config(false));
  EXPECT_ERROR(io::family_named("llama", "test").folder->write(dir.path("out"), partial, {}),
               "sliding windows on some layers only has no Hugging Face layout");
  nn::DecoderConfig bad = windowed_config(false);
  bad.window_layers = {1, 0};
  EXPECT_ERROR(nn::DecoderModel{bad}, "window_layers must be increasing");
  bad.window_layers = {}, bad.sliding_window = 0, bad.window_layers = {0};
  EXPECT_ERROR(nn::DecoderModel{bad}, "window_layers needs a sliding_window");
}
