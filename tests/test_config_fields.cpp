// The enum name tables (base/enum_names.h) and config field lists (base/json_fields.h): every enum
// value's name round-trips and an unknown name is refused with the list; every config round-trips
// through to_json/from_json with the keys checkpoints have always had, and a bad field names its key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "analysis/pruning.h"
#include "base/json_fields.h"
#include "nn/decoder_family.h"
#include "train/config.h"

using namespace headlab;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR_HAS(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

// Every value of E (listed by the caller from the enum's declaration) has its own name, which parses
// back to it; the names are exactly `names`; an unknown name is refused, listing them.
template <typename E>
void expect_names(const std::vector<E>& values, const std::vector<std::string>& names, const std::string& listed) {
  EXPECT_EQ(enum_names<E>(), names);
  ASSERT_EQ(values.size(), names.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(std::string(enum_name(values[i])), names[i]);
    EXPECT_EQ(parse_enum<E>(names[i], "test"), values[i]);
  }
  EXPECT_EQ(error_of([] { parse_enum<E>("nonsense", "who: --flag"); }),
            "who: --flag: expected one of " + listed + ", got 'nonsense'");
  EXPECT_EQ(std::string(enum_name(static_cast<E>(99))), "?");
}

}  // namespace

// ---- enum names ---------------------------------------------------------------------------------

TEST(EnumNames, EveryValueRoundTripsAndUnknownNamesListTheChoices) {
  using nn::AttentionForm;
  expect_names<AttentionForm>({AttentionForm::fused, AttentionForm::wrapper}, {"fused", "wrapper"},
                              "'fused', 'wrapper'");
  // The model families, by their "arch" (the registry, io/families.h, lists them).
  EXPECT_EQ(io::family_names(), (std::vector<std::string>{"gpt", "encoder-decoder", "llama", "qwen3", "olmo2", "gemma",
                                                          "gemma2", "gemma3", "neox", "gpt_neo", "bert", "hooked"}));
  for (const std::string& arch : io::family_names()) EXPECT_EQ(io::family_named(arch, "test").model.arch(), arch);
  EXPECT_EQ(error_of([] { io::family_named("nonsense", "who: --flag"); }),
            "who: --flag: expected one of 'gpt', 'encoder-decoder', 'llama', 'qwen3', 'olmo2', 'gemma', 'gemma2', "
            "'gemma3', 'neox', 'gpt_neo', 'bert', 'hooked', got 'nonsense'");
  using optim::OptimizerKind, optim::ScheduleKind;
  expect_names<OptimizerKind>({OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw}, {"sgd", "adam", "adamw"},
                              "'sgd', 'adam', 'adamw'");
  expect_names<ScheduleKind>({ScheduleKind::constant, ScheduleKind::cosine, ScheduleKind::step},
                             {"constant", "cosine", "step"}, "'constant', 'cosine', 'step'");
  using analysis::Criterion, analysis::Metric;
  expect_names<Criterion>({Criterion::automatic, Criterion::ablation, Criterion::gradient, Criterion::l0},
                          {"auto", "ablation", "gradient", "l0"}, "'auto', 'ablation', 'gradient', 'l0'");
  expect_names<Metric>({Metric::exact_match, Metric::token_accuracy}, {"exact_match", "token_accuracy"},
                       "'exact_match', 'token_accuracy'");
}

TEST(EnumNames, AliasesParseButNameTheFirstName) {
  using analysis::Metric;
  EXPECT_EQ(parse_enum<Metric>("exact", "test"), Metric::exact_match);
  EXPECT_EQ(parse_enum<Metric>("accuracy", "test"), Metric::token_accuracy);
  EXPECT_EQ(parse_enum<Metric>("token", "test"), Metric::token_accuracy);
  EXPECT_STREQ(enum_name(Metric::token_accuracy), "token_accuracy");
  EXPECT_STREQ(enum_name(Metric::exact_match), "exact_match");
  EXPECT_ERROR_HAS(parse_enum<Metric>("bleu", "ablate: --metric"),
                   "ablate: --metric: expected one of 'exact_match', 'token_accuracy', got 'bleu'");
  EXPECT_ERROR_HAS(parse_enum<Metric>("Exact", "m"), "got 'Exact'");  // names are case-sensitive
}

// ---- the field helper on its own ------------------------------------------------------------------

