// The GPT-NeoX family (nn/neox.h, io/hf_neox.h): Hugging Face folders against a float64 PyTorch twin of
// GPTNeoXForCausalLM (tools/fixtures_neox_folders.py: both residual forms, rotary on a quarter, half and all of
// each head, float16 with the buffers older files carry, shards), the bitwise export round trip, the cached decode
// against the full forward, refusals by name, and every command on a model trained from scratch with --arch neox.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "analysis/circuit.h"
#include "analysis/hooked_run.h"
#include "io/families.h"
#include "io/hf_neox.h"
#include "io/safetensors.h"
#include "nn/generate.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/every_command.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::headlab_in;
using headlab::testing::TempDir;

namespace {

namespace fs = std::filesystem;

std::string neox_fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/neox_folders/" + name;
}

Tensor ids_tensor(const nlohmann::json& rows) {
  const auto ids = rows.get<std::vector<std::vector<int64_t>>>();
  std::vector<int64_t> flat;
  for (const auto& row : ids) flat.insert(flat.end(), row.begin(), row.end());
  return tensor(flat, {static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids[0].size())});
}

double max_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

std::shared_ptr<nn::Model> read_folder(const std::string& folder) {
  const io::Family& family = io::family_of_folder(folder);
  EXPECT_EQ(family.model.arch(), "neox");
  return io::build_folder_model(family.folder->read(folder), folder);
}

nn::DecoderConfig small_config(bool parallel, int64_t rotary_dims) {
  nn::DecoderConfig c = nn::neox_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 3, c.n_layers = 2, c.hidden_dim = 40;
  c.rotary_dims = rotary_dims, c.rope_theta = 500.0, c.parallel_residual = parallel;
  return c;
}

}  // namespace

class NeoXFolders : public ::testing::TestWithParam<std::string> {};

