// GPT-2 folders in the Hugging Face layout <-> GPTModel parameters (see hf_gpt2.h). GPT-2's Conv1D
// stores (in, out) where nn.Linear stores (out, in), and its c_attn holds query, key and value side
// by side (C, 3C); everything else maps name to name. C = n_embd, H = n_head, D = C / H.
#include "io/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "autograd/engine.h"
#include "base/input_path.h"
#include "base/json_fields.h"
#include "io/atomic_file.h"
#include "io/hf_folder.h"
#include "io/safetensors.h"
#include "nn/attention.h"
#include "ops/ops.h"

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

// One tensor of the file as float32 (C, ...), its shape checked; `used` collects what was read.
struct TensorSource {
  const SafetensorsModel& st;
  std::string prefix, where;
  std::set<std::string>& used;
  Tensor get(const std::string& name, const Shape& shape) const {
    const std::string full = prefix + name;
    HL_CHECK(st.contains(full), where, ": missing tensor '", full, "'");
    const SafetensorsEntry& e = st.file_of(full).entry(full);
    HL_CHECK(e.shape == shape, st.file_of(full).path(), ": tensor '", full, "' has shape ", shape_str(e.shape),
             ", expected ", shape_str(shape), " for the config");
    used.insert(full);
    return st.to_float(full);
  }
};

// (rows, cols) -> (cols, rows) of a float32 CPU matrix whose rows may be strided (a column slice), in
// square tiles so that reads and writes both stay in cache, tile rows over the threads: Conv1D's 85M
// weights in GPT-2 small took a second through the generic strided copy, a tenth of that so.
Tensor transposed(const Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1), ld = t.stride(0);
  HL_CHECK(t.stride(1) == 1 && t.dtype() == DType::f32 && !t.device().is_cuda(), "transposed: a CPU float32 matrix");
  Tensor out = Tensor::empty({cols, rows});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  constexpr int64_t kTile = 64;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < cols; c0 += kTile)
    for (int64_t r0 = 0; r0 < rows; r0 += kTile)
      for (int64_t c = c0; c < std::min(c0 + kTile, cols); ++c)
        for (int64_t r = r0; r < std::min(r0 + kTile, rows); ++r) dst[c * rows + r] = src[r * ld + c];
  return out;
}

}  // namespace

HfGpt2Config read_hf_gpt2_config(const std::string& folder) {
  const json j = read_hf_config(folder);
  const std::string config_path = hf_config_path(folder);
  HfGpt2Config out;
  out.config = gpt_config_from_hf(j, config_path);
  out.config.tie_embeddings = hf_config_value<bool>(j, "tie_word_embeddings", true, config_path);
  return out;
}

