// The LLaMA family (nn/llama.h): its model against its own slow references (the KV-cache decode against the
// full forward, grouped-query attention against multi-head attention with repeated key/value weights, the fused
// kernel against the composite path, rotary layouts against each other); llama2.c's checkpoint and tokenizer
// formats and their bad inputs; and stories260K, a real pretrained model (../shared/models/stories260K), whose
// published greedy story must come out token for token. The parts' gradchecks are in the op registry
// (tests/op_cases.h: rms_norm, silu, rotary_*, sdpa_gqa_*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>

#include "analysis/pruning.h"
#include "analysis/surgery.h"
#include "io/families.h"
#include "io/hf_llama.h"
#include "io/llama2c.h"
#include "loader/load.h"
#include "nn/decoder_family.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "tasks/llama2c_tokenizer.h"
#include "tasks/sentencepiece_tokenizer.h"
#include "tests/core_test_util.h"
#include "tests/family_checks.h"
#include "tests/process_util.h"
#include "tests/shared_models.h"

using namespace headlab;
using headlab::testing::published_story;
using headlab::testing::TempDir;

namespace {

namespace fs = std::filesystem;

const std::string kStories = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/stories260K";

nn::DecoderConfig small_config(int64_t kv_heads, bool interleaved = false) {
  nn::DecoderConfig c = nn::llama_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_kv_heads = kv_heads;
  c.n_layers = 2, c.hidden_dim = 40, c.rope_theta = 500.0, c.rope_interleaved = interleaved;
  return c;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, g);
}

double max_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

}  // namespace

TEST(Llama, ParameterCountAndNamesFollowTheBooksConversion) {
  for (int64_t kv : {4, 2, 1}) {
    const nn::DecoderConfig c = small_config(kv);
    nn::DecoderModel m(c);
    EXPECT_EQ(static_cast<double>(m.num_parameters()), c.num_parameters()) << kv;
    const NamedTensors p = m.named_parameters();
    const auto shape_of = [&](const std::string& n) {
      for (const auto& [name, t] : p)
        if (name == n) return t.shape();
      ADD_FAILURE() << n << " missing";
      return Shape{};
    };
    EXPECT_EQ(shape_of("trf_blocks.1.att.W_key.weight"), Shape({kv * 6, 24}));
    EXPECT_EQ(shape_of("trf_blocks.0.ff.fc1.weight"), Shape({40, 24}));
    EXPECT_EQ(shape_of("trf_blocks.0.ff.fc3.weight"), Shape({24, 40}));
    EXPECT_EQ(shape_of("final_norm.weight"), Shape({24}));
    for (const auto& [name, t] : p) EXPECT_EQ(name.find("bias"), std::string::npos) << name;  // LLaMA has none
  }
}

// A grouped-query model is the multi-head model whose key/value weights repeat per group: the same logits.
TEST(Llama, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueWeights) {
  manual_seed(3);
  nn::DecoderModel gqa(small_config(2));
  nn::DecoderModel mha(small_config(4));
  const NoGradGuard no_grad;
  for (const auto& [name, t] : mha.named_parameters()) {
    Tensor src;
    for (const auto& [n2, t2] : gqa.named_parameters())
      if (n2 == name) src = t2;
    if (name.find("W_key") != std::string::npos || name.find("W_value") != std::string::npos)
      src = src.view({2, 1, 6, 24}).expand({2, 2, 6, 24}).reshape({24, 24});  // kv head j serves heads 2j, 2j+1
    t.detach().copy_(src);
  }
  const Tensor idx = tokens(2, 9, 37, 5);
  EXPECT_LT(max_diff(gqa.forward(idx), mha.forward(idx)), 1e-5);
  // TransformerLens's W_K of a grouped-query model: one (repeated) per query head.
  const nn::HeadWeights w = gqa.head_weights(1);
  EXPECT_EQ(w.W_K.shape(), Shape({4, 24, 6}));
  EXPECT_LT(max_diff(w.W_K.select(0, 2), w.W_K.select(0, 3)), 1e-12);
  EXPECT_LT(max_diff(w.W_K, mha.head_weights(1).W_K), 1e-12);
}

// Incremental decoding (the cache holds n_kv_heads heads, rotary at the cached offset) gives the logits the
// full forward gives at every position; and the attention weights the analyses keep equal the fused path.
TEST(Llama, CachedDecodingAndKeptWeightsMatchTheFullForward) {
  for (const bool interleaved : {false, true})
    for (int64_t kv : {4, 2, 1}) {
      manual_seed(11);
      nn::DecoderModel m(small_config(kv, interleaved));
      m.eval();
      const NoGradGuard no_grad;
      const Tensor idx = tokens(2, 10, 37, 7);
      const Tensor full = m.forward(idx);  // (2, 10, 37)
      std::vector<nn::KVCache> caches(2);
      Tensor last = m.forward_cached(idx.narrow(1, 0, 4), caches);
      EXPECT_LT(max_diff(last, full.select(1, 3)), 2e-5);
      EXPECT_EQ(caches[0].keys.size(1), kv);
      for (int64_t t = 4; t < 10; ++t) {
        last = m.forward_cached(idx.narrow(1, t, 1), caches);
        EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "kv " << kv << " position " << t;
      }
      for (const int64_t chunk : {1, 3, 4}) {  // a prompt in chunks: rotary and the mask at each chunk's offset
        std::vector<nn::KVCache> chunked(2);
        EXPECT_LT(max_diff(m.forward_cached(idx, chunked, chunk), full.select(1, 9)), 2e-5) << "chunk " << chunk;
      }
      m.keep_attention_weights(true);
      EXPECT_LT(max_diff(m.forward(idx), full), 2e-5);
      EXPECT_EQ(m.attention_weights(0).shape(), Shape({2, 4, 10, 10}));
    }
}

