// PyTorch files (io/torch_file.h, io/torch_layouts.h) against tests/fixtures/torch_files, written by Debian's torch
// (tools/fixtures_torch_files.py): every storage dtype, views sharing a storage, big-endian archives, nested
// checkpoints with optimizer state and objects that must be skipped; GPT-2's folder as pytorch_model.bin (one file
// and shards) and nanoGPT's ckpt.pt (with and without biases) giving the GPT-2 twin's logits; hostile files refused
// naming the global or field, never run; and the real checkpoints of Nanda et al. in ../shared/models/grokking.
#include "io/torch_file.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "io/sources.h"
#include "io/weight_files.h"
#include "loader/load.h"
#include "nn/generate.h"
#include "ops/ops.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::TempDir;

namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/torch_files/" + name;
}
const std::string kGrokking = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/grokking/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

// Every tensor of a state_dict equals its float32 twin in a safetensors file, bit for bit.
void expect_equal_to(const io::TorchFile& file, const io::TorchStateDict& sd, const std::string& twin) {
  const io::SafetensorsModel st = io::SafetensorsModel::open(twin);
  ASSERT_EQ(sd.tensors.size(), st.names().size());
  for (const auto& [name, i] : sd.tensors) {
    const Tensor got = file.to_float(i, name), want = st.to_float(name);
    EXPECT_EQ(got.shape(), want.shape()) << name;
    EXPECT_EQ(values(got), values(want)) << name;
  }
}

double max_abs_diff(const Tensor& a, const std::vector<float>& b) {
  const std::vector<float> av = values(a);
  EXPECT_EQ(av.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(av.size(), b.size()); ++i) m = std::max(m, double(std::abs(av[i] - b[i])));
  return m;
}

std::vector<float> flat_floats(const nlohmann::json& j) {
  std::vector<float> out;
  for (const auto& a : j)
    for (const auto& b : a)
      for (const auto& v : b) out.push_back(v.get<float>());
  return out;
}

Tensor logits_of(const loader::Loaded& l, const nlohmann::json& ids_json) {
  const auto ids = ids_json.get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
  const NoGradGuard no_grad;
  return l.decoder("test").forward(tensor(flat, {int64_t(ids.size()), int64_t(ids[0].size())}));
}

nlohmann::json gpt2_reference() {
  return read_json(std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/gpt2_folders/reference.json");
}

}  // namespace

// ---- the pickle's values ----

TEST(TorchFile, EveryStorageDtypeAndViewIsRebuilt) {
  const io::TorchFile f(fixture("values.pt"));
  const io::TorchStateDict sd = io::find_state_dict(f);
  EXPECT_EQ(sd.key, "");
  expect_equal_to(f, sd, fixture("values.safetensors"));
  // The views share base's storage at their offsets and strides, as torch laid them out.
  std::map<std::string, io::TorchTensor> by_name;
  for (const auto& [name, i] : sd.tensors) by_name[name] = f.tensors()[static_cast<size_t>(i)];
  EXPECT_EQ(by_name["slice"].storage, by_name["base"].storage);
  EXPECT_EQ(by_name["slice"].offset, 16);
  EXPECT_EQ(by_name["transposed"].stride, (std::vector<int64_t>{1, 8}));
  EXPECT_EQ(by_name["column"].offset, 3);
  EXPECT_EQ(by_name["bf16"].dtype, "bfloat16");
  EXPECT_EQ(by_name["scalar"].shape, Shape{});
  EXPECT_EQ(by_name["empty"].shape, (Shape{0, 3}));
}

TEST(TorchFile, BigEndianArchivesAreReadInTheirOrder) {
  const io::TorchFile f(fixture("big_endian.pt"));
  expect_equal_to(f, io::find_state_dict(f), fixture("values.safetensors"));
}