// Logits to 1e-5 of the float64 twin and the same greedy tokens (the cached decode), in every variant.
TEST_P(NeoXFolders, MatchPyTorchLogitsAndGreedyTokens) {
  const std::string folder = neox_fixture(GetParam());
  auto model = read_folder(folder);
  auto& decoder = dynamic_cast<nn::DecoderModel&>(*model);
  std::ifstream in(neox_fixture("reference.json"));
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

// export writes every tensor back under its Hugging Face name with the same values, bit for bit (float16 files
// as the float32 values they hold), the fused query_key_value included, and the config reads back the same.
TEST_P(NeoXFolders, ExportRoundTripIsBitwise) {
  const std::string folder = neox_fixture(GetParam());
  auto model = read_folder(folder);
  const TempDir dir("neox_export");
  io::family_named("neox", "test").folder->write(dir.path("out"), *model, {});
  EXPECT_EQ(io::read_hf_neox_config(dir.path("out")).to_json(), io::read_hf_neox_config(folder).to_json());
  const io::SafetensorsModel src = io::SafetensorsModel::open(folder),
                             out = io::SafetensorsModel::open(dir.path("out"));
  size_t compared = 0;
  for (const std::string& name : src.names()) {
    if (name.ends_with("attention.bias") || name.ends_with("masked_bias") || name.ends_with("inv_freq")) {
      EXPECT_FALSE(out.contains(name)) << name << ": a buffer is not written back";
      continue;
    }
    ASSERT_TRUE(out.contains(name)) << name;
    EXPECT_EQ(max_diff(src.to_float(name), out.to_float(name)), 0.0) << name;
    ++compared;
  }
  EXPECT_EQ(compared, out.names().size());
  auto back = read_folder(dir.path("out"));
  const NamedTensors a = model->named_parameters(), b = back->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(max_diff(a[i].second, b[i].second), 0.0) << a[i].first;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, NeoXFolders,
                         ::testing::Values("parallel_quarter", "sequential_full", "parallel_f16_buffers"));

// A fresh model from train's options is Pythia's shape, and its section answers to the options that made it.
TEST(NeoX, AFreshConfigFromTheRegistryIsPythiasShape) {
  nn::ModelOptions o;
  o.arch = "neox", o.emb_dim = 64, o.n_heads = 4, o.n_layers = 2;
  const nn::ModelFamily& f = io::family_named("neox", "test").model;
  const nn::TaskSizes sizes{.task = "copy", .vocab_size = 13, .context_length = 12};
  const nlohmann::json s = f.from_options(o, sizes);
  const nn::DecoderConfig c = nn::neox_family().config(s);
  EXPECT_EQ(c.hidden_dim, 256);
  EXPECT_EQ(c.rotary_dims, 4);  // a quarter of the head's 16
  EXPECT_TRUE(c.parallel_residual && c.qkv_bias && !c.tie_embeddings);
  EXPECT_EQ(f.from_options(f.options(s), sizes), s);
  EXPECT_EQ(io::num_parameters(s), static_cast<double>(io::make_model(s)->num_parameters()));
  o.n_kv_heads = 2;
  EXPECT_ERROR(f.from_options(o, sizes), "--n-kv-heads: the neox family has multi-head attention only");
  o.n_kv_heads = 0, o.attn_only = true;
  EXPECT_ERROR(f.from_options(o, sizes), "--attn-only: the neox family has no attention-only form");
}

TEST(NeoX, ParameterCountNamesAndTheParallelResidual) {
  for (const bool parallel : {true, false}) {
    const nn::DecoderConfig c = small_config(parallel, 2);
    nn::DecoderModel m(c);
    EXPECT_EQ(static_cast<double>(m.num_parameters()), c.num_parameters());
    EXPECT_EQ(m.shape().parallel_residual, parallel);
    EXPECT_EQ(m.block(0)->parallel_residual(), parallel);
    const NamedTensors p = m.named_parameters();
    const auto has = [&](const std::string& n) {
      return std::any_of(p.begin(), p.end(), [&](const auto& e) { return e.first == n; });
    };
    for (const char* n :
         {"trf_blocks.0.att.W_query.bias", "trf_blocks.0.att.out_proj.bias", "trf_blocks.1.ff.layers.0.bias",
          "trf_blocks.1.norm2.bias", "final_norm.bias", "out_head.weight"})
      EXPECT_TRUE(has(n)) << n;
    // hook_resid_mid exists only where the MLP reads the attention's output
    const std::vector<nn::HookKey> points = m.hook_points();
    EXPECT_EQ(std::any_of(points.begin(), points.end(),
                          [](const nn::HookKey& k) { return k.point == nn::HookPoint::resid_mid; }),
              !parallel);
  }
}

// The cached decode (a prompt, then a token a step, or a prompt in chunks) against the full forward, with
// rotary on part of each head and on all of it, both residual forms.
TEST(NeoX, CachedDecodingMatchesTheFullForward) {
  for (const bool parallel : {true, false})
    for (const int64_t rotary : {2, 8}) {
      manual_seed(12);
      nn::DecoderModel m(small_config(parallel, rotary));
      m.eval();
      const NoGradGuard no_grad;
      Generator gen(3);
      const Tensor idx = randint(0, 37, {2, 10}, gen);
      const Tensor full = m.forward(idx);
      std::vector<nn::KVCache> caches(2);
      Tensor last = m.forward_cached(idx.narrow(1, 0, 4), caches);
      EXPECT_LT(max_diff(last, full.select(1, 3)), 2e-5);
      for (int64_t t = 4; t < 10; ++t) {
        last = m.forward_cached(idx.narrow(1, t, 1), caches);
        EXPECT_LT(max_diff(last, full.select(1, t)), 2e-5) << "position " << t;
      }
      std::vector<nn::KVCache> chunked(2);
      EXPECT_LT(max_diff(m.forward_cached(idx, chunked, 3), full.select(1, 9)), 2e-5);
      m.keep_attention_weights(true);  // the composite path
      EXPECT_LT(max_diff(m.forward(idx), full), 2e-5);
    }
}

TEST(NeoXFolders, WhatNeoXModelDoesNotComputeIsRefusedByName) {
  const TempDir dir("neox_bad");
  const std::string base = headlab::testing::slurp(neox_fixture("parallel_quarter/config.json"));
  const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = nlohmann::json::parse(base);
    change(j);
    fs::create_directories(dir.path(name));
    std::ofstream(dir.path(name) + "/config.json") << j.dump();
    return dir.path(name);
  };
  EXPECT_ERROR(io::read_hf_neox_config(with("act", [](auto& j) { j["hidden_act"] = "gelu_new"; })),
                    "hidden_act 'gelu_new' is not supported (the neox family's MLP uses the exact GELU");
  EXPECT_ERROR(io::read_hf_neox_config(with("scaling",
                                                 [](auto& j) {
                                                   j["rope_scaling"] = {{"type", "linear"}};
                                                 })),
                    "rope_scaling");
  EXPECT_ERROR(io::read_hf_neox_config(with("odd", [](auto& j) { j["rotary_pct"] = 0.375; })),
                    "rotary_pct 0.375 of head size 8 rotates 3 dims, an odd number");
  EXPECT_ERROR(io::read_hf_neox_config(with("heads", [](auto& j) { j["num_attention_heads"] = 5; })),
                    "hidden_size 32 is not divisible by num_attention_heads 5");
  // A tensor the config does not have, and one it needs but the file lacks: the file and tensor named.
  const std::string extra = with("extra", [](auto&) {});
  io::write_safetensors(extra + "/model.safetensors", {{"gpt_neox.embed_in.weight", zeros({80, 32})}});
  EXPECT_ERROR(io::family_of_folder(extra).folder->read(extra),
                    "missing tensor 'gpt_neox.layers.0.attention.query_key_value.weight'");
  const std::string wrong = with("wrong", [](auto& j) { j["intermediate_size"] = 48; });
  fs::copy_file(neox_fixture("parallel_quarter/model.safetensors"), wrong + "/model.safetensors");
  EXPECT_ERROR(io::family_of_folder(wrong).folder->read(wrong),
                    "tensor 'gpt_neox.layers.0.mlp.dense_h_to_4h.weight' has shape [64, 32], expected [48, 32]");
}

