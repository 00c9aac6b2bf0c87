// GPT-NeoX folders in the Hugging Face layout <-> the neox family's parameters (see hf_neox.h): config.json's keys,
// and the weight table: gpt_neox.embed_in -> tok_emb, layers.N.attention.query_key_value -> att.W_query/W_key/
// W_value (rows per head [q | k | v]), attention.dense -> att.out_proj, mlp.dense_h_to_4h / dense_4h_to_h ->
// ff.layers.0 / 2, input_layernorm / post_attention_layernorm -> norm1 / norm2, final_layer_norm -> final_norm,
// embed_out -> out_head; nn.Linear's (out, in) on both sides.
#include "io/hf_neox.h"

#include "io/hf_weights.h"

namespace headlab::io {

namespace {

using nlohmann::json;

nn::DecoderConfig neox_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "", file);
  HL_CHECK(type == "gpt_neox", file, ": model_type '", type, "' is not one the neox family reads (gpt_neox)");
  nn::DecoderConfig c = nn::neox_family().config();
  read_hf_sizes(j, file, c);
  // Older files: rotary_pct and rotary_emb_base; newer: partial_rotary_factor and rope_theta.
  const char* pct_key = j.contains("partial_rotary_factor") ? "partial_rotary_factor" : "rotary_pct";
  const double pct = hf_config_value<double>(j, pct_key, 0.25, file);
  HL_CHECK(pct >= 0 && pct <= 1, file, ": ", pct_key, " ", pct, " is not a fraction in [0, 1]");
  c.rotary_dims = static_cast<int64_t>(static_cast<double>(c.head_size()) * pct);  // Hugging Face's int()
  HL_CHECK(c.rotary_dims % 2 == 0, file, ": ", pct_key, " ", pct, " of head size ", c.head_size(), " rotates ",
           c.rotary_dims, " dims, an odd number (rotary turns pairs)");
  c.rope_theta = hf_config_value<double>(j, j.contains("rope_theta") ? "rope_theta" : "rotary_emb_base", 10000.0, file);
  c.norm_eps = hf_config_value<double>(j, "layer_norm_eps", 1e-5, file);
  c.parallel_residual = hf_config_value<bool>(j, "use_parallel_residual", true, file);
  c.qkv_bias = hf_config_value<bool>(j, "attention_bias", true, file);
  c.tie_embeddings = hf_config_value<bool>(j, "tie_word_embeddings", false, file);
  c.drop_rate = hf_config_value<double>(j, "attention_dropout", 0.0, file);
  const std::string act = hf_config_value<std::string>(j, "hidden_act", "gelu", file);
  HL_CHECK(act == "gelu", file, ": hidden_act '", act,
           "' is not supported (the neox family's MLP uses the exact GELU: 'gelu')");
  HL_CHECK(!j.contains("rope_scaling") || j.at("rope_scaling").is_null(), file, ": rope_scaling ",
           j.contains("rope_scaling") ? j.at("rope_scaling").dump() : "", " is not supported (plain rotary only)");
  c.validate();
  return c;
}

WeightMap neox_weights(const nn::DecoderConfig& c) {
  const int64_t C = c.emb_dim, F = c.hidden_dim, V = c.vocab_size;
  // Older files save the causal mask, its fill value and the rotary frequencies: recomputed here.
  WeightMap m;
  m.what = "a GPT-NeoX model", m.head_dim = c.head_size();
  m.buffer_suffixes = {".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq"};
  const auto add = [&](std::string hf, std::vector<std::string> ours, Shape shape, Fused fused = Fused::none) {
    m.add(std::move(hf), std::move(ours), std::move(shape)).fused = fused;
  };
  const auto with_bias = [&](const std::string& hf, const std::string& ours, Shape shape) {
    add(hf + ".weight", {ours + ".weight"}, shape);
    add(hf + ".bias", {ours + ".bias"}, {shape[0]});
  };
  add("gpt_neox.embed_in.weight", {"tok_emb.weight"}, {V, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "gpt_neox.layers." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    const auto qkv = [&](const char* kind) {
      const std::string att = ours + ".att.";
      return std::vector<std::string>{att + "W_query." + kind, att + "W_key." + kind, att + "W_value." + kind};
    };
    add(hf + ".attention.query_key_value.weight", qkv("weight"), {3 * C, C}, Fused::per_head);
    if (c.qkv_bias) add(hf + ".attention.query_key_value.bias", qkv("bias"), {3 * C}, Fused::per_head);
    add(hf + ".attention.dense.weight", {ours + ".att.out_proj.weight"}, {C, C});
    if (c.qkv_bias) add(hf + ".attention.dense.bias", {ours + ".att.out_proj.bias"}, {C});
    with_bias(hf + ".mlp.dense_h_to_4h", ours + ".ff.layers.0", {F, C});
    with_bias(hf + ".mlp.dense_4h_to_h", ours + ".ff.layers.2", {C, F});
    with_bias(hf + ".input_layernorm", ours + ".norm1", {C});
    with_bias(hf + ".post_attention_layernorm", ours + ".norm2", {C});
  }
  with_bias("gpt_neox.final_layer_norm", "final_norm", {C});
  if (c.tie_embeddings)
    m.ignored.push_back("embed_out.weight");  // the same tensor, saved beside it
  else
    add("embed_out.weight", {"out_head.weight"}, {V, C});
  return m;
}

class HfNeoXFormat final : public DecoderFolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"gpt_neox"}; }
  const nn::DecoderFamily& family() const override { return nn::neox_family(); }
  nn::DecoderConfig config_from_hf(const json& j, const std::string& file) const override {
    return neox_config_from_hf(j, file);
  }
  WeightMap weight_map(const nn::DecoderConfig& c, const std::string&, const WeightFiles*) const override {
    return neox_weights(c);
  }
  json hf_config(const nn::DecoderConfig& c) const override {
    return {{"architectures", {"GPTNeoXForCausalLM"}},
            {"model_type", "gpt_neox"},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"hidden_size", c.emb_dim},
            {"intermediate_size", c.hidden_dim},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.context_length},
            {"rotary_pct", static_cast<double>(c.rotary_dims) / static_cast<double>(c.head_size())},
            {"rotary_emb_base", c.rope_theta},
            {"layer_norm_eps", c.norm_eps},
            {"use_parallel_residual", c.parallel_residual},
            {"attention_bias", c.qkv_bias},
            {"hidden_act", "gelu"},
            {"tie_word_embeddings", c.tie_embeddings},
            {"attention_dropout", c.drop_rate},
            {"hidden_dropout", 0.0},
            {"torch_dtype", "float32"}};
  }
  std::string describe(const nn::DecoderConfig& c) const override {
    return std::string("head: ") + (c.tie_embeddings ? "tied to embed_in" : "embed_out.weight") + "; rotary on " +
           std::to_string(c.rotary_dims) + " of " + std::to_string(c.head_size()) + " dims per head; " +
           (c.parallel_residual ? "parallel" : "sequential") + " residual";
  }
};

const HfNeoXFormat& format() {
  static const HfNeoXFormat f;
  return f;
}

}  // namespace

nn::DecoderConfig read_hf_neox_config(const std::string& folder) { return format().config(folder); }

const FolderFormat& hf_neox_format() { return format(); }

}  // namespace headlab::io
