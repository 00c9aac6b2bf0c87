// GPT-NeoX folders in the Hugging Face layout <-> NeoXModel parameters (see hf_neox.h): gpt_neox.embed_in ->
// tok_emb, gpt_neox.layers.N.attention.query_key_value -> trf_blocks.N.att.W_query/W_key/W_value (split per
// head), attention.dense -> att.out_proj, mlp.dense_h_to_4h -> ff.layers.0, mlp.dense_4h_to_h -> ff.layers.2,
// input_layernorm -> norm1, post_attention_layernorm -> norm2, gpt_neox.final_layer_norm -> final_norm,
// embed_out -> out_head; nn.Linear's (out, in) on both sides.
#include "io/hf_neox.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "autograd/engine.h"
#include "io/atomic_file.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

nn::DecoderConfig neox_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "", file);
  HL_CHECK(type == "gpt_neox", file, ": model_type '", type, "' is not one the neox family reads (gpt_neox)");
  nn::DecoderConfig c = nn::neox_family().config();
  c.n_layers = hf_config_int(j, {"num_hidden_layers"}, 1, 10000, file);
  c.n_heads = hf_config_int(j, {"num_attention_heads"}, 1, 100000, file);
  c.emb_dim = hf_config_int(j, {"hidden_size"}, 1, 1 << 20, file);
  HL_CHECK(c.emb_dim % c.n_heads == 0, file, ": hidden_size ", c.emb_dim, " is not divisible by num_attention_heads ",
           c.n_heads);
  c.hidden_dim = hf_config_int(j, {"intermediate_size"}, 1, 1 << 22, file);
  c.vocab_size = hf_config_int(j, {"vocab_size"}, 1, 1 << 28, file);
  c.context_length = hf_config_int(j, {"max_position_embeddings"}, 1, 1 << 24, file);
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

// The fused projection's rows per head h: [q_h | k_h | v_h], D each (Hugging Face's view(..., H, 3 * D)).
// which 0, 1, 2: q, k, v; rows (3 * H * D, ...) -> (H * D, ...).
Tensor unfuse(const Tensor& qkv, int64_t H, int64_t D, int64_t which) {
  std::vector<int64_t> rows;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < D; ++i) rows.push_back(h * 3 * D + which * D + i);
  return index_select(qkv, 0, tensor(rows));
}

// The inverse: q, k, v (H * D, ...) each -> (3 * H * D, ...).
Tensor fuse(const Tensor& q, const Tensor& k, const Tensor& v, int64_t H, int64_t D) {
  std::vector<Tensor> parts;
  for (int64_t h = 0; h < H; ++h)
    for (const Tensor* t : {&q, &k, &v}) parts.push_back(t->narrow(0, h * D, D));
  return cat(parts, 0);
}

