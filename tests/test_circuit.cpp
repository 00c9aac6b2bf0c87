// Circuits (analysis/circuit.h): the graph forward against the model's, patched edges against patching
// done naively (one forward per patch set, through the split heads' own modules), edge attribution
// against the slope of patching, and discovery on a model with a planted circuit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "analysis/circuit.h"
#include "analysis/circuit_internal.h"
#include "core_test_util.h"
#include "nn/decoder_family.h"
#include "tiny_models.h"

namespace headlab {
namespace {

using analysis::CircuitGraph;
using analysis::CircuitPatcher;
using analysis::EdgePatch;
using analysis::PromptPairs;
using testing::tiny_gpt_config;
using Input = CircuitGraph::Input;

// Random prompt pairs: clean and corrupted rows of independent random tokens.
PromptPairs random_pairs(int64_t vocab, int64_t rows, int64_t T, uint64_t seed) {
  PromptPairs p = analysis::induction_prompt_pairs(vocab, rows, (T + 1) / 2, seed);
  p.T = 2 * ((T + 1) / 2) - 1;
  return p;
}

// The same rows scored by the probability metric: candidates 0..5, each row's signs drawn.
PromptPairs with_probability_metric(PromptPairs p, uint64_t seed) {
  p.candidates = {0, 1, 2, 3, 4, 5};
  Generator gen(seed);
  for (double u : rand({p.rows(), 6}, gen, DType::f64).to_vector<double>()) p.weights.push_back(u < 0.5 ? 1.0 : -1.0);
  return p;
}

// The logit difference of every row with the edges in `patched` patched, computed the slow way: the
// model run module by module, every receiver's input summed from the senders' outputs (this run's,
// or the corrupted run's for a patched edge), each head through its own CausalAttention module of
// split_heads(). corrupt: the corrupted run's node outputs (empty for an unpatched run). Node `restored`
// (-1: none) outputs restored_out[restored] instead of what it computes (at position `at` only when that
// is >= 0). Fills outputs.
std::vector<double> naive_run(nn::DecoderModel& model, const CircuitGraph& g, const std::vector<int64_t>& tokens,
                              const PromptPairs& pairs, const std::set<int64_t>& patched,
                              const std::vector<Tensor>& corrupt, std::vector<Tensor>& outputs, int64_t restored = -1,
                              const std::vector<Tensor>& restored_out = {}, int64_t at = -1) {
  const NoGradGuard ng;
  const int64_t B = pairs.rows(), T = pairs.T;
  outputs.assign(1, model.embed(tensor(tokens, {B, T})));
  const auto restore_last = [&](size_t added) {  // the node just added, if it is the restored one
    if (restored < static_cast<int64_t>(outputs.size() - added) || restored >= static_cast<int64_t>(outputs.size()))
      return;
    Tensor& out = outputs[static_cast<size_t>(restored)];
    const Tensor& clean = restored_out[static_cast<size_t>(restored)];
    if (at < 0) {
      out = clean;
    } else {
      std::vector<double> m(static_cast<size_t>(T), 0.0);
      m[static_cast<size_t>(at)] = 1.0;
      out = add(out, mul(tensor(m, {1, T, 1}).to(DType::f64), sub(clean, out)));
    }
  };
  restore_last(1);
  Tensor biases = zeros_like(outputs[0]);
  const auto input_of = [&](int64_t receiver) {
    Tensor x = biases;
    for (int64_t s = 0; s < g.receivers()[static_cast<size_t>(receiver)].senders; ++s)
      x = add(x,
              patched.count(g.edge(s, receiver)) ? corrupt[static_cast<size_t>(s)] : outputs[static_cast<size_t>(s)]);
    return x;
  };
  const auto receiver_of = [&](int64_t layer, int64_t head, Input in) {
    for (size_t r = 0; r < g.receivers().size(); ++r)
      if (g.receivers()[r].layer == layer && g.receivers()[r].head == head && g.receivers()[r].input == in)
        return static_cast<int64_t>(r);
    ADD_FAILURE() << "no receiver";
    return int64_t{0};
  };
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    const auto block = model.block(l);
    const auto split = block->att->split_heads();
    const int64_t D = split->d_out;
    std::vector<Tensor> outs;
    for (int64_t h = 0; h < split->num_heads; ++h) {
      auto& head = dynamic_cast<nn::CausalAttention&>(*split->heads->at(static_cast<size_t>(h)));
      const auto read = [&](Input in, nn::Linear& proj) {
        return proj.forward(block->norm1->forward(input_of(receiver_of(l, h, in))));
      };
      const Tensor q = read(Input::q, *head.W_query), k = read(Input::k, *head.W_key),
                   v = read(Input::v, *head.W_value);
      const Tensor w = causal_softmax(matmul(q, k.mT()), 1.0 / std::sqrt(static_cast<double>(D)));  // (B, T, T)
      outs.push_back(matmul(matmul(w, v), split->out_proj->weight.narrow(1, h * D, D).mT()));       // (B, T, C)
    }
    for (const Tensor& o : outs) outputs.push_back(o);
    restore_last(outs.size());
    biases = add(biases, split->out_proj->bias);
    if (block->ff) {
      outputs.push_back(block->ff->forward(block->norm2->forward(input_of(receiver_of(l, -1, Input::mlp)))));
      restore_last(1);
    }
  }
  const std::vector<double> logits =
      model.unembed(input_of(receiver_of(model.n_layers(), -1, Input::logits))).narrow(1, T - 1, 1).to_vector<double>();
  const int64_t V = model.config().vocab_size;
  std::vector<double> ld;
  for (int64_t r = 0; r < B; ++r)
    ld.push_back(logits[static_cast<size_t>(r * V + pairs.answer[static_cast<size_t>(r)])] -
                 logits[static_cast<size_t>(r * V + pairs.wrong[static_cast<size_t>(r)])]);
  return ld;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

TEST(Circuit, GraphNamesEdgesAndParsesNames) {
  nn::DecoderModel model(tiny_gpt_config(testing::kThreeHeadGpt));
  const CircuitGraph g(model);
  // nodes: embed, L0H0..2, MLP0, L1H0..2, MLP1; receivers: 9 + 1 per layer, logits
  ASSERT_EQ(g.node_count(), 9);
  ASSERT_EQ(g.receivers().size(), 21u);
  EXPECT_EQ(g.edge_count(), 9 * 1 + 1 * 4 + 9 * 5 + 1 * 8 + 9);
  EXPECT_EQ(g.node_name(4), "MLP0");
  EXPECT_EQ(g.receiver_name(g.parse_receivers("L1H2.k", "t").front()), "L1H2.k");
  EXPECT_EQ(g.parse_receivers("L1H2", "t").size(), 3u);
  const int64_t e = g.edge(g.parse_node("L0H1", "t"), g.parse_receivers("L1H2.k", "t").front());
  ASSERT_GE(e, 0);
  EXPECT_EQ(g.edge_name(e), "L0H1 -> L1H2.k");
  EXPECT_EQ(g.edge(g.parse_node("L1H0", "t"), g.parse_receivers("L1H2.q", "t").front()), -1);  // same layer
  EXPECT_ERROR(g.parse_node("L7H0", "circuit"), "circuit: the model has no node 'L7H0'");
  EXPECT_ERROR(g.parse_receivers("L0H0.x", "circuit"), "circuit: the model has no receiver 'L0H0.x'");
  nn::DecoderModel pruned(testing::pruned(tiny_gpt_config(testing::kThreeHeadGpt), testing::kPrunedHeads));
  EXPECT_EQ(CircuitGraph(pruned).node_name(2), "L0H2");  // original head indices
}

TEST(Circuit, ForwardIsTheModelsAndPatchingEveryEdgeIsTheCorruptedRun) {
  for (const auto& [name, cfg] : testing::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    manual_seed(3);
    nn::DecoderModel model(cfg);
    model.to(DType::f64);
    const PromptPairs logit_pairs = random_pairs(cfg.vocab_size, 5, cfg.context_length - 1, 11);
    for (const PromptPairs& pairs : {logit_pairs, with_probability_metric(logit_pairs, 2)}) {
      SCOPED_TRACE(pairs.probability_metric() ? "probability difference" : "logit difference");
      const analysis::LogitDifference expected = analysis::logit_difference(model, pairs);
      analysis::CircuitOptions o;
      o.chunk_rows = 2;  // three chunks, the last of one row
      CircuitPatcher patcher(model, pairs, o);
      for (size_t r = 0; r < expected.clean.size(); ++r) {
        EXPECT_NEAR(patcher.baseline().clean[r], expected.clean[r], 1e-10);
        EXPECT_NEAR(patcher.baseline().corrupt[r], expected.corrupt[r], 1e-10);
      }
      const auto E = static_cast<size_t>(patcher.graph().edge_count());
      const std::vector<double> m = patcher.metric({EdgePatch(E, 0.0), EdgePatch(E, 1.0)});
      EXPECT_NEAR(m[0], 1.0, 1e-9);
      EXPECT_NEAR(m[1], 0.0, 1e-9);
    }
  }
}

TEST(Circuit, PatchedEdgesAndPathPatchingMatchNaivePatching) {
  for (const auto& [name, cfg] : testing::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    manual_seed(4);
    nn::DecoderModel model(cfg);
    model.to(DType::f64);
    model.eval();
    const PromptPairs pairs = random_pairs(cfg.vocab_size, 4, cfg.context_length - 1, 12);
    const CircuitGraph g(model);
    std::vector<Tensor> clean_out, corrupt_out;
    const double clean = mean(naive_run(model, g, pairs.clean, pairs, {}, {}, clean_out));
    const double corrupt = mean(naive_run(model, g, pairs.corrupt, pairs, {}, {}, corrupt_out));
    const auto naive = [&](const std::set<int64_t>& patched) {
      std::vector<Tensor> outs;
      return (mean(naive_run(model, g, pairs.clean, pairs, patched, corrupt_out, outs)) - corrupt) / (clean - corrupt);
    };
    analysis::CircuitOptions o;
    o.chunk_rows = 3, o.max_copies = 2;  // copies and chunks split unevenly
    CircuitPatcher patcher(model, pairs, o);
    // Random sets of a third of the edges, single edges into every kind of receiver.
    Generator gen(7);
    std::vector<std::set<int64_t>> sets;
    for (int i = 0; i < 3; ++i) {
      const std::vector<double> u = rand({g.edge_count()}, gen, DType::f64).to_vector<double>();
      std::set<int64_t>& s = sets.emplace_back();
      for (size_t e = 0; e < u.size(); ++e)
        if (u[e] < 1.0 / 3) s.insert(static_cast<int64_t>(e));
    }
    const std::string l1 = g.node_name(g.first_node_of_layer(1));  // layer 1's first head
    for (const std::string& r : {l1 + ".q", l1 + ".k", l1 + ".v", std::string("logits")})
      sets.push_back({g.edge(1, g.parse_receivers(r, "t")[0])});  // from layer 0's first head
    std::set<int64_t>& noising = sets.emplace_back();             // layer 0's first head corrupted for every receiver
    for (int64_t e = 0; e < g.edge_count(); ++e)
      if (g.edge_sender(e) == 1) noising.insert(e);
    std::vector<EdgePatch> patches;
    for (const auto& s : sets) {
      EdgePatch& p = patches.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
      for (int64_t e : s) p[static_cast<size_t>(e)] = 1.0;
    }
    const std::vector<double> got = patcher.metric(patches);
    for (size_t i = 0; i < sets.size(); ++i) EXPECT_NEAR(got[i], naive(sets[i]), 1e-9) << i;

    // Path patching: each layer-0 node's edges into every receiver of L1's first head and the logits.
    std::vector<int64_t> receivers = g.parse_receivers(g.node_name(g.first_node_of_layer(1)), "t");
    receivers.push_back(g.parse_receivers("logits", "t")[0]);
    std::vector<int64_t> senders;
    for (int64_t n = 0; n < g.first_node_of_layer(1); ++n) senders.push_back(n);
    const std::vector<double> pp = analysis::path_patching(patcher, senders, receivers);
    for (size_t i = 0; i < senders.size(); ++i) {
      std::set<int64_t> s;
      for (int64_t r : receivers) s.insert(g.edge(senders[i], r));
      EXPECT_NEAR(pp[i], naive(s), 1e-9) << g.node_name(senders[i]);
    }

    // Activation patching of every node: noising (its edges into every receiver patched) and denoising (the
    // corrupted run with the node's clean output restored, computed naively as exactly that).
    std::vector<int64_t> nodes(static_cast<size_t>(g.node_count()));
    std::iota(nodes.begin(), nodes.end(), 0);
    const analysis::ActivationPatching act = analysis::activation_patching(patcher, nodes, true);
    for (int64_t n : nodes) {
      std::set<int64_t> from_n;
      for (int64_t e = 0; e < g.edge_count(); ++e)
        if (g.edge_sender(e) == n) from_n.insert(e);
      EXPECT_NEAR(act.noising[static_cast<size_t>(n)], naive(from_n), 1e-9) << g.node_name(n);
      std::vector<Tensor> outs;
      const double restored = mean(naive_run(model, g, pairs.corrupt, pairs, {}, {}, outs, n, clean_out));
      EXPECT_NEAR(act.denoising[static_cast<size_t>(n)], (restored - corrupt) / (clean - corrupt), 1e-9)
          << g.node_name(n);
      for (int64_t t = 0; t < pairs.T; ++t) {
        const double at = mean(naive_run(model, g, pairs.corrupt, pairs, {}, {}, outs, n, clean_out, t));
        EXPECT_NEAR(act.denoising_by_position[static_cast<size_t>(n)][static_cast<size_t>(t)],
                    (at - corrupt) / (clean - corrupt), 1e-9)
            << g.node_name(n) << " at " << t;
        // noising at t: the clean run with the node's corrupted output there
        const double noised = mean(naive_run(model, g, pairs.clean, pairs, {}, {}, outs, n, corrupt_out, t));
        EXPECT_NEAR(act.noising_by_position[static_cast<size_t>(n)][static_cast<size_t>(t)],
                    (noised - corrupt) / (clean - corrupt), 1e-9)
            << g.node_name(n) << " at " << t;
      }
    }
    EXPECT_NEAR(act.denoising[0], 1.0, 1e-9);  // the clean embeddings restored: the clean run

    // Zero and mean ablation of every node in the clean run, naively: its output replaced by zeros, or by
    // its clean output's mean over the rows at each position.
    const analysis::NodeAblation abl = analysis::ablate_nodes(patcher, nodes);
    for (int64_t n : nodes) {
      const auto i = static_cast<size_t>(n);
      std::vector<Tensor> zeros_out(clean_out.size()), mean_out(clean_out.size()), outs;
      zeros_out[i] = zeros_like(clean_out[i]);
      mean_out[i] = clean_out[i].mean({0}, true).expand(clean_out[i].shape()).contiguous();
      const double zeroed = mean(naive_run(model, g, pairs.clean, pairs, {}, {}, outs, n, zeros_out));
      const double averaged = mean(naive_run(model, g, pairs.clean, pairs, {}, {}, outs, n, mean_out));
      EXPECT_NEAR(abl.zero[i], (zeroed - corrupt) / (clean - corrupt), 1e-9) << g.node_name(n);
      EXPECT_NEAR(abl.mean[i], (averaged - corrupt) / (clean - corrupt), 1e-9) << g.node_name(n);
    }

    // Direct logit attribution: the clean logit difference, and each node's output at the last position
    // through the final norm with the clean run's scale, along answer - wrong, done by hand here.
    const analysis::DirectLogitAttribution dla = patcher.direct_logit_attribution();
    EXPECT_NEAR(dla.clean, clean, 1e-9);
    double total = dla.constant;
    for (double v : dla.node) total += v;
    EXPECT_NEAR(total, clean, 1e-9);  // the parts sum to the whole
    {
      const NoGradGuard ng;
      const int64_t B = pairs.rows(), T = pairs.T, C = cfg.emb_dim;
      Tensor resid = zeros({B, C}, DType::f64);
      for (const Tensor& o : clean_out) resid = add(resid, o.select(1, T - 1));
      for (int64_t l = 0; l < model.n_layers(); ++l)
        resid = add(resid, model.block(l)->att->split_heads()->out_proj->bias);
      const std::vector<double> x = resid.to_vector<double>();
      const std::vector<double> w = model.final_norm->weight.to_vector<double>();
      const std::vector<double> W_U = model.out_head->weight.to_vector<double>();
      for (int64_t n : nodes) {
        const std::vector<double> o =
            clean_out[static_cast<size_t>(n)].select(1, T - 1).contiguous().to_vector<double>();
        double expected = 0;
        for (int64_t b = 0; b < B; ++b) {
          double mx = 0, mo = 0, var = 0;
          for (int64_t k = 0; k < C; ++k) mx += x[b * C + k] / C, mo += o[b * C + k] / C;
          for (int64_t k = 0; k < C; ++k) var += (x[b * C + k] - mx) * (x[b * C + k] - mx) / C;
          const double sigma = std::sqrt(var + model.final_norm->eps);
          const int64_t a = pairs.answer[static_cast<size_t>(b)], z = pairs.wrong[static_cast<size_t>(b)];
          for (int64_t k = 0; k < C; ++k)
            expected += (o[b * C + k] - mo) / sigma * w[k] * (W_U[a * C + k] - W_U[z * C + k]) / B;
        }
        EXPECT_NEAR(dla.node[static_cast<size_t>(n)], expected, 1e-9) << g.node_name(n);
      }
    }
  }
}

// A chunk whose runs are all stored keeps them in the stored budget, not in one forward's: more rows a
// chunk than where they are made again in every pass; edge attribution's backward counts them always.
TEST(Circuit, StoredRunsTakeNoRoomInAForwardsBudget) {
  const nn::DecoderConfig cfg = tiny_gpt_config(testing::kThreeHeadGpt);
  manual_seed(5);
  nn::DecoderModel model(cfg);
  const auto rows_a_chunk = [&](int64_t stored_rows, bool backward) {
    analysis::CircuitOptions o;
    o.stored_rows = stored_rows;
    CircuitPatcher::Impl s(model, o);
    s.rows = 64;
    return s.chunk_rows(cfg.context_length, backward);
  };
  const int64_t all_stored = rows_a_chunk(64, false), made_again = rows_a_chunk(63, false);
  EXPECT_GT(all_stored, made_again);
  EXPECT_GT(made_again, 0);
  EXPECT_EQ(rows_a_chunk(64, true), rows_a_chunk(63, true));
}

// Chunks past stored_rows are run again in every pass: the same numbers, bit for bit, with none, some or all
// of the runs stored (memory bounded by the option, not by the rows).
TEST(Circuit, RunsNotStoredAreMadeAgainToTheSameNumbers) {
  const nn::DecoderConfig cfg = tiny_gpt_config(testing::kThreeHeadGpt);
  manual_seed(5);
  nn::DecoderModel model(cfg);
  model.to(DType::f64);
  const PromptPairs pairs = random_pairs(cfg.vocab_size, 6, cfg.context_length - 1, 13);
  const auto run = [&](int64_t stored, int64_t expect_stored) {
    analysis::CircuitOptions o;
    o.chunk_rows = 2, o.stored_rows = stored;  // three chunks of two rows
    CircuitPatcher patcher(model, pairs, o);
    EXPECT_EQ(patcher.stored_rows(), expect_stored);
    EXPECT_EQ(patcher.own_rows(), 6);
    EXPECT_EQ(analysis::stored_runs_text(patcher).empty(), expect_stored == 6);
    const CircuitGraph& g = patcher.graph();
    std::vector<int64_t> nodes(static_cast<size_t>(g.node_count()));
    std::iota(nodes.begin(), nodes.end(), 0);
    std::vector<double> all;
    for (const auto& v :
         {analysis::ablate_nodes(patcher, nodes).mean, analysis::ablate_nodes(patcher, nodes).zero,
          analysis::activation_patching(patcher, nodes).denoising, patcher.direct_logit_attribution().node})
      all.insert(all.end(), v.begin(), v.end());
    EXPECT_EQ(patcher.rerun_rows() > 0, expect_stored < 6);
    return all;
  };
  const std::vector<double> stored = run(0, 6);
  EXPECT_EQ(run(1, 0), stored);  // a chunk of two rows does not fit one: none stored
  EXPECT_EQ(run(3, 2), stored);  // one chunk stored, two run again
}

// Every third edge's attribution against the slope of patching it (central differences; float64 models).
void expect_attribution_is_the_slope(nn::DecoderModel& model, const PromptPairs& pairs,
                                     const analysis::EdgeAttribution& eap) {
  CircuitPatcher patcher(model, pairs);
  const CircuitGraph& g = patcher.graph();
  ASSERT_EQ(static_cast<int64_t>(eap.effect.size()), g.edge_count());
  for (int64_t e = 0; e < g.edge_count(); e += 3) {
    const double eps = 1e-5;
    EdgePatch up(static_cast<size_t>(g.edge_count()), 0.0), down = up;
    up[static_cast<size_t>(e)] = eps, down[static_cast<size_t>(e)] = -eps;
    const std::vector<double> m = patcher.metric({up, down});
    const double slope = (m[0] - m[1]) / (2 * eps);
    EXPECT_NEAR(eap.effect[static_cast<size_t>(e)], slope, 1e-7 + 1e-6 * std::abs(slope)) << g.edge_name(e);
  }
}

TEST(Circuit, EdgeAttributionIsTheSlopeOfPatching) {
  for (const auto& [name, cfg] : testing::analysis_gpt_forms()) {
    SCOPED_TRACE(name);
    manual_seed(5);
    nn::DecoderModel model(cfg);
    model.to(DType::f64);
    for (const PromptPairs& pairs :
         {random_pairs(cfg.vocab_size, 4, cfg.context_length - 1, 13),
          with_probability_metric(random_pairs(cfg.vocab_size, 4, cfg.context_length - 1, 13), 3)}) {
      SCOPED_TRACE(pairs.probability_metric() ? "probability difference" : "logit difference");
      analysis::CircuitOptions one_row;
      one_row.chunk_rows = 1;
      const analysis::EdgeAttribution eap = analysis::edge_attribution(model, pairs);
      const analysis::EdgeAttribution eap_rows = analysis::edge_attribution(model, pairs, 0, one_row);
      const analysis::EdgeAttribution ig1 = analysis::edge_attribution(model, pairs, 1);
      const analysis::EdgeAttribution ig4 = analysis::edge_attribution(model, pairs, 4);
      expect_attribution_is_the_slope(model, pairs, eap);
      double ig_gap = 0;
      for (size_t e = 0; e < eap.effect.size(); ++e) {
        EXPECT_NEAR(eap_rows.effect[e], eap.effect[e], 1e-12) << e;
        EXPECT_NEAR(ig1.effect[e], eap.effect[e], 1e-12) << e;  // one step: alpha = 1, the clean run
        ig_gap = std::max(ig_gap, std::abs(ig4.effect[e] - eap.effect[e]));
      }
      EXPECT_GT(ig_gap, 1e-6);  // more steps average other gradients
    }
  }
}

// The attention's receivers' gradients go back through each head's projection rows and the layer's norm
// after the backward: RMSNorm, rotary on every dimension and grouped keys (LLaMA); LayerNorm with bias,
// rotary on part of each head and the parallel residual (GPT-NeoX).
TEST(Circuit, EdgeAttributionIsTheSlopeOfPatchingInTheLlamaAndNeoXFamilies) {
  nn::DecoderConfig lc = nn::llama_family().config();
  lc.vocab_size = 23, lc.context_length = 9, lc.emb_dim = 16, lc.n_heads = 4, lc.n_kv_heads = 2;
  lc.n_layers = 2, lc.hidden_dim = 24;
  nn::DecoderConfig nc = nn::neox_family().config();
  nc.vocab_size = 29, nc.context_length = 9, nc.emb_dim = 24, nc.n_heads = 3, nc.n_layers = 2, nc.hidden_dim = 40;
  nc.rotary_dims = 2, nc.rope_theta = 500.0, nc.parallel_residual = true;
  manual_seed(7);
  nn::DecoderModel llama(lc);
  nn::DecoderModel neox(nc);
  for (nn::DecoderModel* model : {static_cast<nn::DecoderModel*>(&llama), static_cast<nn::DecoderModel*>(&neox)}) {
    SCOPED_TRACE(model->type_name());
    model->to(DType::f64);
    const PromptPairs pairs = random_pairs(model->shape().vocab_size, 4, 8, 19);
    expect_attribution_is_the_slope(*model, pairs, analysis::edge_attribution(*model, pairs));
  }
}

// A grouped-query layer's keys and values are one receiver per key/value group. Its model is the multi-head model
// whose key/value weights repeat per group, so patching an edge into a group's k (or v) must equal patching that
// edge into the k (or v) of every head of the group there, and its attribution the sum of theirs.
TEST(Circuit, GroupedQueryReceiversAreTheirGroupsHeadsInTheMultiHeadTwin) {
  nn::DecoderConfig c = nn::llama_family().config();
  c.vocab_size = 23, c.context_length = 9, c.emb_dim = 16, c.n_heads = 4, c.n_kv_heads = 2;
  c.n_layers = 2, c.hidden_dim = 24;
  manual_seed(6);
  nn::DecoderModel gqa(c);
  c.n_kv_heads = 4;
  nn::DecoderModel mha(c);
  gqa.to(DType::f64), mha.to(DType::f64);
  {
    const NoGradGuard no_grad;
    const NamedTensors from = gqa.named_parameters();
    for (const auto& [name, t] : mha.named_parameters()) {
      Tensor src;
      for (const auto& [n2, t2] : from)
        if (n2 == name) src = t2;
      if (name.find("W_key") != std::string::npos || name.find("W_value") != std::string::npos)
        src = src.view({2, 1, 4, 16}).expand({2, 2, 4, 16}).reshape({16, 16});  // kv head j serves heads 2j, 2j+1
      t.detach().copy_(src);
    }
  }
  const PromptPairs pairs = random_pairs(c.vocab_size, 5, c.context_length - 1, 17);
  CircuitPatcher pg(gqa, pairs), pm(mha, pairs);
  const CircuitGraph &g = pg.graph(), &m = pm.graph();
  ASSERT_EQ(g.node_count(), m.node_count());
  // Per layer: 4 q receivers and 2 + 2 for the groups' k and v (the twin: 12), one MLP; then the logits.
  ASSERT_EQ(g.receivers().size(), 2u * (4 + 2 + 2 + 1) + 1);
  EXPECT_EQ(g.receiver_name(g.parse_receivers("L1G1.k", "t").front()), "L1G1.k");
  EXPECT_EQ(g.parse_receivers("L1G1", "t").size(), 2u);
  const std::vector<int64_t> h3 = g.parse_receivers("L1H3", "t");  // its q, and its group's k and v
  ASSERT_EQ(h3.size(), 3u);
  EXPECT_EQ(g.receiver_name(h3[1]), "L1G1.k");
  EXPECT_EQ(g.nodes_of_receiver(h3[1]), (std::vector<int64_t>{g.parse_node("L1H2", "t"), g.parse_node("L1H3", "t")}));
  EXPECT_ERROR(g.parse_receivers("L1G2", "circuit"), "circuit: the model has no receiver 'L1G2'");

  // The twin's edges for each of ours: the same sender into the same receiver, or into each head of the group.
  const auto twin_edges = [&](int64_t e) {
    const int64_t r = g.edge_receiver(e), s = g.edge_sender(e);
    const CircuitGraph::Receiver& rc = g.receivers()[static_cast<size_t>(r)];
    std::vector<int64_t> out;
    if (rc.input == Input::k || rc.input == Input::v) {
      for (int64_t n : g.nodes_of_receiver(r)) {
        const std::string head = g.node_name(n) + (rc.input == Input::k ? ".k" : ".v");
        out.push_back(m.edge(s, m.parse_receivers(head, "t").front()));
      }
    } else {
      out.push_back(m.edge(s, m.parse_receivers(g.receiver_name(r), "t").front()));
    }
    return out;
  };
  Generator gen(8);
  std::vector<EdgePatch> ours, theirs;
  for (int i = 0; i < 4; ++i) {
    const std::vector<double> u = rand({g.edge_count()}, gen, DType::f64).to_vector<double>();
    EdgePatch& a = ours.emplace_back(static_cast<size_t>(g.edge_count()), 0.0);
    EdgePatch& b = theirs.emplace_back(static_cast<size_t>(m.edge_count()), 0.0);
    for (int64_t e = 0; e < g.edge_count(); ++e)
      if (u[static_cast<size_t>(e)] < (i == 0 ? 1.0 : 0.3)) {  // the first: every edge, the corrupted run
        a[static_cast<size_t>(e)] = 1.0;
        for (int64_t t : twin_edges(e)) b[static_cast<size_t>(t)] = 1.0;
      }
  }
  const std::vector<double> got = pg.metric(ours), want = pm.metric(theirs);
  EXPECT_NEAR(got[0], 0.0, 1e-9);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-9) << i;

