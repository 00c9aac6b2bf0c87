// GGUF files (io/gguf.h): every tensor type headlab reads against numpy's dequantization from ggml's block layouts;
// the llama, qwen2, gpt2 and gptneox models of the Hugging Face folder fixtures, converted as llama.cpp's converter
// lays them out (tools/fixtures_gguf.py), against PyTorch's logits and the folders' own models; the tokenizers the
// metadata carries; hostile files (cut short anywhere, lying counts and lengths, bad offsets, unknown types,
// version 1, repeated keys and names): each an error naming the file and the field, nothing huge allocated; and
// stories260K.gguf (../shared/models), whose greedy story and logits must equal its llama2.c checkpoint's.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "backends/quant_blocks.h"
#include "base/input_path.h"
#include "io/gguf.h"
#include "io/gguf_quants.h"
#include "loader/load.h"
#include "nn/generate.h"
#include "nn/layers.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "tests/shared_models.h"

using namespace headlab;
using headlab::testing::published_story;
using headlab::testing::TempDir;

namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/";
const std::string kStories = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/stories260K";

std::string gguf_fixture(const std::string& name) { return kFixtures + "gguf/" + name; }

double max_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

std::string write_bytes(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path(name);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// A GGUF file's bytes, field by field: the hostile cases below write exactly the lie they test.
struct Bytes {
  std::string b;
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& raw(const void* p, size_t n) {
    b.append(static_cast<const char*>(p), n);
    return *this;
  }
  Bytes& pad(size_t to) {
    b.resize((b.size() + to - 1) / to * to, '\0');
    return *this;
  }
};

// "GGUF", version 3, the counts.
Bytes header(uint64_t tensors, uint64_t kv) {
  Bytes h;
  h.raw("GGUF", 4).u32(3).u64(tensors).u64(kv);
  return h;
}

// A tensor info: name, n_dims, ne, type, offset.
Bytes& tensor_info(Bytes& b, const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
  b.str(name).u32(static_cast<uint32_t>(ne.size()));
  for (const uint64_t n : ne) b.u64(n);
  return b.u32(type).u64(offset);
}

}  // namespace

// ---- tensor types ----

TEST(GgufTypes, EveryTypeWidensToNumpysDequantizationBitForBit) {
  const io::GgufFile f(gguf_fixture("types.gguf"));
  EXPECT_EQ(f.version(), 3u);
  for (const char* name : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}) {
    const io::GgufTensorInfo* t = f.tensor(name);
    ASSERT_TRUE(t) << name;
    const Tensor got = f.to_float(name), want = f.to_float(std::string("expected.") + name);
    ASSERT_EQ(got.shape(), want.shape()) << name;
    EXPECT_EQ(got.shape(), (Shape{static_cast<int64_t>(t->ne[1]), static_cast<int64_t>(t->ne[0])}));  // ne reversed
    EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), sizeof(float) * size_t(got.numel())), 0)
        << name << ": max diff " << max_diff(got, want);
    EXPECT_EQ(io::ggml_type_name(t->type), name == std::string("f32") ? "F32" : [&] {
      std::string up = name;
      for (char& c : up) c = static_cast<char>(std::toupper(c));
      return up;
    }());
  }
  // Blocks widen alone too, as a quantized kernel would call them: Q8_0's 34 bytes.
  std::vector<std::byte> block(34, std::byte{0});
  block[1] = std::byte{0x3c};  // d = 1.0 (fp16 0x3c00)
  block[2] = std::byte{0xfe};  // -2
  float out[32];
  quant::dequantize_q8_0(block.data(), out, 1);
  EXPECT_EQ(out[0], -2.0f);
  EXPECT_EQ(out[31], 0.0f);
}

// ---- models of the folder fixtures ----

struct ModelCase {
  std::string gguf, family, folder;
  std::string suffix;  // GPT-2's reference.json: one object, its keys "logits_tied", "greedy_tied"
};

void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.gguf; }

class GgufModels : public ::testing::TestWithParam<ModelCase> {};

