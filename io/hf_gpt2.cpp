// GPT-2 folders in the Hugging Face layout <-> the gpt family's parameters (see hf_gpt2.h): config.json's
// keys, and the weight table: GPT-2's Conv1D stores (in, out) where nn.Linear stores (out, in), and its c_attn
// holds query, key and value side by side (C, 3C); everything else maps name to name. C = n_embd.
#include "io/hf_gpt2.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/input_path.h"
#include "io/hf_weights.h"
#include "io/safetensors.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kGpt2LayerNormEps = 1e-5;  // the book's LayerNorm, and every GPT-2's

// What of GPT2Config headlab's GPTModel computes; anything else is refused by name.
nn::DecoderConfig gpt_config_from_hf(const json& j, const std::string& file) {
  const std::string type = hf_config_value<std::string>(j, "model_type", "gpt2", file);
  HL_CHECK(type == "gpt2", file, ": model_type '", type, "' is not gpt2");
  nn::DecoderConfig c;
  c.n_layers = hf_config_int(j, {"n_layer"}, 1, 1000, file);
  c.n_heads = hf_config_int(j, {"n_head"}, 1, 10000, file);
  c.emb_dim = hf_config_int(j, {"n_embd"}, 1, 1 << 20, file);
  c.context_length = hf_config_int(j, {"n_positions", "n_ctx"}, 1, 1 << 24, file);
  c.vocab_size = hf_config_int(j, {"vocab_size"}, 1, 1 << 28, file);
  HL_CHECK(c.emb_dim % c.n_heads == 0, file, ": n_embd ", c.emb_dim, " is not divisible by n_head ", c.n_heads);
  c.qkv_bias = true;
  c.attention = nn::AttentionForm::fused;
  c.drop_rate = hf_config_value<double>(j, "resid_pdrop", 0.1, file);
  HL_CHECK(c.drop_rate >= 0 && c.drop_rate < 1, file, ": resid_pdrop must be in [0, 1), got ", c.drop_rate);

  const std::string act = hf_config_value<std::string>(j, "activation_function", "gelu_new", file);
  HL_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", file, ": activation_function '", act,
           "' is not supported (GPTModel's GELU is the tanh approximation: gelu_new)");
  const double eps = hf_config_value<double>(j, "layer_norm_epsilon", kGpt2LayerNormEps, file);
  HL_CHECK(std::abs(eps - kGpt2LayerNormEps) <= 1e-12, file, ": layer_norm_epsilon ", eps,
           " is not supported (GPTModel's LayerNorm uses 1e-5)");
  if (j.contains("n_inner") && !j.at("n_inner").is_null()) {
    const int64_t inner = hf_config_int(j, {"n_inner"}, 1, int64_t(1) << 40, file);
    HL_CHECK(inner == 4 * c.emb_dim, file, ": n_inner ", inner, " is not 4 x n_embd (", 4 * c.emb_dim,
             "), which GPTModel's FeedForward has");
  }
  HL_CHECK(hf_config_value<bool>(j, "scale_attn_weights", true, file), file,
           ": scale_attn_weights false is not supported (scores are scaled by 1 / sqrt(head size))");
  HL_CHECK(!hf_config_value<bool>(j, "scale_attn_by_inverse_layer_idx", false, file), file,
           ": scale_attn_by_inverse_layer_idx is not supported");
  HL_CHECK(!hf_config_value<bool>(j, "add_cross_attention", false, file), file,
           ": add_cross_attention is not supported (a decoder-only GPT-2 is)");
  c.validate();
  return c;
}

}  // namespace

WeightMap gpt2_weights(const nn::DecoderConfig& c, const std::string& prefix, bool tied) {
  const int64_t C = c.emb_dim, V = c.vocab_size;
  WeightMap m;
  m.what = "a GPT-2", m.buffer_suffixes = {".attn.bias", ".attn.masked_bias"};
  const auto add = [&](const std::string& hf, std::vector<std::string> ours, Shape shape, bool conv1d = false,
                       Fused fused = Fused::none) {
    WeightEntry& e = m.add(prefix + hf, std::move(ours), std::move(shape));
    e.transposed = conv1d, e.fused = fused;
  };
  const auto linear = [&](const std::string& hf, const std::string& ours, int64_t in, int64_t out) {
    add(hf + ".weight", {ours + ".weight"}, {in, out}, true);
    add(hf + ".bias", {ours + ".bias"}, {out});
  };
  const auto norm = [&](const std::string& hf, const std::string& ours) {
    add(hf + ".weight", {ours + ".scale"}, {C});
    add(hf + ".bias", {ours + ".shift"}, {C});
  };
  add("wte.weight", {"tok_emb.weight"}, {V, C});
  add("wpe.weight", {"pos_emb.weight"}, {c.context_length, C});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "h." + std::to_string(l), att = "trf_blocks." + std::to_string(l) + ".att.";
    const auto qkv = [&](const char* kind) {
      return std::vector<std::string>{att + "W_query." + kind, att + "W_key." + kind, att + "W_value." + kind};
    };
    add(hf + ".attn.c_attn.weight", qkv("weight"), {C, 3 * C}, true, Fused::blocks);
    add(hf + ".attn.c_attn.bias", qkv("bias"), {3 * C}, false, Fused::blocks);
    linear(hf + ".attn.c_proj", att + "out_proj", C, C);
    const std::string ours = "trf_blocks." + std::to_string(l);
    linear(hf + ".mlp.c_fc", ours + ".ff.layers.0", C, 4 * C);
    linear(hf + ".mlp.c_proj", ours + ".ff.layers.2", 4 * C, C);
    norm(hf + ".ln_1", ours + ".norm1");
    norm(hf + ".ln_2", ours + ".norm2");
  }
  norm("ln_f", "final_norm");
  // The head: wte itself when tied (a lm_head.weight saved beside it is the same tensor), else lm_head.
  if (tied) {
    m.ignored.push_back("lm_head.weight");
  } else {
    m.add("lm_head.weight", {"out_head.weight"}, {V, C}).missing =
        "tie_word_embeddings is false but the weights hold no lm_head.weight";
  }
  return m;
}

