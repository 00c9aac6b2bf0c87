// GPT-Neo folders in the Hugging Face layout <-> the gpt_neo family's parameters (see hf_gpt_neo.h): config.json's
// keys, and the weight table: transformer.wte / wpe -> tok_emb / pos_emb, h.N.attn.attention.q_proj / k_proj /
// v_proj / out_proj -> att.W_query / W_key / W_value / out_proj, mlp.c_fc / c_proj -> ff.layers.0 / 2 (nn.Linear's
// (out, in), not GPT-2's Conv1D), ln_1 / ln_2 / ln_f -> norm1 / norm2 / final_norm; lm_head tied to wte.
#include "io/hf_gpt_neo.h"

#include <string>
#include <vector>

#include "io/hf_weights.h"
#include "nn/decoder_family.h"

namespace headlab::io {

namespace {

using nlohmann::json;

// Each layer's kind: attention_layers where given, else attention_types expanded ([[["global", "local"], 2]] ->
// global, local, global, local), as GPTNeoConfig does.
std::vector<std::string> layer_kinds(const json& j, int64_t layers, const std::string& file) {
  std::vector<std::string> kinds;
  if (j.contains("attention_layers") && j.at("attention_layers").is_array()) {
    for (const json& k : j.at("attention_layers")) kinds.push_back(k.is_string() ? k.get<std::string>() : k.dump());
  } else {
    HL_CHECK(j.contains("attention_types") && j.at("attention_types").is_array(), file,
             ": neither attention_layers nor attention_types is given (each layer's global or local attention)");
    for (const json& item : j.at("attention_types")) {
      HL_CHECK(item.is_array() && item.size() == 2 && item[0].is_array() && item[1].is_number_integer() &&
                   item[1].get<int64_t>() >= 0 && item[1].get<int64_t>() <= layers,
               file, ": attention_types entry ", item.dump(), " is not [[kinds...], repeats]");
      for (int64_t r = 0; r < item[1].get<int64_t>(); ++r)
        for (const json& k : item[0]) kinds.push_back(k.is_string() ? k.get<std::string>() : k.dump());
    }
  }
  HL_CHECK(static_cast<int64_t>(kinds.size()) == layers, file, ": attention layers list ", kinds.size(),
           " kinds for num_layers ", layers);
  return kinds;
}

nn::DecoderConfig gpt_neo_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "", file);
  HL_CHECK(type == "gpt_neo", file, ": model_type '", type, "' is not one the gpt_neo family reads (gpt_neo)");
  nn::DecoderConfig c = nn::gpt_neo_family().config();
  c.n_layers = hf_config_int(j, {"num_layers"}, 1, 10000, file);
  c.n_heads = hf_config_int(j, {"num_heads"}, 1, 100000, file);
  c.emb_dim = hf_config_int(j, {"hidden_size"}, 1, 1 << 20, file);
  HL_CHECK(c.emb_dim % c.n_heads == 0, file, ": hidden_size ", c.emb_dim, " is not divisible by num_heads ", c.n_heads);
  c.hidden_dim = j.contains("intermediate_size") && !j.at("intermediate_size").is_null()
                     ? hf_config_int(j, {"intermediate_size"}, 1, 1 << 22, file)
                     : 4 * c.emb_dim;
  c.vocab_size = hf_config_int(j, {"vocab_size"}, 1, 1 << 28, file);
  c.context_length = hf_config_int(j, {"max_position_embeddings"}, 1, 1 << 24, file);
  c.norm_eps = hf_config_value<double>(j, "layer_norm_epsilon", 1e-5, file);
  c.drop_rate = hf_config_value<double>(j, "attention_dropout", 0.0, file);
  const std::string act = hf_config_value<std::string>(j, "activation_function", "gelu_new", file);
  HL_CHECK(act == "gelu_new", file, ": activation_function '", act,
           "' is not supported (the gpt_neo family's MLP uses GELU's tanh form: gelu_new)");
  HL_CHECK(hf_config_value<bool>(j, "tie_word_embeddings", true, file), file,
           ": tie_word_embeddings false is not supported (GPT-Neo's head is its embedding)");
  const std::vector<std::string> kinds = layer_kinds(j, c.n_layers, file);
  std::vector<int64_t> local;
  for (size_t l = 0; l < kinds.size(); ++l) {
    HL_CHECK(kinds[l] == "global" || kinds[l] == "local", file, ": attention layer ", l, " is '", kinds[l],
             "', expected global or local");
    if (kinds[l] == "local") local.push_back(static_cast<int64_t>(l));
  }
  const int64_t window = local.empty() ? 0 : hf_config_int(j, {"window_size"}, 1, int64_t(1) << 40, file);
  if (!local.empty() && window < c.context_length) {  // a window as long as the context changes nothing
    c.sliding_window = window;
    if (static_cast<int64_t>(local.size()) < c.n_layers) c.window_layers = local;
  }
  c.validate();
  return c;
}