  const analysis::EdgeAttribution ea = analysis::edge_attribution(gqa, pairs),
                                  eb = analysis::edge_attribution(mha, pairs);
  for (int64_t e = 0; e < g.edge_count(); ++e) {
    double sum = 0;
    for (int64_t t : twin_edges(e)) sum += eb.effect[static_cast<size_t>(t)];
    EXPECT_NEAR(ea.effect[static_cast<size_t>(e)], sum, 1e-9) << g.edge_name(e);
  }
  std::vector<int64_t> nodes(static_cast<size_t>(g.node_count()));
  std::iota(nodes.begin(), nodes.end(), 0);
  const analysis::ActivationPatching pa = analysis::activation_patching(pg, nodes),
                                     pb = analysis::activation_patching(pm, nodes);
  for (size_t n = 0; n < nodes.size(); ++n) {
    EXPECT_NEAR(pa.noising[n], pb.noising[n], 1e-9) << g.node_name(static_cast<int64_t>(n));
    EXPECT_NEAR(pa.denoising[n], pb.denoising[n], 1e-9) << g.node_name(static_cast<int64_t>(n));
  }
}

TEST(Circuit, DiscoveryFindsExactlyThePlantedInductionCircuit) {
  const auto model = testing::planted_induction_gpt();
  const PromptPairs pairs = analysis::induction_prompt_pairs(testing::kPlantedVocab, 16, 8, 21);
  CircuitPatcher patcher(*model, pairs);
  EXPECT_GT(patcher.baseline().clean_mean - patcher.baseline().corrupt_mean, 5.0);
  const analysis::EdgeAttribution eap = analysis::edge_attribution(*model, pairs);
  const std::set<std::string> expected = {"embed -> L0H0.v", "L0H0 -> L1H0.k", "embed -> L1H0.q", "embed -> L1H0.v",
                                          "L1H0 -> logits"};
  for (bool plain : {false, true}) {
    SCOPED_TRACE(plain ? "plain ACDC" : "attribution order");
    analysis::DiscoveryOptions o;
    o.plain_acdc = plain;
    const analysis::Circuit c = analysis::discover_circuit(patcher, eap.effect, o);
    std::set<std::string> found;
    for (int64_t e = 0; e < patcher.graph().edge_count(); ++e)
      if (c.kept[static_cast<size_t>(e)]) found.insert(patcher.graph().edge_name(e));
    EXPECT_EQ(found, expected);
    EXPECT_GT(c.metric, 0.9);
    if (plain) {
      EXPECT_EQ(c.tests, patcher.graph().edge_count() + 2);
    }
    const std::string json = analysis::circuit_json(patcher.graph(), c, patcher.baseline());
    EXPECT_NE(json.find("\"receiver\": \"L1H0\""), std::string::npos);
    const std::string dot = analysis::circuit_dot(patcher.graph(), c);
    EXPECT_NE(dot.find("\"L0H0\" -> \"L1H0\" [color=\"#2ca02c\", label=\"k\"]"), std::string::npos) << dot;
  }
}

TEST(Circuit, BadInputIsRefusedClearly) {
  nn::DecoderModel model(tiny_gpt_config(testing::kTwoHeadGpt));
  PromptPairs long_rows = random_pairs(13, 2, 11, 1);
  EXPECT_ERROR(CircuitPatcher(model, long_rows), "circuit: prompts of 11 tokens do not fit the model's context of 10");
  PromptPairs bad = random_pairs(13, 2, 5, 1);
  bad.answer[1] = 99;
  EXPECT_ERROR(analysis::edge_attribution(model, bad),
               "edge_attribution: answer token 99 (at 1) is outside the vocabulary of 13");
  PromptPairs same = random_pairs(13, 2, 5, 1);
  same.wrong = same.answer;  // a logit difference of 0 in both runs
  EXPECT_ERROR(CircuitPatcher(model, same), "the clean and corrupted runs score the same");
  same.corrupt = same.clean;  // refused before any run
  EXPECT_ERROR(CircuitPatcher(model, same), "circuit: every clean prompt equals its corrupted one");
  CircuitPatcher p(model, random_pairs(13, 2, 5, 1));
  analysis::DiscoveryOptions o;
  o.tau = -1;
  EXPECT_ERROR(analysis::discover_circuit(p, std::vector<double>(3), o),
               "discover_circuit: the attribution lists 3 edges");
  EXPECT_ERROR(analysis::discover_circuit(p, std::vector<double>(static_cast<size_t>(p.graph().edge_count())), o),
               "discover_circuit: tau must be a number >= 0, got -1");
}

}  // namespace
}  // namespace headlab
