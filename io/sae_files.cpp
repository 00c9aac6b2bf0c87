// SAELens's SAE folders (io/sae_files.h): cfg.json in v3-v5's or v6's layout, sae_weights.safetensors.
#include "io/sae_files.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "base/input_path.h"
#include "base/json_text.h"
#include "base/sizes.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "nn/hooks.h"

namespace headlab::io {

using nlohmann::json;

namespace {

// cfg.json's field `key` as an integer >= 1, or the error naming the file and the field.
int64_t positive(const json& cfg, const char* key, const std::string& path) {
  HL_CHECK(cfg.contains(key), path, ": no '", key, "'");
  const json& v = cfg[key];
  HL_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, path, ": '", key, "' must be an integer >= 1, got ",
           v.dump());
  return v.get<int64_t>();
}

bool flag(const json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

std::string text_or(const json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

// v6 when metadata.sae_lens_version is 6 or later (SAELens's own test); otherwise v3-v5's flat layout.
int layout_of(const json& cfg) {
  if (!cfg.contains("metadata") || !cfg["metadata"].is_object()) return 5;
  const std::string v = text_or(cfg["metadata"], "sae_lens_version", "");
  return !v.empty() && std::isdigit(static_cast<unsigned char>(v[0])) && std::stoi(v) >= 6 ? 6 : 5;
}

// SAELens's transcoder architectures and the activation each uses; topk_transcoder is headlab's name.
constexpr std::array<std::pair<const char*, nn::SaeArch>, 3> kTranscoders = {
    {{"transcoder", nn::SaeArch::relu},
     {"jumprelu_transcoder", nn::SaeArch::jumprelu},
     {"topk_transcoder", nn::SaeArch::topk}}};

std::string transcoder_name(nn::SaeArch arch) {
  for (const auto& [name, a] : kTranscoders)
    if (a == arch) return name;
  HL_FAIL("sae: no transcoder architecture for ", enum_name(arch));
}

// The architecture, as SAELens decides it: v5 by activation_fn_str ("topk" under "standard" too: older TopK SAEs),
// v6 by architecture; `transcoder` says whether it is one of kTranscoders.
nn::SaeArch arch_of(const json& cfg, int layout, const std::string& path, bool& transcoder) {
  const std::string arch = text_or(cfg, "architecture", "standard");
  for (const auto& [name, a] : kTranscoders)
    if (arch == name) return transcoder = true, a;
  transcoder = false;
  HL_CHECK(arch != "skip_transcoder", path,
           ": architecture 'skip_transcoder' (a transcoder with a skip connection, W_skip) is not read by headlab yet");
  HL_CHECK(arch == "standard" || arch == "topk" || arch == "jumprelu", path, ": architecture '", arch,
           "' is not one headlab reads (it reads standard, topk, jumprelu, transcoder, jumprelu_transcoder and "
           "topk_transcoder)");
  if (layout == 5) {
    const std::string fn = text_or(cfg, "activation_fn_str", text_or(cfg, "activation_fn", "relu"));
    HL_CHECK(fn == "relu" || fn == "topk", path, ": activation_fn_str '", fn,
             "' is not one headlab reads (it reads relu and topk)");
    if (fn == "topk") return nn::SaeArch::topk;
  }
  return parse_enum<nn::SaeArch>(arch, path + " architecture");
}

Tensor weight(const SafetensorsFile& f, const char* name, const Shape& shape) {
  HL_CHECK(f.contains(name), f.path(), ": no tensor '", name, "'");
  Tensor t = f.to_float(name);
  HL_CHECK(t.shape() == shape, f.path(), ": tensor '", name, "' has shape ", shape_str(t.shape()), ", expected ",
           shape_str(shape));
  HL_CHECK(backend_of(t).all_finite(t.dtype(), t.raw_data(), t.numel()), f.path(), ": tensor '", name,
           "' holds a NaN or an infinity");
  return t;
}

// The block a hook name sits in ("blocks.3.hook_mlp_out": 3; 0 outside the blocks), SAELens's hook_layer.
int64_t hook_layer(const std::string& hook) {
  const std::optional<nn::HookKey> key = nn::parse_hook_name(hook);
  return key && key->layer >= 0 ? key->layer : 0;
}

}  // namespace

LoadedSae read_sae_folder(const std::string& folder) {
  check_input_folder(folder, "sae");
  const std::string cfg_path = folder + "/cfg.json", weights_path = folder + "/sae_weights.safetensors";
  const json cfg = parse_json_text(read_whole_file(cfg_path, WholeFile::config, "SAE config"), cfg_path);
  HL_CHECK(cfg.is_object(), cfg_path, ": expected a JSON object");
  LoadedSae out;
  out.layout_version = layout_of(cfg);
  nn::SaeConfig c;
  c.d_in = positive(cfg, "d_in", cfg_path);
  c.d_sae = positive(cfg, "d_sae", cfg_path);
  bool transcoder = false;
  c.arch = arch_of(cfg, out.layout_version, cfg_path, transcoder);
  if (transcoder) {
    c.d_out = positive(cfg, "d_out", cfg_path);
    c.apply_b_dec_to_input = false;  // SAELens's transcoder: b_dec is the output's bias, never the input's
  }
  if (c.arch == nn::SaeArch::topk) {
    const json& kw = cfg.contains("activation_fn_kwargs") ? cfg["activation_fn_kwargs"] : json::object();
    c.k = cfg.contains("k") ? positive(cfg, "k", cfg_path) : positive(kw, "k", cfg_path + " activation_fn_kwargs");
  }
  if (!transcoder && cfg.contains("apply_b_dec_to_input")) {
    HL_CHECK(cfg["apply_b_dec_to_input"].is_boolean(), cfg_path, ": 'apply_b_dec_to_input' must be true or false");
    c.apply_b_dec_to_input = cfg["apply_b_dec_to_input"].get<bool>();
  }
  // what would make SAELens compute something else than these maths
  const std::string norm = cfg.contains("normalize_activations") && cfg["normalize_activations"].is_string()
                               ? cfg["normalize_activations"].get<std::string>()
                               : "none";
  HL_CHECK(norm == "none" || norm == "expected_average_only_in", cfg_path, ": normalize_activations '", norm,
           "' (a norm applied at run time) is not one headlab reads (it reads none and expected_average_only_in, "
           "whose factor SAELens folds into the saved weights)");
  HL_CHECK(!flag(cfg, "finetuning_scaling_factor"), cfg_path,
           ": finetuning_scaling_factor (a per-feature scale in decode) is not read by headlab");
  HL_CHECK(!flag(cfg, "rescale_acts_by_decoder_norm"), cfg_path,
           ": rescale_acts_by_decoder_norm (TopK choosing by pre-activation x decoder norm) is not read by headlab");
  const std::string reshape = text_or(cfg, "reshape_activations", "none");
  HL_CHECK(reshape == "none", cfg_path, ": reshape_activations '", reshape, "' is not read by headlab (it reads none)");
  c.validate();

  const json& meta = out.layout_version == 6 ? cfg["metadata"] : cfg;
  out.origin.model_name = text_or(meta, "model_name", "");
  out.origin.hook_name = text_or(meta, "hook_name", text_or(meta, "hook_point", ""));
  if (meta.contains("hook_head_index") && meta["hook_head_index"].is_number_integer())
    out.origin.hook_head_index = meta["hook_head_index"].get<int64_t>();
  if (meta.contains("context_size") && meta["context_size"].is_number_integer())
    out.origin.context_size = meta["context_size"].get<int64_t>();
  if (transcoder) {
    out.origin.hook_name_out = text_or(cfg, "hook_name_out", text_or(meta, "hook_name_out", ""));
    HL_CHECK(!out.origin.hook_name_out.empty(), cfg_path, ": a transcoder's 'hook_name_out' is missing or empty");
  }

  const SafetensorsFile f(weights_path);
  std::vector<std::string> expected = {"W_enc", "W_dec", "b_enc", "b_dec"};
  if (c.arch == nn::SaeArch::jumprelu) expected.push_back("threshold");
  std::string names;
  for (const std::string& n : expected) names += (names.empty() ? "" : ", ") + n;
  for (const auto& [name, entry] : f.entries())
    HL_CHECK(std::find(expected.begin(), expected.end(), name) != expected.end(), weights_path, ": tensor '", name,
             "' is not one a ", transcoder ? transcoder_name(c.arch) : std::string(enum_name(c.arch)) + " SAE",
             " has (", names, ")");
  out.sae = std::make_unique<nn::SparseAutoencoder>(c);
  NamedTensors values = {{"W_enc", weight(f, "W_enc", {c.d_in, c.d_sae})},
                         {"W_dec", weight(f, "W_dec", {c.d_sae, c.out_width()})},
                         {"b_enc", weight(f, "b_enc", {c.d_sae})},
                         {"b_dec", weight(f, "b_dec", {c.out_width()})}};
  if (c.arch == nn::SaeArch::jumprelu) values.emplace_back("threshold", weight(f, "threshold", {c.d_sae}));
  out.sae->adopt_parameters(std::move(values), weights_path);
  return out;
}

void write_sae_folder(const std::string& folder, const nn::SparseAutoencoder& sae, const SaeOrigin& origin) {
  const nn::SaeConfig& c = sae.config();
  HL_CHECK(c.out_width() == c.d_in || origin.transcoder(), "sae: ", folder, ": a transcoder (d_out ", c.out_width(),
           " != d_in ", c.d_in, ") is written with the hook it reconstructs (hook_name_out), and none was given");
  HL_CHECK(!origin.transcoder() || !c.apply_b_dec_to_input, "sae: ", folder,
           ": a transcoder subtracts no b_dec from its input in SAELens's layout (apply_b_dec_to_input must be off)");
  std::filesystem::create_directories(folder);
  json meta = {{"sae_lens_version", "6.0.0"},  // the layout's version: SAELens reads v6's fields from 6.0.0 on
               {"model_name", origin.model_name},
               {"hook_name", origin.hook_name},
               {"hook_head_index", origin.hook_head_index >= 0 ? json(origin.hook_head_index) : json(nullptr)},
               {"trained_with", "headlab"}};
  if (origin.context_size > 0) meta["context_size"] = origin.context_size;
  json cfg = {{"d_in", c.d_in},
              {"d_sae", c.d_sae},
              {"dtype", "float32"},
              {"device", "cpu"},
              {"apply_b_dec_to_input", c.apply_b_dec_to_input},
              {"normalize_activations", "none"},
              {"reshape_activations", "none"},
              {"metadata", meta}};
  if (c.arch == nn::SaeArch::topk) {
    cfg["k"] = c.k;
    cfg["rescale_acts_by_decoder_norm"] = false;
  }
  cfg["architecture"] = origin.transcoder()           ? transcoder_name(c.arch)
                        : c.arch == nn::SaeArch::relu ? "standard"
                                                      : std::string(enum_name(c.arch));
  if (origin.transcoder()) {
    cfg["d_out"] = c.out_width();
    cfg["hook_name_out"] = origin.hook_name_out;
    cfg["hook_layer_out"] = hook_layer(origin.hook_name_out);
    cfg["hook_head_index_out"] = nullptr;
  }
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"W_enc", sae.W_enc}, {"W_dec", sae.W_dec}, {"b_enc", sae.b_enc}, {"b_dec", sae.b_dec}};
  if (c.arch == nn::SaeArch::jumprelu) tensors.emplace_back("threshold", sae.threshold);
  write_safetensors(folder + "/sae_weights.safetensors", tensors);
  write_file_atomic(folder + "/cfg.json", cfg.dump(2) + "\n", "sae");
}

void write_sae_trainer_tensors(const std::string& path, const NamedTensors& tensors) {
  write_safetensors(path, std::vector<std::pair<std::string, Tensor>>(tensors.begin(), tensors.end()));
}

NamedTensors read_sae_trainer_tensors(const std::string& path) {
  const SafetensorsFile f(path);
  NamedTensors out;
  for (const auto& [name, entry] : f.entries()) {
    Tensor t = f.to_float(name);
    HL_CHECK(backend_of(t).all_finite(t.dtype(), t.raw_data(), t.numel()), path, ": tensor '", name,
             "' holds a NaN or an infinity");
    out.emplace_back(name, std::move(t));
  }
  return out;
}

}  // namespace headlab::io