// The two rotary layouts are one rotation of permuted coordinates: a halves model whose q and k rows are
// permuted as llama2.c's export permutes them computes what the interleaved model computes.
TEST(Llama, InterleavedAndHalvesRotaryAgreeUnderTheExportPermutation) {
  manual_seed(4);
  nn::DecoderModel pairs(small_config(2, true));
  nn::DecoderModel halves(small_config(2, false));
  const NoGradGuard no_grad;
  const int64_t D = 6;
  std::vector<int64_t> perm;  // halves row i*... : within a head, (0, 2, 4, 1, 3, 5)
  for (int64_t j = 0; j < D / 2; ++j) perm.push_back(2 * j);
  for (int64_t j = 0; j < D / 2; ++j) perm.push_back(2 * j + 1);
  for (const auto& [name, t] : halves.named_parameters()) {
    Tensor src;
    for (const auto& [n2, t2] : pairs.named_parameters())
      if (n2 == name) src = t2;
    if (name.find("W_query") != std::string::npos || name.find("W_key") != std::string::npos) {
      const int64_t heads = src.size(0) / D;
      std::vector<int64_t> rows;
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t p : perm) rows.push_back(h * D + p);
      src = index_select(src, 0, tensor(rows));
    }
    t.detach().copy_(src);
  }
  const Tensor idx = tokens(1, 12, 37, 9);
  EXPECT_LT(max_diff(pairs.forward(idx), halves.forward(idx)), 1e-5);
}

TEST(Llama, TrainsOnAFreshConfigFromTheRegistry) {
  nn::ModelOptions o;
  o.arch = "llama", o.emb_dim = 16, o.n_heads = 4, o.n_kv_heads = 1, o.n_layers = 1;
  const io::Family& f = io::family_named("llama", "test");
  const nn::TaskSizes sizes{.task = "copy", .vocab_size = 13, .context_length = 12};
  const nlohmann::json s = f.model.from_options(o, sizes);
  EXPECT_EQ(f.model.options(s).n_kv_heads, 1);
  EXPECT_EQ(f.model.options(s).ffn_hiddens, 0);  // the default width reads back as the default
  auto model = std::dynamic_pointer_cast<nn::DecoderModel>(io::make_model(s));
  ASSERT_TRUE(model);
  EXPECT_EQ(model->config().hidden_dim, 48);  // 8/3 x 16 rounded up to a multiple of 8
  const Tensor idx = tokens(4, 12, 13, 1);
  const Tensor targets = tokens(4, 12, 13, 2);
  optim::Optimizer opt(model->named_parameters(), {.kind = optim::OptimizerKind::adamw, .lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const Tensor loss = cross_entropy(model->forward(idx), targets);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first);  // memorises a fixed batch
  // Refusals by name.
  o.n_kv_heads = 3;
  EXPECT_ERROR(f.model.from_options(o, sizes), "n_kv_heads 3 must divide n_heads 4");
  o.n_kv_heads = 2;
  EXPECT_ERROR(io::family_named("gpt", "test").model.from_options(o, sizes),
                    "--n-kv-heads: the gpt family has multi-head attention only");
}

// ---- llama2.c's files ----
namespace {

// A legacy llama2.c file of `c`'s sizes with the model's values, as export.py's legacy_export writes it.
void write_legacy(const std::string& path, nn::DecoderModel& m, bool tied) {
  const nn::DecoderConfig& c = m.config();
  std::ofstream out(path, std::ios::binary);
  const int32_t header[7] = {
      static_cast<int32_t>(c.emb_dim),       static_cast<int32_t>(c.hidden_dim),
      static_cast<int32_t>(c.n_layers),      static_cast<int32_t>(c.n_heads),
      static_cast<int32_t>(c.kv_heads()),    static_cast<int32_t>(tied ? c.vocab_size : -c.vocab_size),
      static_cast<int32_t>(c.context_length)};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  const auto put = [&](const Tensor& t) {
    const Tensor f = contiguous(t.detach().to(DType::f32));
    out.write(static_cast<const char*>(f.raw_data()), static_cast<std::streamsize>(f.numel() * 4));
  };
  const auto layers = [&](auto pick) {
    for (int64_t l = 0; l < c.n_layers; ++l) put(pick(*m.block(l)));
  };
  put(m.tok_emb->weight);
  layers([](nn::DecoderBlock& b) { return b.norm1->weight; });
  const auto att = [](nn::DecoderBlock& b) -> nn::CausalMultiHeadAttention& {
    return dynamic_cast<nn::CausalMultiHeadAttention&>(*b.att);
  };
  layers([&](nn::DecoderBlock& b) { return att(b).W_query->weight; });
  layers([&](nn::DecoderBlock& b) { return att(b).W_key->weight; });
  layers([&](nn::DecoderBlock& b) { return att(b).W_value->weight; });
  layers([&](nn::DecoderBlock& b) { return att(b).out_proj->weight; });
  layers([](nn::DecoderBlock& b) { return b.norm2->weight; });
  layers([](nn::DecoderBlock& b) { return dynamic_cast<nn::GatedFeedForward&>(*b.ff).fc1->weight; });  // w1
  layers([](nn::DecoderBlock& b) { return dynamic_cast<nn::GatedFeedForward&>(*b.ff).fc3->weight; });  // w2
  layers([](nn::DecoderBlock& b) { return dynamic_cast<nn::GatedFeedForward&>(*b.ff).fc2->weight; });  // w3
  put(m.final_norm->weight);
  put(zeros({c.context_length, c.head_size()}));  // freq_cis_real and _imag
  if (!tied) put(m.out_head->weight);
}

}  // namespace

TEST(Llama2c, LegacyFilesRoundTripAndBadHeadersAreRefusedByName) {
  TempDir dir("llama2c");
  for (const bool tied : {true, false}) {
    manual_seed(2);
    nn::DecoderConfig c = small_config(2, true);
    c.tie_embeddings = tied;
    c.rope_theta = 10000.0;  // llama2.c's, which its files do not state
    nn::DecoderModel m(c);
    m.eval();
    const std::string path = dir.path(tied ? "tied.bin" : "untied.bin");
    write_legacy(path, m, tied);
    ASSERT_TRUE(io::is_llama2c_checkpoint(path));
    io::FolderModel read = io::read_llama2c(path);
    auto back = io::build_folder_model(std::move(read), path);
    const Tensor idx = tokens(1, 8, 37, 3);
    const NoGradGuard no_grad;
    EXPECT_LT(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), m.forward(idx)), 1e-6);
  }
  // A truncated file, and a header whose sizes do not give the file's length, are not llama2.c checkpoints.
  const std::string good = dir.path("tied.bin");
  std::string bytes = headlab::testing::slurp(good);
  const auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir.path(name), std::ios::binary) << content;
    return dir.path(name);
  };
  const std::string cut = write("cut.bin", bytes.substr(0, bytes.size() - 4));
  EXPECT_FALSE(io::is_llama2c_checkpoint(cut));
  EXPECT_ERROR(io::read_llama2c(cut), "has a header whose sizes need");
  std::string absurd = bytes;
  const int32_t huge = 1 << 30;
  std::memcpy(absurd.data() + 4, &huge, 4);  // hidden_dim: a claimed size no file holds
  EXPECT_ERROR(io::read_llama2c(write("absurd.bin", absurd)), "has a header whose sizes need");
  std::string odd = bytes;
  const int32_t three = 3;
  std::memcpy(odd.data() + 16, &three, 4);  // n_kv_heads 3 of 4 heads
  EXPECT_ERROR(io::read_llama2c(write("odd.bin", odd)), "n_kv_heads must divide n_heads");
  EXPECT_ERROR(io::read_llama2c(write("short.bin", "abc")), "shorter than a llama2.c header");
}