TEST(TorchFile, NestedCheckpointsGiveTheirStateDictAndSkipWhatTheyDoNotBuild) {
  const io::TorchFile f(fixture("nested.pt"));
  const io::TorchStateDict sd = io::find_state_dict(f);
  EXPECT_EQ(sd.key, "model");
  expect_equal_to(f, sd, fixture("nested.safetensors"));
  const nlohmann::ordered_json& v = f.value();
  EXPECT_EQ(v.at("args"), (nlohmann::ordered_json{{"__object__", "argparse.Namespace"}}));  // kept as a name
  EXPECT_EQ(v.at("epoch"), 7);
  EXPECT_EQ(v.at("losses"), (nlohmann::ordered_json{1.5, 0.25}));
  EXPECT_EQ(v.at("config").at("fn_name"), "add");
  // The optimizer's state: plain dicts of tensors and numbers, keyed by parameter index.
  const auto& state = v.at("optimizer").at("state");
  EXPECT_GE(io::torch_tensor_index(state.at("0").at("exp_avg")), 0);
  EXPECT_EQ(v.at("optimizer").at("param_groups").at(0).at("lr"), 0.01);
  EXPECT_EQ(v.at("scheduler").at("step_size"), 10);
}

// ---- hostile files ----

TEST(TorchFile, HostileFilesAreRefusedByNameAndNothingRuns) {
  const std::string marker = "/tmp/headlab_pwned";  // what the evil pickles' commands would touch
  EXPECT_ERROR(io::find_state_dict(io::TorchFile(fixture("evil_os_system.pt"))),
               "saves an object of posix.system, which headlab does not build");  // os.system, as pickle names it
  EXPECT_ERROR(io::find_state_dict(io::TorchFile(fixture("evil_eval_entry.pt"))),
               "an object of builtins.eval, which headlab does not build");
  EXPECT_FALSE(fs::exists(marker));
  EXPECT_ERROR(io::TorchFile(fixture("lying_storage.pt")), "archive/data/0 holds 16 bytes, but its 1000000000000");
  EXPECT_ERROR(io::TorchFile(fixture("past_storage.pt")), "runs past its storage '0' of 16 elements");
  EXPECT_ERROR(io::TorchFile(fixture("legacy.pt")), "PyTorch's legacy format (torch.save before PyTorch 1.6");
  EXPECT_ERROR(io::TorchFile(fixture("torchscript.pt")), "a TorchScript archive (torch.jit.save)");
  // Cut short anywhere: an error naming the file, never a crash.
  TempDir dir("torch_cut");
  std::ifstream in(fixture("values.pt"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const size_t keep : {size_t{4}, size_t{100}, bytes.size() / 2, bytes.size() - 30}) {
    const std::string cut = dir.path("cut.pt");
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, keep);
    EXPECT_ERROR(io::TorchFile f(cut); for (int64_t i = 0; i < int64_t(f.tensors().size()); ++i) f.to_float(i, "t"),
                 cut);
  }
}

// ---- layouts ----

TEST(TorchFile, HuggingFaceFoldersOfBinFilesGiveTheirModel) {
  const nlohmann::json ref = gpt2_reference();
  for (const char* folder : {"gpt2_bin", "gpt2_bin_sharded"}) {
    const std::string path = fixture(folder);
    io::SourceModel m = io::source_of(path, "test").read(path);
    const auto model = io::build_folder_model(std::move(m.pretrained), path);
    const NoGradGuard no_grad;
    const auto ids = ref["ids"].get<std::vector<std::vector<int64_t>>>();
    std::vector<int64_t> flat;
    for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
    const Tensor logits = model->as_decoder()->forward(tensor(flat, {int64_t(ids.size()), int64_t(ids[0].size())}));
    EXPECT_LT(max_abs_diff(logits, flat_floats(ref["logits_tied"])), 1e-5) << folder;
  }
}

