// LLaMA-layout folders in the Hugging Face layout <-> the llama-layout families' parameters (see hf_llama.h):
// config.json's keys, and the weight table: names map one to one (model.layers.N.self_attn.q_proj ->
// trf_blocks.N.att.W_query, mlp.gate_proj -> ff.fc1, up_proj -> fc2, down_proj -> fc3, input_layernorm -> norm1,
// post_attention_layernorm -> norm2; with post norms post_attention_layernorm -> norm1_post,
// pre_feedforward_layernorm -> norm2, post_feedforward_layernorm -> norm2_post); nn.Linear's (out, in) on both
// sides; q and k rows in the halves layout.
#include "io/hf_llama.h"

#include <cmath>
#include <utility>
#include <vector>

#include "io/hf_weights.h"

namespace headlab::io {

namespace {

using nlohmann::json;

// config.json's integer at key in [lo, hi], or fallback where absent or null.
int64_t int_or(const json& j, const char* key, int64_t lo, int64_t hi, int64_t fallback, const std::string& file) {
  return j.contains(key) && !j.at(key).is_null() ? hf_config_int(j, {key}, lo, hi, file) : fallback;
}

// Each model_type the layout reads and the family it is read as; errors list them.
const std::vector<std::pair<std::string, const nn::DecoderFamily& (*)()>>& model_types() {
  static const std::vector<std::pair<std::string, const nn::DecoderFamily& (*)()>> types = {
      {"llama", nn::llama_family}, {"mistral", nn::llama_family}, {"qwen2", nn::llama_family},
      {"phi3", nn::llama_family},  {"qwen3", nn::qwen3_family},   {"olmo2", nn::olmo2_family},
      {"gemma", nn::gemma_family}, {"gemma2", nn::gemma2_family}, {"gemma3_text", nn::gemma3_family}};
  return types;
}

const nn::DecoderFamily& family_of_type(const std::string& type, const std::string& file) {
  std::string known;
  for (const auto& [name, family] : model_types()) {
    if (name == type) return family();
    known += (known.empty() ? "" : ", ") + name;
  }
  HL_FAIL(file, ": model_type '", type, "' is not one the llama layout reads (", known, ")");
}

// Sliding-window layers: transformers' layer_types where given ("sliding_attention"), else Mistral's every layer
// and Qwen's layers from max_window_layers on where use_sliding_window; each sees itself and sliding_window - 1
// positions before. A window no shorter than the context changes nothing and is dropped.
// Gemma 3 without layer_types: sliding_window_pattern (6), every layer windowed but each pattern-th.
void read_windows(const json& j, const std::string& type, const std::string& file, nn::DecoderConfig& c) {
  const bool qwen = type == "qwen2" || type == "qwen3";
  const bool given = j.contains("sliding_window") && !j.at("sliding_window").is_null();
  const bool used =
      qwen ? hf_config_value<bool>(j, "use_sliding_window", false, file) : type == "mistral" || type == "phi3";
  std::vector<int64_t> layers;
  if ((type == "gemma3_text" || type == "gemma2") && !(j.contains("layer_types") && !j.at("layer_types").is_null())) {
    // Gemma 2: the even layers (a pattern of 2)
    const int64_t pattern = type == "gemma2" ? 2 : int_or(j, "sliding_window_pattern", 1, 10000, 6, file);
    for (int64_t l = 0; l < c.n_layers; ++l)
      if ((l + 1) % pattern != 0) layers.push_back(l);
  }
  if (j.contains("layer_types") && !j.at("layer_types").is_null()) {
    const json& kinds = j.at("layer_types");
    HL_CHECK(kinds.is_array() && static_cast<int64_t>(kinds.size()) == c.n_layers, file,
             ": layer_types must list num_hidden_layers (", c.n_layers, ") kinds, got ", kinds.dump());
    for (size_t l = 0; l < kinds.size(); ++l) {
      HL_CHECK(kinds[l] == "full_attention" || kinds[l] == "sliding_attention", file, ": layer_types[", l, "] ",
               kinds[l].dump(), " is not supported (full_attention or sliding_attention)");
      if (kinds[l] == "sliding_attention") layers.push_back(static_cast<int64_t>(l));
    }
  } else if (used && given && layers.empty()) {
    const int64_t from = qwen ? hf_config_int(j, {"max_window_layers"}, 0, 10000, file) : 0;
    for (int64_t l = from; l < c.n_layers; ++l) layers.push_back(l);
  }
  if (layers.empty()) return;
  HL_CHECK(given, file, ": layer_types has sliding_attention layers but sliding_window is not given");
  const int64_t window = hf_config_int(j, {"sliding_window"}, 1, int64_t(1) << 40, file);
  if (window >= c.context_length) return;  // every position already sees all before it
  c.sliding_window = window;
  if (static_cast<int64_t>(layers.size()) < c.n_layers) c.window_layers = layers;
}

// rope_scaling: null or rope_type "default" (plain rotary), "linear" (factor) or "llama3" (factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings), as transformers' ROPE_INIT_FUNCTIONS compute them; the
// older key "type" where rope_type is absent. Others (longrope / su, yarn, dynamic) are refused by name.
void read_rope_scaling(const json& j, const std::string& file, nn::DecoderConfig& c) {
  if (!j.contains("rope_scaling") || j.at("rope_scaling").is_null()) return;
  const json& s = j.at("rope_scaling");
  HL_CHECK(s.is_object(), file, ": rope_scaling must be an object or null, got ", s.dump());
  const json kind = s.value("rope_type", s.value("type", json()));
  if (kind == "default") return;
  HL_CHECK(kind == "linear" || kind == "llama3", file, ": rope_scaling ", s.dump(),
           " is not supported (rope_type default, linear or llama3; Phi-3's longrope / su, yarn and dynamic are not "
           "computed)");
  const std::string where = file + " rope_scaling";
  const auto positive = [&](const char* key) {
    HL_CHECK(s.contains(key), where, ": '", key, "' is missing (rope_type ", kind.get<std::string>(), " needs it)");
    const double v = hf_config_value<double>(s, key, 0.0, where);
    HL_CHECK(v > 0 && std::isfinite(v), where, ": ", key, " must be positive, got ", s.at(key).dump());
    return v;
  };
  c.rope_factor = positive("factor");
  c.rope_scaling = kind == "linear" ? RopeScalingKind::linear : RopeScalingKind::llama3;
  if (c.rope_scaling != RopeScalingKind::llama3) return;
  c.rope_low_freq_factor = positive("low_freq_factor"), c.rope_high_freq_factor = positive("high_freq_factor");
  HL_CHECK(c.rope_high_freq_factor > c.rope_low_freq_factor, where, ": high_freq_factor ", c.rope_high_freq_factor,
           " must exceed low_freq_factor ", c.rope_low_freq_factor);
  c.rope_original_context = hf_config_int(s, {"original_max_position_embeddings"}, 1, int64_t(1) << 40, where);
}

nn::DecoderConfig llama_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "", file);
  const bool gemma2 = type == "gemma2", gemma = type == "gemma" || gemma2 || type == "gemma3_text";
  nn::DecoderConfig c = family_of_type(type, file).config();
  read_hf_sizes(j, file, c, /*heads_divide=*/false);  // head_dim may stand apart from the width
  c.n_kv_heads = int_or(j, "num_key_value_heads", 1, 100000, c.n_heads, file);
  HL_CHECK(c.n_heads % c.n_kv_heads == 0, file, ": num_key_value_heads ", c.n_kv_heads,
           " does not divide num_attention_heads ", c.n_heads);
  const int64_t natural = c.emb_dim % c.n_heads == 0 ? c.emb_dim / c.n_heads : 0;
  c.head_dim = int_or(j, "head_dim", 2, 1 << 16, natural, file);
  HL_CHECK(c.head_dim > 0, file, ": hidden_size ", c.emb_dim, " is not divisible by num_attention_heads ", c.n_heads,
           " and head_dim is not given");
  if (c.head_dim == natural) c.head_dim = 0;  // the default, as a fresh model writes it
  c.norm_eps = hf_config_value<double>(j, "rms_norm_eps", 1e-6, file);
  c.rope_theta = hf_config_value<double>(j, "rope_theta", type == "gemma3_text" ? 1e6 : 10000.0, file);
  c.rope_interleaved = false;                                                       // rotate_half
  c.tie_embeddings = hf_config_value<bool>(j, "tie_word_embeddings", gemma, file);  // each config class's default
  c.drop_rate = hf_config_value<double>(j, "attention_dropout", 0.0, file);
  if (gemma) {  // hidden_activation; Gemma 1's hidden_act is read past, as transformers does
    const std::string act = hf_config_value<std::string>(j, "hidden_activation", "gelu_pytorch_tanh", file);
    HL_CHECK(act == "gelu_pytorch_tanh", file, ": hidden_activation '", act,
             "' is not supported (Gemma's MLP is GeGLU with the tanh GELU: gelu_pytorch_tanh)");
  } else {
    const std::string act = hf_config_value<std::string>(j, "hidden_act", "silu", file);
    HL_CHECK(act == "silu", file, ": hidden_act '", act, "' is not supported (the llama family's MLP is SwiGLU: silu)");
  }
  if (gemma && type != "gemma") {  // Gemma 2's and 3's: the scores' factor, soft-caps (Gemma2Config's defaults)
    if (!gemma2) c.rope_local_theta = hf_config_value<double>(j, "rope_local_base_freq", 10000.0, file);
    const double scalar = hf_config_value<double>(j, "query_pre_attn_scalar", 256.0, file);
    HL_CHECK(scalar > 0 && std::isfinite(scalar), file, ": query_pre_attn_scalar must be positive, got ", scalar);
    c.attn_scale = 1.0 / std::sqrt(scalar);
    const auto cap = [&](const char* key, double fallback) {
      const double v = hf_config_value<double>(j, key, gemma2 ? fallback : 0.0, file);
      HL_CHECK(v >= 0 && std::isfinite(v), file, ": ", key, " must be positive or null, got ", v);
      return v;
    };
    c.attn_softcap = cap("attn_logit_softcapping", 50.0), c.logit_softcap = cap("final_logit_softcapping", 30.0);
  }
  read_rope_scaling(j, file, c);
  const double rotated = hf_config_value<double>(j, "partial_rotary_factor", 1.0, file);
  HL_CHECK(rotated == 1.0, file, ": partial_rotary_factor ", rotated,
           " is not supported (the llama family rotates every dim of each head)");
  HL_CHECK(!hf_config_value<bool>(j, "mlp_bias", false, file), file, ": mlp_bias is not supported");
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q, k and v projections have biases; o_proj has none
  } else {
    // attention_bias: biases on q, k, v and o_proj
    HL_CHECK(!hf_config_value<bool>(j, "attention_bias", false, file), file,
             ": attention_bias is not supported (biases on q, k, v and o_proj)");
  }
  read_windows(j, type, file, c);
  c.validate();
  return c;
}

