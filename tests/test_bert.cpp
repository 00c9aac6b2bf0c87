// The BERT family (nn/bert.cpp, io/hf_bert.cpp): its folders against the float64 twin (tools/fixtures_bert_folders.py:
// masked-LM logits to 1e-5 with a padded row and without a mask, in safetensors and a pytorch_model.bin of the original
// conversions' names, tied and untied, float32 and bfloat16); the encoder's parts against their maths at the hook
// points (post-LN blocks, the embedding norm, the masked-LM head); padding hidden, not cut; the per-head form against
// the fused one; export read back bitwise; and what the family refuses by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "analysis/residual.h"
#include "analysis/surgery.h"
#include "io/families.h"
#include "io/safetensors.h"
#include "loader/load.h"
#include "nn/decoder_family.h"
#include "nn/generate.h"
#include "tests/core_test_util.h"
#include "tests/every_command.h"
#include "tests/family_checks.h"
#include "tests/process_util.h"
#include "train/evaluate.h"

using namespace headlab;
using headlab::testing::max_diff;
using headlab::testing::nested;
using headlab::testing::TempDir;
using headlab::testing::tokens;

namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/bert_folders/" + name;
}

nlohmann::json reference(const std::string& variant) {
  std::ifstream in(fixture("reference.json"));
  return nlohmann::json::parse(in).at(variant);
}

std::shared_ptr<nn::DecoderModel> read_folder(const std::string& folder) {
  const io::Family& family = io::family_of_folder(folder);
  EXPECT_EQ(family.model.arch(), "bert");
  return std::dynamic_pointer_cast<nn::DecoderModel>(io::build_folder_model(family.folder->read(folder), folder));
}

// BERT's parts at test sizes.
nn::DecoderConfig bert_config(nn::AttentionForm form = nn::AttentionForm::fused) {
  nn::DecoderConfig c = nn::bert_family().config();
  c.vocab_size = 37, c.context_length = 16, c.emb_dim = 24, c.n_heads = 4, c.n_layers = 2, c.hidden_dim = 40;
  c.attention = form;
  return c;
}

}  // namespace

class BertFolders : public ::testing::TestWithParam<std::string> {};