TEST(Llama2c, TokenizerFileErrorsNameTheFileAndField) {
  TempDir dir("llama2c_tok");
  EXPECT_ERROR(tasks::Llama2cTokenizer("\x01\x00", "tok"), "tok: the file ends inside the header");
  const std::string header("\x10\x00\x00\x00", 4);  // max_token_length 16
  EXPECT_ERROR(tasks::Llama2cTokenizer(header + std::string("\0\0\0\0\x40\0\0\0", 8), "tok"),
                    "tok: token 0 has length 64, outside 0..max_token_length 16");
  EXPECT_ERROR(tasks::Llama2cTokenizer(header + std::string("\0\0\0\0\x02\0\0\0a", 9), "tok"),
                    "tok: the file ends inside token 0's 2 bytes");
  EXPECT_ERROR(tasks::Llama2cTokenizer(header + std::string("\0\0\0\0\x01\0\0\0a", 9), "tok"),
                    "tok: 1 tokens; a llama2.c vocabulary holds");
}

// ---- Hugging Face folders against PyTorch's twin (tools/fixtures_llama_folders.py) ----
namespace {

std::string llama_fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/llama_folders/" + name;
}

Tensor ids_tensor(const nlohmann::json& rows) {
  const auto ids = rows.get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
  return tensor(flat, {static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids[0].size())});
}

}  // namespace

class LlamaFolders : public ::testing::TestWithParam<std::string> {};

