// Parity of nn/ with PyTorch: every `kind: "module"` fixture of tests/fixtures/index.json is rebuilt
// from its config and parameters, run forward in float64 and float32, then backward with
// dout = loss_weight; output, attention weights and every input and parameter gradient are compared
// with PyTorch's (float64) answers. Prints the largest deviation per fixture and per module.
// (The GPT fixtures are test_gpt.cpp's.)
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/transformer.h"
#include "tests/fixture_util.h"

using namespace headlab;
using namespace headlab::testing;

namespace {

constexpr double kTolF64 = 1e-10;  // |a - b| <= tol * max(1, |b|)
constexpr double kTolF32 = 1e-5;

// A fixture's subject: the module (null for the masked_softmax function), how the fixture's call
// runs it on the inputs, and the attention weights it kept (undefined where there are none).
struct Subject {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(std::map<std::string, Tensor>&)> forward;
  std::function<Tensor()> weights = [] { return Tensor(); };
};

int64_t cfg_i(const nlohmann::json& c, const char* k) { return c.at(k).get<int64_t>(); }
double cfg_d(const nlohmann::json& c, const char* k) { return c.at(k).get<double>(); }
bool cfg_b(const nlohmann::json& c, const char* k) { return c.at(k).get<bool>(); }

Tensor opt(std::map<std::string, Tensor>& in, const char* name) {
  auto it = in.find(name);
  return it == in.end() ? Tensor() : it->second;
}

// d2l's Transformer blocks: the config holds exactly nn::BlockSizes' fields (plus "i" for a decoder block).
nn::BlockSizes block_sizes(const nlohmann::json& c) {
  nn::BlockSizes s;
  s.key_size = cfg_i(c, "key_size");
  s.query_size = cfg_i(c, "query_size");
  s.value_size = cfg_i(c, "value_size");
  s.num_hiddens = cfg_i(c, "num_hiddens");
  s.norm_shape = cfg_i(c, "norm_shape");
  s.ffn_num_input = cfg_i(c, "ffn_num_input");
  s.ffn_num_hiddens = cfg_i(c, "ffn_num_hiddens");
  s.num_heads = cfg_i(c, "num_heads");
  s.dropout = cfg_d(c, "dropout");
  s.use_bias = cfg_b(c, "use_bias");
  return s;
}

// Labels at positions >= their row's valid length become kIgnoreIndex: cross_entropy's mean over the rest is
// d2l's masked loss per valid token. label: (B, T) int64, valid_len: (B,) int64.
Tensor mask_labels(const Tensor& label, const Tensor& valid_len) {
  std::vector<int64_t> ids = label.to_vector<int64_t>();
  const std::vector<int64_t> lens = valid_len.to_vector<int64_t>();
  const int64_t T = label.size(1);
  for (size_t k = 0; k < ids.size(); ++k)
    if (static_cast<int64_t>(k) % T >= lens[k / static_cast<size_t>(T)]) ids[k] = kIgnoreIndex;
  return tensor(ids, label.shape());
}

Subject build(const FixtureEntry& e) {
  const nlohmann::json& c = e.config;
  Subject s;
  if (e.module == "masked_softmax") {
    s.forward = [](auto& in) { return masked_softmax(in.at("x"), opt(in, "valid_lens")); };
  } else if (e.module == "DotProductAttention") {
    auto m = std::make_shared<nn::DotProductAttention>(cfg_d(c, "dropout"));
    s.module = m;
    s.forward = [m](auto& in) {
      return m->forward(in.at("queries"), in.at("keys"), in.at("values"), opt(in, "valid_lens"));
    };
    s.weights = [m] { return m->attention_weights; };
  } else if (e.module == "AdditiveAttention") {
    auto m = std::make_shared<nn::AdditiveAttention>(cfg_i(c, "key_size"), cfg_i(c, "query_size"),
                                                     cfg_i(c, "num_hiddens"), cfg_d(c, "dropout"));
    s.module = m;
    s.forward = [m](auto& in) {
      return m->forward(in.at("queries"), in.at("keys"), in.at("values"), opt(in, "valid_lens"));
    };
    s.weights = [m] { return m->attention_weights; };
  } else if (e.module == "MultiHeadAttention") {
    auto m = std::make_shared<nn::MultiHeadAttention>(cfg_i(c, "key_size"), cfg_i(c, "query_size"),
                                                      cfg_i(c, "value_size"), cfg_i(c, "num_hiddens"),
                                                      cfg_i(c, "num_heads"), cfg_d(c, "dropout"), cfg_b(c, "bias"));
    s.module = m;
    if (e.call == "module(x, x, x, valid_lens, gates)")
      s.forward = [m](auto& in) {
        const Tensor& x = in.at("x");
        return m->forward(x, x, x, opt(in, "valid_lens"), in.at("gates"));
      };
    else
      s.forward = [m](auto& in) {
        return m->forward(in.at("queries"), in.at("keys"), in.at("values"), opt(in, "valid_lens"), in.at("gates"));
      };
    s.weights = [m] { return m->attention_weights; };
  } else if (e.module == "CausalAttention") {
    auto m = std::make_shared<nn::CausalAttention>(cfg_i(c, "d_in"), cfg_i(c, "d_out"), cfg_i(c, "context_length"),
                                                   cfg_d(c, "dropout"), cfg_b(c, "qkv_bias"));
    m->keep_attention_weights = true;
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
    s.weights = [m] { return m->attention_weights; };
  } else if (e.module == "MultiHeadAttentionWrapper" || e.module == "CausalMultiHeadAttention") {
    std::shared_ptr<nn::CausalMultiHead> m;
    if (e.module == "MultiHeadAttentionWrapper")
      m = std::make_shared<nn::MultiHeadAttentionWrapper>(
          cfg_i(c, "d_in"), cfg_i(c, "d_out"), cfg_i(c, "context_length"), cfg_d(c, "dropout"), cfg_i(c, "num_heads"),
          cfg_b(c, "qkv_bias"), cfg_b(c, "out_proj"));
    else
      m = std::make_shared<nn::CausalMultiHeadAttention>(cfg_i(c, "d_in"), cfg_i(c, "d_out"),
                                                         cfg_i(c, "context_length"), cfg_d(c, "dropout"),
                                                         cfg_i(c, "num_heads"), cfg_b(c, "qkv_bias"));
    m->keep_attention_weights(true);
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x"), opt(in, "gates")); };
    s.weights = [m] { return m->last_attention_weights(); };
  } else if (e.module == "Linear") {
    auto m = std::make_shared<nn::Linear>(cfg_i(c, "in_features"), cfg_i(c, "out_features"), cfg_b(c, "bias"));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
  } else if (e.module == "Embedding") {
    auto m = std::make_shared<nn::Embedding>(cfg_i(c, "num_embeddings"), cfg_i(c, "embedding_dim"));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("idx")); };
  } else if (e.module == "LayerNorm" || e.module == "LayerNormBook") {
    const bool book = e.module == "LayerNormBook";
    auto m = std::make_shared<nn::LayerNorm>(cfg_i(c, book ? "emb_dim" : "normalized_shape"), cfg_d(c, "eps"),
                                             book ? nn::LayerNorm::Style::Book : nn::LayerNorm::Style::Torch);
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
  } else if (e.module == "GELU") {
    auto m = std::make_shared<nn::GELU>(c.at("approximate").get<std::string>() == "tanh");
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
  } else if (e.module == "FeedForward") {
    auto m = std::make_shared<nn::FeedForward>(cfg_i(c, "emb_dim"));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
  } else if (e.module == "PositionalEncoding") {
    auto m =
        std::make_shared<nn::PositionalEncoding>(cfg_i(c, "num_hiddens"), cfg_d(c, "dropout"), cfg_i(c, "max_len"));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
  } else if (e.module == "PositionWiseFFN") {
    auto m = std::make_shared<nn::PositionWiseFFN>(cfg_i(c, "ffn_num_input"), cfg_i(c, "ffn_num_hiddens"),
                                                   cfg_i(c, "ffn_num_outputs"));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x")); };
  } else if (e.module == "AddNorm") {
    auto m = std::make_shared<nn::AddNorm>(cfg_i(c, "normalized_shape"), cfg_d(c, "dropout"));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x"), in.at("y")); };
  } else if (e.module == "TransformerEncoderBlock") {
    auto m = std::make_shared<nn::TransformerEncoderBlock>(block_sizes(c));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("x"), opt(in, "valid_lens")); };
  } else if (e.module == "TransformerDecoderBlock") {
    auto m = std::make_shared<nn::TransformerDecoderBlock>(block_sizes(c), cfg_i(c, "i"));
    s.module = m;
    s.forward = [m](auto& in) {  // a lone block: its state has i + 1 empty caches
      nn::DecoderState state;
      state.enc_outputs = in.at("enc_outputs");
      state.enc_valid_lens = opt(in, "enc_valid_lens");
      state.key_values.resize(static_cast<size_t>(m->i + 1));
      return m->forward(in.at("x"), state);
    };
  } else if (e.module == "TransformerEncoder") {
    auto m = std::make_shared<nn::TransformerEncoder>(nn::TransformerConfig::from_json(c));
    s.module = m;
    s.forward = [m](auto& in) { return m->forward(in.at("idx"), opt(in, "valid_lens")); };
  } else if (e.module == "TransformerDecoder") {
    auto m = std::make_shared<nn::TransformerDecoder>(nn::TransformerConfig::from_json(c));
    s.module = m;
    s.forward = [m](auto& in) {
      nn::DecoderState state = m->init_state(in.at("enc_outputs"), opt(in, "enc_valid_lens"));
      return m->forward(in.at("idx"), state);
    };
  } else if (e.module == "EncoderDecoder") {
    auto m = std::make_shared<nn::EncoderDecoder>(nn::TransformerConfig::from_json(c));
    s.module = m;
    if (e.call == "module(enc_X, dec_X, enc_valid_lens, gates)") {
      s.forward = [m](auto& in) {  // gates (3, L, H): encoder l -> module l, decoder self L + l, cross 2L + l
        const Tensor& g = in.at("gates");
        const int64_t L = m->config().num_layers;
        for (int64_t k = 0; k < 3; ++k)
          for (int64_t l = 0; l < L; ++l) m->head_control(k * L + l).gates = g.select(0, k).select(0, l);
        return m->forward(in.at("enc_X"), in.at("dec_X"), opt(in, "enc_valid_lens"));
      };
    } else if (e.call == "masked_ce(module(enc_X, dec_X, enc_valid_lens), label, label_valid_len)") {
      s.forward = [m](auto& in) {
        const Tensor logits = m->forward(in.at("enc_X"), in.at("dec_X"), opt(in, "enc_valid_lens"));  // (B, T, V)
        const Tensor labels = mask_labels(in.at("label"), in.at("label_valid_len"));
        return cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}), kIgnoreIndex);
      };
    } else {
      throw Error("no EncoderDecoder call '" + e.call + "' (" + e.file + ")");
    }
  } else {
    throw Error("no builder for fixture module '" + e.module + "' (" + e.file + ")");
  }
  return s;
}

