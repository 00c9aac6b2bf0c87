// LLaMA-family folders in the Hugging Face layout <-> the llama family's parameters (see hf_llama.h): config.json's
// keys, and the weight table: names map one to one (model.layers.N.self_attn.q_proj -> trf_blocks.N.att.W_query,
// mlp.gate_proj -> ff.fc1, up_proj -> fc2, down_proj -> fc3, input_layernorm -> norm1, post_attention_layernorm ->
// norm2); nn.Linear's (out, in) on both sides; q and k rows in the halves layout.
#include "io/hf_llama.h"

#include "io/hf_weights.h"

namespace headlab::io {

namespace {

using nlohmann::json;

nn::DecoderConfig llama_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "", file);
  HL_CHECK(type == "llama" || type == "mistral" || type == "qwen2", file, ": model_type '", type,
           "' is not one the llama family reads (llama, mistral, qwen2)");
  nn::DecoderConfig c = nn::llama_family().config();
  c.n_layers = hf_config_int(j, {"num_hidden_layers"}, 1, 10000, file);
  c.n_heads = hf_config_int(j, {"num_attention_heads"}, 1, 100000, file);
  c.n_kv_heads = j.contains("num_key_value_heads") && !j.at("num_key_value_heads").is_null()
                     ? hf_config_int(j, {"num_key_value_heads"}, 1, 100000, file)
                     : c.n_heads;
  HL_CHECK(c.n_heads % c.n_kv_heads == 0, file, ": num_key_value_heads ", c.n_kv_heads,
           " does not divide num_attention_heads ", c.n_heads);
  c.emb_dim = hf_config_int(j, {"hidden_size"}, 1, 1 << 20, file);
  c.hidden_dim = hf_config_int(j, {"intermediate_size"}, 1, 1 << 22, file);
  c.vocab_size = hf_config_int(j, {"vocab_size"}, 1, 1 << 28, file);
  c.context_length = hf_config_int(j, {"max_position_embeddings"}, 1, 1 << 24, file);
  const int64_t natural = c.emb_dim % c.n_heads == 0 ? c.emb_dim / c.n_heads : 0;
  c.head_dim = j.contains("head_dim") && !j.at("head_dim").is_null() ? hf_config_int(j, {"head_dim"}, 2, 1 << 16, file)
                                                                     : natural;
  HL_CHECK(c.head_dim > 0, file, ": hidden_size ", c.emb_dim, " is not divisible by num_attention_heads ", c.n_heads,
           " and head_dim is not given");
  if (c.head_dim == natural) c.head_dim = 0;  // the default, as a fresh model writes it
  c.norm_eps = hf_config_value<double>(j, "rms_norm_eps", 1e-6, file);
  c.rope_theta = hf_config_value<double>(j, "rope_theta", 10000.0, file);
  c.rope_interleaved = false;                                                       // rotate_half
  c.tie_embeddings = hf_config_value<bool>(j, "tie_word_embeddings", false, file);  // LlamaConfig's default
  c.drop_rate = hf_config_value<double>(j, "attention_dropout", 0.0, file);
  const std::string act = hf_config_value<std::string>(j, "hidden_act", "silu", file);
  HL_CHECK(act == "silu", file, ": hidden_act '", act, "' is not supported (the llama family's MLP is SwiGLU: silu)");
  HL_CHECK(!j.contains("rope_scaling") || j.at("rope_scaling").is_null(), file, ": rope_scaling ",
           j.contains("rope_scaling") ? j.at("rope_scaling").dump() : "", " is not supported (plain rotary only)");
  HL_CHECK(!hf_config_value<bool>(j, "mlp_bias", false, file), file, ": mlp_bias is not supported");
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q, k and v projections have biases; o_proj has none
    const bool sliding = hf_config_value<bool>(j, "use_sliding_window", false, file);
    HL_CHECK(!sliding, file, ": use_sliding_window is not supported (every position attends to all before it)");
  } else {
    HL_CHECK(!hf_config_value<bool>(j, "attention_bias", false, file), file,
             ": attention_bias is not supported (biases on q, k, v and o_proj)");
  }
  if (j.contains("sliding_window") && !j.at("sliding_window").is_null() && type == "mistral") {
    const int64_t window = hf_config_int(j, {"sliding_window"}, 1, int64_t(1) << 40, file);
    HL_CHECK(window >= c.context_length, file, ": sliding_window ", window, " is shorter than the context (",
             c.context_length, " positions), which headlab does not compute");
  }
  c.validate();
  return c;
}

WeightMap llama_weights(const nn::DecoderConfig& c) {
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
    for (const auto& [h, o, rows, rotary] : qkv) {
      add(hf + ".self_attn." + h + ".weight", ours + ".att." + o + ".weight", {rows, C}, rotary);
      if (c.qkv_bias) add(hf + ".self_attn." + h + ".bias", ours + ".att." + o + ".bias", {rows}, rotary);
    }
    add(hf + ".self_attn.o_proj.weight", ours + ".att.out_proj.weight", {C, Dq});
    add(hf + ".mlp.gate_proj.weight", ours + ".ff.fc1.weight", {F, C});
    add(hf + ".mlp.up_proj.weight", ours + ".ff.fc2.weight", {F, C});
    add(hf + ".mlp.down_proj.weight", ours + ".ff.fc3.weight", {C, F});
    add(hf + ".input_layernorm.weight", ours + ".norm1.weight", {C});
    add(hf + ".post_attention_layernorm.weight", ours + ".norm2.weight", {C});
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

class HfLlamaFormat final : public DecoderFolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"llama", "mistral", "qwen2"}; }
  const nn::DecoderFamily& family() const override { return nn::llama_family(); }
  nn::DecoderConfig config_from_hf(const json& j, const std::string& file) const override {
    return llama_config_from_hf(j, file);
  }
  WeightMap weight_map(const nn::DecoderConfig& c, const std::string&) const override { return llama_weights(c); }
  json hf_config(const nn::DecoderConfig& c) const override {
    return {{"architectures", {c.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
            {"model_type", c.qkv_bias ? "qwen2" : "llama"},
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
            {"hidden_act", "silu"},
            {"tie_word_embeddings", c.tie_embeddings},
            {"attention_dropout", c.drop_rate},
            {"torch_dtype", "float32"}};
  }
  std::string describe(const nn::DecoderConfig& c) const override {
    return std::string("head: ") + (c.tie_embeddings ? "tied to embed_tokens" : "lm_head.weight") + "; " +
           std::to_string(c.kv_heads()) + " key/value heads for " + std::to_string(c.n_heads) + " query heads";
  }
};

const HfLlamaFormat& format() {
  static const HfLlamaFormat f;
  return f;
}

}  // namespace

nn::DecoderConfig read_hf_llama_config(const std::string& folder) { return format().config(folder); }

const FolderFormat& hf_llama_format() { return format(); }

}  // namespace headlab::io