namespace {

class HfGpt2Format final : public DecoderFolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"gpt2"}; }
  const nn::DecoderFamily& family() const override { return nn::gpt_family(); }
  nn::DecoderConfig config_from_hf(const json& j, const std::string& file) const override {
    nn::DecoderConfig c = gpt_config_from_hf(j, file);
    c.tie_embeddings = hf_config_value<bool>(j, "tie_word_embeddings", true, file);
    return c;
  }
  // Files save_pretrained wrote carry the "transformer." prefix; older ones do not.
  WeightMap weight_map(const nn::DecoderConfig& c, const std::string& folder, const WeightFiles* w) const override {
    if (w == nullptr) return gpt2_weights(c, "transformer.", c.tie_embeddings);
    HL_CHECK(w->contains("transformer.wte.weight") || w->contains("wte.weight"), folder,
             ": the weights hold neither transformer.wte.weight nor wte.weight");
    return gpt2_weights(c, w->contains("transformer.wte.weight") ? "transformer." : "", c.tie_embeddings);
  }
  FolderModel read(const std::string& folder) const override {
    FolderModel m = DecoderFolderFormat::read(folder);
    for (const char* f : {"vocab.json", "merges.txt"}) {
      const std::string path = (fs::path(folder) / f).string();
      if (path_present(path)) (std::string(f) == "vocab.json" ? m.vocab_path : m.merges_path) = path;
    }
    return m;
  }
  // A head equal to wte is written tied, as save_pretrained would (the book's GPT unties them).
  void write(const std::string& folder, const nn::Model& model, const TokenizerFiles& tokenizer) const override {
    const nn::DecoderModel& m = decoder_of(model);
    const nn::DecoderConfig& c = m.config();
    HL_CHECK(!c.attn_only, "export: an attention-only model has no MLPs, which GPT-2's layout needs");
    const Tensor wte = m.tok_emb->weight.detach().to(kCPU).contiguous(),
                 head = m.out_head->weight.detach().to(kCPU).contiguous();
    const bool tied = c.tie_embeddings ||
                      std::memcmp(wte.data<float>(), head.data<float>(), sizeof(float) * size_t(wte.numel())) == 0;
    json config = hf_config(c);
    config["tie_word_embeddings"] = tied;
    write_hf_folder(folder, weights_to_write(m, gpt2_weights(c, "transformer.", tied)), config, tokenizer);
  }
  json hf_config(const nn::DecoderConfig& c) const override {
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_embd", c.emb_dim},
            {"n_positions", c.context_length},
            {"n_ctx", c.context_length},
            {"vocab_size", c.vocab_size},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", kGpt2LayerNormEps},
            {"resid_pdrop", c.drop_rate},
            {"embd_pdrop", c.drop_rate},
            {"attn_pdrop", c.drop_rate},
            {"tie_word_embeddings", c.tie_embeddings},
            {"torch_dtype", "float32"}};
  }
  std::string describe(const nn::DecoderConfig& c) const override {
    return std::string("head: ") + (c.tie_embeddings ? "tied to wte" : "lm_head.weight");
  }
};

const HfGpt2Format& format() {
  static const HfGpt2Format f;
  return f;
}

}  // namespace

const FolderFormat& hf_gpt2_format() { return format(); }

HfGpt2Config read_hf_gpt2_config(const std::string& folder) { return {format().config(folder)}; }

HfGpt2 read_hf_gpt2(const std::string& folder) {
  FolderModel m = format().read(folder);
  HfGpt2 out;
  out.config = nn::gpt_family().config(m.config);
  out.parameters = std::move(m.parameters);
  out.vocab_path = m.vocab_path, out.merges_path = m.merges_path;
  return out;
}

std::shared_ptr<nn::DecoderModel> build_hf_gpt2(HfGpt2&& hf, const std::string& folder) {
  std::shared_ptr<nn::DecoderModel> model;
  {
    const nn::SkipInit no_values;  // every value is about to be replaced
    model = std::make_shared<nn::DecoderModel>(hf.config);
  }
  model->adopt_parameters(std::move(hf.parameters), folder);
  model->eval();
  return model;
}

void write_hf_gpt2(const std::string& folder, const nn::DecoderModel& model, const TokenizerFiles& tokenizer) {
  format().write(folder, model, tokenizer);
}

}  // namespace headlab::io