std::vector<std::pair<std::string, Tensor>> as_pairs(const std::map<std::string, Tensor>& m) {
  return {m.begin(), m.end()};
}

// Largest deviations of one fixture run, over everything compared.
struct RunStats {
  double max_abs = 0;
  int compared = 0;  // tensors compared
};

void compare(const std::string& what, const Tensor& actual, const Tensor& expected, double tol, RunStats& st) {
  const Deviation d = deviation(actual, expected);
  st.max_abs = std::max(st.max_abs, d.max_abs);
  ++st.compared;
  EXPECT_LE(d.max_rel, tol) << what << ": " << d.where;
}

// One fixture in one dtype: forward, compare, backward with dout = loss_weight, compare gradients.
RunStats run_fixture(const FixtureEntry& e, const Fixture& f, DType dt) {
  const double tol = dt == DType::f64 ? kTolF64 : kTolF32;
  RunStats st;
  Subject s = build(e);
  if (s.module) {
    s.module->to(dt);
    s.module->eval();
    s.module->load_parameters(as_pairs(f.params), f.file);  // checks every name and shape, both ways
    std::set<std::string> names;
    for (const auto& [name, t] : s.module->named_parameters()) {
      names.insert(name);
      EXPECT_EQ(t.dtype(), dt) << name;
    }
    std::set<std::string> expected;
    for (const auto& [name, t] : f.grad_params) expected.insert(name);
    EXPECT_EQ(names, expected);
  } else {
    EXPECT_TRUE(f.params.empty());
  }
  std::map<std::string, Tensor> in;
  for (const auto& [name, t] : f.inputs) {
    if (name == "loss_weight") continue;
    in[name] = is_floating(t.dtype()) ? t.to(dt).detach().requires_grad_(true) : t;
  }
  const Tensor out = s.forward(in);
  EXPECT_EQ(out.dtype(), dt);
  compare("output", out, f.outputs.at("output"), tol, st);
  auto w = f.outputs.find("attention_weights");
  if (w != f.outputs.end())
    compare("attention_weights", s.weights(), w->second, tol, st);
  else
    EXPECT_FALSE(s.weights().defined());

  out.backward(f.inputs.at("loss_weight").to(dt));
  for (const auto& [name, g] : f.grad_inputs) {
    const Tensor& x = in.at(name);
    compare("grad of input " + name, x.grad().defined() ? x.grad() : zeros_like(x), g, tol, st);
  }
  for (const auto& [name, g] : f.grad_params) {
    const Tensor p = s.module->parameter(name);
    compare("grad of parameter " + name, p.grad().defined() ? p.grad() : zeros_like(p), g, tol, st);
  }
  return st;
}

}  // namespace

