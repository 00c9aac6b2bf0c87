// Parameter surgery by state_dict name: physical pruning (fewer heads) and fused <-> wrapper layout.
#include "analysis/surgery.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "analysis/head_control.h"

namespace headlab::analysis {

namespace {


// Parameter names of the model a config describes, in registration order.
std::vector<std::pair<std::string, Shape>> expected_parameters(const nn::GPTConfig& cfg) {
  NoGradGuard no_grad;
  const nn::GPTModel m(cfg);
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& [name, t] : m.named_parameters()) out.emplace_back(name, t.shape());
  return out;
}

std::map<std::string, Tensor> by_name(const NamedTensors& params) {
  std::map<std::string, Tensor> m;
  for (const auto& [name, t] : params) m[name] = t;
  return m;
}

const Tensor& lookup(const std::map<std::string, Tensor>& m, const std::string& name, const char* who) {
  auto it = m.find(name);
  HL_CHECK(it != m.end(), who, ": parameter ", name, " is missing");
  return it->second;
}

// "trf_blocks.3.att.heads.2.W_key.weight" -> (3, "heads.2.W_key.weight"); layer -1 if not attention.
std::pair<int64_t, std::string> split_attention_name(const std::string& name) {
  static const std::string pre = "trf_blocks.";
  if (name.rfind(pre, 0) != 0) return {-1, ""};
  const size_t dot = name.find('.', pre.size());
  if (dot == std::string::npos) return {-1, ""};
  const std::string rest = name.substr(dot + 1);
  if (rest.rfind("att.", 0) != 0) return {-1, ""};
  return {std::stoll(name.substr(pre.size(), dot - pre.size())), rest.substr(4)};
}

// Rows [h*D, (h+1)*D) of every kept head, as an index tensor.
Tensor head_rows(const std::vector<int64_t>& keep, int64_t D) {
  std::vector<int64_t> rows;
  for (int64_t h : keep)
    for (int64_t i = 0; i < D; ++i) rows.push_back(h * D + i);
  return tensor(rows, {static_cast<int64_t>(rows.size())});
}

}  // namespace

// ---- physical pruning and conversion ----
std::pair<nn::GPTConfig, NamedTensors> prune_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                        const std::vector<std::vector<int64_t>>& keep) {
  const char* who = "prune_parameters";
  HL_CHECK(static_cast<int64_t>(keep.size()) == cfg.n_layers, who, ": keep lists ", keep.size(),
           " layers, the model has ", cfg.n_layers);
  nn::GPTConfig out = cfg;
  out.kept_heads.assign(static_cast<size_t>(cfg.n_layers), {});
  const int64_t D = cfg.head_dim();
  std::vector<std::map<int64_t, int64_t>> renumber(keep.size());  // old local head -> new local head
  std::vector<Tensor> rows(keep.size()), cols(keep.size());
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const auto& k = keep[static_cast<size_t>(l)];
    const int64_t H = cfg.heads_in_layer(l);
    HL_CHECK(!k.empty(), who, ": layer ", l, " must keep at least one head");
    for (size_t i = 0; i < k.size(); ++i) {
      HL_CHECK(k[i] >= 0 && k[i] < H, who, ": layer ", l, " has no head ", k[i], " (it has ", H, ")");
      HL_CHECK(i == 0 || k[i] > k[i - 1], who, ": the heads kept in layer ", l, " must be sorted and distinct");
      renumber[static_cast<size_t>(l)][k[i]] = static_cast<int64_t>(i);
      out.kept_heads[static_cast<size_t>(l)].push_back(analysis::original_head(cfg, l, k[i]));
    }
    rows[static_cast<size_t>(l)] = head_rows(k, D);
  }
  out.validate();
  NamedTensors result;
  for (const auto& [name, t] : params) {
    const auto [l, rest] = split_attention_name(name);
    if (l < 0) {
      result.emplace_back(name, t);
      continue;
    }
    HL_CHECK(l < cfg.n_layers, who, ": parameter ", name, " names layer ", l, " of ", cfg.n_layers);
    const Tensor& idx = rows[static_cast<size_t>(l)];
    if (rest == "out_proj.weight") {  // (C, H*D): keep the kept heads' columns
      result.emplace_back(name, index_select(t, 1, idx.to(t.device())));
    } else if (rest == "out_proj.bias") {
      result.emplace_back(name, t);
    } else if (rest.rfind("heads.", 0) == 0) {  // wrapper: heads.{j}.<rest>, renumbered
      const size_t dot = rest.find('.', 6);
      const int64_t j = std::stoll(rest.substr(6, dot - 6));
      auto it = renumber[static_cast<size_t>(l)].find(j);
      if (it == renumber[static_cast<size_t>(l)].end()) continue;
      result.emplace_back("trf_blocks." + std::to_string(l) + ".att.heads." + std::to_string(it->second) +
                              rest.substr(dot),
                          t);
    } else {  // fused W_query/W_key/W_value weight (H*D, C) or bias (H*D): keep the kept heads' rows
      result.emplace_back(name, index_select(t, 0, idx.to(t.device())));
    }
  }
  return {out, result};
}