WeightMap gpt_neo_weights(const nn::DecoderConfig& c) {
  const int64_t C = c.emb_dim, F = c.hidden_dim, V = c.vocab_size;
  WeightMap m;
  m.what = "a GPT-Neo model", m.head_dim = c.head_size();
  m.buffer_suffixes = {".attn.attention.bias", ".attn.attention.masked_bias"};  // the masks older files save
  const auto add = [&](const std::string& hf, const std::string& ours, Shape shape, bool bias) {
    m.add(hf + ".weight", {ours + ".weight"}, shape);
    if (bias) m.add(hf + ".bias", {ours + ".bias"}, {shape[0]});
  };
  m.add("transformer.wte.weight", {"tok_emb.weight"}, {V, C});
  m.add("transformer.wpe.weight", {"pos_emb.weight"}, {c.context_length, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "transformer.h." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    add(hf + ".attn.attention.q_proj", ours + ".att.W_query", {C, C}, false);
    add(hf + ".attn.attention.k_proj", ours + ".att.W_key", {C, C}, false);
    add(hf + ".attn.attention.v_proj", ours + ".att.W_value", {C, C}, false);
    add(hf + ".attn.attention.out_proj", ours + ".att.out_proj", {C, C}, true);
    add(hf + ".mlp.c_fc", ours + ".ff.layers.0", {F, C}, true);
    add(hf + ".mlp.c_proj", ours + ".ff.layers.2", {C, F}, true);
    add(hf + ".ln_1", ours + ".norm1", {C}, true);
    add(hf + ".ln_2", ours + ".norm2", {C}, true);
  }
  add("transformer.ln_f", "final_norm", {C}, true);
  m.ignored.push_back("lm_head.weight");  // wte itself, saved beside it
  return m;
}

class HfGptNeoFormat final : public DecoderFolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"gpt_neo"}; }
  const nn::DecoderFamily& family() const override { return nn::gpt_neo_family(); }
  nn::DecoderConfig config_from_hf(const json& j, const std::string& file) const override {
    return gpt_neo_config_from_hf(j, file);
  }
  WeightMap weight_map(const nn::DecoderConfig& c, const std::string&, const WeightFiles*) const override {
    return gpt_neo_weights(c);
  }
  json hf_config(const nn::DecoderConfig& c) const override {
    json kinds = json::array(), types = json::array();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      kinds.push_back(c.window_of(l) ? "local" : "global");
      types.push_back({json::array({kinds.back()}), 1});
    }
    return {{"architectures", {"GPTNeoForCausalLM"}},
            {"model_type", "gpt_neo"},
            {"num_layers", c.n_layers},
            {"num_heads", c.n_heads},
            {"hidden_size", c.emb_dim},
            {"intermediate_size", c.hidden_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.context_length},
            {"window_size", c.sliding_window ? c.sliding_window : c.context_length},
            {"attention_types", types},
            {"attention_layers", kinds},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", c.norm_eps},
            {"attention_dropout", c.drop_rate},
            {"embed_dropout", c.drop_rate},
            {"resid_dropout", c.drop_rate},
            {"tie_word_embeddings", true},
            {"torch_dtype", "float32"}};
  }
  std::string describe(const nn::DecoderConfig& c) const override {
    return "head: tied to wte; local layers see " + std::to_string(c.sliding_window) + " positions";
  }
};

}  // namespace

const FolderFormat& hf_gpt_neo_format() {
  static const HfGptNeoFormat f;
  return f;
}

}  // namespace headlab::io
