// Physical pruning and attention-layout conversion of parameters and checkpoints. No state_dict name
// is parsed here: the model is built from its config and loaded, each attention module prunes or
// converts itself (nn/attention), and the parameters are read back from the model with the new modules.
#include "analysis/surgery.h"

#include <algorithm>

#include "analysis/head_control.h"
#include "io/families.h"

namespace headlab::analysis {

namespace {

// Surgery builds modules, and building draws initial values from the default generator: the
// caller's random stream is put back where it was, so pruning or converting changes no later draw.
class KeepRandomState {
 public:
  KeepRandomState() : seed_(default_generator().seed()), offset_(default_generator().offset()) {}
  ~KeepRandomState() { default_generator().set_state(seed_, offset_); }
  KeepRandomState(const KeepRandomState&) = delete;
  KeepRandomState& operator=(const KeepRandomState&) = delete;

 private:
  uint64_t seed_, offset_;
};

// The state_dict prefix of `target` inside `root` ("trf_blocks.3.att."), found by identity: surgery
// needs no knowledge of where a model keeps its attention modules.
bool find_prefix(const nn::Module& root, const nn::Module& target, std::string& prefix) {
  for (const auto& [name, child] : root.children()) {
    const size_t before = prefix.size();
    prefix += name + ".";
    if (child.get() == &target || find_prefix(*child, target, prefix)) return true;
    prefix.resize(before);
  }
  return false;
}

// An attention module of `model` and the module that takes its place.
using Replacement = std::pair<const nn::Module*, std::shared_ptr<nn::Module>>;

// model's parameters in its order, each replaced module's entries taken from its replacement instead
// (at the place of the replaced module's first one).
NamedTensors replace_modules(const nn::Module& model, const std::vector<Replacement>& replacements) {
  std::vector<std::string> prefixes;
  for (const auto& [replaced, by] : replacements) {
    std::string prefix;
    HL_CHECK(find_prefix(model, *replaced, prefix), "surgery: a replaced module is not part of the model");
    prefixes.push_back(prefix);
  }
  std::vector<bool> done(replacements.size(), false);
  NamedTensors out;
  for (const auto& [name, t] : model.named_parameters()) {
    const std::string& param = name;  // clang 14 cannot capture a structured binding
    const auto it =
        std::find_if(prefixes.begin(), prefixes.end(), [&](const std::string& p) { return param.rfind(p, 0) == 0; });
    if (it == prefixes.end()) {
      out.emplace_back(name, t.detach());
      continue;
    }
    const auto i = static_cast<size_t>(it - prefixes.begin());
    if (done[i]) continue;
    done[i] = true;
    for (const auto& [sub, v] : replacements[i].second->named_parameters()) out.emplace_back(*it + sub, v.detach());
  }
  return out;
}

// keep[i] checked against the model's attention module i; returns the kept heads' original indices.
std::vector<std::vector<int64_t>> original_heads(const nn::Model& model, const std::vector<std::vector<int64_t>>& keep,
                                                 const std::string& unit) {
  std::vector<std::vector<int64_t>> kept(keep.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    const auto m = static_cast<int64_t>(i);
    nn::check_head_selection(keep[i], model.heads_at(m), "prune_parameters", unit + " " + std::to_string(i));
    for (int64_t h : keep[i]) kept[i].push_back(model.original_head(m, h));
  }
  return kept;
}

// The model's config and parameters with module i keeping heads keep[i] (checked).
std::pair<nlohmann::json, NamedTensors> prune(const nn::Model& model, const std::vector<std::vector<int64_t>>& keep) {
  const bool decoder = model.is_decoder();  // its modules are its layers
  const std::string unit = decoder ? "layer" : "attention module";
  HL_CHECK(static_cast<int64_t>(keep.size()) == model.attention_count(), "prune_parameters: keep lists ", keep.size(),
           " ", unit, "s, the ", decoder ? "model" : "encoder-decoder", " has ", model.attention_count());
  const nlohmann::json config = model.pruned_config(original_heads(model, keep, unit));
  std::vector<Replacement> replacements;
  for (int64_t i = 0; i < model.attention_count(); ++i) {
    const nn::MultiHead& m = model.multi_head(i);
    replacements.emplace_back(dynamic_cast<const nn::Module*>(&m), m.keep_heads(keep[static_cast<size_t>(i)]));
  }
  return {config, replace_modules(model, replacements)};
}

// A model of the section with these parameters; the caller's random stream is kept (see KeepRandomState).
std::shared_ptr<nn::Model> loaded_model(const nlohmann::json& config, const NamedTensors& params, const char* who) {
  std::shared_ptr<nn::Model> model = io::make_model(config);
  model->load_parameters(params, who);
  return model;
}

}  // namespace

// ---- physical pruning and conversion ----
std::pair<nlohmann::json, NamedTensors> prune_parameters(const nlohmann::json& config, const NamedTensors& params,
                                                         const std::vector<std::vector<int64_t>>& keep) {
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  return prune(*loaded_model(config, params, "prune_parameters"), keep);
}

Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source) {
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  const std::shared_ptr<nn::Model> model = loaded_model(ckpt.config.at("model"), ckpt.model, "prune_parameters");
  auto [config, params] = prune(*model, keep);
  const std::shared_ptr<nn::Model> pruned = io::make_model(config);
  // The heads removed, as [module, original head]; the kept ones per module, grouped by kind where a model
  // has several ({"encoder": [...], "decoder": [...], "cross": [...]}), else a list per layer.
  nlohmann::json removed = nlohmann::json::array(), kept = nlohmann::json::array(), by_kind = nlohmann::json::object();
  for (int64_t i = 0; i < pruned->attention_count(); ++i) {
    std::vector<int64_t> heads;
    for (int64_t h = 0; h < pruned->heads_at(i); ++h) heads.push_back(pruned->original_head(i, h));
    for (int64_t h = 0; h < pruned->full_heads(); ++h)
      if (std::find(heads.begin(), heads.end(), h) == heads.end()) removed.push_back({i, h});
    kept.push_back(heads);
    by_kind[pruned->attention_kind(i)].push_back(heads);
  }
  Checkpoint out;
  out.config = ckpt.config;
  out.config["model"] = config;
  out.config["pruning"] = {
      {"source", source}, {"removed_heads", removed}, {"kept_heads", by_kind.size() > 1 ? by_kind : kept}};
  out.tokenizer = ckpt.tokenizer;
  out.model = params;
  out.has_optimizer = false;
  out.has_trainer = ckpt.has_trainer;
  out.trainer = ckpt.trainer;
  return out;
}