TEST(TorchFile, NanoGptCheckpointsGiveTheirModel) {
  const nlohmann::json ref = gpt2_reference();
  const loader::Loaded l = loader::load("test", fixture("nanogpt/ckpt.pt"), "cpu", "", "");
  EXPECT_EQ(io::source_of(fixture("nanogpt/ckpt.pt"), "test").name(), "PyTorch file");
  EXPECT_LT(max_abs_diff(logits_of(l, ref["ids"]), flat_floats(ref["logits_tied"])), 1e-5);
  const loader::Loaded nobias = loader::load("test", fixture("nanogpt_nobias/ckpt.pt"), "cpu", "", "");
  const nlohmann::json zero = read_json(fixture("nanogpt_nobias.json"));
  EXPECT_LT(max_abs_diff(logits_of(nobias, zero["ids"]), flat_floats(zero["logits"])), 1e-5);
  // No tokenizer in the file: tokens are numbers.
  EXPECT_EQ(l.subword()->decode({5, 17}), "5 17");
}

// ---- the real checkpoints of Nanda et al. 2023 ----

TEST(TorchFile, TheGrokkingCheckpointsAreReadWithEverythingBesideTheModel) {
  if (!fs::exists(kGrokking)) GTEST_SKIP() << kGrokking << " is absent (../shared/models)";
  const io::TorchFile f(kGrokking + "wd_10-1_mod_addition_loss_curve.pth");
  const io::TorchStateDict sd = io::find_state_dict(f);
  EXPECT_EQ(sd.key, "model");
  EXPECT_EQ(sd.tensors.size(), 12u);
  const nlohmann::ordered_json& v = f.value();
  EXPECT_EQ(v.at("config").at("p"), 113);
  EXPECT_EQ(v.at("epoch"), 107790);
  // Its stored losses, float64 0-dim tensors.
  EXPECT_NEAR(f.to_float(io::torch_tensor_index(v.at("train_loss")), "train_loss").item<float>(), 9.2025e-09, 1e-12);
  EXPECT_NEAR(f.to_float(io::torch_tensor_index(v.at("test_loss")), "test_loss").item<float>(), 4.9915e-07, 1e-10);
  EXPECT_EQ(v.at("train_losses").size(), 107791u);  // every epoch
  EXPECT_EQ(v.at("test_losses").size(), 10780u);    // every tenth
  for (const char* name : {"5_digit_addition_infinite.pth", "induction_head_infinite.pth"}) {
    const io::TorchFile g(kGrokking + name);
    EXPECT_EQ(io::find_state_dict(g).key, "model") << name;
  }
}

// The paper's modular-addition model, through the command line's loader: right on all 12,769 pairs, its loss
// over them near the stored train and test losses (9.2e-09 and 5.0e-07: the pairs' mean lies between).
TEST(TorchFile, TheGrokkedModelAddsModuloP) {
  if (!fs::exists(kGrokking)) GTEST_SKIP() << kGrokking << " is absent (../shared/models)";
  const loader::Loaded l = loader::load("test", kGrokking + "wd_10-1_mod_addition_loss_curve.pth", "cpu");
  EXPECT_EQ(l.subword()->encode("3 5 ="), (std::vector<int64_t>{3, 5, 113}));
  constexpr int64_t p = 113;
  std::vector<int64_t> ids;
  for (int64_t a = 0; a < p; ++a)
    for (int64_t b = 0; b < p; ++b) ids.insert(ids.end(), {a, b, p});
  const NoGradGuard no_grad;
  const Tensor logits = l.decoder("test").forward(tensor(ids, {p * p, 3}));  // (p^2, 3, 114)
  ASSERT_EQ(logits.shape(), (Shape{p * p, 3, p + 1}));
  const std::vector<float> v = values(logits);
  int64_t right = 0;
  double loss = 0;
  for (int64_t r = 0; r < p * p; ++r) {
    const float* row = v.data() + (r * 3 + 2) * (p + 1);  // the last position
    const int64_t answer = (r / p + r % p) % p;
    const float top = *std::max_element(row, row + p + 1);
    right += row[answer] == top;
    double z = 0;
    for (int64_t c = 0; c <= p; ++c) z += std::exp(double(row[c]) - top);
    loss += std::log(z) - (double(row[answer]) - top);
  }
  EXPECT_EQ(right, p * p);
  EXPECT_LT(loss / double(p * p), 5e-6);
  EXPECT_GT(loss / double(p * p), 1e-9);
}

