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
      m = std::make_shared<nn::MultiHeadAttentionWrapper>(cfg_i(c, "d_in"), cfg_i(c, "d_out"),
                                                          cfg_i(c, "context_length"), cfg_d(c, "dropout"),
                                                          cfg_i(c, "num_heads"), cfg_b(c, "qkv_bias"),
                                                          cfg_b(c, "out_proj"));
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
  if (w != f.outputs.end()) compare("attention_weights", s.weights(), w->second, tol, st);
  else EXPECT_FALSE(s.weights().defined());

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
  ASSERT_GE(entries.size(), 35u) << "tests/fixtures/index.json lists fewer module fixtures than expected";

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
    EXPECT_EQ(s64.compared, 1 + static_cast<int>(f.grad_inputs.size() + f.grad_params.size() +
                                                 f.outputs.count("attention_weights")));
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
