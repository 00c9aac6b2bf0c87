// d2l's encoder-decoder beyond PyTorch parity (test_nn_parity.cpp, test_gradcheck.cpp): incremental
// greedy decoding against recomputing the whole prefix; decoding exact match against teacher-forced
// exact match; d2l's BLEU; head analysis through nn::Model (per-head ablation against gates and offsets
// by hand, Michel et al.'s best-head-only scores by hand, the pruning curve); physical pruning against the
// gated model; attention maps of every kind against a padded batch's row; and the commands (train, eval,
// generate, inspect, ablate, attention) on an encoder-decoder checkpoint.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "analysis/analysis.h"
#include "analysis/explorer.h"
#include "io/checkpoint.h"
#include "io/h5file.h"
#include "nn/transformer.h"
#include "tasks/bleu.h"
#include "tests/process_util.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace headlab;
using headlab::testing::TempDir;

namespace {

tasks::TaskOptions reverse_options() {
  tasks::TaskOptions o;
  o.min_len = 2;
  o.max_len = 5;
  o.seed = 5;
  return o;
}

nn::TransformerConfig small_config(const tasks::Seq2SeqTask& task) {
  nn::TransformerConfig c;
  c.src_vocab_size = task.source_vocab_size();
  c.tgt_vocab_size = task.vocab_size();
  c.num_hiddens = 16;
  c.ffn_num_hiddens = 32;
  c.num_heads = 4;
  c.num_layers = 2;
  c.dropout = 0;
  return c;
}

class Seq2Seq : public ::testing::Test {
 protected:
  void SetUp() override { omp_set_num_threads(1); }
  std::string path(const std::string& name) const { return tmp_.path(name); }
  // A reverse model trained 150 steps (made once per test binary): right on some rows, wrong on others.
  static const io::Checkpoint& trained() {
    static const io::Checkpoint ck = [] {
      TempDir dir("seq2seq_train");
      train::TrainOptions o;
      o.model.arch = "encoder-decoder";
      o.config.task.name = "reverse";
      o.config.task.options = reverse_options();
      o.model.emb_dim = 32;
      o.model.n_heads = 4;
      o.model.n_layers = 2;
      o.model.ffn_hiddens = 64;
      o.model.drop_rate = 0;
      o.config.run.steps = 150;
      o.config.run.batch_size = 32;
      o.config.run.eval_every = o.config.run.save_every = 150;
      o.config.run.eval_batches = 2;
      o.config.run.seed = 5;
      o.config.optimizer.lr = 5e-3;
      o.config.schedule.warmup = 10;
      o.out = dir.path("run");
      o.quiet = true;
      return io::load_checkpoint(train::Trainer(o).run().checkpoint);
    }();
    return ck;
  }
  static std::shared_ptr<nn::EncoderDecoder> trained_model() {
    return std::dynamic_pointer_cast<nn::EncoderDecoder>(io::load_model(trained(), "trained"));
  }
  static std::unique_ptr<tasks::Seq2SeqTask> task() { return tasks::make_seq2seq_task("reverse", reverse_options()); }
  static analysis::EvalSet eval_set(int64_t batches, int64_t B) {
    return analysis::make_eval_set(*task(), batches, B, 1000);
  }
  TempDir tmp_{"seq2seq_test"};
};

// ---- decoding -------------------------------------------------------------------------------------

TEST_F(Seq2Seq, GreedyDecodingWithTheStateEqualsRecomputingThePrefix) {
  const auto t = task();
  manual_seed(11);
  nn::EncoderDecoder model(small_config(*t));
  model.eval();
  const tasks::Batch b = t->batch(tasks::Split::val, 0, 6, 0);
  const nn::ModelInputs in = train::model_inputs(b, kCPU);
  const int64_t steps = 7;
  const auto fast = nn::greedy_decode(model, in.source, in.source_valid_lens, t->bos_id(), t->end_id(), steps);
  ASSERT_EQ(fast.size(), 6u);
  NoGradGuard no_grad;
  for (int64_t r = 0; r < b.B; ++r) {
    // The slow way: the whole prefix through forward() at every step, the last position's argmax.
    const Tensor src = in.source.narrow(0, r, 1), vl = in.source_valid_lens.narrow(0, r, 1);
    std::vector<int64_t> prefix = {t->bos_id()}, out;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t n = static_cast<int64_t>(prefix.size());
      const Tensor logits = model.forward(src, tensor(prefix, {1, n}), vl);  // (1, n, V)
      const int64_t next = argmax(logits.select(1, n - 1), -1).item<int64_t>();
      if (next == t->end_id()) break;
      out.push_back(next);
      prefix.push_back(next);
    }
    EXPECT_EQ(fast[static_cast<size_t>(r)], out) << "row " << r;
  }
}