// Logits to 1e-5 of the float64 twin and the same greedy tokens (the cached decode), in every variant.
TEST_P(LlamaFolders, MatchPyTorchLogitsAndGreedyTokens) {
  const std::string folder = llama_fixture(GetParam());
  const io::Family& family = io::family_of_folder(folder);
  const std::string v = GetParam();
  ASSERT_EQ(family.model.arch(), v.starts_with("qwen3")    ? "qwen3"
                                 : v.starts_with("olmo2")  ? "olmo2"
                                 : v.starts_with("gemma3") ? "gemma3"
                                 : v.starts_with("gemma2") ? "gemma2"
                                 : v.starts_with("gemma")  ? "gemma"
                                                           : "llama");
  auto model = io::build_folder_model(family.folder->read(folder), folder);
  auto& decoder = dynamic_cast<nn::DecoderModel&>(*model);
  std::ifstream in(llama_fixture("reference.json"));
  const nlohmann::json ref = nlohmann::json::parse(in).at(GetParam());
  const NoGradGuard no_grad;
  const Tensor logits = decoder.forward(ids_tensor(ref["ids"]));
  const auto want = ref["logits"].get<std::vector<std::vector<std::vector<double>>>>();
  std::vector<double> flat;
  for (const auto& row : want)
    for (const auto& t : row) flat.insert(flat.end(), t.begin(), t.end());
  EXPECT_LT(max_diff(logits, tensor(flat, logits.shape())), 1e-5);
  nn::GenerateOptions g;
  g.max_new_tokens = 12;
  EXPECT_EQ(nn::generate(decoder, ref["prompt"].get<std::vector<int64_t>>(), g),
            ref["greedy"].get<std::vector<int64_t>>());
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaFolders,
                         ::testing::Values("gqa_tied", "mqa_untied_f16", "mha_mistral_bf16", "qwen2_bias", "qwen3_tied",
                                           "qwen3_untied_bf16", "mistral_window", "qwen2_window", "qwen3_window",
                                           "phi3_window_gqa", "olmo2_gqa", "olmo2_tied_bf16", "gemma_mqa", "gemma_bf16",
                                           "gemma3_pattern", "gemma3_types_bf16", "gemma2_caps", "gemma2_types_bf16",
                                           "llama3_scaled", "gemma3_linear"));

// rope_scaling's frequencies: llama3 keeps the high frequencies (wavelength under original / high_freq_factor),
// divides the low ones (over original / low_freq_factor) and blends between; linear divides all; Gemma 3's local
// layers keep plain rotary.
TEST(RopeScaling, FrequenciesFollowTransformersRules) {
  const RopeScaling llama3{.kind = RopeScalingKind::llama3,
                           .factor = 8,
                           .low_freq_factor = 1,
                           .high_freq_factor = 4,
                           .original_context = 32};
  const std::vector<double> plain = rotary_frequencies(16, 10000), f = rotary_frequencies(16, 10000, llama3);
  ASSERT_EQ(f.size(), 8u);
  EXPECT_EQ(f[0], plain[0]);                                                     // wavelength 6.3 < 32 / 4
  const double smooth = (32 / (2 * std::numbers::pi / plain[1]) - 1) / (4 - 1);  // wavelength 19.9 between 8 and 32
  EXPECT_DOUBLE_EQ(f[1], (1 - smooth) * plain[1] / 8 + smooth * plain[1]);
  for (size_t i = 2; i < f.size(); ++i) EXPECT_DOUBLE_EQ(f[i], plain[i] / 8) << i;
  const std::vector<double> linear = rotary_frequencies(16, 10000, {.kind = RopeScalingKind::linear, .factor = 4});
  for (size_t i = 0; i < f.size(); ++i) EXPECT_DOUBLE_EQ(linear[i], plain[i] / 4) << i;
  EXPECT_ERROR(rotary_frequencies(16, 10000, {.kind = RopeScalingKind::llama3, .factor = 8}),
               "llama3 rope scaling needs original_max_position_embeddings > 0");
  io::FolderModel g = io::family_of_folder(llama_fixture("gemma3_linear")).folder->read(llama_fixture("gemma3_linear"));
  auto gemma = io::build_folder_model(std::move(g), "gemma3_linear");
  const nn::DecoderConfig& c = dynamic_cast<nn::DecoderModel&>(*gemma).config();
  EXPECT_EQ(c.attention_sizes(0).rotary.scaling.kind, RopeScalingKind::none);  // local: rope_local_base_freq alone
  EXPECT_EQ(c.attention_sizes(1).rotary.scaling, (RopeScaling{.kind = RopeScalingKind::linear, .factor = 4}));
}