HfGpt2 read_hf_gpt2(const std::string& folder) {
  HfGpt2 out;
  static_cast<HfGpt2Config&>(out) = read_hf_gpt2_config(folder);
  const nn::DecoderConfig& c = out.config;
  const int64_t C = c.emb_dim, V = c.vocab_size;

  const SafetensorsModel st = SafetensorsModel::open(folder);
  std::string prefix;
  if (st.contains("transformer.wte.weight"))
    prefix = "transformer.";
  else
    HL_CHECK(st.contains("wte.weight"), folder, ": the weights hold neither transformer.wte.weight nor wte.weight");
  std::set<std::string> used;
  const TensorSource src{st, prefix, folder, used};

  NamedTensors& p = out.parameters;
  auto linear_from_conv1d = [&](const std::string& hf, const std::string& ours, int64_t in, int64_t out_features) {
    p.emplace_back(ours + ".weight", transposed(src.get(hf + ".weight", {in, out_features})));  // (out, in)
    p.emplace_back(ours + ".bias", src.get(hf + ".bias", {out_features}));
  };
  auto layer_norm = [&](const std::string& hf, const std::string& ours) {
    p.emplace_back(ours + ".scale", src.get(hf + ".weight", {C}));
    p.emplace_back(ours + ".shift", src.get(hf + ".bias", {C}));
  };
  p.emplace_back("tok_emb.weight", src.get("wte.weight", {V, C}));
  p.emplace_back("pos_emb.weight", src.get("wpe.weight", {c.context_length, C}));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = "h." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    const Tensor qkv_w = src.get(hf + ".attn.c_attn.weight", {C, 3 * C});  // (C, [q | k | v])
    const Tensor qkv_b = src.get(hf + ".attn.c_attn.bias", {3 * C});
    const char* names[] = {"W_query", "W_key", "W_value"};
    for (int64_t i = 0; i < 3; ++i) {
      p.emplace_back(ours + ".att." + names[i] + ".weight", transposed(qkv_w.narrow(1, i * C, C)));
      p.emplace_back(ours + ".att." + names[i] + ".bias", qkv_b.narrow(0, i * C, C).contiguous());
    }
    linear_from_conv1d(hf + ".attn.c_proj", ours + ".att.out_proj", C, C);
    linear_from_conv1d(hf + ".mlp.c_fc", ours + ".ff.layers.0", C, 4 * C);
    linear_from_conv1d(hf + ".mlp.c_proj", ours + ".ff.layers.2", 4 * C, C);
    layer_norm(hf + ".ln_1", ours + ".norm1");
    layer_norm(hf + ".ln_2", ours + ".norm2");
  }
  layer_norm("ln_f", "final_norm");
  // The head: wte itself when tied (a lm_head.weight saved beside it is the same tensor), else lm_head.
  if (c.tie_embeddings) {
    if (st.contains("lm_head.weight")) used.insert("lm_head.weight");
  } else {
    HL_CHECK(st.contains("lm_head.weight"), folder,
             ": tie_word_embeddings is false but the weights hold no lm_head.weight");
    const SafetensorsEntry& e = st.file_of("lm_head.weight").entry("lm_head.weight");
    HL_CHECK(e.shape == Shape({V, C}), st.file_of("lm_head.weight").path(), ": tensor 'lm_head.weight' has shape ",
             shape_str(e.shape), ", expected ", shape_str({V, C}));
    used.insert("lm_head.weight");
    p.emplace_back("out_head.weight", st.to_float("lm_head.weight"));
  }
  // Anything else is a model this reader does not know, except the old files' causal-mask buffers.
  for (const std::string& name : st.names()) {
    if (used.count(name)) continue;
    const bool mask = name.size() > 10 && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"));
    HL_CHECK(mask, st.file_of(name).path(), ": tensor '", name, "' is not part of a GPT-2 of this config");
  }

  for (const char* f : {"vocab.json", "merges.txt"}) {
    const std::string path = (fs::path(folder) / f).string();
    if (path_present(path)) (std::string(f) == "vocab.json" ? out.vocab_path : out.merges_path) = path;
  }
  return out;
}

namespace {

class HfGpt2Format : public FolderFormat {
 public:
  std::vector<std::string> model_types() const override { return {"gpt2"}; }
  nlohmann::json read_config(const std::string& folder) const override {
    return read_hf_gpt2_config(folder).config.to_json();
  }
  FolderModel read(const std::string& folder) const override {
    HfGpt2 hf = read_hf_gpt2(folder);
    return {hf.config.to_json(), std::move(hf.parameters), hf.vocab_path, hf.merges_path};
  }
  void write(const std::string& folder, const nn::Model& model, const TokenizerFiles& tokenizer) const override {
    const auto* gpt = dynamic_cast<const nn::DecoderModel*>(&model);
    HL_CHECK(gpt && gpt->config().family == &nn::gpt_family(), "export: a ", model.type_name(), " is not a GPT; GPT-2's folders hold GPTs");
    write_hf_gpt2(folder, *gpt, tokenizer);
  }
  std::string describe(const FolderModel& m) const override {
    return std::string("head: ") +
           (nn::gpt_family().config(m.config).tie_embeddings ? "tied to wte" : "lm_head.weight");
  }
};

}  // namespace