// The 5-digit addition model (no config stored: its sizes from the tensors' shapes, 10 outputs for 12 inputs)
// writes the six digits of a sum; the attention-only induction model copies a repeated sequence.
TEST(TorchFile, TheOtherProgressMeasuresModelsDoTheirTasks) {
  if (!fs::exists(kGrokking)) GTEST_SKIP() << kGrokking << " is absent (../shared/models)";
  const loader::Loaded add = loader::load("test", kGrokking + "5_digit_addition_infinite.pth", "cpu");
  EXPECT_EQ(add.decoder("test").config().output_vocab(), 10);
  std::mt19937 rng(7);
  int64_t sums_right = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t a = rng() % 100000, b = rng() % 100000, s = a + b;
    const auto digits = [](int64_t x, int n) {
      std::vector<int64_t> d(static_cast<size_t>(n));
      for (int i = n - 1; i >= 0; --i, x /= 10) d[static_cast<size_t>(i)] = x % 10;
      return d;
    };
    std::vector<int64_t> prompt = digits(a, 5);
    prompt.push_back(10);  // +
    for (const int64_t d : digits(b, 5)) prompt.push_back(d);
    prompt.push_back(11);  // =
    nn::GenerateOptions g;
    g.max_new_tokens = 6;
    sums_right += nn::generate(add.decoder("test"), prompt, g) == digits(s, 6);
  }
  EXPECT_EQ(sums_right, 20);

  // A 16-token subsequence (the run's subseq_len) five times after 5 random tokens: from its second copy on, the
  // next token is the previous copy's. An independent PyTorch twin of the grokking code's forward gives this
  // model's logits within 4e-6 (measured with Debian's torch) and copies 42 of 63 on its own draw; chance is 0.5.
  const loader::Loaded ind = loader::load("test", kGrokking + "induction_head_infinite.pth", "cpu");
  std::vector<int64_t> seq, sub;
  for (int i = 0; i < 5; ++i) seq.push_back(static_cast<int64_t>(rng() % 128));
  for (int i = 0; i < 16; ++i) sub.push_back(static_cast<int64_t>(rng() % 128));
  for (int r = 0; r < 5; ++r) seq.insert(seq.end(), sub.begin(), sub.end());
  const NoGradGuard no_grad;
  const std::vector<float> v = values(ind.decoder("test").forward(tensor(seq, {1, 85})));
  int64_t copied = 0;
  for (int64_t t = 21; t < 84; ++t) {
    const float* row = v.data() + t * 128;
    copied += std::max_element(row, row + 128) - row == seq[static_cast<size_t>(t + 1)];
  }
  EXPECT_GE(copied, 25) << "of 63";
}

// TransformerLens's HookedTransformer state_dict with its cfg: the weights of tests/fixtures/hooked/lens_gpt2 in
// TransformerLens's layout (W_Q (heads, d_model, d_head), W_O (heads, d_head, d_model), W_in (d_model, d_mlp),
// b_U, ...) give that fixture's float64 PyTorch twin's logits.
TEST(TorchFile, TransformerLensStateDictsGiveTheirModel) {
  const nlohmann::json ref =
      read_json(std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/hooked/reference.json")["lens_gpt2"];
  const loader::Loaded l = loader::load("test", fixture("lens_gpt2.pt"), "cpu");
  const nn::DecoderConfig& c = l.decoder("test").config();
  EXPECT_EQ(c.head_dim, ref["section"]["head_dim"].get<int64_t>());
  EXPECT_TRUE(c.unembed_bias && c.qkv_bias);
  EXPECT_LT(max_abs_diff(logits_of(l, ref["ids"]), flat_floats(ref["logits"])), 1e-4);
}