// A scaled model decodes with its cache as its full forward does, exports its rope_scaling to config.json and reads
// back bit for bit; scalings headlab does not compute, and llama3's without its keys, are refused by name.
TEST(RopeScaling, CachedDecodingExportAndRefusals) {
  for (const std::string v : {"llama3_scaled", "gemma3_linear"}) {
    SCOPED_TRACE(v);
    const std::string folder = llama_fixture(v);
    auto model = io::build_folder_model(io::family_of_folder(folder).folder->read(folder), folder);
    auto& m = dynamic_cast<nn::DecoderModel&>(*model);
    const NoGradGuard no_grad;
    const Tensor idx = tokens(1, 16, 70, 3);
    const Tensor full = m.forward(idx);
    std::vector<nn::KVCache> caches(static_cast<size_t>(m.n_layers()));
    Tensor last = m.forward_cached(idx.narrow(1, 0, 4), caches);
    for (int64_t t = 4; t < 16; ++t) {
      last = m.forward_cached(idx.narrow(1, t, 1), caches);
      EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "position " << t;
    }
    TempDir dir("rope_export");
    io::family_named(m.config().family->arch(), "test").folder->write(dir.path("out"), m, {});
    std::ifstream cfg(dir.path("out") + "/config.json"), given_cfg(folder + "/config.json");
    const nlohmann::json j = nlohmann::json::parse(cfg), given = nlohmann::json::parse(given_cfg);
    EXPECT_EQ(j.at("rope_scaling"), given.at("rope_scaling"));
    auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
    EXPECT_EQ(dynamic_cast<nn::DecoderModel&>(*back).config().to_json(), m.config().to_json());
    EXPECT_EQ(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), full), 0.0);
  }
  TempDir dir("rope_bad");
  const std::string base = headlab::testing::slurp(llama_fixture("llama3_scaled") + "/config.json");
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    return headlab::testing::config_variant(dir, base, name, change);
  };
  const std::string longrope = with("longrope", [](auto& j) {
    j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {2.0}}};
  });
  const std::string no_low = with("no_low", [](auto& j) { j["rope_scaling"].erase("low_freq_factor"); });
  const std::string inverted = with("inverted", [](auto& j) { j["rope_scaling"]["high_freq_factor"] = 0.5; });
  const std::string zero = with("zero", [](auto& j) { j["rope_scaling"]["factor"] = 0; });
  EXPECT_ERROR(io::read_hf_llama_config(longrope), "longrope / su, yarn and dynamic are not computed");
  EXPECT_ERROR(io::read_hf_llama_config(no_low), "rope_scaling: 'low_freq_factor' is missing (rope_type llama3");
  EXPECT_ERROR(io::read_hf_llama_config(inverted), "high_freq_factor 0.5 must exceed low_freq_factor 1");
  EXPECT_ERROR(io::read_hf_llama_config(zero), "rope_scaling: factor must be positive, got 0");
}

// export writes the Hugging Face layout: a llama2.c model (interleaved pairs) exported and read back computes
// the same logits (its q and k rows permuted to halves).
TEST(LlamaFolders, ExportOfAnInterleavedModelReadsBackTheSame) {
  TempDir dir("llama_export");
  manual_seed(6);
  nn::DecoderModel m(small_config(2, true));
  m.eval();
  io::family_named("llama", "test").folder->write(dir.path("out"), m, {});
  auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
  const NoGradGuard no_grad;
  const Tensor idx = tokens(2, 11, 37, 4);
  EXPECT_LT(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), m.forward(idx)), 1e-5);
  EXPECT_FALSE(dynamic_cast<nn::DecoderModel&>(*back).config().rope_interleaved);
}

// Physical pruning of whole key/value groups: the pruned model (fewer W_query rows, the dropped groups' W_key
// and W_value rows gone, fewer out_proj columns) computes what the full model computes with those heads gated
// off, in either attention form; its config round-trips; export writes it at full width with zero rows, and
// the folder computes the same. A selection that splits a group is refused by name.
TEST(Llama, PruningWholeKeyValueGroupsEqualsGatingThemOff) {
  for (const auto form : {nn::AttentionForm::fused, nn::AttentionForm::wrapper})
    for (const int64_t kv : {2, 4}) {
      manual_seed(21);
      nn::DecoderConfig c = small_config(kv);
      c.attention = form;
      nn::DecoderModel m(c);
      m.eval();
      const std::vector<std::vector<int64_t>> keep{{2, 3}, {0, 1}};  // layer 0 keeps group 1, layer 1 group 0
      const auto [config, params] = analysis::prune_parameters(m.config_json(), m.named_parameters(), keep);
      const nn::DecoderConfig pc = nn::llama_family().config(config);
      EXPECT_EQ(pc.kept_heads, keep);
      nn::DecoderModel pruned(pc);
      pruned.load_parameters(params, "pruned");
      pruned.eval();
      EXPECT_EQ(pruned.attention(0).head_count(), 2);
      EXPECT_EQ(pruned.attention(1).kv_head_count(), kv / 2);
      EXPECT_EQ(pruned.original_head(0, 1), 3);
      // per layer: 2 heads' W_query rows and out_proj columns, kv / 2 key/value heads' W_key and W_value rows
      const double removed = 2 * (2 * 2 * 6 * 24 + 2 * (kv / 2) * 6 * 24);
      EXPECT_DOUBLE_EQ(m.num_parameters() - pruned.num_parameters(), removed);
      EXPECT_DOUBLE_EQ(pc.num_parameters(), pruned.num_parameters());
      const NoGradGuard no_grad;
      m.attention(0).control().gates = tensor(std::vector<double>{0, 0, 1, 1}, {4});
      m.attention(1).control().gates = tensor(std::vector<double>{1, 1, 0, 0}, {4});
      const Tensor idx = tokens(2, 9, 37, 5);
      const Tensor gated = m.forward(idx);
      EXPECT_LT(max_diff(pruned.forward(idx), gated), 1e-5) << "kv " << kv;
      TempDir dir("llama_pruned_export");
      io::family_named("llama", "test").folder->write(dir.path("out"), pruned, {});
      auto back = io::build_folder_model(io::family_of_folder(dir.path("out")).folder->read(dir.path("out")), "out");
      EXPECT_EQ(dynamic_cast<nn::DecoderModel&>(*back).attention(0).head_count(), 4) << "full width";
      EXPECT_LT(max_diff(dynamic_cast<nn::DecoderModel&>(*back).forward(idx), gated), 1e-5);
      if (kv == 2) {  // what ablate's pruning curve removes, rounded to whole groups for physical pruning
        EXPECT_EQ(analysis::whole_kv_groups(m, {{1}, {0, 3}}),
                  (std::vector<std::vector<int64_t>>{{0, 1}, {0, 1, 2, 3}}));
        EXPECT_ERROR(analysis::prune_parameters(m.config_json(), m.named_parameters(), {{1, 2}, {0, 1}}),
                          "whole groups");
        nlohmann::json split = config;
        split["kept_heads"] = {{0, 2}, {0, 1}};
        EXPECT_ERROR(nn::llama_family().config(split),
                          "kept_heads of layer 0 keeps head 0 but not all of its key/value group 0 (heads 0-1)");
      }
    }
}