TEST_F(Seq2Seq, DecodingExactMatchIsTeacherForcedExactMatch) {
  const auto model = trained_model();
  const analysis::EvalSet data = eval_set(4, 32);
  const train::Scores tf = train::evaluate(*model, data.batches);
  const train::DecodeScores d = train::evaluate_decoding(*model, *task(), data.batches);
  EXPECT_EQ(d.rows, 128);
  EXPECT_GT(tf.exact_match, 0.02) << "the trained model gets some rows right";
  EXPECT_LT(tf.exact_match, 1.0) << "and some wrong, so the comparison means something";
  EXPECT_DOUBLE_EQ(d.exact_match, tf.exact_match);
  EXPECT_GE(d.bleu, d.exact_match);  // a right row scores 1, a wrong one >= 0
  EXPECT_LE(d.bleu, 1.0);
}

TEST(Bleu, FollowsD2l) {
  EXPECT_DOUBLE_EQ(tasks::bleu({1, 2, 3}, {1, 2, 3}), 1.0);
  // p1 = 2/3, p2 = 1/2, no brevity penalty: (2/3)^(1/2) (1/2)^(1/4)
  EXPECT_NEAR(tasks::bleu({1, 2, 4}, {1, 2, 3}), std::sqrt(2.0 / 3.0) * std::pow(0.5, 0.25), 1e-12);
  // One token of two: brevity penalty exp(1 - 2/1), p1 = 1, no bigram to score.
  EXPECT_NEAR(tasks::bleu({1}, {1, 2}), std::exp(-1.0), 1e-12);
  // Clipped counts: the label has one 7 (p1 = 1/2), and no bigram matches (p2 = 0).
  EXPECT_EQ(tasks::bleu({7, 7}, {7, 5}), 0.0);
  EXPECT_NEAR(tasks::bleu({7, 5, 7}, {7, 5}), std::sqrt(2.0 / 3.0) * std::pow(0.5, 0.25), 1e-12);
  EXPECT_EQ(tasks::bleu({}, {1, 2}), 0.0);
  // Longer than the label: no brevity penalty; p1 = 2/4, p2 = 1/3.
  EXPECT_NEAR(tasks::bleu({1, 2, 3, 4}, {1, 2}), std::sqrt(0.5) * std::pow(1.0 / 3.0, 0.25), 1e-12);
}

// ---- analysis through nn::Model ---------------------------------------------------------------------

TEST_F(Seq2Seq, ZeroAndMeanAblationEqualGatesAndOffsetsByHand) {
  const auto model = trained_model();
  const analysis::EvalSet data = eval_set(2, 16);
  const analysis::AblationResult a = analysis::ablate_heads(*model, data);
  ASSERT_EQ(a.heads.size(), static_cast<size_t>(3 * 2 * 4));
  const std::vector<Tensor> means = analysis::mean_head_contexts(*model, data);
  for (const analysis::HeadAblation& h : a.heads) {
    analysis::HeadMatrix gates = analysis::head_matrix(*model, 1.0);
    gates[static_cast<size_t>(h.layer)][static_cast<size_t>(h.head)] = 0;
    EXPECT_DOUBLE_EQ(h.zero.loss, analysis::evaluate_heads(*model, data, gates).loss);
    std::vector<Tensor> offsets(static_cast<size_t>(model->attention_count()));
    Tensor o = zeros_like(means[static_cast<size_t>(h.layer)]);
    o.select(0, h.head).copy_(means[static_cast<size_t>(h.layer)].select(0, h.head));
    offsets[static_cast<size_t>(h.layer)] = o;
    EXPECT_DOUBLE_EQ(h.mean.loss, analysis::evaluate_heads(*model, data, gates, offsets).loss);
    EXPECT_TRUE(std::isnan(h.resample.loss)) << "resample is not computed for the encoder-decoder";
  }
  // Every kind of attention matters somewhere: some head of each costs loss when zeroed.
  for (const char* kind : {"encoder", "decoder", "cross"}) {
    double worst = 0;
    for (const auto& h : a.heads)
      if (model->attention_kind(h.layer) == kind) worst = std::max(worst, h.zero.loss - a.base.loss);
    EXPECT_GT(worst, 1e-3) << kind;
  }
}