// The GGUF model's logits equal PyTorch's (the folder fixture's float64 twin) to 1e-5 and the folder's model's to
// 1e-5; its greedy tokens are PyTorch's.
TEST_P(GgufModels, MatchPyTorchAndTheFolderModel) {
  const ModelCase& c = GetParam();
  const std::string folder = kFixtures + c.family + "/" + c.folder;
  io::SourceModel g = io::source_of(gguf_fixture(c.gguf), "test").read(gguf_fixture(c.gguf));
  EXPECT_TRUE(is_an_input(gguf_fixture(c.gguf)));  // the writers never replace it
  io::SourceModel hf = io::source_of(folder, "test").read(folder);
  nlohmann::json gc = g.pretrained.config, fc = hf.pretrained.config;
  EXPECT_EQ(gc.value("rope_interleaved", false), c.gguf == "llama.gguf") << gc.dump();
  for (const char* k : {"rope_interleaved", "context_length", "drop_rate"}) gc.erase(k), fc.erase(k);  // GGUF: no dropout
  EXPECT_EQ(gc, fc);
  auto gm = io::build_folder_model(std::move(g.pretrained), c.gguf);
  auto fm = io::build_folder_model(std::move(hf.pretrained), folder);
  std::ifstream in(kFixtures + c.family + "/reference.json");
  const nlohmann::json all = nlohmann::json::parse(in), ref = c.suffix.empty() ? all.at(c.folder) : all;
  const auto rows = ref["ids"].get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Tensor ids = tensor(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  const NoGradGuard no_grad;
  const Tensor logits = gm->as_decoder()->forward(ids);
  std::vector<double> want;
  for (const auto& row : ref["logits" + c.suffix].get<std::vector<std::vector<std::vector<double>>>>())
    for (const auto& t : row) want.insert(want.end(), t.begin(), t.end());
  EXPECT_LT(max_diff(logits, tensor(want, logits.shape())), 1e-5);
  EXPECT_LT(max_diff(logits, fm->as_decoder()->forward(ids)), 1e-5);
  const std::vector<int64_t> greedy = ref["greedy" + c.suffix].get<std::vector<int64_t>>();
  nn::GenerateOptions o;
  o.max_new_tokens = static_cast<int64_t>(greedy.size());
  EXPECT_EQ(nn::generate(*gm->as_decoder(), ref["prompt"].get<std::vector<int64_t>>(), o), greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModels,
                         ::testing::Values(ModelCase{"llama.gguf", "llama_folders", "gqa_tied", ""},
                                           ModelCase{"qwen2.gguf", "llama_folders", "qwen2_bias", ""},
                                           ModelCase{"qwen3.gguf", "llama_folders", "qwen3_untied_bf16", ""},
                                           ModelCase{"olmo2.gguf", "llama_folders", "olmo2_gqa", ""},
                                           ModelCase{"phi3.gguf", "llama_folders", "phi3_window_gqa", ""},
                                           ModelCase{"gemma.gguf", "llama_folders", "gemma_mqa", ""},
                                           ModelCase{"gemma2.gguf", "llama_folders", "gemma2_caps", ""},
                                           ModelCase{"gemma3.gguf", "llama_folders", "gemma3_linear", ""},
                                           ModelCase{"gpt2.gguf", "gpt2_folders", "lm_head_model", "_tied"},
                                           ModelCase{"gptneox.gguf", "neox_folders", "parallel_quarter", ""},
                                           ModelCase{"gptneox_sequential.gguf", "neox_folders", "sequential_full", ""}),
                         [](const auto& info) {
                           std::string n = info.param.gguf.substr(0, info.param.gguf.size() - 5);
                           return n;
                         });

// A Q8_0 file (tools/fixtures_gguf.py quantized llama.gguf as ggml's reference quantizer does): its matrices stay
// in their blocks, byte for byte those headlab's quantizer writes from the float file, so the two models' logits
// are the same; and near PyTorch's float32 ones (as near as 8 bits a weight leave a random model 32 wide).
TEST(GgufQuantized, Q8_0MatricesStayInTheirBlocks) {
  const std::string q8 = gguf_fixture("llama_q8_0.gguf"), f32 = gguf_fixture("llama.gguf");
  auto qm = io::build_folder_model(io::source_of(q8, "test").read(q8).pretrained, q8);
  auto fm = io::build_folder_model(io::source_of(f32, "test").read(f32).pretrained, f32);
  const NoGradGuard no_grad;
  std::ifstream in(kFixtures + "llama_folders/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in).at("gqa_tied");
  const auto rows = ref["ids"].get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const Tensor ids = tensor(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  const Tensor float_logits = fm->as_decoder()->forward(ids);
  nn::to_quantized_weights(*fm, DType::q8_0);
  int64_t blocks = 0;
  for (const auto& [name, t] : qm->named_parameters()) {
    const Tensor ours = fm->parameter(name);
    ASSERT_EQ(t.dtype(), ours.dtype()) << name;
    ASSERT_EQ(t.shape(), ours.shape()) << name;
    if (t.dtype() != DType::q8_0) continue;
    ++blocks;
    EXPECT_EQ(std::memcmp(t.raw_data(), ours.raw_data(), static_cast<size_t>(t.numel()) * 34), 0) << name;
  }
  EXPECT_EQ(blocks, 1 + 2 * 6);  // the tied table; each layer's q, k, v, o, gate and up (down is 56 wide)
  const Tensor logits = qm->as_decoder()->forward(ids);
  EXPECT_EQ(max_diff(logits, fm->as_decoder()->forward(ids)), 0.0);
  std::vector<double> want;
  for (const auto& row : ref["logits"].get<std::vector<std::vector<std::vector<double>>>>())
    for (const auto& t : row) want.insert(want.end(), t.begin(), t.end());
  const Tensor pytorch = tensor(want, logits.shape());
  const double to_pytorch = max_diff(logits, pytorch), spread = std::sqrt(var(pytorch).item<float>());
  std::printf(
      "llama_q8_0.gguf: largest logit difference from PyTorch's float32 %.3g (their standard deviation %.3g; the "
      "float32 file's: %.3g)\n",
      to_pytorch, spread, max_diff(float_logits, pytorch));
  EXPECT_LT(to_pytorch, 0.25 * spread);  // a random model 32 wide: 0.5% noise in each weight grows through 2 layers
}

TEST(GgufSource, IsClaimedByItsMagicAndSaysWhatItRead) {
  const std::string path = gguf_fixture("gpt2.gguf");
  const io::ModelSource& s = io::source_of(path, "test");
  EXPECT_EQ(s.name(), "GGUF file");
  EXPECT_EQ(s.tokenizer_option(), io::TokenizerOption::overrides);
  EXPECT_EQ(s.read_config(path), s.read(path).pretrained.config);
  const io::SourceModel m = s.read(path);
  EXPECT_NE(m.notes.find("F32 x "), std::string::npos) << m.notes;
  EXPECT_NE(m.notes.find("output.weight, equal to token_embd.weight: tied"), std::string::npos) << m.notes;
  EXPECT_NE(m.notes.find("none in the file"), std::string::npos) << m.notes;
  EXPECT_FALSE(m.embedded_tokenizer);
  EXPECT_TRUE(m.pretrained.config.value("tie_embeddings", false));
  // A model without a tokenizer loads with --tokenizer (overrides), as a folder does.
  EXPECT_ERROR(loader::load("test", path, "cpu", "", ""),
               "test: the GGUF file '" + path + "' has no tokenizer headlab reads");
}

// ---- tokenizers in the metadata ----

TEST(GgufTokenizer, Gpt2ByteLevelBpeFromTokensAndMerges) {
  const loader::Loaded l = loader::load("test", gguf_fixture("gpt2_tokenizer.gguf"), "cpu", "", "");
  const tasks::TextTokenizer& tok = *l.subword();
  EXPECT_EQ(tok.size(), 261);
  EXPECT_EQ(tok.encode(" the a"), (std::vector<int64_t>{258, 259}));  // Ġthe, Ġa
  EXPECT_EQ(tok.decode({258, 259}), " the a");
  EXPECT_EQ(tok.eos(), std::optional<int64_t>(260));  // <|endoftext|>
  const tasks::TokenizerFiles files = tok.files();
  EXPECT_EQ(files.type, "bpe");
  ASSERT_TRUE(files.find("merges.txt"));
  EXPECT_EQ(*files.find("merges.txt"), "#version: 0.2\nĠ t\nh e\nĠt he\nĠ a\n");
  EXPECT_EQ(l.ckpt.tokenizer.type, "bpe");  // what a checkpoint of it stores
}

TEST(GgufTokenizer, LlamaPiecesAsLlama2cTokenizer) {
  const loader::Loaded l = loader::load("test", gguf_fixture("llama_tokenizer.gguf"), "cpu", "", "");
  const tasks::TextTokenizer& tok = *l.subword();
  EXPECT_EQ(tok.size(), 264);
  EXPECT_EQ(tok.encode("the a"), (std::vector<int64_t>{262, 263}));  // ▁the, ▁a
  EXPECT_EQ(tok.bos(), std::optional<int64_t>(1));
  EXPECT_EQ(tok.decode({1, 262, 263}), "the a");
  EXPECT_EQ(tok.encode("\n"), (std::vector<int64_t>{259, 3 + '\n'}));  // ▁, then the byte fallback <0x0A>
  EXPECT_EQ(l.ckpt.tokenizer.type, "llama2c");
  // --tokenizer overrides the file's own (tok512.bin's first 264 tokens).
  if (fs::exists(kStories + "/tok512.bin")) {
    const loader::Loaded o = loader::load("test", gguf_fixture("llama_tokenizer.gguf"), "cpu", "", kStories + "/tok512.bin");
    ASSERT_TRUE(o.ckpt.tokenizer.find("tokenizer.bin"));
    EXPECT_TRUE(*o.ckpt.tokenizer.find("tokenizer.bin") == headlab::testing::slurp(kStories + "/tok512.bin"));
  }
}

// ---- hostile files ----

TEST(GgufHostile, LyingCountsAndLengthsFailFastNamingTheField) {
  TempDir dir("gguf_hostile");
  const uint64_t huge = uint64_t{1} << 60;
  const auto err = [&](const std::string& name, const Bytes& b) {
    const std::string path = write_bytes(dir, name, b.b);
    const std::string e = headlab::testing::error_of([&] { io::GgufFile f(path); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    return e;
  };
  EXPECT_NE(err("v1.gguf", Bytes().raw("GGUF", 4).u32(1).u32(0).u32(0)).find("GGUF version 1"), std::string::npos);
  Bytes v4 = header(0, 0);
  v4.b[4] = 4;
  EXPECT_NE(err("v4.gguf", v4).find("GGUF version 4 (headlab reads versions 2 and 3)"), std::string::npos);
  EXPECT_NE(err("big.gguf", Bytes().raw("GGUF", 4).raw("\0\0\0\3", 4).u64(0).u64(0)).find("a big-endian GGUF file"),
            std::string::npos);
  EXPECT_NE(err("magic.gguf", Bytes().raw("GGUX", 4).u32(3)).find("does not start with the magic"), std::string::npos);
  EXPECT_NE(err("tensors.gguf", header(huge, 0)).find("the tensor count 1152921504606846976 needs at least 24 bytes"),
            std::string::npos);
  EXPECT_NE(err("kv.gguf", header(0, huge)).find("the metadata count 1152921504606846976"), std::string::npos);
  EXPECT_NE(err("key.gguf", header(0, 1).u64(huge).u64(0)).find("metadata key 0: a string of 1152921504606846976 bytes"),
            std::string::npos);
  Bytes strings = header(0, 1);
  strings.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(huge);
  EXPECT_NE(err("array.gguf", strings).find("metadata 'tokenizer.ggml.tokens': the array's count 1152921504606846976"),
            std::string::npos);
  Bytes long_string = header(0, 1);
  long_string.str("general.name").u32(8).u64(huge);
  EXPECT_NE(err("string.gguf", long_string).find("metadata 'general.name': a string of 1152921504606846976 bytes"),
            std::string::npos);
  Bytes nested = header(0, 1);
  nested.str("a").u32(9).u32(9).u64(1);
  EXPECT_NE(err("nested.gguf", nested).find("an array of arrays"), std::string::npos);
  Bytes type = header(0, 1);
  type.str("a").u32(13).u64(0);
  EXPECT_NE(err("type.gguf", type).find("metadata 'a': value type 13 is not one of GGUF's"), std::string::npos);
  Bytes boolean = header(0, 1);
  boolean.str("a").u32(7).raw("\x02", 1);
  EXPECT_NE(err("bool.gguf", boolean).find("a BOOL of value 2"), std::string::npos);
  Bytes twice = header(0, 2);
  twice.str("a").u32(4).u32(1).str("a").u32(4).u32(2);
  EXPECT_NE(err("twice.gguf", twice).find("metadata 'a' appears twice"), std::string::npos);
  Bytes align = header(0, 1);
  align.str("general.alignment").u32(4).u32(24);
  EXPECT_NE(err("align.gguf", align).find("'general.alignment' = 24 (expected a power of two)"), std::string::npos);
}

TEST(GgufHostile, BadTensorInfosNameTheTensor) {
  TempDir dir("gguf_hostile_tensors");
  const auto err = [&](const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                       size_t data = 64, int tensors = 1) {
    Bytes b = header(static_cast<uint64_t>(tensors), 0);
    for (int i = 0; i < tensors; ++i) tensor_info(b, "blk.0.attn_q.weight", ne, type, offset);
    b.pad(32).b.append(data, '\0');
    const std::string path = write_bytes(dir, name, b.b);
    const std::string e = headlab::testing::error_of([&] { io::GgufFile f(path); });
    EXPECT_NE(e.find(path + ": tensor 'blk.0.attn_q.weight'"), std::string::npos) << e;
    return e;
  };
  EXPECT_NE(err("past.gguf", {1024}, 0, 0).find("offset 0 + 4096 bytes runs past the data's end (64 bytes of data"),
            std::string::npos);
  EXPECT_NE(err("far.gguf", {4}, 0, uint64_t{1} << 62).find("runs past the data's end"), std::string::npos);
  EXPECT_NE(err("misaligned.gguf", {4}, 0, 4).find("offset 4 is not a multiple of the alignment 32"),
            std::string::npos);
  EXPECT_NE(err("q3k.gguf", {256}, 11, 0).find("ggml type Q3_K, which headlab does not read"), std::string::npos);
  EXPECT_NE(err("type99.gguf", {4}, 99, 0).find("ggml type type 99"), std::string::npos);
  EXPECT_NE(err("rows.gguf", {100}, 12, 0).find("rows of 100 elements are not whole Q4_K blocks of 256"),
            std::string::npos);
  EXPECT_NE(err("dims.gguf", {1, 1, 1, 1, 1}, 0, 0).find("n_dims 5 (expected 1 to 4)"), std::string::npos);
  EXPECT_NE(err("huge.gguf", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0).find("too many elements"),
            std::string::npos);
  EXPECT_NE(err("zero_huge.gguf", {0, uint64_t{1} << 63}, 0, 0).find("too many elements"), std::string::npos);
  EXPECT_NE(err("twice.gguf", {4}, 0, 0, 64, 2).find("appears twice"), std::string::npos);
}

// Cut short anywhere (in the header, byte by byte; in the data, here and there): an error naming the file, never a
// crash or a read past the end.
TEST(GgufHostile, TruncatedAnywhereIsAnError) {
  TempDir dir("gguf_truncated");
  const std::string whole = headlab::testing::slurp(gguf_fixture("types.gguf"));
  ASSERT_GT(whole.size(), 4000u);
  int errors = 0;
  for (size_t n = 0; n + 1 < whole.size(); n += n < 1000 ? 1 : 97) {
    const std::string path = write_bytes(dir, "cut.gguf", whole.substr(0, n));
    const std::string e = headlab::testing::error_of([&] { io::GgufFile f(path); });
    EXPECT_NE(e.find(path), std::string::npos) << n << ": " << e;
    errors += e.find(path) != std::string::npos;
  }
  EXPECT_GT(errors, 1000);
  // As a model: not claimed without the magic, and a GGUF file with no architecture says so.
  EXPECT_FALSE(io::is_gguf_file(write_bytes(dir, "ggu.gguf", "GGU")));
  const std::string types = gguf_fixture("types.gguf");
  EXPECT_ERROR(io::read_gguf(types), "general.architecture 'none' is not one headlab reads");
}

// A llama's metadata without tensors, with `extra` pairs (n of them) after the sizes.
std::string llama_metadata(const TempDir& dir, const std::string& name, const Bytes& extra, int n,
                           bool block_count = true) {
  Bytes b = header(0, static_cast<uint64_t>(6 + n + (block_count ? 1 : 0)));
  b.str("general.architecture").u32(8).str("llama");
  for (const char* k : {"llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
                        "llama.attention.head_count", "llama.vocab_size"})
    b.str(k).u32(4).u32(std::string(k) == "llama.attention.head_count" ? 2 : 16);
  if (block_count) b.str("llama.block_count").u32(4).u32(1);
  b.b += extra.b;
  return write_bytes(dir, name, b.b);
}

// Bytes of the header changed at random (a fixed seed): each file reads, or fails with headlab::Error (the fuzz
// target, tests/fuzz/fuzz_gguf.cpp, does this at length under libFuzzer).
TEST(GgufHostile, RandomlyChangedHeadersReadOrFailCleanly) {
  TempDir dir("gguf_mutated");
  for (const char* name : {"llama_tokenizer.gguf", "types.gguf"}) {
    const std::string whole = headlab::testing::slurp(gguf_fixture(name));
    const size_t header_bytes = std::min<size_t>(whole.size(), 4096);
    uint64_t state = 12345;
    const auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull, state >> 33; };
    for (int i = 0; i < 300; ++i) {
      std::string b = whole;
      for (int k = 0; k < 1 + static_cast<int>(next() % 4); ++k) b[next() % header_bytes] = static_cast<char>(next());
      const std::string path = write_bytes(dir, "mutated.gguf", b);
      try {
        const io::GgufFile f(path);
        for (const io::GgufTensorInfo& t : f.tensors()) f.to_float(t.name);
        io::read_gguf(path);
      } catch (const Error&) {
      }
    }
  }
}

TEST(GgufHostile, MetadataTheConfigCannotHonourIsRefusedByName) {
  TempDir dir("gguf_metadata");
  const auto read = [&](const std::string& name, const Bytes& extra, int n, bool block_count = true) {
    return headlab::testing::error_of([&] { io::read_gguf(llama_metadata(dir, name, extra, n, block_count)); });
  };
  Bytes eps;
  eps.str("llama.attention.layer_norm_rms_epsilon").u32(6);
  const float e = 1e-5f;
  eps.raw(&e, 4);
  // The sizes alone make a config: what fails next is the first tensor.
  EXPECT_NE(read("plain.gguf", eps, 1).find("no tensor 'token_embd.weight' (a llama model has it)"), std::string::npos);
  Bytes none = eps;
  none.str("llama.rope.scaling.type").u32(8).str("none");
  EXPECT_NE(read("none.gguf", none, 2).find("no tensor 'token_embd.weight'"), std::string::npos);
  Bytes linear = eps;  // linear scaling without its factor
  linear.str("llama.rope.scaling.type").u32(8).str("linear");
  EXPECT_NE(read("linear.gguf", linear, 2)
                .find("metadata 'llama.rope.scaling.factor' must be positive with "
                      "rope.scaling.type linear, got 0"),
            std::string::npos);
  Bytes yarn = eps;
  yarn.str("llama.rope.scaling.type").u32(8).str("yarn");
  EXPECT_NE(read("yarn.gguf", yarn, 2).find("metadata 'llama.rope.scaling.type' = \"yarn\" is not supported"),
            std::string::npos);
  Bytes softcap = eps;  // a key another architecture reads (Gemma 2's) is refused on a llama
  softcap.str("llama.final_logit_softcapping").u32(6).raw(&e, 4);
  EXPECT_NE(read("softcap.gguf", softcap, 2).find("metadata 'llama.final_logit_softcapping' = "), std::string::npos);
  Bytes window = eps;
  window.str("llama.attention.sliding_window").u32(4).u32(4096);
  EXPECT_NE(read("window.gguf", window, 2).find("metadata 'llama.attention.sliding_window' = 4096 is not supported"),
            std::string::npos);
  Bytes partial = eps;
  partial.str("llama.rope.dimension_count").u32(4).u32(4);
  EXPECT_NE(read("partial.gguf", partial, 2).find("rope.dimension_count 4 of head size 8: the llama family rotates"),
            std::string::npos);
  Bytes real_layers;
  real_layers.str("llama.block_count").u32(6).raw(&e, 4);
  EXPECT_NE(read("real.gguf", real_layers, 1, false).find("metadata 'llama.block_count' is a FLOAT32 (expected an "
                                                          "integer)"),
            std::string::npos);
  EXPECT_NE(read("missing.gguf", eps, 1, false).find("metadata 'llama.block_count' is missing (a llama model needs "
                                                     "it)"),
            std::string::npos);
  Bytes mamba = header(0, 1);
  mamba.str("general.architecture").u32(8).str("mamba");
  EXPECT_ERROR(io::read_gguf(write_bytes(dir, "mamba.gguf", mamba.b)),
               "general.architecture 'mamba' is not one headlab reads (llama, qwen2, phi3: the llama family; qwen3");
}

// ---- stories260K: the real model, as llama.cpp's converter wrote it ----

TEST(Stories260KGguf, WritesThePublishedStoryWithItsOwnTokenizer) {
  if (!fs::exists(kStories + "/stories260K.gguf")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  const loader::Loaded l = loader::load("test", kStories + "/stories260K.gguf", "cpu", "", "");
  const tasks::Prompt p = l.task->encode_prompt("");
  ASSERT_EQ(p.ids, std::vector<int64_t>({1}));
  nn::GenerateOptions o;
  o.max_new_tokens = 256;  // as tests/test_llama.cpp: run's 256 steps after BOS
  o.temperature = 0;
  o.end_id = l.task->end_id();
  const std::vector<int64_t> out = nn::generate(l.decoder("test"), p.ids, o);
  EXPECT_EQ(l.task->format_continuation(p, out), published_story());
  // The tokenizer it carries is tok512.bin, byte for byte: checkpoints and export carry it.
  ASSERT_TRUE(l.ckpt.tokenizer.find("tokenizer.bin"));
  EXPECT_TRUE(*l.ckpt.tokenizer.find("tokenizer.bin") == headlab::testing::slurp(kStories + "/tok512.bin"));
}

TEST(Stories260KGguf, LogitsEqualTheLlama2cCheckpoints) {
  if (!fs::exists(kStories + "/stories260K.gguf")) GTEST_SKIP() << kStories << " is absent (../shared/models)";
  const loader::Loaded g = loader::load("test", kStories + "/stories260K.gguf", "cpu", "", "");
  const loader::Loaded b = loader::load("test", kStories + "/stories260K.bin", "cpu", "", kStories + "/tok512.bin");
  // The same config but for the context the metadata says (2048; the .bin's header 512).
  nlohmann::json gc = g.config.model, bc = b.config.model;
  EXPECT_EQ(gc.at("context_length"), 2048);
  gc.erase("context_length"), bc.erase("context_length");
  EXPECT_EQ(gc, bc);
  const tasks::Prompt p = g.task->encode_prompt("Once upon a time, there was a little girl named Lily.");
  EXPECT_EQ(p.ids, b.task->encode_prompt("Once upon a time, there was a little girl named Lily.").ids);
  const Tensor ids = tensor(p.ids, {1, static_cast<int64_t>(p.ids.size())});
  const NoGradGuard no_grad;
  const double diff = max_diff(g.decoder("test").forward(ids), b.decoder("test").forward(ids));
  EXPECT_LE(diff, 1e-6);
  std::cout << "stories260K.gguf vs .bin: max logit diff " << diff << " over " << p.ids.size() << " tokens\n";
  for (const auto& [name_, t] : g.ckpt.model) {  // every weight bit for bit, as the folder's README says
    const std::string& name = name_;  // clang 14 cannot capture a structured binding
    const auto it = std::find_if(b.ckpt.model.begin(), b.ckpt.model.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, b.ckpt.model.end()) << name;
    EXPECT_EQ(max_diff(t, it->second), 0.0) << name;
  }
}