namespace demo {
enum class Colour { red, green };
constexpr auto enum_table(Colour) {
  return std::to_array<EnumName<Colour>>({{Colour::red, "red"}, {Colour::green, "green"}});
}
struct Settings {
  int64_t count = 1;
  uint64_t seed = 7;
  double rate = 0.5, any = -3;
  bool flag = false;
  std::string label = "x";
  Colour colour = Colour::red;
  std::vector<std::vector<int64_t>> lists;
};
const auto kSettingsFields = std::tuple{
    field("count", &Settings::count, Need::required, kPositive),
    field("seed", &Settings::seed),
    field("rate", &Settings::rate, kFraction),
    field("any", &Settings::any),
    field("flag", &Settings::flag),
    field("max_label", &Settings::label),
    field("colour", &Settings::colour),
    field("lists", &Settings::lists),
};
}  // namespace demo

TEST(ConfigFields, RoundTripAndDefaults) {
  demo::Settings s;
  // Defaults: every field written except the empty list; the enum by name.
  EXPECT_EQ(fields_to_json(s, demo::kSettingsFields),
            nlohmann::json::parse(R"({"count": 1, "seed": 7, "rate": 0.5, "any": -3.0, "flag": false,
                                      "max_label": "x", "colour": "red"})"));
  s.count = 4, s.seed = 123456789012345ull, s.rate = 0.25, s.any = 1e300, s.flag = true, s.label = "yes";
  s.colour = demo::Colour::green, s.lists = {{0, 2}, {1}};
  const nlohmann::json j = nlohmann::json::parse(fields_to_json(s, demo::kSettingsFields).dump());
  EXPECT_EQ(j["colour"], "green");
  EXPECT_EQ(j["lists"], nlohmann::json::parse("[[0, 2], [1]]"));
  demo::Settings back;
  fields_from_json(j, back, demo::kSettingsFields, "demo");
  EXPECT_EQ(fields_to_json(back, demo::kSettingsFields), j);
  EXPECT_EQ(back.seed, 123456789012345ull);
  EXPECT_EQ(back.colour, demo::Colour::green);

  // Optional keys that are absent keep the member's value; unknown keys are ignored.
  demo::Settings partial;
  partial.label = "kept";
  fields_from_json({{"count", 2}, {"no_such_key", "whatever"}}, partial, demo::kSettingsFields, "demo");
  EXPECT_EQ(partial.count, 2);
  EXPECT_EQ(partial.label, "kept");
  EXPECT_EQ(partial.seed, 7u);
}

TEST(ConfigFields, BadFieldsNameTheirKey) {
  demo::Settings s;
  auto read = [&](const nlohmann::json& j) { fields_from_json(j, s, demo::kSettingsFields, "demo"); };
  EXPECT_ERROR_HAS(read({{"seed", 1}}), "demo: missing key 'count'");
  EXPECT_ERROR_HAS(read({{"count", "four"}}), "demo: key 'count' must be an integer, got \"four\"");
  EXPECT_ERROR_HAS(read({{"count", 2.5}}), "demo: key 'count' must be an integer, got 2.5");
  EXPECT_ERROR_HAS(read({{"count", 1}, {"seed", -1}}), "demo: key 'seed' must be an integer >= 0, got -1");
  EXPECT_ERROR_HAS(read({{"count", 1}, {"rate", "high"}}), "demo: key 'rate' has the wrong type (string)");
  EXPECT_ERROR_HAS(read({{"count", 1}, {"flag", 1}}), "demo: key 'flag' has the wrong type (number)");
  EXPECT_ERROR_HAS(read({{"count", 1}, {"colour", 1}}), "demo: key 'colour' has the wrong type (number)");
  EXPECT_ERROR_HAS(read({{"count", 1}, {"colour", "blue"}}),
                   "demo: colour: expected one of 'red', 'green', got 'blue'");
  EXPECT_ERROR_HAS(read({{"count", 1}, {"lists", nlohmann::json::parse("[[0.5]]")}}),
                   "demo: lists holds 0.5, expected head indices");
  EXPECT_ERROR_HAS(read(nlohmann::json::array()), "demo: expected a JSON object, got array");
}

TEST(ConfigFields, BoundsNameTheKeyOrTheOption) {
  demo::Settings s;
  check_fields(s, demo::kSettingsFields, "demo");  // defaults are fine
  s.count = 0;
  EXPECT_EQ(error_of([&] { check_fields(s, demo::kSettingsFields, "demo"); }), "demo: count must be positive, got 0");
  s.count = 1, s.rate = 1.0;
  EXPECT_EQ(error_of([&] { check_fields(s, demo::kSettingsFields, "demo"); }), "demo: rate must be in [0, 1), got 1");
  s.rate = std::nan("");
  EXPECT_ERROR_HAS(check_fields(s, demo::kSettingsFields, "demo"), "demo: rate must be in [0, 1)");
  s.rate = 0, s.any = -1e308;  // no bounds: anything goes
  check_fields(s, demo::kSettingsFields, "demo");
  s.count = -2;
  EXPECT_EQ(error_of([&] { check_fields(s, demo::kSettingsFields, "run", FieldNames::options); }),
            "run: --count must be positive, got -2");
  EXPECT_EQ(kNonNegative.text(), ">= 0");
  EXPECT_EQ((Bounds{1, 8, false, false}.text()), "in [1, 8]");
  EXPECT_EQ((Bounds{2, std::numeric_limits<double>::infinity(), true, false}.text()), "> 2");
}