TEST(LlamaFolders, WhatLlamaModelDoesNotComputeIsRefusedByName) {
  TempDir dir("llama_bad");
  const std::string base = headlab::testing::slurp(llama_fixture("gqa_tied/config.json"));
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = nlohmann::json::parse(base);
    change(j);
    fs::create_directories(dir.path(name));
    std::ofstream(dir.path(name) + "/config.json") << j.dump();
    return dir.path(name);
  };
  const std::string scaling = with("scaling", [](auto& j) { j["rope_scaling"] = {{"type", "linear"}}; });
  const std::string kv = with("kv", [](auto& j) { j["num_key_value_heads"] = 3; });
  const std::string act = with("act", [](auto& j) { j["hidden_act"] = "gelu"; });
  const std::string window = with("window", [](auto& j) {
    j["model_type"] = "mistral";
    j["sliding_window"] = 4;
  });
  const std::string falcon = with("type", [](auto& j) { j["model_type"] = "falcon"; });
  EXPECT_ERROR(io::read_hf_llama_config(scaling), "rope_scaling");
  EXPECT_ERROR(io::read_hf_llama_config(kv), "num_key_value_heads 3 does not divide num_attention_heads 4");
  EXPECT_ERROR(io::read_hf_llama_config(act), "hidden_act 'gelu'");
  EXPECT_EQ(io::read_hf_llama_config(window).sliding_window, 4);  // a window shorter than the context: computed
  EXPECT_ERROR(io::family_of_folder(falcon),
               "model_type 'falcon' is not one headlab reads (gpt2, llama, mistral, qwen2, phi3, qwen3, olmo2, gemma, "
               "gemma2, gemma3_text, gpt_neox, gpt_neo, bert)");
  // head_dim that disagrees with the tensors: the file and tensor named.
  const std::string hd = with("head_dim", [](auto& j) { j["head_dim"] = 16; });
  fs::copy_file(llama_fixture("gqa_tied/model.safetensors"), hd + "/model.safetensors");
  EXPECT_ERROR(io::family_of_folder(hd).folder->read(hd), "has shape");
}