// A model trained from scratch with --arch neox goes through every command that reads a checkpoint.
TEST(NeoX, EveryCommandRunsOnAModelTrainedFromScratch) {
  const TempDir dir("neox_cli");
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  const auto train = run({"train",
                          "--task",
                          "reverse",
                          "--arch",
                          "neox",
                          "--steps",
                          "3",
                          "--emb-dim",
                          "32",
                          "--n-heads",
                          "2",
                          "--n-layers",
                          "2",
                          "--batch-size",
                          "4",
                          "--eval-every",
                          "3",
                          "--eval-batches",
                          "1",
                          "--out",
                          dir.path("run")});
  EXPECT_NE(train.out.find("neox, 2 layers x 2 heads, emb 32, ffn 128, rotary 4 of 16 dims, parallel residual"),
            std::string::npos)
      << train.out;
  headlab::testing::run_every_checkpoint_command(dir, dir.path("run/checkpoint.h5"));
}

// A Pythia-like folder with its tokenizer.json (a byte-level BPE with the NFC normalizer, as GPT-NeoX-20B's):
// convert, tokenize, eval --text, generate, attention and the prompt-pair analyses read it as they read a Hub folder.
TEST(NeoX, EveryCommandReadsAFolderWithItsTokenizerJson) {
  const TempDir dir("neox_hub");
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  nn::DecoderConfig c = small_config(true, 2);
  c.vocab_size = 1472, c.context_length = 64;
  manual_seed(5);
  nn::DecoderModel m(c);
  const std::string tok = std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/tokenizer_json/qwen2.json";
  io::TokenizerFiles files;
  files.type = "tokenizer.json";
  files.files.emplace_back("tokenizer.json", headlab::testing::slurp(tok));
  const std::string hub = dir.path("pythia");
  io::family_named("neox", "test").folder->write(hub, m, files);
  const std::string story = headlab::testing::write_story(dir);
  headlab::testing::run_every_folder_command(dir, hub, story);
  // Pythia's training revisions as folders step<N>: heads gives every head's scores at each, on the text given.
  for (const char* revision : {"step100", "step20"}) {
    nn::DecoderModel other(c);
    io::family_named("neox", "test").folder->write(dir.path("revisions/") + revision, other, files);
  }
  const auto series =
      run({"heads", dir.path("revisions"), "--text", dir.path("story.txt"), "--tokens", "16", "--out", dir.path("h")});
  EXPECT_NE(series.out.find("2 checkpoints of one run in " + dir.path("revisions") + " (steps 20 to 100)"),
            std::string::npos)
      << series.out;
  const std::string csv = headlab::testing::slurp(dir.path("h/heads_over_time.csv"));
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 2 * 2 * 3) << csv;  // 2 revisions x 2 layers x 3 heads
  run({"train", "--init", hub, "--text", dir.path("story.txt"), "--steps", "2", "--batch-size", "2", "--eval-every",
       "2", "--eval-batches", "1", "--out", dir.path("tuned")});
  run({"convert", hub, "--out", dir.path("pythia.h5")});
  run({"export", dir.path("pythia.h5"), "--out", dir.path("back")});
  EXPECT_TRUE(fs::exists(dir.path("back/tokenizer.json")));
}