// fused: Phi-3's layout, q | k | v in one qkv_proj and gate | up in one gate_up_proj.
WeightMap llama_weights(const nn::DecoderConfig& c, bool fused) {
  const int64_t C = c.emb_dim, F = c.hidden_dim, V = c.vocab_size, Dq = c.n_heads * c.head_size(),
                Dkv = c.kv_heads() * c.head_size();
  WeightMap m;
  m.what = "a llama-family model", m.buffer_suffixes = {".rotary_emb.inv_freq"}, m.head_dim = c.head_size();
  const auto add = [&](std::string hf, std::string ours, Shape shape, bool rotary = false) {
    m.add(std::move(hf), {std::move(ours)}, std::move(shape)).rotary = rotary;
  };
  add("model.embed_tokens.weight", "tok_emb.weight", {V, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    const std::tuple<const char*, const char*, int64_t, bool> qkv[] = {
        {"q_proj", "W_query", Dq, true}, {"k_proj", "W_key", Dkv, true}, {"v_proj", "W_value", Dkv, false}};
    if (fused) {  // halves already: no rotary permutation, as a model read from these rotates halves
      WeightEntry& e = m.add(hf + ".self_attn.qkv_proj.weight",
                             {ours + ".att.W_query.weight", ours + ".att.W_key.weight", ours + ".att.W_value.weight"},
                             {Dq + 2 * Dkv, C});
      e.fused = Fused::blocks, e.rows = {Dq, Dkv, Dkv};
    }
    for (const auto& [h, o, rows, rotary] : qkv) {
      if (fused) break;
      add(hf + ".self_attn." + h + ".weight", ours + ".att." + o + ".weight", {rows, C}, rotary);
      if (c.qkv_bias) add(hf + ".self_attn." + h + ".bias", ours + ".att." + o + ".bias", {rows}, rotary);
    }
    add(hf + ".self_attn.o_proj.weight", ours + ".att.out_proj.weight", {C, Dq});
    if (c.qk_norm != nn::QkNorm::none) {  // one (D) weight each, over every head's (Qwen3); or over all (OLMo-2)
      const bool whole = c.qk_norm == nn::QkNorm::whole;
      add(hf + ".self_attn.q_norm.weight", ours + ".att.q_norm.weight", {whole ? Dq : c.head_size()});
      add(hf + ".self_attn.k_norm.weight", ours + ".att.k_norm.weight", {whole ? Dkv : c.head_size()});
    }
    if (fused)
      m.add(hf + ".mlp.gate_up_proj.weight", {ours + ".ff.fc1.weight", ours + ".ff.fc2.weight"}, {2 * F, C}).fused =
          Fused::blocks;
    else
      add(hf + ".mlp.gate_proj.weight", ours + ".ff.fc1.weight", {F, C}),
          add(hf + ".mlp.up_proj.weight", ours + ".ff.fc2.weight", {F, C});
    add(hf + ".mlp.down_proj.weight", ours + ".ff.fc3.weight", {C, F});
    if (c.pre_norms) add(hf + ".input_layernorm.weight", ours + ".norm1.weight", {C});
    if (!c.post_norms) {
      add(hf + ".post_attention_layernorm.weight", ours + ".norm2.weight", {C});
      continue;
    }
    if (c.pre_norms) add(hf + ".pre_feedforward_layernorm.weight", ours + ".norm2.weight", {C});
    add(hf + ".post_attention_layernorm.weight", ours + ".norm1_post.weight", {C});
    add(hf + ".post_feedforward_layernorm.weight", ours + ".norm2_post.weight", {C});
  }
  add("model.norm.weight", "final_norm.weight", {C});
  if (c.tie_embeddings) {
    m.ignored.push_back("lm_head.weight");  // the same tensor, saved beside it
  } else {
    add("lm_head.weight", "out_head.weight", {V, C});
    m.entries.back().missing = "tie_word_embeddings is false but the weights hold no lm_head.weight";
  }
  return m;
}

// The llama family's folders (llama, mistral, qwen2), or Qwen3's (qwen3): one reader, one table.
class HfLlamaFormat final : public DecoderFolderFormat {
 public:
  HfLlamaFormat(const nn::DecoderFamily& family, std::vector<std::string> types)
      : family_(family), types_(std::move(types)) {}
  std::vector<std::string> model_types() const override { return types_; }
  const nn::DecoderFamily& family() const override { return family_; }
  nn::DecoderConfig config_from_hf(const json& j, const std::string& file) const override {
    return llama_config_from_hf(j, file);
  }
  // A Phi-3 folder's fused layout when reading one; export writes the unfused layout of its family.
  WeightMap weight_map(const nn::DecoderConfig& c, const std::string& folder, const WeightFiles*) const override {
    const bool phi3 = !folder.empty() && hf_config_value<std::string>(read_hf_config(folder), "model_type", "",
                                                                      hf_config_path(folder)) == "phi3";
    return llama_weights(c, phi3);
  }
  json hf_config(const nn::DecoderConfig& c) const override {
    const std::string arch = c.family->arch();
    const bool qwen3 = arch == "qwen3", qwen2 = c.qkv_bias, later_gemma = arch == "gemma3" || arch == "gemma2",
               mistral = arch == "llama" && !qwen2 && c.sliding_window;
    HL_CHECK(
        !mistral || c.window_layers.empty(),
        "export: a llama model with sliding windows on some layers only has "
        "no Hugging Face layout (Mistral's window is on every layer; Qwen2's and Qwen3's take biases or q/k norms)");
    HL_CHECK((arch != "gemma" && arch != "olmo2") || c.sliding_window == 0, "export: a ", arch,
             " model with sliding windows has no Hugging Face layout (", arch, "'s layers see every position)");
    HL_CHECK(later_gemma || (c.attn_softcap == 0 && c.logit_softcap == 0), "export: a ", arch,
             " model with soft-caps has no Hugging Face layout (Gemma 2's and 3's have them)");
    HL_CHECK(arch == "gemma3" || c.rope_local_theta == 0, "export: a ", arch,
             " model with a second rotary base for its windowed layers has no Hugging Face layout (Gemma 3's has)");
    const std::pair<const char*, const char*> type = qwen3              ? std::pair{"qwen3", "Qwen3ForCausalLM"}
                                                     : qwen2            ? std::pair{"qwen2", "Qwen2ForCausalLM"}
                                                     : mistral          ? std::pair{"mistral", "MistralForCausalLM"}
                                                     : arch == "olmo2"  ? std::pair{"olmo2", "Olmo2ForCausalLM"}
                                                     : arch == "gemma"  ? std::pair{"gemma", "GemmaForCausalLM"}
                                                     : arch == "gemma2" ? std::pair{"gemma2", "Gemma2ForCausalLM"}
                                                     : later_gemma      ? std::pair{"gemma3_text", "Gemma3ForCausalLM"}
                                                                        : std::pair{"llama", "LlamaForCausalLM"};
    json out = {{"architectures", {type.second}},
                {"model_type", type.first},
                {"num_hidden_layers", c.n_layers},
                {"num_attention_heads", c.n_heads},
                {"num_key_value_heads", c.kv_heads()},
                {"hidden_size", c.emb_dim},
                {"intermediate_size", c.hidden_dim},
                {"head_dim", c.head_size()},
                {"vocab_size", c.vocab_size},
                {"max_position_embeddings", c.context_length},
                {"rms_norm_eps", c.norm_eps},
                {"rope_theta", c.rope_theta},
                {"hidden_act", c.mlp == nn::MlpKind::geglu ? "gelu_pytorch_tanh" : "silu"},
                {"tie_word_embeddings", c.tie_embeddings},
                {"attention_dropout", c.drop_rate},
                {"torch_dtype", "float32"}};
    if (c.mlp == nn::MlpKind::geglu) out["hidden_activation"] = "gelu_pytorch_tanh";
    if (c.rope_scaling != RopeScalingKind::none) {
      out["rope_scaling"] = {{"rope_type", enum_name(c.rope_scaling)}, {"factor", c.rope_factor}};
      if (c.rope_scaling == RopeScalingKind::llama3)
        out["rope_scaling"].update({{"low_freq_factor", c.rope_low_freq_factor},
                                    {"high_freq_factor", c.rope_high_freq_factor},
                                    {"original_max_position_embeddings", c.rope_original_context}});
    }
    json kinds = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) kinds.push_back(c.window_of(l) ? "sliding_attention" : "full_attention");
    if (later_gemma) {
      const double scalar = c.attn_scale > 0 ? 1.0 / (c.attn_scale * c.attn_scale) : static_cast<double>(c.head_size());
      out["query_pre_attn_scalar"] =
          std::abs(scalar - std::round(scalar)) < 1e-9 * scalar ? std::round(scalar) : scalar;
      if (arch == "gemma3") out["rope_local_base_freq"] = c.rope_local_theta > 0 ? c.rope_local_theta : c.rope_theta;
      out["attn_logit_softcapping"] = c.attn_softcap > 0 ? json(c.attn_softcap) : json();
      out["final_logit_softcapping"] = c.logit_softcap > 0 ? json(c.logit_softcap) : json();
      out["sliding_window"] = c.sliding_window ? c.sliding_window : c.context_length;
      out["layer_types"] = kinds;
      return out;
    }
    if (c.sliding_window == 0) return out;
    out["sliding_window"] = c.sliding_window;
    if (mistral) return out;
    out["use_sliding_window"] = true, out["layer_types"] = kinds;
    out["max_window_layers"] = c.window_layers.empty() ? 0 : c.window_layers.front();
    return out;
  }
  std::string describe(const nn::DecoderConfig& c) const override {
    return std::string("head: ") + (c.tie_embeddings ? "tied to embed_tokens" : "lm_head.weight") + "; " +
           std::to_string(c.kv_heads()) + " key/value heads for " + std::to_string(c.n_heads) + " query heads" +
           (c.qk_norm == nn::QkNorm::per_head ? "; q/k norms per head"
            : c.qk_norm == nn::QkNorm::whole  ? "; q/k norms over the whole projections"
                                              : "") +
           (c.post_norms ? "; norms after attention and MLP" : "");
  }

 private:
  const nn::DecoderFamily& family_;
  std::vector<std::string> types_;
};

const HfLlamaFormat& format() {
  static const HfLlamaFormat f(nn::llama_family(), {"llama", "mistral", "qwen2", "phi3"});
  return f;
}

}  // namespace

nn::DecoderConfig read_hf_llama_config(const std::string& folder) { return format().config(folder); }

const FolderFormat& hf_llama_format() { return format(); }

const FolderFormat& hf_qwen3_format() {
  static const HfLlamaFormat f(nn::qwen3_family(), {"qwen3"});
  return f;
}

const FolderFormat& hf_olmo2_format() {
  static const HfLlamaFormat f(nn::olmo2_family(), {"olmo2"});
  return f;
}

const FolderFormat& hf_gemma_format() {
  static const HfLlamaFormat f(nn::gemma_family(), {"gemma"});
  return f;
}

const FolderFormat& hf_gemma2_format() {
  static const HfLlamaFormat f(nn::gemma2_family(), {"gemma2"});
  return f;
}

const FolderFormat& hf_gemma3_format() {
  static const HfLlamaFormat f(nn::gemma3_family(), {"gemma3_text"});
  return f;
}

}  // namespace headlab::io
