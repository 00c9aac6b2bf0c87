// Physical pruning and attention-layout conversion of parameters and checkpoints. No state_dict name
// is parsed here: the model is built from its config and loaded, each attention module prunes or
// converts itself (nn/attention), and the parameters are read back from the model with the new modules.
#include "analysis/surgery.h"

#include <algorithm>

#include "analysis/head_control.h"

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

void check_keep_count(const std::vector<std::vector<int64_t>>& keep, const nn::GPTConfig& cfg) {
  HL_CHECK(static_cast<int64_t>(keep.size()) == cfg.n_layers, "prune_parameters: keep lists ", keep.size(),
           " layers, the model has ", cfg.n_layers);
}

// The GPT's config and parameters with layer l keeping heads keep[l] (checked).
std::pair<nn::GPTConfig, NamedTensors> prune_gpt(const nn::GPTModel& model,
                                                 const std::vector<std::vector<int64_t>>& keep) {
  check_keep_count(keep, model.config());
  nn::GPTConfig out = model.config();
  out.kept_heads = original_heads(model, keep, "layer");
  out.validate();
  std::vector<Replacement> replacements;
  for (int64_t l = 0; l < model.n_layers(); ++l)
    replacements.emplace_back(&model.attention(l), model.attention(l).prune_heads(keep[static_cast<size_t>(l)]));
  return {out, replace_modules(model, replacements)};
}

}  // namespace

// ---- physical pruning and conversion ----
std::pair<nn::GPTConfig, NamedTensors> prune_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                        const std::vector<std::vector<int64_t>>& keep) {
  check_keep_count(keep, cfg);
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  nn::GPTModel model(cfg);
  model.load_parameters(params, "prune_parameters");
  return prune_gpt(model, keep);
}

std::pair<nn::TransformerConfig, NamedTensors> prune_parameters(const nn::TransformerConfig& cfg,
                                                                const NamedTensors& params,
                                                                const std::vector<std::vector<int64_t>>& keep) {
  const int64_t L = cfg.num_layers;
  HL_CHECK(static_cast<int64_t>(keep.size()) == 3 * L, "prune_parameters: keep lists ", keep.size(),
           " attention modules, the encoder-decoder has ", 3 * L);
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  nn::EncoderDecoder model(cfg);
  model.load_parameters(params, "prune_parameters");
  const std::vector<std::vector<int64_t>> kept = original_heads(model, keep, "attention module");
  // Modules in nn::Model's order: encoder layers, decoder self-attention, cross-attention.
  nn::TransformerConfig out = cfg;
  const auto Ls = static_cast<size_t>(L);
  out.kept_encoder.assign(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(Ls));
  out.kept_decoder.assign(kept.begin() + static_cast<std::ptrdiff_t>(Ls),
                          kept.begin() + static_cast<std::ptrdiff_t>(2 * Ls));
  out.kept_cross.assign(kept.begin() + static_cast<std::ptrdiff_t>(2 * Ls), kept.end());
  out.validate();
  std::vector<Replacement> replacements;
  for (int64_t i = 0; i < 3 * L; ++i)
    replacements.emplace_back(&model.attention(i), model.attention(i).prune_heads(keep[static_cast<size_t>(i)]));
  return {out, replace_modules(model, replacements)};
}

Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source) {
  Checkpoint out;
  out.config = ckpt.config;
  out.tokenizer = ckpt.tokenizer;
  const nlohmann::json& model = ckpt.config.at("model");
  // The heads removed, as [module, original head] ([layer, head] for a GPT).
  nlohmann::json removed = nlohmann::json::array(), kept;
  auto note_removed = [&](const std::vector<std::vector<int64_t>>& kept_lists, int64_t full_heads, int64_t offset) {
    for (size_t l = 0; l < kept_lists.size(); ++l)
      for (int64_t h = 0; h < full_heads; ++h)
        if (std::find(kept_lists[l].begin(), kept_lists[l].end(), h) == kept_lists[l].end())
          removed.push_back({static_cast<int64_t>(l) + offset, h});
  };
  if (nn::is_encoder_decoder(model)) {
    const nn::TransformerConfig cfg = nn::TransformerConfig::from_json(model);
    auto [pcfg, params] = prune_parameters(cfg, ckpt.model, keep);
    out.config["model"] = pcfg.to_json();
    note_removed(pcfg.kept_encoder, cfg.num_heads, 0);
    note_removed(pcfg.kept_decoder, cfg.num_heads, cfg.num_layers);
    note_removed(pcfg.kept_cross, cfg.num_heads, 2 * cfg.num_layers);
    kept = {{"encoder", pcfg.kept_encoder}, {"decoder", pcfg.kept_decoder}, {"cross", pcfg.kept_cross}};
    out.model = params;
  } else {
    const nn::GPTConfig cfg = nn::GPTConfig::from_json(model);
    auto [pcfg, params] = prune_parameters(cfg, ckpt.model, keep);
    out.config["model"] = pcfg.to_json();
    note_removed(pcfg.kept_heads, cfg.n_heads, 0);
    kept = pcfg.kept_heads;
    out.model = params;
  }
  out.config["pruning"] = {{"source", source}, {"removed_heads", removed}, {"kept_heads", kept}};
  out.has_optimizer = false;
  out.has_trainer = ckpt.has_trainer;
  out.trainer = ckpt.trainer;
  return out;
}

std::shared_ptr<nn::GPTModel> prune_model(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep) {
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  auto [cfg, pruned] = prune_gpt(model, keep);
  auto m = std::make_shared<nn::GPTModel>(cfg);
  m->to(detail::model_dtype(model));
  m->to(model.device());
  m->load_parameters(pruned, "prune_model");
  m->train(model.is_training());
  return m;
}

std::pair<nn::GPTConfig, NamedTensors> convert_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                          nn::AttentionForm attention) {
  nn::GPTConfig out = cfg;
  out.attention = attention;
  if (attention == cfg.attention) return {out, params};
  KeepRandomState keep_random_state;
  NoGradGuard no_grad;
  nn::GPTModel model(cfg);
  model.load_parameters(params, "convert_parameters");
  std::vector<Replacement> replacements;
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    replacements.emplace_back(&model.attention(l), nn::convert_attention(model.attention(l), attention));
  return {out, replace_modules(model, replacements)};
}

Checkpoint convert_checkpoint(const Checkpoint& ckpt, nn::AttentionForm attention) {
  const nn::GPTConfig cfg = nn::GPTConfig::from_json(ckpt.config.at("model"));
  auto [ccfg, params] = convert_parameters(cfg, ckpt.model, attention);
  Checkpoint out;
  out.config = ckpt.config;
  out.config["model"] = ccfg.to_json();
  out.model = params;
  out.has_trainer = ckpt.has_trainer;
  out.trainer = ckpt.trainer;
  return out;  // optimizer state is per parameter name, which changed
}

}  // namespace headlab::analysis