// Every tensor of the folder by NeoXModel's names, shapes checked; anything else in the weights refused.
FolderModel read_hf_neox(const std::string& folder) {
  FolderModel out;
  const nn::DecoderConfig c = read_hf_neox_config(folder);
  out.config = c.to_json();
  const SafetensorsModel st = SafetensorsModel::open(folder);
  std::set<std::string> used;
  const int64_t C = c.emb_dim, F = c.hidden_dim, V = c.vocab_size, H = c.n_heads, D = c.head_size();
  const auto read = [&](const std::string& hf, const Shape& shape) {
    HL_CHECK(st.contains(hf), folder, ": missing tensor '", hf, "'");
    const SafetensorsEntry& e = st.file_of(hf).entry(hf);
    HL_CHECK(e.shape == shape, st.file_of(hf).path(), ": tensor '", hf, "' has shape ", shape_str(e.shape),
             ", expected ", shape_str(shape), " for the config");
    used.insert(hf);
    return st.to_float(hf);
  };
  const auto take = [&](const std::string& hf, const std::string& ours, const Shape& shape) {
    out.parameters.emplace_back(ours, read(hf, shape));
  };
  take("gpt_neox.embed_in.weight", "tok_emb.weight", {V, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "gpt_neox.layers." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    const char* qkv_names[] = {"W_query", "W_key", "W_value"};
    const Tensor w = read(hf + ".attention.query_key_value.weight", {3 * C, C});
    for (int64_t i = 0; i < 3; ++i)
      out.parameters.emplace_back(ours + ".att." + qkv_names[i] + ".weight", unfuse(w, H, D, i));
    if (c.qkv_bias) {
      const Tensor b = read(hf + ".attention.query_key_value.bias", {3 * C});
      for (int64_t i = 0; i < 3; ++i)
        out.parameters.emplace_back(ours + ".att." + qkv_names[i] + ".bias", unfuse(b, H, D, i));
    }
    take(hf + ".attention.dense.weight", ours + ".att.out_proj.weight", {C, C});
    if (c.qkv_bias) take(hf + ".attention.dense.bias", ours + ".att.out_proj.bias", {C});
    take(hf + ".mlp.dense_h_to_4h.weight", ours + ".ff.layers.0.weight", {F, C});
    take(hf + ".mlp.dense_h_to_4h.bias", ours + ".ff.layers.0.bias", {F});
    take(hf + ".mlp.dense_4h_to_h.weight", ours + ".ff.layers.2.weight", {C, F});
    take(hf + ".mlp.dense_4h_to_h.bias", ours + ".ff.layers.2.bias", {C});
    for (const auto& [norm, mine] : {std::pair{"input_layernorm", "norm1"}, {"post_attention_layernorm", "norm2"}}) {
      take(hf + "." + norm + ".weight", ours + "." + mine + ".weight", {C});
      take(hf + "." + norm + ".bias", ours + "." + mine + ".bias", {C});
    }
  }
  take("gpt_neox.final_layer_norm.weight", "final_norm.weight", {C});
  take("gpt_neox.final_layer_norm.bias", "final_norm.bias", {C});
  if (c.tie_embeddings) {
    if (st.contains("embed_out.weight")) used.insert("embed_out.weight");  // the same tensor, saved beside it
  } else {
    take("embed_out.weight", "out_head.weight", {V, C});
  }
  for (const std::string& name : st.names()) {
    // Buffers older files save: the causal mask, its fill value and the rotary frequencies, recomputed here.
    const bool buffer = name.ends_with(".attention.bias") || name.ends_with(".attention.masked_bias") ||
                        name.ends_with(".rotary_emb.inv_freq");
    HL_CHECK(used.count(name) || buffer, st.file_of(name).path(), ": tensor '", name,
             "' is not part of a GPT-NeoX model of this config");
  }
  return out;
}

void write_hf_neox(const std::string& folder, const nn::DecoderModel& model) {
  const NoGradGuard no_grad;
  const nn::DecoderConfig& c = model.config();
  const int64_t H = c.n_heads, D = c.head_size();
  const auto cpu = [](const Tensor& p) { return p.detach().to(kCPU).contiguous(); };
  const auto param = [&](const std::string& name) { return cpu(model.parameter(name)); };
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("gpt_neox.embed_in.weight", param("tok_emb.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "gpt_neox.layers." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    std::shared_ptr<nn::CausalMultiHead> converted;
    const nn::CausalMultiHeadAttention* att = &fused_attention(model, l, converted);
    std::vector<int64_t> kept;  // a pruned layer is written at full width, its removed heads as zeros
    for (int64_t j = 0; j < att->head_count(); ++j) kept.push_back(model.original_head(l, j));
    const auto wide = [&](const Tensor& w) { return full_width(cpu(w), kept, H, D); };
    t.emplace_back(hf + ".attention.query_key_value.weight",
                   fuse(wide(att->W_query->weight), wide(att->W_key->weight), wide(att->W_value->weight), H, D));
    if (c.qkv_bias) {
      const auto wide_bias = [&](const Tensor& b) { return wide(b.view({-1, 1})); };
      t.emplace_back(
          hf + ".attention.query_key_value.bias",
          fuse(wide_bias(att->W_query->bias), wide_bias(att->W_key->bias), wide_bias(att->W_value->bias), H, D)
              .view({-1}));
    }
    t.emplace_back(hf + ".attention.dense.weight", wide(cpu(att->out_proj->weight).mT()).mT().contiguous());
    if (c.qkv_bias) t.emplace_back(hf + ".attention.dense.bias", cpu(att->out_proj->bias));
    t.emplace_back(hf + ".mlp.dense_h_to_4h.weight", param(ours + ".ff.layers.0.weight"));
    t.emplace_back(hf + ".mlp.dense_h_to_4h.bias", param(ours + ".ff.layers.0.bias"));
    t.emplace_back(hf + ".mlp.dense_4h_to_h.weight", param(ours + ".ff.layers.2.weight"));
    t.emplace_back(hf + ".mlp.dense_4h_to_h.bias", param(ours + ".ff.layers.2.bias"));
    for (const auto& [norm, mine] : {std::pair{"input_layernorm", "norm1"}, {"post_attention_layernorm", "norm2"}}) {
      t.emplace_back(hf + "." + norm + ".weight", param(ours + "." + mine + ".weight"));
      t.emplace_back(hf + "." + norm + ".bias", param(ours + "." + mine + ".bias"));
    }
  }
  t.emplace_back("gpt_neox.final_layer_norm.weight", param("final_norm.weight"));
  t.emplace_back("gpt_neox.final_layer_norm.bias", param("final_norm.bias"));
  if (!c.tie_embeddings) t.emplace_back("embed_out.weight", param("out_head.weight"));
  std::error_code ec;
  fs::create_directories(folder, ec);
  HL_CHECK(!ec && fs::is_directory(folder), "export: cannot create folder '", folder,
           "': ", ec ? ec.message() : "not a folder");
  write_safetensors((fs::path(folder) / "model.safetensors").string(), t, {{"format", "pt"}});
  const json config = {{"architectures", {"GPTNeoXForCausalLM"}},
                       {"model_type", "gpt_neox"},
                       {"num_hidden_layers", c.n_layers},
                       {"num_attention_heads", c.n_heads},
                       {"hidden_size", c.emb_dim},
                       {"intermediate_size", c.hidden_dim},
                       {"vocab_size", c.vocab_size},
                       {"max_position_embeddings", c.context_length},
                       {"rotary_pct", static_cast<double>(c.rotary_dims) / static_cast<double>(D)},
                       {"rotary_emb_base", c.rope_theta},
                       {"layer_norm_eps", c.norm_eps},
                       {"use_parallel_residual", c.parallel_residual},
                       {"attention_bias", c.qkv_bias},
                       {"hidden_act", "gelu"},
                       {"tie_word_embeddings", c.tie_embeddings},
                       {"attention_dropout", c.drop_rate},
                       {"hidden_dropout", 0.0},
                       {"torch_dtype", "float32"}};
  write_file_atomic((fs::path(folder) / "config.json").string(), config.dump(2) + "\n", "export");
}

class HfNeoXFormat : public FolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"gpt_neox"}; }
  nlohmann::json read_config(const std::string& folder) const override { return read_hf_neox_config(folder).to_json(); }
  FolderModel read(const std::string& folder) const override { return read_hf_neox(folder); }
  void write(const std::string& folder, const nn::Model& model, const TokenizerFiles& tokenizer) const override {
    const auto* neox = dynamic_cast<const nn::DecoderModel*>(&model);
    HL_CHECK(neox && neox->config().family == &nn::neox_family(), "export: a ", model.type_name(), " is not a GPT-NeoX model");
    write_hf_neox(folder, *neox);
    write_tokenizer_files(folder, tokenizer);
  }
  std::string describe(const FolderModel& m) const override {
    const nn::DecoderConfig c = nn::neox_family().config(m.config);
    return std::string("head: ") + (c.tie_embeddings ? "tied to embed_in" : "embed_out.weight") + "; rotary on " +
           std::to_string(c.rotary_dims) + " of " + std::to_string(c.head_size()) + " dims per head; " +
           (c.parallel_residual ? "parallel" : "sequential") + " residual";
  }
};

}  // namespace

nn::DecoderConfig read_hf_neox_config(const std::string& folder) {
  return neox_config_from_hf(read_hf_config(folder), hf_config_path(folder));
}

const FolderFormat& hf_neox_format() {
  static const HfNeoXFormat format;
  return format;
}

}  // namespace headlab::io