// ---- the real configs: keys as checkpoints have them ------------------------------------------------

TEST(ConfigFields, GptConfigKeysAndRoundTrip) {
  nn::DecoderConfig c;
  c.vocab_size = 13, c.context_length = 9, c.emb_dim = 12, c.n_heads = 3, c.n_layers = 2, c.drop_rate = 0.1;
  c.qkv_bias = true, c.attention = nn::AttentionForm::wrapper;
  // The JSON an unpruned model's checkpoint has always carried (no kept_heads key).
  const nlohmann::json stored = nlohmann::json::parse(
      R"({"vocab_size": 13, "context_length": 9, "emb_dim": 12, "n_heads": 3, "n_layers": 2, "drop_rate": 0.1,
          "qkv_bias": true, "attention": "wrapper"})");
  EXPECT_EQ(c.to_json(), stored);
  c.kept_heads = {{0, 2}, {1}};
  const nn::DecoderConfig back = nn::gpt_family().config(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(back.kept_heads, c.kept_heads);
  EXPECT_EQ(back.attention, nn::AttentionForm::wrapper);
  EXPECT_EQ(back.to_json(), c.to_json());

  nlohmann::json old = stored;  // the oldest checkpoints: no attention key, fused
  old.erase("attention");
  EXPECT_EQ(nn::gpt_family().config(old).attention, nn::AttentionForm::fused);
  old["unknown_future_key"] = 1;  // ignored, as before
  EXPECT_NO_THROW(nn::gpt_family().config(old));
  old["n_layers"] = 0;
  EXPECT_ERROR_HAS(nn::gpt_family().config(old), "GPT config: n_layers must be positive, got 0");
  old["n_layers"] = true;
  EXPECT_ERROR_HAS(nn::gpt_family().config(old), "GPT config: key 'n_layers' must be an integer, got true");
}

TEST(ConfigFields, TransformerConfigKeysAndRoundTrip) {
  nn::TransformerConfig c;
  c.src_vocab_size = 20, c.tgt_vocab_size = 15, c.max_len = 40, c.use_bias = true;
  const nlohmann::json stored = nlohmann::json::parse(
      R"({"arch": "encoder-decoder", "src_vocab_size": 20, "tgt_vocab_size": 15, "num_hiddens": 32,
          "ffn_num_hiddens": 64, "num_heads": 4, "num_layers": 2, "dropout": 0.1, "use_bias": true, "max_len": 40})");
  EXPECT_EQ(c.to_json(), stored);
  c.kept_encoder = {{0}, {1, 3}}, c.kept_cross = {{2}, {0, 1, 2, 3}};
  const nn::TransformerConfig back = nn::TransformerConfig::from_json(c.to_json());
  EXPECT_EQ(back.kept_encoder, c.kept_encoder);
  EXPECT_TRUE(back.kept_decoder.empty());
  EXPECT_EQ(back.to_json(), c.to_json());
  nlohmann::json j = stored;
  j.erase("use_bias");  // optional: false
  EXPECT_FALSE(nn::TransformerConfig::from_json(j).use_bias);
  j.erase("max_len");
  EXPECT_ERROR_HAS(nn::TransformerConfig::from_json(j), "encoder-decoder config: missing key 'max_len'");
  j = stored;
  j["dropout"] = "0.1";
  EXPECT_ERROR_HAS(nn::TransformerConfig::from_json(j),
                   "encoder-decoder config: key 'dropout' has the wrong type (string)");
  j = stored;
  j["src_vocab_size"] = 0;
  EXPECT_ERROR_HAS(nn::TransformerConfig::from_json(j),
                   "encoder-decoder config: src_vocab_size must be positive, got 0");
}

