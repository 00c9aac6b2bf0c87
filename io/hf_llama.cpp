// LLaMA-family folders in the Hugging Face layout <-> LlamaModel parameters (see hf_llama.h): names map one to
// one (model.layers.N.self_attn.q_proj -> trf_blocks.N.att.W_query, mlp.gate_proj -> ff.fc1, up_proj -> fc2,
// down_proj -> fc3, input_layernorm -> norm1, post_attention_layernorm -> norm2); nn.Linear's (out, in) on both
// sides.
#include "io/hf_llama.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "autograd/engine.h"
#include "base/input_path.h"
#include "io/atomic_file.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;
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

}  // namespace

nn::DecoderConfig read_hf_llama_config(const std::string& folder) {
  return llama_config_from_hf(read_hf_config(folder), hf_config_path(folder));
}

namespace {

// Every tensor of the folder by LlamaModel's names, shapes checked; anything else in the weights refused.
FolderModel read_hf_llama(const std::string& folder) {
  FolderModel out;
  const nn::DecoderConfig c = read_hf_llama_config(folder);
  out.config = c.to_json();
  const SafetensorsModel st = SafetensorsModel::open(folder);
  std::set<std::string> used;
  const int64_t C = c.emb_dim, F = c.hidden_dim, V = c.vocab_size, Dq = c.n_heads * c.head_size(),
                Dkv = c.kv_heads() * c.head_size();
  const auto take = [&](const std::string& hf, const std::string& ours, const Shape& shape) {
    HL_CHECK(st.contains(hf), folder, ": missing tensor '", hf, "'");
    const SafetensorsEntry& e = st.file_of(hf).entry(hf);
    HL_CHECK(e.shape == shape, st.file_of(hf).path(), ": tensor '", hf, "' has shape ", shape_str(e.shape),
             ", expected ", shape_str(shape), " for the config");
    used.insert(hf);
    out.parameters.emplace_back(ours, st.to_float(hf));
  };
  take("model.embed_tokens.weight", "tok_emb.weight", {V, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    const std::pair<const char*, const char*> qkv[] = {
        {"q_proj", "W_query"}, {"k_proj", "W_key"}, {"v_proj", "W_value"}};
    for (const auto& [h, o] : qkv) {
      const int64_t rows = std::string(h) == "q_proj" ? Dq : Dkv;
      take(hf + ".self_attn." + h + ".weight", ours + ".att." + o + ".weight", {rows, C});
      if (c.qkv_bias) take(hf + ".self_attn." + h + ".bias", ours + ".att." + o + ".bias", {rows});
    }
    take(hf + ".self_attn.o_proj.weight", ours + ".att.out_proj.weight", {C, Dq});
    take(hf + ".mlp.gate_proj.weight", ours + ".ff.fc1.weight", {F, C});
    take(hf + ".mlp.up_proj.weight", ours + ".ff.fc2.weight", {F, C});
    take(hf + ".mlp.down_proj.weight", ours + ".ff.fc3.weight", {C, F});
    take(hf + ".input_layernorm.weight", ours + ".norm1.weight", {C});
    take(hf + ".post_attention_layernorm.weight", ours + ".norm2.weight", {C});
  }
  take("model.norm.weight", "final_norm.weight", {C});
  if (c.tie_embeddings) {
    if (st.contains("lm_head.weight")) used.insert("lm_head.weight");  // the same tensor, saved beside it
  } else {
    HL_CHECK(st.contains("lm_head.weight"), folder,
             ": tie_word_embeddings is false but the weights hold no lm_head.weight");
    take("lm_head.weight", "out_head.weight", {V, C});
  }
  for (const std::string& name : st.names()) {
    const bool rotary_buffer = name.ends_with(".rotary_emb.inv_freq");  // older files save it; recomputed here
    HL_CHECK(used.count(name) || rotary_buffer, st.file_of(name).path(), ": tensor '", name, "' is not part of a ",
             "llama-family model of this config");
  }
  return out;
}

// Rows of a (heads * D, C) projection from interleaved pairs (2i, 2i+1) to halves (i, i + D/2) per head.
Tensor pairs_to_halves(const Tensor& w, int64_t D) {
  std::vector<int64_t> rows;
  for (int64_t h = 0; h < w.size(0) / D; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) rows.push_back(h * D + 2 * i);
    for (int64_t i = 0; i < D / 2; ++i) rows.push_back(h * D + 2 * i + 1);
  }
  return index_select(w, 0, tensor(rows));
}

void write_hf_llama(const std::string& folder, const nn::DecoderModel& model) {
  const NoGradGuard no_grad;
  const nn::DecoderConfig& c = model.config();
  const auto cpu = [](const Tensor& p) { return p.detach().to(kCPU).contiguous(); };
  const auto param = [&](const std::string& name) { return cpu(model.parameter(name)); };
  const auto rotated = [&](const Tensor& p) {  // q and k rows in the halves layout
    const Tensor w = cpu(p);
    return c.rope_interleaved ? pairs_to_halves(w, c.head_size()) : w;
  };
  std::vector<std::pair<std::string, Tensor>> t;
  t.emplace_back("model.embed_tokens.weight", param("tok_emb.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    std::shared_ptr<nn::CausalMultiHead> converted;
    const nn::CausalMultiHeadAttention* att = &fused_attention(model, l, converted);
    // A pruned layer is written at full width: its removed heads (and their groups' keys and values) as zeros.
    const int64_t D = c.head_size(), G = c.group_size();
    std::vector<int64_t> heads, groups;  // the kept ones, by original index
    for (int64_t j = 0; j < att->head_count(); ++j) heads.push_back(model.original_head(l, j));
    for (size_t j = 0; j < heads.size(); j += static_cast<size_t>(G)) groups.push_back(heads[j] / G);
    const auto by_head = [&](const Tensor& w) { return full_width(w, heads, c.n_heads, D); };
    const auto by_group = [&](const Tensor& w) { return full_width(w, groups, c.kv_heads(), D); };
    t.emplace_back(hf + ".self_attn.q_proj.weight", by_head(rotated(att->W_query->weight)));
    t.emplace_back(hf + ".self_attn.k_proj.weight", by_group(rotated(att->W_key->weight)));
    t.emplace_back(hf + ".self_attn.v_proj.weight", by_group(cpu(att->W_value->weight)));
    if (c.qkv_bias) {
      const auto bias = [&](const Tensor& p, bool rotates) {  // (rows, 1): rows as the weights'
        const Tensor b = cpu(p).view({-1, 1});
        return rotates && c.rope_interleaved ? pairs_to_halves(b, c.head_size()) : b;
      };
      t.emplace_back(hf + ".self_attn.q_proj.bias", by_head(bias(att->W_query->bias, true)).view({-1}));
      t.emplace_back(hf + ".self_attn.k_proj.bias", by_group(bias(att->W_key->bias, true)).view({-1}));
      t.emplace_back(hf + ".self_attn.v_proj.bias", by_group(bias(att->W_value->bias, false)).view({-1}));
    }
    t.emplace_back(hf + ".self_attn.o_proj.weight", by_head(cpu(att->out_proj->weight).mT()).mT().contiguous());
    t.emplace_back(hf + ".mlp.gate_proj.weight", param(ours + ".ff.fc1.weight"));
    t.emplace_back(hf + ".mlp.up_proj.weight", param(ours + ".ff.fc2.weight"));
    t.emplace_back(hf + ".mlp.down_proj.weight", param(ours + ".ff.fc3.weight"));
    t.emplace_back(hf + ".input_layernorm.weight", param(ours + ".norm1.weight"));
    t.emplace_back(hf + ".post_attention_layernorm.weight", param(ours + ".norm2.weight"));
  }
  t.emplace_back("model.norm.weight", param("final_norm.weight"));
  if (!c.tie_embeddings) t.emplace_back("lm_head.weight", param("out_head.weight"));
  std::error_code ec;
  fs::create_directories(folder, ec);
  HL_CHECK(!ec && fs::is_directory(folder), "export: cannot create folder '", folder,
           "': ", ec ? ec.message() : "not a folder");
  write_safetensors((fs::path(folder) / "model.safetensors").string(), t, {{"format", "pt"}});
  const json config = {{"architectures", {c.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
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
  write_file_atomic((fs::path(folder) / "config.json").string(), config.dump(2) + "\n", "export");
}

class HfLlamaFormat : public FolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"llama", "mistral", "qwen2"}; }
  nlohmann::json read_config(const std::string& folder) const override {
    return read_hf_llama_config(folder).to_json();
  }
  FolderModel read(const std::string& folder) const override { return read_hf_llama(folder); }
  void write(const std::string& folder, const nn::Model& model, const TokenizerFiles& tokenizer) const override {
    const auto* llama = dynamic_cast<const nn::DecoderModel*>(&model);
    HL_CHECK(llama && llama->config().family == &nn::llama_family(), "export: a ", model.type_name(), " is not a llama-family model");
    write_hf_llama(folder, *llama);
    write_tokenizer_files(folder, tokenizer);
  }
  std::string describe(const FolderModel& m) const override {
    const nn::DecoderConfig c = nn::llama_family().config(m.config);
    return std::string("head: ") + (c.tie_embeddings ? "tied to embed_tokens" : "lm_head.weight") + "; " +
           std::to_string(c.kv_heads()) + " key/value heads for " + std::to_string(c.n_heads) + " query heads";
  }
};

}  // namespace

const FolderFormat& hf_llama_format() {
  static const HfLlamaFormat format;
  return format;
}

}  // namespace headlab::io
