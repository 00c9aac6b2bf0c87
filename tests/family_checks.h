// What the decoder families' own tests check the same way (tests/test_qwen3.cpp, tests/test_gemma_olmo2.cpp,
// tests/test_bert.cpp, tests/test_gpt_neo.cpp): a fixture's reference values as tensors, norms moved off their initial
// weights, the per-head form against the fused form and the composite path (and the conversion back, bit for bit), a
// fresh model learning, and a fixture folder's config.json with one change.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "analysis/surgery.h"
#include "nn/decoder_family.h"
#include "optim/optim.h"
#include "tests/process_util.h"

namespace headlab::testing {

inline double max_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64)))).item<double>();
}

// A JSON array of arrays (of arrays) of numbers as a tensor of that shape: a fixture's reference.json values.
inline Tensor nested(const nlohmann::json& rows, DType dtype) {
  std::vector<double> flat;
  Shape shape{static_cast<int64_t>(rows.size())};
  const std::function<void(const nlohmann::json&, size_t)> walk = [&](const nlohmann::json& j, size_t depth) {
    if (!j.is_array()) return flat.push_back(j.get<double>());
    if (depth == shape.size()) shape.push_back(static_cast<int64_t>(j.size()));
    for (const nlohmann::json& e : j) walk(e, depth + 1);
  };
  for (const nlohmann::json& r : rows) walk(r, 1);
  return tensor(flat, shape).to(dtype);
}

// Token ids (B, T) uniform in [0, V), from their own seed.
inline Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator g(seed);
  return randint(0, V, {B, T}, g);
}

// Every norm's weight (a parameter named "...norm...") moved by 0.3 N(0, 1), so that a norm read, placed or copied
// wrongly shows.
inline void perturb_norms(nn::Module& m, uint64_t seed) {
  Generator g(seed);
  const NoGradGuard no_grad;
  for (auto& [name, t] : m.named_parameters())
    if (name.find("norm") != std::string::npos) t.detach().copy_(add(t, mul(randn(t.shape(), g), 0.3)));
}

// A fused-form model's per-head form (the wrapper): the same weights, in eval mode.
inline std::unique_ptr<nn::DecoderModel> wrapper_of(const nn::DecoderModel& fused) {
  const auto [config, params] =
      analysis::convert_parameters(fused.config_json(), fused.named_parameters(), nn::AttentionForm::wrapper);
  auto wrapper = std::make_unique<nn::DecoderModel>(fused.config().family->config(config));
  wrapper->load_parameters(params, "wrapper");
  wrapper->eval();
  return wrapper;
}

// c (fused form, vocabulary >= 37): the wrapper, the fused form and the fused form with the pattern kept (the
// composite path) compute one function; converting back to fused gives the same weights.
inline void expect_forms_agree(const nn::DecoderConfig& c) {
  manual_seed(3);
  nn::DecoderModel fused(c);
  perturb_norms(fused, 9);
  fused.eval();
  const std::unique_ptr<nn::DecoderModel> w = wrapper_of(fused);
  nn::DecoderModel& wrapper = *w;
  const NoGradGuard no_grad;
  const Tensor idx = tokens(2, 11, 37, 5);
  const Tensor want = fused.forward(idx);
  EXPECT_LT(max_diff(wrapper.forward(idx), want), 1e-5);
  fused.keep_attention_weights(true);
  EXPECT_LT(max_diff(fused.forward(idx), want), 1e-5);
  fused.keep_attention_weights(false);
  const auto [back_config, back_params] =
      analysis::convert_parameters(wrapper.config_json(), wrapper.named_parameters(), nn::AttentionForm::fused);
  const NamedTensors original = fused.named_parameters();
  ASSERT_EQ(back_params.size(), original.size());
  for (size_t i = 0; i < original.size(); ++i)
    EXPECT_EQ(max_diff(back_params[i].second, original[i].second), 0.0) << original[i].first;
}

// A fresh model (vocabulary 13, context 12) trained 30 AdamW steps on one batch: its loss falls below `factor` of the
// first.
inline void expect_fresh_model_learns(nn::DecoderModel& model, double factor) {
  const Tensor idx = tokens(4, 12, 13, 1), targets = tokens(4, 12, 13, 2);
  optim::Optimizer opt(model.named_parameters(), {.kind = optim::OptimizerKind::adamw, .lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    const Tensor loss = cross_entropy(model.forward(idx), targets);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, factor * first);
}

// A folder dir/name holding `base` (a config.json's text) with `change` made to it; returns the folder.
inline std::string config_variant(const TempDir& dir, const std::string& base, const std::string& name,
                                  const std::function<void(nlohmann::json&)>& change) {
  nlohmann::json j = nlohmann::json::parse(base);
  change(j);
  std::filesystem::create_directories(dir.path(name));
  std::ofstream(dir.path(name) + "/config.json") << j.dump();
  return dir.path(name);
}

}  // namespace headlab::testing