TEST_P(BertFolders, MatchPyTorchMaskedLmLogitsWithAndWithoutPadding) {
  auto m = read_folder(fixture(GetParam()));
  ASSERT_TRUE(m);
  const nlohmann::json ref = reference(GetParam());
  const NoGradGuard no_grad;
  const Tensor ids = nested(ref["ids"], DType::i64);
  const Tensor lens = tensor(ref["valid_lens"].get<std::vector<int64_t>>(), {2});
  EXPECT_LT(max_diff(m->forward(ids, nullptr, lens), nested(ref["logits"], DType::f64)), 1e-5);
  EXPECT_LT(max_diff(m->forward(ids), nested(ref["logits_full"], DType::f64)), 1e-5);
  // through nn::Model's face too (what evaluation and the analyses call)
  nn::ModelInputs in;
  in.tokens = ids, in.valid_lens = lens;
  EXPECT_LT(max_diff(m->logits(in), nested(ref["logits"], DType::f64)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Variants, BertFolders, ::testing::Values("mlm_tied", "mlm_gamma_bin", "mlm_untied_bf16"));

TEST(Bert, ConfigReadsAnEncoderWhosePaddingIsHiddenNotCut) {
  auto m = read_folder(fixture("mlm_tied"));
  const nn::DecoderConfig& c = m->config();
  EXPECT_EQ(m->type_name(), "Bert");
  EXPECT_FALSE(c.causal);
  EXPECT_TRUE(c.post_ln && c.embed_norm && c.mlm_head && c.tie_embeddings && c.unembed_bias);
  EXPECT_EQ(c.type_vocab_size, 2);
  EXPECT_EQ(c.norm_eps, 1e-12);
  EXPECT_FALSE(m->supports_kv_cache());
  EXPECT_EQ(c.num_parameters(), static_cast<double>(m->num_parameters()));  // counted part by part
  EXPECT_EQ(read_folder(fixture("mlm_untied_bf16"))->config().type_vocab_size, 1);
  EXPECT_FALSE(read_folder(fixture("mlm_untied_bf16"))->config().tie_embeddings);
  // A padded row's real positions are the row alone: its padding is hidden from them.
  const NoGradGuard no_grad;
  const Tensor ids = tokens(2, 16, 80, 3);
  const Tensor padded = m->forward(ids, nullptr, tensor(std::vector<int64_t>{16, 9}, {2}));
  const Tensor alone = m->forward(ids.narrow(0, 1, 1).narrow(1, 0, 9).contiguous());
  EXPECT_LT(max_diff(padded.select(0, 1).narrow(0, 0, 9), alone.select(0, 0)), 1e-5);
  EXPECT_LT(max_diff(padded.select(0, 0), m->forward(ids.narrow(0, 0, 1)).select(0, 0)), 1e-5);
  // Bidirectional: the first position sees the last.
  Tensor changed = ids.clone();
  changed.select(0, 0).select(0, 15).fill_(1.0);
  EXPECT_GT(max_diff(m->forward(changed).select(0, 0).select(0, 0), padded.select(0, 0).select(0, 0)), 1e-4);
  EXPECT_ERROR(m->forward(ids, nullptr, tensor(std::vector<int64_t>{16, 17}, {2})),
               "Bert: row 1's valid length must be in [1, 16] (its tokens), got 17");
  EXPECT_ERROR(m->forward(ids, nullptr, tensor(std::vector<int64_t>{16}, {1})),
               "Bert: valid lengths must be int64 of shape [batch] = [2], got int64 [1]");
}

TEST(Bert, HookPointsAreBertBlocksAndHoldTheMathsOfPostLnBlocks) {
  auto m = read_folder(fixture("mlm_gamma_bin"));
  std::vector<std::string> names;
  for (const nn::HookKey& k : m->hook_points()) names.push_back(nn::hook_name(k));
  const std::vector<std::string> first{"hook_embed",
                                       "hook_pos_embed",
                                       "embed.ln.hook_normalized",
                                       "blocks.0.hook_resid_pre",
                                       "blocks.0.attn.hook_q",
                                       "blocks.0.attn.hook_k",
                                       "blocks.0.attn.hook_v",
                                       "blocks.0.attn.hook_pattern",
                                       "blocks.0.attn.hook_z",
                                       "blocks.0.attn.hook_result",
                                       "blocks.0.hook_attn_out",
                                       "blocks.0.hook_resid_mid",
                                       "blocks.0.ln1.hook_normalized",
                                       "blocks.0.mlp.hook_pre",
                                       "blocks.0.mlp.hook_post",
                                       "blocks.0.hook_mlp_out",
                                       "blocks.0.hook_resid_post",
                                       "blocks.0.ln2.hook_normalized"};
  ASSERT_GE(names.size(), first.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + static_cast<long>(first.size())), first);
  EXPECT_EQ(names.back(), "mlm_head.ln.hook_normalized");
  const std::vector<nn::HookKey> keys = m->hook_points();
  nn::ActivationCache cache(std::set<nn::HookKey>(keys.begin(), keys.end()));
  const NoGradGuard no_grad;
  const Tensor ids = tokens(1, 12, 80, 4);
  const Tensor logits = m->forward(ids, &cache);
  const auto at = [&](nn::HookPoint p, int64_t l) { return cache.cache().at({p, l}); };
  using P = nn::HookPoint;
  for (int64_t l = 0; l < 2; ++l) {
    nn::DecoderBlock& b = m->decoder_block(l);
    EXPECT_LT(max_diff(at(P::resid_mid, l), add(at(P::resid_pre, l), at(P::attn_out, l))), 1e-6);
    EXPECT_LT(max_diff(at(P::ln1_normalized, l), b.ln1().forward(at(P::resid_mid, l))), 1e-6);
    EXPECT_LT(max_diff(at(P::resid_post, l), add(at(P::ln1_normalized, l), at(P::mlp_out, l))), 1e-6);
    EXPECT_LT(max_diff(at(P::ln2_normalized, l), b.ln2()->forward(at(P::resid_post, l))), 1e-6);
  }
  EXPECT_LT(max_diff(at(P::resid_pre, 1), at(P::ln2_normalized, 0)), 1e-12);  // the next block reads the norm
  EXPECT_LT(max_diff(at(P::resid_pre, 0), at(P::embed_normalized, -1)), 1e-12);
  const Tensor head = m->mlm_norm->forward(gelu(m->mlm_dense->forward(at(P::ln2_normalized, 1)), false));
  EXPECT_LT(max_diff(at(P::mlm_normalized, -1), head), 1e-6);
  EXPECT_LT(max_diff(logits, m->lm_head().forward(head)), 1e-5);
}

TEST(Bert, TheFormsAgreeAndAFreshEncoderLearns) {
  headlab::testing::expect_forms_agree(bert_config());
  {
    nn::DecoderModel fresh(bert_config());
    headlab::testing::expect_fresh_model_learns(fresh, 0.6);
  }
  // The wrapper's padded forward goes through the fused form's: the same logits.
  manual_seed(5);
  nn::DecoderModel fused(bert_config());
  fused.eval();
  const std::unique_ptr<nn::DecoderModel> wrapper = headlab::testing::wrapper_of(fused);
  const NoGradGuard no_grad;
  const Tensor ids = tokens(2, 10, 37, 6), lens = tensor(std::vector<int64_t>{4, 10}, {2});
  EXPECT_LT(max_diff(wrapper->forward(ids, nullptr, lens), fused.forward(ids, nullptr, lens)), 1e-5);
}

TEST(Bert, ExportReadsBackBitwise) {
  TempDir dir("bert_export");
  for (const std::string variant : {"mlm_gamma_bin", "mlm_untied_bf16"}) {
    SCOPED_TRACE(variant);
    auto m = read_folder(fixture(variant));
    io::family_named("bert", "test").folder->write(dir.path(variant), *m, {});
    auto back = read_folder(dir.path(variant));
    EXPECT_EQ(back->config_json(), m->config_json());
    const NamedTensors a = m->named_parameters(), b = back->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(max_diff(a[i].second, b[i].second), 0.0) << a[i].first;
  }
}

TEST(Bert, WhatAnEncoderCannotDoIsRefusedByName) {
  auto m = read_folder(fixture("mlm_tied"));
  EXPECT_ERROR(nn::generate(*m, {1, 2, 3}, {}), "generate: Bert is an encoder (bidirectional attention)");
  std::vector<nn::KVCache> caches(2);
  EXPECT_ERROR(m->forward_cached(tokens(1, 3, 80, 1), caches), "does not decode with a cache");
  EXPECT_ERROR(analysis::logit_lens(*m, {1, 2, 3}), "logit_lens: reads each position's prediction of the next token");
  EXPECT_ERROR(analysis::decompose_resid(*m, tokens(1, 4, 80, 1), {}),
               "decompose_resid: Bert norms the stream after every residual add (post-LN)");
  nn::ModelOptions o;
  o.arch = "bert", o.emb_dim = 16, o.n_heads = 2, o.n_layers = 1;
  EXPECT_ERROR(
      io::family_named("bert", "test").model.from_options(o, {.task = "copy", .vocab_size = 13, .context_length = 12}),
      "train --arch bert: an encoder trains on a masked-LM objective");
  TempDir dir("bert_refusals");
  std::ifstream in(fixture("mlm_tied/config.json"));
  const std::string base((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto refused = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change,
                           const std::string& message) {
    const std::string folder = headlab::testing::config_variant(dir, base, name, change);
    EXPECT_ERROR(io::family_of_folder(folder).folder->read_config(folder), message);
  };
  refused(
      "act", [](nlohmann::json& j) { j["hidden_act"] = "relu"; }, "hidden_act 'relu' is not supported");
  refused(
      "relative", [](nlohmann::json& j) { j["position_embedding_type"] = "relative_key"; },
      "position_embedding_type 'relative_key' is not supported (learned absolute positions only)");
  refused(
      "decoder", [](nlohmann::json& j) { j["is_decoder"] = true; }, "is_decoder true (BERT as a causal decoder)");
  refused(
      "cross", [](nlohmann::json& j) { j["add_cross_attention"] = true; }, "add_cross_attention true");
  // A folder without the masked-LM head (a BertModel's, a classifier's body) says so.
  {
    const io::SafetensorsFile full(fixture("mlm_tied/model.safetensors"));
    std::vector<std::pair<std::string, Tensor>> body;
    for (const auto& [name, entry] : full.entries())
      if (name.rfind("cls.", 0) != 0) body.emplace_back(name, full.to_float(name));
    fs::create_directories(dir.path("body"));
    fs::copy_file(fixture("mlm_tied/config.json"), dir.path("body/config.json"));
    io::write_safetensors(dir.path("body/model.safetensors"), body, {});
    EXPECT_ERROR(read_folder(dir.path("body")),
                 "the folder has no masked-LM head (a BertModel or a fine-tuned "
                 "classifier, not BertForMaskedLM)");
  }
}

TEST(Bert, AFolderReadsItsWordPieceVocabularyAndIsScoredOnMaskedTokens) {
  TempDir dir("bert_mlm");
  const std::string story = headlab::testing::write_story(dir);
  const loader::Loaded l = loader::load("eval", fixture("mlm_tied"), "cpu", story);
  const tasks::TextTokenizer* tok = l.subword();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("The cat sat."), (std::vector<int64_t>{62, 63, 65, 57}));  // the, cat, sat, .
  EXPECT_EQ(tok->encode("Once"), (std::vector<int64_t>{66, 33, 35}));  // on ##c ##e: the longest piece first
  // Rows framed [CLS] ... [SEP]; the masked positions hold [MASK] and are the only ones scored, at least one a row.
  const tasks::Batch b = l.task->batch(tasks::Split::val, 0, 4, 16);
  const tasks::Batch again = l.task->batch(tasks::Split::val, 0, 4, 16);
  EXPECT_EQ(b.inputs, again.inputs);
  int64_t scored = 0;
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(b.input(r, 0), 2);
    EXPECT_EQ(b.input(r, 15), 3);
    int64_t in_row = 0;
    for (int64_t t = 0; t < 16; ++t) {
      const bool masked = b.input(r, t) == 4;
      EXPECT_EQ(b.target(r, t) != kIgnoreIndex, masked) << r << ", " << t;
      if (masked) {
        EXPECT_GE(b.target(r, t), 5);  // a text token, never a special one
        ++in_row;
      }
    }
    EXPECT_GE(in_row, 1);
    scored += in_row;
  }
  EXPECT_EQ(b.scored_targets(), scored);
  // The loss the evaluation reports is the cross entropy at the masked positions.
  const train::Scores s = train::evaluate(*l.model, {b});
  const NoGradGuard no_grad;
  const Tensor logits = l.model->logits(train::model_inputs(b, kCPU));
  const Tensor want =
      cross_entropy(logits.reshape({-1, logits.size(-1)}), train::batch_tensors(b, kCPU).second.reshape({-1}));
  EXPECT_NEAR(s.loss, want.item<double>(), 1e-5);
}