TEST(NNParity, EveryModuleFixtureMatchesPyTorch) {
  std::vector<FixtureEntry> entries;
  for (const FixtureEntry& e : fixture_index())
    if (e.kind == "module") entries.push_back(e);
  ASSERT_GE(entries.size(), 44u) << "tests/fixtures/index.json lists fewer module fixtures than expected";

  struct Row {
    std::string file, module;
    double f64, f32;
    int compared;
  };
  std::vector<Row> rows;
  std::map<std::string, std::pair<double, double>> per_module;
  for (const FixtureEntry& e : entries) {
    SCOPED_TRACE(e.file + " (" + e.module + ": " + e.description + ")");
    const Fixture f = load_fixture(e.file);
    ASSERT_EQ(f.module, e.module);
    ASSERT_EQ(f.call, e.call);
    ASSERT_EQ(f.config, e.config);
    RunStats s64, s32;
    {
      SCOPED_TRACE("float64");
      s64 = run_fixture(e, f, DType::f64);
    }
    {
      SCOPED_TRACE("float32");
      s32 = run_fixture(e, f, DType::f32);
    }
    // output + every gradient at least (+ the attention weights where the fixture has them)
    EXPECT_EQ(s64.compared,
              1 + static_cast<int>(f.grad_inputs.size() + f.grad_params.size() + f.outputs.count("attention_weights")));
    rows.push_back({e.file, e.module, s64.max_abs, s32.max_abs, s64.compared});
    auto& pm = per_module[e.module];
    pm.first = std::max(pm.first, s64.max_abs);
    pm.second = std::max(pm.second, s32.max_abs);
  }

  std::printf("\nPyTorch parity: largest |headlab - torch| over output, attention weights and every gradient\n");
  std::printf("%-32s %-26s %8s %12s %12s\n", "fixture", "module", "tensors", "f64", "f32");
  for (const Row& r : rows)
    std::printf("%-32s %-26s %8d %12.3e %12.3e\n", r.file.c_str(), r.module.c_str(), r.compared, r.f64, r.f32);
  std::printf("\n%-26s %12s %12s\n", "module", "max dev f64", "max dev f32");
  for (const auto& [m, d] : per_module) std::printf("%-26s %12.3e %12.3e\n", m.c_str(), d.first, d.second);
  std::printf("\n");
}