TEST_F(Seq2Seq, BestHeadOnlyIsTheBestOfEachLayerByHand) {
  const auto model = trained_model();
  const analysis::EvalSet data = eval_set(2, 16);
  const auto best = analysis::best_head_only(*model, data, analysis::Metric::token_accuracy);
  ASSERT_EQ(best.size(), 6u);
  for (const auto& b : best) {
    double top = -1;
    for (int64_t h = 0; h < 4; ++h) {
      analysis::HeadMatrix gates = analysis::head_matrix(*model, 1.0);
      for (int64_t j = 0; j < 4; ++j) gates[static_cast<size_t>(b.layer)][static_cast<size_t>(j)] = j == h;
      top = std::max(top, analysis::evaluate_heads(*model, data, gates).token_accuracy);
    }
    EXPECT_DOUBLE_EQ(b.scores.token_accuracy, top) << model->attention_label(b.layer);
  }
}

TEST_F(Seq2Seq, PruningCurveKeepsAHeadInEveryModule) {
  const auto model = trained_model();
  const analysis::EvalSet data = eval_set(1, 16);
  analysis::PruneOptions po;
  po.step_fraction = 0.25;
  po.stop_below = -1;  // the whole curve
  po.criterion = analysis::Criterion::gradient;
  const analysis::PruningCurve c = analysis::iterative_pruning(*model, data, po);
  EXPECT_EQ(static_cast<int64_t>(c.order.size()), 6 * 3) << "every module down to one head";
  const auto keep = analysis::kept_after(*model, c.order, static_cast<int64_t>(c.order.size()));
  for (const auto& k : keep) EXPECT_EQ(k.size(), 1u);
  // The curve's last scores are the model with those gates.
  EXPECT_DOUBLE_EQ(c.steps.back().scores.loss,
                   analysis::evaluate_heads(*model, data, analysis::gates_keeping(*model, keep)).loss);
}

TEST_F(Seq2Seq, PrunedCheckpointComputesWhatTheGatedModelDoes) {
  const io::Checkpoint& ck = trained();
  const auto model = trained_model();
  const analysis::EvalSet data = eval_set(2, 16);
  // Drop heads of every kind: encoder layer 0 keeps {1, 3}, decoder self layer 1 keeps {0}, cross layer 0 keeps {2, 3}.
  std::vector<std::vector<int64_t>> keep(6, {0, 1, 2, 3});
  keep[0] = {1, 3};
  keep[3] = {0};
  keep[4] = {2, 3};
  const io::Checkpoint pruned_ck = analysis::prune_checkpoint(ck, keep, "trained");
  io::save_checkpoint(path("pruned.h5"), pruned_ck);
  const auto pruned = io::load_model(io::load_checkpoint(path("pruned.h5")), path("pruned.h5"));
  const analysis::HeadMatrix gates = analysis::gates_keeping(*model, keep);
  EXPECT_LT(analysis::max_logit_difference(*model, gates, *pruned, data), 2e-5);
  EXPECT_EQ(pruned->heads_at(0), 2);
  EXPECT_EQ(pruned->original_head(0, 1), 3);
  EXPECT_EQ(pruned->heads_at(3), 1);
  EXPECT_EQ(static_cast<double>(pruned->num_parameters()),
            nn::TransformerConfig::from_json(pruned_ck.config["model"]).num_parameters());
  EXPECT_LT(pruned->num_parameters(), model->num_parameters());
  // Pruning the pruned model again keeps original indices: encoder layer 0 keeps its (original) head 3.
  std::vector<std::vector<int64_t>> again(6, {0, 1, 2, 3});
  again[0] = {1};
  again[3] = {0};
  again[4] = {0, 1};
  const io::Checkpoint twice = analysis::prune_checkpoint(pruned_ck, again, "pruned");
  EXPECT_EQ(twice.config["model"]["kept_encoder"][0], nlohmann::json({3}));
  EXPECT_EQ(twice.config["model"]["kept_cross"][0], nlohmann::json({2, 3}));
  // Errors name what is wrong.
  keep[2] = {};
  try {
    analysis::prune_checkpoint(ck, keep);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention module 2 must keep at least one head"), std::string::npos)
        << e.what();
  }
}