// ---- tokenizers against python3-sentencepiece (tools/sentencepiece_fixtures.py) ----
namespace {

const std::string kModels = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/";

nlohmann::json sentencepiece_cases() {
  std::ifstream in(std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/sentencepiece_cases.json");
  return nlohmann::json::parse(in);
}

}  // namespace

// libsentencepiece through the wrapper gives the reference's ids and text; llama2.c's tokenizer.bin of the same
// vocabulary gives the same ids, except where SentencePiece's model normalises whitespace (tok512 collapses runs
// of spaces; llama2.c's encoder does not; Llama 2's keeps them, and there every case agrees).
TEST(Tokenizers, SentencePieceAndLlama2cMatchPythonSentencePiece) {
  if (!fs::exists(kModels + "llama2-tokenizer/tokenizer.model")) GTEST_SKIP() << kModels << " is absent";
  const nlohmann::json all = sentencepiece_cases();
  const std::pair<const char*, const char*> bins[] = {{"llama2", "llama2-tokenizer/tokenizer.bin"},
                                                      {"tok512", "stories260K/tok512.bin"}};
  for (const auto& [name, bin] : bins) {
    const nlohmann::json& m = all.at(name);
    const auto sp = tasks::tokenizer_from_file(kModels + m.at("model").get<std::string>(), m.at("size"));
    const auto l2c = tasks::tokenizer_from_file(kModels + bin, m.at("size"));
    ASSERT_TRUE(dynamic_cast<const tasks::SentencePieceTokenizer*>(sp.get())) << name;
    ASSERT_TRUE(dynamic_cast<const tasks::Llama2cTokenizer*>(l2c.get())) << name;
    EXPECT_EQ(sp->bos(), m.at("bos").get<int64_t>());
    EXPECT_EQ(sp->eos(), m.at("eos").get<int64_t>());
    for (const auto& c : m.at("cases")) {
      const std::string text = c.at("text");
      const auto ids = c.at("ids").get<std::vector<int64_t>>();
      EXPECT_EQ(sp->encode(text), ids) << name << ": " << text;
      EXPECT_EQ(sp->decode(ids), c.at("decoded").get<std::string>()) << name << ": " << text;
      const bool normalised = std::string(name) == "tok512" &&
                              (text.find("  ") != std::string::npos || (!text.empty() && std::isspace(text[0])));
      if (!normalised) {
        EXPECT_EQ(l2c->encode(text), ids) << name << " (llama2.c): " << text;
        std::vector<int64_t> with_bos = ids;
        with_bos.insert(with_bos.begin(), 1);
        EXPECT_EQ(l2c->decode(with_bos), text) << name << " (llama2.c): " << text;
      }
    }
    // An answer token after a prompt: " the" is one piece, without the dummy space before it.
    const std::vector<int64_t> the = sp->encode_continuation(" the");
    EXPECT_EQ(the.size(), 1u) << name;
    EXPECT_EQ(l2c->encode_continuation(" the"), the) << name;
    EXPECT_EQ(sp->token_text(the[0]), " the");
  }
  EXPECT_ERROR(tasks::SentencePieceTokenizer::from_file(kModels + "stories260K/tok512.bin"),
                    "not a SentencePiece model");
  EXPECT_ERROR(tasks::tokenizer_from_file(kModels + "llama2-tokenizer/tokenizer.model", 512),
                    "32000 tokens, but the model emits 512");
}

// ---- stories260K: a real pretrained model ----
TEST(Stories260K, GreedyStoryEqualsThePublishedOneTokenForToken) {
  if (!fs::exists(kStories + "/stories260K.bin")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  const std::string story = published_story();
  ASSERT_FALSE(story.empty());
  const loader::Loaded l = loader::load("test", kStories + "/stories260K.bin", "cpu", "", kStories + "/tok512.bin");
  nn::DecoderModel& model = l.decoder("test");
  const tasks::Prompt p = l.task->encode_prompt("");
  ASSERT_EQ(p.ids, std::vector<int64_t>({1}));  // BOS alone, as llama2.c's run starts that story
  nn::GenerateOptions o;
  // `run stories260K.bin -t 0.0` takes its default 256 steps, each (positions 0..255) sampling the next token:
  // 256 tokens after BOS. (255 stop one token short, before the story's last full stop.)
  o.max_new_tokens = 256;
  o.temperature = 0;
  o.end_id = l.task->end_id();
  const std::vector<int64_t> out = nn::generate(model, p.ids, o);
  const std::string text = l.task->format_continuation(p, out);
  EXPECT_EQ(text, story);
  // The same vocabulary as a SentencePiece model decodes the same ids to the same story.
  const loader::Loaded sp = loader::load("test", kStories + "/stories260K.bin", "cpu", "", kStories + "/tok512.model");
  EXPECT_EQ(sp.task->format_continuation(p, out), story);
  // The tokenizer gives back what it read: the story's ids decode to the story.
  const auto& tok = *l.subword();
  std::vector<int64_t> ids = tok.encode(story);
  ids.insert(ids.begin(), 1);
  EXPECT_EQ(tok.decode(ids), story);
}

// With its linear weights stored in bfloat16 (headlab generate --dtype bfloat16) the real model still writes the
// published story, all 256 tokens, and its logits over the story move by at most 5% of their spread.
TEST(Stories260K, Bfloat16WeightsWriteThePublishedStory) {
  if (!fs::exists(kStories + "/stories260K.bin")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  const headlab::testing::StoredWeightsRun r = headlab::testing::stories260k_with_stored_weights(
      [](nn::DecoderModel& model) { return nn::to_bfloat16_weights(model); });
  EXPECT_GT(r.saved, 0);
  EXPECT_EQ(r.text_after, published_story());
  const double diff = amax(abs(sub(r.logits_after, r.logits_before))).item<float>(),
               spread = std::sqrt(var(r.logits_before).item<float>());
  std::printf(
      "stories260K, bfloat16 weights: largest logit difference %.3g over %lld positions (logits' standard "
      "deviation %.3g)\n",
      diff, static_cast<long long>(r.logits_before.size(1)), spread);
  EXPECT_LT(diff, 0.05 * spread);
}

// The real grouped-query model's circuits: heads --by kv-group patches each group's shared keys and values (8
// query heads over 4 groups in each of 5 layers) and circuit builds its graph with the groups as receivers.
TEST(Stories260K, HeadsByKeyValueGroupAndCircuitRunOnTheRealModel) {
  if (!fs::exists(kStories + "/stories260K.bin")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  const TempDir dir("stories_kv");
  {
    std::ofstream pairs(dir.path("pairs.jsonl"));
    pairs
        << R"({"clean": "Tim and Lily went to the park. Lily gave the ball to", "corrupt": "Tim and Lily went to the park. Tim gave the ball to", "answer": " Tim", "wrong": " Lily"})"
        << "\n"
        << R"({"clean": "Lily and Tim went to the park. Tim gave the ball to", "corrupt": "Lily and Tim went to the park. Lily gave the ball to", "answer": " Lily", "wrong": " Tim"})"
        << "\n";
  }
  const std::string bin = std::string(HEADLAB_BINARY_DIR) + "/headlab", model = kStories + "/stories260K.bin",
                    tok = kStories + "/tok512.bin";
  const headlab::testing::ProcessResult heads =
      headlab::testing::run_process({bin, "heads", model, "--tokenizer", tok, "--pairs", dir.path("pairs.jsonl"),
                                     "--by", "kv-group", "--out", dir.path("heads")},
                                    dir.dir());
  ASSERT_EQ(heads.code, 0) << heads.err;
  const std::string csv = headlab::testing::slurp(dir.path("heads/kv_groups.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 5 * 4) << csv;
  EXPECT_NE(csv.find("L4G1,L4H2 L4H3,"), std::string::npos) << csv;
  const headlab::testing::ProcessResult circuit = headlab::testing::run_process(
      {bin, "circuit", model, "--tokenizer", tok, "--pairs", dir.path("pairs.jsonl"), "--out", dir.path("circuit")},
      dir.dir());
  ASSERT_EQ(circuit.code, 0) << circuit.err;
  EXPECT_NE(headlab::testing::slurp(dir.path("circuit/edges.csv")).find("G0.k"), std::string::npos);
  // The attention page says which key/value group each head reads.
  const headlab::testing::ProcessResult att =
      headlab::testing::run_process({bin, "attention", model, "--tokenizer", tok, "--prompt",
                                     "Tim and Lily went to the", "--max-new-tokens", "0", "--out", dir.path("att")},
                                    dir.dir());
  ASSERT_EQ(att.code, 0) << att.err;
  std::string html;
  for (const auto& e : fs::directory_iterator(dir.path("att")))
    if (e.path().extension() == ".html") html += headlab::testing::slurp(e.path().string());
  EXPECT_NE(html.find("\"kv_heads\":4"), std::string::npos);
  // Without prompt pairs there is nothing to patch from: said so.
  const headlab::testing::ProcessResult no_pairs = headlab::testing::run_process(
      {bin, "heads", model, "--tokenizer", tok, "--by", "kv-group", "--out", dir.path("h2")}, dir.dir());
  EXPECT_NE(no_pairs.code, 0);
  EXPECT_NE(no_pairs.err.find("--by kv-group patches keys and values on prompt pairs"), std::string::npos)
      << no_pairs.err;
}

// A pretrained model keeps its tokenizer wherever it goes: convert (the llama2.c file with either tokenizer file)
// stores the tokenizer's files in the checkpoint, export writes them beside the weights, train --init's checkpoints
// carry them, and each reads back to the same ids and the same greedy tokens.
TEST(Stories260K, ConvertExportAndInitCarryTheTokenizer) {
  if (!fs::exists(kStories + "/stories260K.bin")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  const TempDir dir("stories_carry");
  const std::string bin = std::string(HEADLAB_BINARY_DIR) + "/headlab", model = kStories + "/stories260K.bin";
  const std::string prompt = "Tim and Lily went to the park.";
  const auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv{bin};
    argv.insert(argv.end(), args.begin(), args.end());
    const headlab::testing::ProcessResult r = headlab::testing::run_process(argv, dir.dir());
    EXPECT_EQ(r.code, 0) << r.err;
    return r.out;
  };
  const std::string want =
      run({"generate", model, "--tokenizer", kStories + "/tok512.bin", "--prompt", prompt, "--max-new-tokens", "16"});
  for (const auto& [file, type] : {std::pair{"tok512.bin", "llama2c"}, std::pair{"tok512.model", "sentencepiece"}}) {
    SCOPED_TRACE(type);
    const std::string h5 = dir.path(std::string(type) + ".h5"), hf = dir.path(std::string(type) + "_hf");
    run({"convert", model, "--tokenizer", kStories + "/" + file, "--out", h5});
    const io::Checkpoint ck = io::load_checkpoint(h5);
    EXPECT_EQ(ck.tokenizer.type, type);
    EXPECT_EQ(ck.config["tokenizer"]["type"], type);
    const std::string stored = ck.tokenizer.files.at(0).second;
    EXPECT_EQ(stored, headlab::testing::slurp(kStories + "/" + file));
    EXPECT_EQ(run({"generate", h5, "--prompt", prompt, "--max-new-tokens", "16"}), want);
    EXPECT_EQ(run({"tokenize", h5, "--prompt", prompt}),
              run({"tokenize", model, "--tokenizer", kStories + "/" + file, "--prompt", prompt}));
    run({"export", h5, "--out", hf});
    EXPECT_EQ(headlab::testing::slurp(hf + "/" + ck.tokenizer.files.at(0).first), stored);
    EXPECT_EQ(run({"generate", hf, "--prompt", prompt, "--max-new-tokens", "16"}), want);
  }
  // Fine-tuning from the llama2.c file: its checkpoints hold the tokenizer and resume.
  {
    std::ofstream text(dir.path("story.txt"));
    for (int i = 0; i < 300; ++i) text << "Tim and Lily went to the park. They played with a red ball. ";
  }
  run({"train", "--init", model, "--tokenizer", kStories + "/tok512.model", "--text", dir.path("story.txt"), "--steps",
       "2", "--batch-size", "2", "--eval-every", "2", "--eval-batches", "1", "--threads", "1", "--out",
       dir.path("tuned")});
  EXPECT_EQ(io::load_checkpoint(dir.path("tuned/checkpoint.h5")).tokenizer.type, "sentencepiece");
  run({"train", "--resume", "--out", dir.path("tuned"), "--text", dir.path("story.txt"), "--steps", "3", "--threads",
       "1"});
  const headlab::testing::ProcessResult no_init = headlab::testing::run_process(
      {bin, "train", "--tokenizer", kStories + "/tok512.model", "--steps", "1"}, dir.dir());
  EXPECT_NE(no_init.err.find("--tokenizer is --init's model's tokenizer"), std::string::npos) << no_init.err;
}