const FolderFormat& hf_gpt2_format() {
  static const HfGpt2Format format;
  return format;
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
  const NoGradGuard no_grad;
  const nn::DecoderConfig& c = model.config();
  HL_CHECK(!c.attn_only, "export: an attention-only model has no MLPs, which GPT-2's layout needs");
  const int64_t C = c.emb_dim, H = c.n_heads, D = c.head_size();
  auto param = [&](const std::string& name) { return model.parameter(name).detach().to(kCPU); };
  auto conv1d = [&](const std::string& ours, const std::string& hf, std::vector<std::pair<std::string, Tensor>>& t) {
    t.emplace_back(hf + ".weight", transposed(param(ours + ".weight")));  // (in, out)
    t.emplace_back(hf + ".bias", param(ours + ".bias"));
  };
  std::vector<std::pair<std::string, Tensor>> t;
  const std::string p = "transformer.";
  t.emplace_back(p + "wte.weight", param("tok_emb.weight"));
  t.emplace_back(p + "wpe.weight", param("pos_emb.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string hf = p + "h." + std::to_string(l), ours = "trf_blocks." + std::to_string(l);
    // Per-head form whatever the model's form; heads a pruning removed come back as zeros.
    const std::shared_ptr<nn::MultiHeadAttentionWrapper> w = model.attention(l).split_heads();
    std::vector<int64_t> local(static_cast<size_t>(H), -1);  // original head -> index in w, or -1
    for (int64_t j = 0; j < w->num_heads; ++j) local[static_cast<size_t>(model.original_head(l, j))] = j;
    std::vector<Tensor> qkv_w, qkv_b, proj_rows;
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t j = local[static_cast<size_t>(h)];
        if (j < 0) {
          qkv_w.push_back(zeros({C, D}));
          qkv_b.push_back(zeros({D}));
          continue;
        }
        const auto& head = w->heads->at<nn::CausalAttention>(static_cast<size_t>(j));
        const nn::Linear& lin = i == 0 ? *head->W_query : i == 1 ? *head->W_key : *head->W_value;
        qkv_w.push_back(lin.weight.detach().to(kCPU).transpose(0, 1));  // (C, D)
        qkv_b.push_back(lin.bias.defined() ? lin.bias.detach().to(kCPU) : zeros({D}));
      }
    HL_CHECK(w->out_proj != nullptr, "export: layer ", l, "'s attention has no output projection");
    const Tensor proj = w->out_proj->weight.detach().to(kCPU);  // (C, kept * D)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t j = local[static_cast<size_t>(h)];
      proj_rows.push_back(j < 0 ? zeros({D, C}) : proj.narrow(1, j * D, D).transpose(0, 1));  // (D, C)
    }
    t.emplace_back(hf + ".ln_1.weight", param(ours + ".norm1.scale"));
    t.emplace_back(hf + ".ln_1.bias", param(ours + ".norm1.shift"));
    t.emplace_back(hf + ".attn.c_attn.weight", cat(qkv_w, 1));  // (C, 3C)
    t.emplace_back(hf + ".attn.c_attn.bias", cat(qkv_b, 0));
    t.emplace_back(hf + ".attn.c_proj.weight", cat(proj_rows, 0));  // (C, C)
    t.emplace_back(hf + ".attn.c_proj.bias", w->out_proj->bias.detach().to(kCPU));
    t.emplace_back(hf + ".ln_2.weight", param(ours + ".norm2.scale"));
    t.emplace_back(hf + ".ln_2.bias", param(ours + ".norm2.shift"));
    conv1d(ours + ".ff.layers.0", hf + ".mlp.c_fc", t);
    conv1d(ours + ".ff.layers.2", hf + ".mlp.c_proj", t);
  }
  t.emplace_back(p + "ln_f.weight", param("final_norm.scale"));
  t.emplace_back(p + "ln_f.bias", param("final_norm.shift"));
  const Tensor wte = t.front().second.contiguous(), head = param("out_head.weight").contiguous();
  const bool tied =
      c.tie_embeddings || std::memcmp(wte.data<float>(), head.data<float>(), sizeof(float) * size_t(wte.numel())) == 0;
  if (!tied) t.emplace_back("lm_head.weight", head);

  std::error_code ec;
  fs::create_directories(folder, ec);
  HL_CHECK(!ec && fs::is_directory(folder), "export: cannot create folder '", folder,
           "': ", ec ? ec.message() : "not a folder");
  write_safetensors((fs::path(folder) / "model.safetensors").string(), t, {{"format", "pt"}});
  const json config = {{"architectures", {"GPT2LMHeadModel"}},
                       {"model_type", "gpt2"},
                       {"n_layer", c.n_layers},
                       {"n_head", H},
                       {"n_embd", C},
                       {"n_positions", c.context_length},
                       {"n_ctx", c.context_length},
                       {"vocab_size", c.vocab_size},
                       {"n_inner", nullptr},
                       {"activation_function", "gelu_new"},
                       {"layer_norm_epsilon", kGpt2LayerNormEps},
                       {"resid_pdrop", c.drop_rate},
                       {"embd_pdrop", c.drop_rate},
                       {"attn_pdrop", c.drop_rate},
                       {"tie_word_embeddings", tied},
                       {"torch_dtype", "float32"}};
  write_file_atomic((fs::path(folder) / "config.json").string(), config.dump(2) + "\n", "export");
  write_tokenizer_files(folder, tokenizer);
}

}  // namespace headlab::io