std::pair<nn::TransformerConfig, NamedTensors> prune_parameters(const nn::TransformerConfig& cfg,
                                                                const NamedTensors& params,
                                                                const std::vector<std::vector<int64_t>>& keep) {
  const char* who = "prune_parameters";
  const int64_t L = cfg.num_layers, D = cfg.head_size();
  HL_CHECK(static_cast<int64_t>(keep.size()) == 3 * L, who, ": keep lists ", keep.size(),
           " attention modules, the encoder-decoder has ", 3 * L);
  nn::TransformerConfig out = cfg;
  std::vector<std::vector<int64_t>>* kept_out[3] = {&out.kept_encoder, &out.kept_decoder, &out.kept_cross};
  const std::vector<std::vector<int64_t>>* kept_in[3] = {&cfg.kept_encoder, &cfg.kept_decoder, &cfg.kept_cross};
  std::map<std::string, Tensor> rows;  // parameter prefix of module i -> its kept rows
  for (int64_t i = 0; i < 3 * L; ++i) {
    const int64_t kind = i / L, l = i % L;
    const std::vector<std::vector<int64_t>>& before = *kept_in[kind];
    const int64_t H = before.empty() ? cfg.num_heads : static_cast<int64_t>(before[static_cast<size_t>(l)].size());
    const auto& k = keep[static_cast<size_t>(i)];
    HL_CHECK(!k.empty(), who, ": attention module ", i, " must keep at least one head");
    if (l == 0) kept_out[kind]->assign(static_cast<size_t>(L), {});
    for (size_t j = 0; j < k.size(); ++j) {
      HL_CHECK(k[j] >= 0 && k[j] < H, who, ": attention module ", i, " has no head ", k[j], " (it has ", H, ")");
      HL_CHECK(j == 0 || k[j] > k[j - 1], who, ": the heads kept in attention module ", i, " must be sorted and distinct");
      (*kept_out[kind])[static_cast<size_t>(l)].push_back(before.empty() ? k[j] : before[static_cast<size_t>(l)][static_cast<size_t>(k[j])]);
    }
    const std::string block = (kind == 0 ? "encoder" : "decoder") + std::string(".blks.block") + std::to_string(l) + ".";
    rows[block + (kind == 0 ? "attention." : kind == 1 ? "attention1." : "attention2.")] = head_rows(k, D);
  }
  out.validate();
  NamedTensors result;
  for (const auto& [name, t] : params) {
    const std::string& param = name;  // clang 14 cannot capture a structured binding
    const auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return param.rfind(r.first, 0) == 0; });
    if (it == rows.end()) {
      result.emplace_back(name, t);
      continue;
    }
    const std::string rest = name.substr(it->first.size());
    const Tensor idx = it->second.to(t.device());
    if (rest == "W_o.weight") result.emplace_back(name, index_select(t, 1, idx));  // (N, H*D): kept columns
    else if (rest == "W_o.bias") result.emplace_back(name, t);
    else result.emplace_back(name, index_select(t, 0, idx));  // W_q/W_k/W_v weight (H*D, N) or bias (H*D): kept rows
  }
  return {out, result};
}

Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source) {
  Checkpoint out;
  out.config = ckpt.config;
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
  NamedTensors params;
  for (auto& [name, t] : model.named_parameters()) params.emplace_back(name, t.detach().to(kCPU).clone());
  auto [cfg, pruned] = prune_parameters(model.config(), params, keep);
  auto m = std::make_shared<nn::GPTModel>(cfg);
  m->to(detail::model_dtype(model));
  m->load_parameters(pruned, "prune_model");
  m->to(model.device());
  m->train(model.is_training());
  return m;
}

std::pair<nn::GPTConfig, NamedTensors> convert_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                          nn::AttentionForm attention) {
  const char* who = "convert_parameters";
  nn::GPTConfig out = cfg;
  out.attention = attention;
  if (attention == cfg.attention) return {out, params};
  const auto src = by_name(params);
  const int64_t D = cfg.head_dim();
  NamedTensors result;
  for (const auto& [name, shape] : expected_parameters(out)) {
    const auto [l, rest] = split_attention_name(name);
    const std::string prefix = "trf_blocks." + std::to_string(l) + ".att.";
    Tensor value;
    if (l >= 0 && attention == nn::AttentionForm::wrapper && rest.rfind("heads.", 0) == 0) {
      // heads.{j}.W_query.weight <- rows [j*D, (j+1)*D) of the fused W_query.weight (bias alike)
      const size_t dot = rest.find('.', 6);
      const int64_t j = std::stoll(rest.substr(6, dot - 6));
      value = lookup(src, prefix + rest.substr(dot + 1), who).narrow(0, j * D, D).contiguous();
    } else if (l >= 0 && attention == nn::AttentionForm::fused && rest.rfind("W_", 0) == 0) {
      std::vector<Tensor> parts;
      for (int64_t j = 0; j < cfg.heads_in_layer(l); ++j)
        parts.push_back(lookup(src, prefix + "heads." + std::to_string(j) + "." + rest, who));
      value = cat(parts, 0);
    } else {
      value = lookup(src, name, who);
    }
    HL_CHECK(value.shape() == shape, who, ": ", name, " came out with shape ", shape_str(value.shape()), ", expected ",
             shape_str(shape));
    result.emplace_back(name, value);
  }
  return {out, result};
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