// ---- attention maps ----------------------------------------------------------------------------------

TEST_F(Seq2Seq, AttentionMapsOfEveryKindAreThePaddedBatchsRow) {
  const auto t = task();
  const auto model = trained_model();
  const std::vector<int64_t> src = t->encode_source("1234");
  const std::vector<int64_t> dec_in = {t->bos_id(), src[3], src[2], src[1]};
  const int64_t S = static_cast<int64_t>(src.size()), T = static_cast<int64_t>(dec_in.size()), L = 2, H = 4;
  const std::vector<analysis::AttentionMaps> kinds = analysis::attention_maps(*model, src, dec_in);
  ASSERT_EQ(kinds.size(), 3u);
  const int64_t queries[] = {S, T, T}, keys[] = {S, T, S};
  const char* prefixes[] = {"enc.L", "dec.L", "cross.L"};
  for (size_t k = 0; k < 3; ++k) {
    const analysis::AttentionMaps& m = kinds[k];
    ASSERT_EQ(m.T, queries[k]);
    ASSERT_EQ(m.S, keys[k]);
    ASSERT_EQ(m.weights.size(), static_cast<size_t>(L * H * m.T * m.S));
    EXPECT_EQ(m.layer_names,
              (std::vector<std::string>{prefixes[k] + std::string("0"), prefixes[k] + std::string("1")}));
    for (int64_t q = 0; q < L * H * m.T; ++q) {
      double row = 0;
      for (int64_t j = 0; j < m.S; ++j) {
        const float w = m.weights[static_cast<size_t>(q * m.S + j)];
        if (k == 1 && j > q % m.T) {
          EXPECT_EQ(w, 0.0f) << "decoder self-attention is causal";
        }
        row += w;
      }
      EXPECT_NEAR(row, 1.0, 1e-5);
    }
  }
  EXPECT_EQ(kinds[2].ids, dec_in);
  EXPECT_EQ(kinds[2].key_ids, src);
  // The same rows inside a padded batch (a second, longer row; row 0 padded, valid_lens S): its weights
  // on the real keys are the maps, on the padding 0.
  {
    NoGradGuard no_grad;
    model->eval();
    std::vector<int64_t> enc(static_cast<size_t>(2 * (S + 2)), t->source_pad_id()), dec;
    std::copy(src.begin(), src.end(), enc.begin());
    for (int64_t i = 0; i < S + 2; ++i) enc[static_cast<size_t>(S + 2 + i)] = src[static_cast<size_t>(i % S)];
    dec = dec_in;
    dec.insert(dec.end(), dec_in.begin(), dec_in.end());
    model->forward(tensor(enc, {2, S + 2}), tensor(dec, {2, T}), tensor(std::vector<int64_t>{S, S + 2}, {2}));
  }
  for (int64_t i : {0, 1, 4, 5}) {  // encoder layers 0-1, cross layers 0-1 (module order: enc, dec, cross)
    const analysis::AttentionMaps& m = kinds[static_cast<size_t>(i / L)];
    const std::vector<float> w = model->attention_weights(i).to_vector<float>();  // (2, H, Q, S + 2), row 0 first
    const int64_t Q = i < L ? S + 2 : T;  // the encoder's queries are its (padded) keys
    for (int64_t h = 0; h < H; ++h)
      for (int64_t q = 0; q < m.T; ++q)
        for (int64_t j = 0; j < S + 2; ++j) {
          const float got = w[static_cast<size_t>((h * Q + q) * (S + 2) + j)];
          const float want = j < S ? m.weights[static_cast<size_t>((((i % L) * H + h) * m.T + q) * S + j)] : 0.0f;
          EXPECT_NEAR(got, want, 1e-6) << model->attention_label(i) << "H" << h << " q " << q << " key " << j;
        }
  }
  // A pruned model: cross.L0 keeps heads 2 and 3 (original indices), the others are NaN; head 2's
  // weights are unchanged (nothing before cross.L0 changed).
  std::vector<std::vector<int64_t>> keep(6, {0, 1, 2, 3});
  keep[4] = {2, 3};
  const auto pruned = std::dynamic_pointer_cast<nn::EncoderDecoder>(
      io::load_model(analysis::prune_checkpoint(trained(), keep, "trained"), "pruned"));
  const analysis::AttentionMaps pc = analysis::attention_maps(*pruned, src, dec_in)[2];
  EXPECT_EQ(pc.kept[0], (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(std::isnan(pc.weights[0]));
  const int64_t head2 = 2 * T * S;
  for (int64_t j = 0; j < T * S; ++j)
    EXPECT_NEAR(pc.weights[static_cast<size_t>(head2 + j)], kinds[2].weights[static_cast<size_t>(head2 + j)], 1e-6);
  EXPECT_THROW(analysis::attention_maps(*model, {}, dec_in), Error);
}

TEST_F(Seq2Seq, RowExplorerPutsEachModulesScoresBesideItsKindsHeads) {
  // Pruned: cross.L0 keeps its original heads 2 and 3, so its scores move to those indices.
  std::vector<std::vector<int64_t>> keep(6, {0, 1, 2, 3});
  keep[4] = {2, 3};
  const auto pruned = io::load_model(analysis::prune_checkpoint(trained(), keep, "trained"), "pruned");
  const auto t = task();
  const tasks::Batch b = t->batch(tasks::Split::val, 0, 4, 0);
  analysis::ExplorerScore score{"module x 10 + head", {}};
  for (int64_t i = 0; i < pruned->attention_count(); ++i) {
    score.values.emplace_back();
    for (int64_t h = 0; h < pruned->heads_at(i); ++h) score.values.back().push_back(static_cast<double>(10 * i + h));
  }
  analysis::save_row_explorer(path("row.html"), *pruned, *t, b, 1, "row 1", {score});
  std::ifstream f(path("row.html"));
  const std::string page((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t start = page.find("const D = ") + 10, end = page.find(";\nconst decode = ");
  const nlohmann::json d = nlohmann::json::parse(page.substr(start, end - start));
  ASSERT_EQ(d["kinds"].size(), 3u);
  for (int64_t k = 0; k < 3; ++k)
    for (int64_t l = 0; l < 2; ++l) {
      const nlohmann::json& row = d["kinds"][k]["scores"][0]["values"][l];
      const int64_t i = 2 * k + l;
      for (int64_t h = 0; h < 4; ++h) {
        if (i == 4 && h < 2) {
          EXPECT_TRUE(row[h].is_null()) << "pruned head cross.L0H" << h;
        } else {
          EXPECT_EQ(row[h], 10 * i + (i == 4 ? h - 2 : h)) << pruned->attention_label(i) << "H" << h;
        }
      }
    }
  // The row's own source and decoder input (bos and its target but the end token).
  const nlohmann::json& cross = d["kinds"][2];
  EXPECT_EQ(cross["S"], b.source_valid_lens[1]);
  EXPECT_EQ(cross["T"], b.answer_end[1]);
}

TEST(TransformerConfigJson, RoundTripsAndNamesBadKeys) {
  nn::TransformerConfig c;
  c.src_vocab_size = 7;
  c.tgt_vocab_size = 9;
  c.kept_cross = {{0, 2}, {1}};
  const nn::TransformerConfig back = nn::TransformerConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  nlohmann::json j = c.to_json();
  j.erase("num_heads");
  EXPECT_THROW(nn::TransformerConfig::from_json(j), Error);
  j = c.to_json();
  j["kept_cross"] = {{0, 7}, {1}};
  try {
    nn::TransformerConfig::from_json(j);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kept_cross of layer 0 holds head 7, expected 0..3"), std::string::npos)
        << e.what();
  }
}

// ---- the commands ------------------------------------------------------------------------------------

TEST_F(Seq2Seq, CommandsRunOnAnEncoderDecoderCheckpoint) {
  const fs::path exe = fs::path(HEADLAB_BINARY_DIR) / "headlab";
  if (!fs::exists(exe)) GTEST_SKIP() << exe << " is not built";
  auto run = [&](std::vector<std::string> args, int want = 0) {
    args.insert(args.begin(), exe.string());
    const headlab::testing::ProcessResult r = headlab::testing::run_process(args, tmp_.dir(), "OMP_NUM_THREADS=1");
    EXPECT_EQ(r.code, want) << r.out << r.err;
    return r.out + r.err;
  };
  io::save_checkpoint(path("ck.h5"), trained());
  EXPECT_NE(run({"eval", path("ck.h5")}).find("BLEU"), std::string::npos);
  EXPECT_NE(run({"generate", path("ck.h5"), "--prompt", "1234"}).find("1234 => "), std::string::npos);
  EXPECT_NE(run({"inspect", path("ck.h5")}).find("decoder.blks.block1.attention2.W_o.weight"), std::string::npos);
  const std::string ab = run({"ablate", path("ck.h5"), "--batches", "1", "--batch-size", "16", "--prune", "2", "--out",
                              path("ablation"), "--repeats", "2"});
  EXPECT_NE(ab.find("cross.L"), std::string::npos) << ab;
  for (const char* f :
       {"heads.csv", "pruning.csv", "report.md", "importance.png", "pruning.png", "pruned.h5", "attention.html"})
    EXPECT_TRUE(fs::exists(path("ablation/") + f)) << f;
  std::ifstream report(path("ablation/report.md"));
  const std::string md((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("Only the best head of each layer"), std::string::npos);
  EXPECT_NE(md.find("encoder-decoder (cross) attention"), std::string::npos);
  EXPECT_NE(run({"eval", path("ablation/pruned.h5")}).find("exact match"), std::string::npos);
  // Every head's attention, by kind: one file with three groups, one page, a picture per kind.
  const std::string att = run({"attention", path("ck.h5"), "--prompt", "1234", "--out", path("att")});
  EXPECT_NE(att.find("1234 => "), std::string::npos) << att;
  {
    io::h5::Reader r(path("att/attention.h5"));
    const int64_t enc_S = r.read("encoder/weights").shape[2];
    const io::h5::Array cross = r.read("cross/weights");
    EXPECT_EQ(enc_S, 4);
    EXPECT_EQ(cross.shape[3], 4) << "cross-attention's keys are the source";
    EXPECT_EQ(cross.shape[2], r.read("decoder/weights").shape[2]) << "its queries the decoder's inputs";
    EXPECT_EQ(r.read("cross/key_token_ids").as<int64_t>(), r.read("encoder/token_ids").as<int64_t>());
    EXPECT_EQ(r.attr_str("cross", "kind"), "encoder-decoder (cross) attention");
  }
  EXPECT_TRUE(fs::exists(path("att/attention.html")));  // the three kinds on one page (tests/test_explorer.cpp)
  for (const char* kind : {"encoder", "decoder", "cross"})
    EXPECT_TRUE(fs::exists(path("att/attention_") + kind + ".png")) << kind;
  // What only the GPT has says so.
  EXPECT_NE(run({"heads", path("ck.h5"), "--batches", "1"}, 1).find("needs a decoder-only model"), std::string::npos);
  EXPECT_NE(run({"train", "--task", "numbers", "--steps", "1", "--out", path("x")}, 1).find("--arch encoder-decoder"),
            std::string::npos);
}

}  // namespace