std::shared_ptr<nn::Model> prune_model(const nn::Model& model, const std::vector<std::vector<int64_t>>& keep) {
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  auto [config, params] = prune(model, keep);
  std::shared_ptr<nn::Model> m = io::make_model(config);
  m->to(detail::model_dtype(model));
  m->to(model.device());
  m->load_parameters(params, "prune_model");
  m->train(model.is_training());
  return m;
}

std::pair<nlohmann::json, NamedTensors> convert_parameters(const nlohmann::json& config, const NamedTensors& params,
                                                           nn::AttentionForm attention) {
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  const std::shared_ptr<nn::Model> model = loaded_model(config, params, "convert_parameters");
  const auto* decoder = model->as_decoder();
  HL_CHECK(decoder, "convert_parameters: a ", model->type_name(), " has no attention forms to convert between");
  const nlohmann::json out = decoder->converted_config(attention);
  if (out == decoder->config_json()) return {out, params};
  std::vector<Replacement> replacements;
  for (int64_t l = 0; l < decoder->n_layers(); ++l)
    replacements.emplace_back(&decoder->attention(l), nn::convert_attention(decoder->attention(l), attention));
  return {out, replace_modules(*decoder, replacements)};
}

Checkpoint convert_checkpoint(const Checkpoint& ckpt, nn::AttentionForm attention) {
  auto [config, params] = convert_parameters(ckpt.config.at("model"), ckpt.model, attention);
  Checkpoint out;
  out.config = ckpt.config;
  out.config["model"] = config;
  out.model = params;
  out.has_trainer = ckpt.has_trainer;
  out.trainer = ckpt.trainer;
  return out;  // optimizer state is per parameter name, which changed
}

}  // namespace headlab::analysis