// d2l's decoder run incrementally, as greedy decoding runs it: the teacher-forced fixture's logits again, now
// from the same inputs decoded in two pieces (2 + 3 positions) and one position at a time, each call after
// the first continuing from the state the previous ones left (the caches and the positional-encoding
// offset). PyTorch's reference asserts the same equality (tools/fixtures_transformer.py); here it pins the
// C++ state handling to PyTorch's numbers. Outputs only: the C++ cache is detached, so gradients do not
// reach earlier calls.
TEST(NNParity, TransformerDecoderInPiecesMatchesPyTorch) {
  const Fixture f = load_fixture("transformer_decoder.h5");
  ASSERT_EQ(f.module, "TransformerDecoder");
  const Tensor idx = f.inputs.at("idx"), expected = f.outputs.at("output");  // (B, T), (B, T, V)
  const int64_t T = idx.size(1);
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dt == DType::f64 ? "float64" : "float32");
    const double tol = dt == DType::f64 ? kTolF64 : kTolF32;
    nn::TransformerDecoder m(nn::TransformerConfig::from_json(f.config));
    m.to(dt);
    m.eval();
    m.load_parameters(as_pairs(f.params), f.file);
    const Tensor enc = f.inputs.at("enc_outputs").to(dt), enc_vl = f.inputs.at("enc_valid_lens");
    for (int64_t first : {int64_t{2}, int64_t{1}}) {
      SCOPED_TRACE("pieces of " + std::to_string(first) + (first == 1 ? " (one position at a time)" : " + rest"));
      nn::DecoderState state = m.init_state(enc, enc_vl);
      std::vector<Tensor> outs;
      for (int64_t t = 0; t < T;) {
        const int64_t len = first == 1 ? 1 : (t == 0 ? first : T - first);
        outs.push_back(m.forward(idx.narrow(1, t, len), state));
        t += len;
      }
      EXPECT_EQ(state.steps, T);
      for (const Tensor& kv : state.key_values) EXPECT_EQ(kv.size(1), T);
      const Deviation d = deviation(cat(outs, 1), expected);
      EXPECT_LE(d.max_rel, tol) << d.where;
      std::printf("transformer_decoder.h5 in pieces of %lld (%s): max |headlab - torch| %.3e\n",
                  static_cast<long long>(first), dt == DType::f64 ? "f64" : "f32", d.max_abs);
    }
  }
}