// The circuit engine on the parallel residual: an MLP reads its block's input, so a head of its own layer is no
// sender of it; the patched forward's baseline is the model's, every node's noising (its output taken from the
// corrupted run for every reader) equals that replacement done with hooks on the model's own forward, and the
// direct logit attributions sum to the clean logit difference.
TEST(NeoX, CircuitPatchingFollowsTheParallelResidual) {
  manual_seed(9);
  nn::DecoderModel m(small_config(true, 4));
  m.to(DType::f64);
  m.eval();
  analysis::PromptPairs pairs;
  Generator gen(4);
  pairs.T = 7;
  pairs.clean = randint(0, 37, {3, 7}, gen).to_vector<int64_t>();
  pairs.corrupt = pairs.clean;
  for (int64_t r = 0; r < 3; ++r) pairs.corrupt[static_cast<size_t>(r * 7 + 2)] = (pairs.clean[r * 7 + 2] + 5) % 37;
  pairs.answer = {1, 2, 3}, pairs.wrong = {4, 5, 6};
  analysis::CircuitPatcher patcher(m, pairs);
  const analysis::CircuitGraph& g = patcher.graph();
  const int64_t head = g.parse_node("L0H1", "t");
  EXPECT_EQ(g.edge(head, g.parse_receivers("MLP0", "t").front()), -1) << "a head feeds its own layer's MLP";
  EXPECT_GE(g.edge(head, g.parse_receivers("MLP1", "t").front()), 0);
  const analysis::LogitDifference base = analysis::logit_difference(m, pairs);
  for (size_t r = 0; r < 3; ++r) EXPECT_NEAR(patcher.baseline().clean[r], base.clean[r], 1e-10);

  // Naively: the clean run with the node's output replaced by the corrupted run's, through the model's hooks.
  const NoGradGuard no_grad;
  const Tensor clean = tensor(pairs.clean, {3, 7}), corrupt = tensor(pairs.corrupt, {3, 7});
  const auto metric = [&](const Tensor& logits) {
    double sum = 0;
    for (int64_t r = 0; r < 3; ++r) {
      const Tensor last = logits.select(0, r).select(0, 6);
      sum += last.select(0, pairs.answer[r]).item<double>() - last.select(0, pairs.wrong[r]).item<double>();
    }
    return (sum / 3 - base.corrupt_mean) / (base.clean_mean - base.corrupt_mean);
  };
  std::vector<int64_t> nodes;
  for (int64_t n = 1; n < g.node_count(); ++n) nodes.push_back(n);
  const analysis::ActivationPatching act = analysis::activation_patching(patcher, nodes);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const analysis::CircuitGraph::Node& n = g.nodes()[static_cast<size_t>(nodes[i])];
    const std::string name =
        "blocks." + std::to_string(n.layer) + (n.head >= 0 ? ".attn.hook_result" : ".hook_mlp_out");
    const Tensor corrupted = analysis::run_hooked(m, corrupt, {name}).cache.at(name);
    const analysis::Hook replace = [&](const std::string&, const Tensor& x) {
      if (n.head < 0) return corrupted;
      Tensor y = x.clone();
      y.select(2, n.head).copy_(corrupted.select(2, n.head));
      return y;
    };
    EXPECT_NEAR(act.noising[i], metric(analysis::run_hooked(m, clean, {}, {{name, replace}}).logits), 1e-9)
        << g.node_name(nodes[i]);
  }
  const analysis::DirectLogitAttribution dla = patcher.direct_logit_attribution();
  double total = dla.constant;
  for (double v : dla.node) total += v;
  EXPECT_NEAR(total, dla.clean, 1e-9);
  EXPECT_NEAR(dla.clean, base.clean_mean, 1e-9);
}