TEST(ConfigFields, OptimizerAndScheduleKeysAndErrors) {
  optim::OptimizerOptions o = optim::OptimizerOptions::defaults(optim::OptimizerKind::sgd);
  o.momentum = 0.9, o.nesterov = true;
  EXPECT_EQ(o.to_json(), nlohmann::json::parse(R"({"kind": "sgd", "lr": 0.1, "momentum": 0.9, "dampening": 0.0,
      "nesterov": true, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0})"));
  EXPECT_EQ(optim::OptimizerOptions::from_json(o.to_json()).to_json(), o.to_json());
  // An absent key takes the kind's default: adamw's weight decay 0.01, sgd's lr 0.1.
  EXPECT_EQ(optim::OptimizerOptions::from_json({{"kind", "adamw"}}).weight_decay, 0.01);
  EXPECT_EQ(optim::OptimizerOptions::from_json({{"kind", "sgd"}, {"momentum", 0.5}}).lr, 0.1);
  EXPECT_ERROR_HAS(optim::OptimizerOptions::from_json({{"eps", "small"}}),
                   "optimizer: key 'eps' has the wrong type (string)");
  o.beta2 = 1.5;
  EXPECT_ERROR_HAS(o.validate(), "optimizer: beta2 must be in [0, 1), got 1.5");

  optim::LRSchedule s;
  s.kind = optim::ScheduleKind::step, s.step_size = 30, s.gamma = 0.1;
  EXPECT_EQ(s.to_json(), nlohmann::json::parse(R"({"kind": "step", "lr": 0.001, "min_lr": 0.0, "warmup": 0,
      "total": 1, "step_size": 30, "gamma": 0.1})"));
  EXPECT_EQ(optim::LRSchedule::from_json(s.to_json()).to_json(), s.to_json());
  EXPECT_ERROR_HAS(optim::LRSchedule::from_json({{"warmup", 2.5}}),
                   "schedule: key 'warmup' must be an integer, got 2.5");
}

TEST(ConfigFields, RunConfigTrainingSectionAndArch) {
  train::RunConfig c = train::RunConfig::defaults();
  nn::DecoderConfig model;
  model.vocab_size = 13, model.context_length = 9, model.emb_dim = 64, model.n_heads = 4, model.n_layers = 2;
  c.model = model.to_json();
  c.run.steps = 42, c.run.seed = 3, c.run.device = "cuda", c.run.skip_nonfinite = true;
  const nlohmann::json j = c.to_json();
  const nlohmann::json& tr = j["training"];
  for (const char* key : {"steps", "batch_size", "grad_clip", "seed", "device", "eval_every", "eval_batches",
                          "save_every", "keep_last", "skip_nonfinite", "max_skipped_steps", "optimizer", "schedule"})
    EXPECT_TRUE(tr.contains(key)) << key;
  EXPECT_EQ(tr.size(), 13u);
  EXPECT_EQ(tr["device"], "cuda");
  EXPECT_FALSE(j["model"].contains("arch"));  // GPT configs never had one
  const train::RunConfig back = train::RunConfig::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.run.steps, 42);

  nlohmann::json bad = j;
  bad["training"]["batch_size"] = 0;
  EXPECT_ERROR_HAS(train::RunConfig::from_json(bad), "config: training: train: --batch-size must be positive, got 0");
  bad = j;
  bad["training"]["seed"] = "three";
  EXPECT_ERROR_HAS(train::RunConfig::from_json(bad), "config: training: key 'seed' must be an integer >= 0");
  bad = j;
  bad["model"]["arch"] = "roberta";
  EXPECT_ERROR_HAS(train::RunConfig::from_json(bad),
                   "config: model: arch: expected one of 'gpt', 'encoder-decoder', 'llama', 'qwen3', 'olmo2', "
                   "'gemma', 'gemma2', 'gemma3', 'neox', 'gpt_neo', 'bert', 'hooked', got 'roberta'");
  bad["model"]["arch"] = 3;
  EXPECT_ERROR_HAS(train::RunConfig::from_json(bad), "config: model: key 'arch' has the wrong type (number)");
  train::RunSettings r;
  r.keep_last = -1;
  EXPECT_EQ(error_of([&] { r.validate(); }), "train: --keep-last must be >= 0, got -1");
}

// The configs of real checkpoints written before the field lists (the fuzz seeds) read and write
// back unchanged, key for key; the saved fuzz finding is still refused with a clear error.
TEST(ConfigFields, OldCheckpointConfigsReadAndWriteBackUnchanged) {
  const std::filesystem::path dir = std::filesystem::path(HEADLAB_SOURCE_DIR) / "tests/fuzz/corpus/config";
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path());
    nlohmann::json stored = nlohmann::json::parse(in);
    stored.erase("pruning");  // written beside the run's config by pruning (analysis/surgery), not part of it
    EXPECT_EQ(train::RunConfig::from_json(stored).to_json(), stored);
    ++seen;
  }
  EXPECT_GE(seen, 3);
  std::ifstream in(std::filesystem::path(HEADLAB_SOURCE_DIR) / "tests/fuzz/regressions/config/emb_dim_1e93.json");
  const nlohmann::json found = nlohmann::json::parse(in);
  EXPECT_ERROR_HAS(train::RunConfig::from_json(found),
                   "GPT config: key 'emb_dim' must be an integer, got 1.1111111111111112e+93");
}