TEST(Bert, EveryCommandThatAppliesToAnEncoderRunsAndTheRestRefuseByName) {
  const TempDir dir("bert_cli");
  const auto run = [&](const std::vector<std::string>& args) { return headlab::testing::headlab_in(dir, args); };
  const std::string hub = fixture("mlm_tied"), story = headlab::testing::write_story(dir);
  EXPECT_NE(run({"inspect", hub}).out.find("bert, 2 layers x 4 heads"), std::string::npos);
  run({"tokenize", hub, "--prompt", "The cat sat."});
  EXPECT_NE(run({"eval", hub, "--text", story}).out.find("masked language model"), std::string::npos);
  run({"attention", hub, "--prompt", "the cat sat on the mat", "--out", dir.path("att")});
  run({"heads", hub, "--text", story, "--tokens", "16", "--batches", "1", "--out", dir.path("heads")});
  run({"ablate", hub, "--text", story, "--tokens", "16", "--batches", "1", "--repeats", "1", "--prune", "2", "--out",
       dir.path("abl")});
  run({"export", dir.path("abl/pruned.h5"), "--out", dir.path("hf_pruned")});
  run({"inspect", dir.path("hf_pruned")});
  run({"convert", hub, "--out", dir.path("back.h5")});
  run({"eval", dir.path("back.h5"), "--text", story});
  run({"export", dir.path("back.h5"), "--out", dir.path("again")});
  run({"eval", dir.path("again"), "--text", story});
  run({"train", "--init", hub, "--text", story, "--steps", "2", "--batch-size", "2", "--eval-every", "2",
       "--eval-batches", "1", "--out", dir.path("init")});
  const auto refused = [&](std::vector<std::string> args, const std::string& message) {
    args.insert(args.begin(), std::string(HEADLAB_BINARY_DIR) + "/headlab");
    const headlab::testing::ProcessResult r = headlab::testing::run_process(args, dir.dir());
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  };
  refused({"generate", hub, "--prompt", "the cat"}, "is an encoder (bidirectional attention)");
  refused({"circuit", hub, "--task", "induction", "--rows", "4", "--out", dir.path("circ")},
          "path patching over post-LN models (circuit, heads --task) is not supported yet");
  refused({"eval", hub}, "is an encoder, scored on masked tokens of a text: give --text FILE");
}
