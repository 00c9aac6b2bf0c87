// The layouts of PyTorch files headlab reads (see torch_layouts.h), each a state_dict's names and the config that
// sizes them, into the weight tables the families' folders use.
#include "io/torch_layouts.h"

#include <filesystem>
#include <map>
#include <set>

#include "base/error.h"
#include "base/input_path.h"
#include "io/hf_gpt2.h"
#include "io/hf_weights.h"
#include "io/torch_file.h"
#include "io/weight_files.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"
#include "tasks/id_tokenizer.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// A whole number of a stored config (model_args, cfg), in [lo, hi]; errors name the file and key.
int64_t stored_int(const ojson& args, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  HL_CHECK(args.contains(key), where, ": missing ", key);
  const ojson& v = args.at(key);
  HL_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi, where, ": ", key,
           " must be a whole number in [", lo, ", ", hi, "], got ", v.dump());
  return v.get<int64_t>();
}

// A weight table's entries the files lack that may be zeros (nanoGPT's bias=False): taken out of the table and
// given back as zero parameters, so the model computes what the file's model does.
NamedTensors zeros_for_missing(WeightMap& map, const WeightFiles& files, const std::string& suffix) {
  NamedTensors zeros;
  std::vector<WeightEntry> kept;
  for (WeightEntry& e : map.entries) {
    if (files.contains(e.hf) || !e.hf.ends_with(suffix)) {
      kept.push_back(std::move(e));
      continue;
    }
    const int64_t parts = static_cast<int64_t>(e.ours.size());
    for (const std::string& name : e.ours) zeros.emplace_back(name, headlab::zeros({e.shape[0] / parts}));
  }
  map.entries = std::move(kept);
  return zeros;
}

// nanoGPT's ckpt.pt: GPT-2's table with nn.Linear's (out, in) where GPT-2 has Conv1D's (in, out).
FolderModel read_nanogpt(const std::shared_ptr<const TorchFile>& file, const TorchStateDict& sd,
                         const std::string& path) {
  const ojson& a = file->value().at("model_args");
  const std::string where = path + ": model_args";
  HL_CHECK(a.is_object(), where, " must be a dict, got ", a.dump());
  nn::DecoderConfig c;  // the gpt family: GPT-2's parts
  c.n_layers = stored_int(a, "n_layer", 1, 1 << 12, where);
  c.n_heads = stored_int(a, "n_head", 1, 1 << 12, where);
  c.emb_dim = stored_int(a, "n_embd", 1, 1 << 20, where);
  c.context_length = stored_int(a, "block_size", 1, 1 << 24, where);
  c.vocab_size = stored_int(a, "vocab_size", 1, 1 << 24, where);
  HL_CHECK(c.emb_dim % c.n_heads == 0, where, ": n_embd ", c.emb_dim, " is not a multiple of n_head ", c.n_heads);
  c.qkv_bias = true;  // bias=False: zeros, below
  c.tie_embeddings = true;
  c.validate();
  WeightMap map = gpt2_weights(c, "transformer.", true);
  for (WeightEntry& e : map.entries)
    if (e.transposed) e.transposed = false, e.shape = {e.shape[1], e.shape[0]};
  const std::unique_ptr<WeightFiles> files = torch_weights(file, sd);
  const bool bias = !a.contains("bias") || a.at("bias") != false;
  NamedTensors zeros = bias ? NamedTensors{} : zeros_for_missing(map, *files, ".bias");
  NamedTensors params = read_weights(*files, path, map);
  for (auto& z : zeros) params.push_back(std::move(z));
  return {c.to_json(), std::move(params), "", ""};
}

// ---- TransformerLens's HookedTransformer and its progenitor, Nanda et al.'s grokking code ----
// Both name a block's weights by head: W_Q (heads, d_model, d_head) in TransformerLens, (heads, d_head, d_model) in
// the grokking code, whose W_E is (d_model, vocab) and W_O (d_model, heads x d_head); both unembed by W_U
// (d_model, vocab out). Read into the hooked family (nn/hooked.cpp), sized from the tensors' shapes.

// A state_dict's tensors by name, with the shape checks of what the layout expects; errors name the file.
class Tensors {
 public:
  Tensors(const WeightFiles& files, std::string path) : files_(files), path_(std::move(path)) {}
  bool has(const std::string& name) const { return files_.contains(name); }
  Shape shape(const std::string& name) const {
    HL_CHECK(files_.contains(name), path_, ": missing tensor '", name, "'");
    return files_.shape(name);
  }
  // The tensor, its rank checked.
  Tensor get(const std::string& name, size_t rank) {
    const Shape s = shape(name);
    HL_CHECK(s.size() == rank, path_, ": tensor '", name, "' has shape ", shape_str(s), ", expected ", rank,
             " dimensions");
    used_.insert(name);
    return files_.to_float(name);
  }
  // The tensor, its shape checked.
  Tensor get(const std::string& name, const Shape& want) {
    const Shape s = shape(name);
    HL_CHECK(s == want, path_, ": tensor '", name, "' has shape ", shape_str(s), ", expected ", shape_str(want),
             " for the sizes the other tensors give");
    used_.insert(name);
    return files_.to_float(name);
  }
  // Every tensor was read, or is a buffer the code recomputes (the causal mask, TransformerLens's IGNORE).
  void check_all_used(const std::string& what) const {
    for (const std::string& name : files_.names()) {
      const bool buffer = name.ends_with(".mask") || name.ends_with(".IGNORE") || name.ends_with("hook_dummy");
      HL_CHECK(used_.count(name) || buffer, path_, ": tensor '", name, "' is not part of ", what, " of these sizes");
    }
  }

 private:
  const WeightFiles& files_;
  std::string path_;
  std::set<std::string> used_;
};

int64_t count_blocks(const WeightFiles& files, const std::string& prefix) {
  int64_t n = 0;
  while (files.contains(prefix + std::to_string(n) + ".attn.W_Q")) ++n;
  return n;
}

// The grokking code's layout: no norms, attention without biases, a ReLU (or GeLU) MLP with biases or none
// (attn_blocks.N.: attention only). model_config (the induction run) or config (modular addition) where stored.
FolderModel read_grokking(const WeightFiles& files, const ojson& value, const std::string& path, std::string& notes) {
  Tensors t(files, path);
  const bool attn_only = !files.contains("blocks.0.attn.W_Q");
  const std::string block = attn_only ? "attn_blocks." : "blocks.";
  nn::DecoderConfig c = nn::hooked_family().config();
  const Shape we = t.shape("embed.W_E"), wq = t.shape(block + "0.attn.W_Q");
  HL_CHECK(we.size() == 2 && wq.size() == 3, path, ": embed.W_E ", shape_str(we), " and ", block, "0.attn.W_Q ",
           shape_str(wq), " are not the grokking code's (d_model, vocab) and (heads, d_head, d_model)");
  c.emb_dim = we[0], c.vocab_size = we[1], c.n_heads = wq[0], c.head_dim = wq[1];
  c.n_layers = count_blocks(files, block);
  c.context_length = t.shape("pos_embed.W_pos").at(0);
  c.out_vocab_size = t.shape("unembed.W_U").at(1);
  c.attn_only = attn_only;
  c.norm = nn::NormKind::none;
  c.qkv_bias = false, c.out_bias = false, c.unembed_bias = false;
  const ojson* cfg = value.contains("model_config") ? &value.at("model_config") : nullptr;
  const std::string act = cfg && cfg->contains("act_type") ? cfg->at("act_type").get<std::string>() : "ReLU";
  HL_CHECK(act == "ReLU" || act == "GeLU", path, ": model_config's act_type '", act, "' is none of ReLU, GeLU");
  c.mlp = act == "ReLU" ? nn::MlpKind::relu : nn::MlpKind::gelu_exact;
  if (!attn_only) c.hidden_dim = t.shape("blocks.0.mlp.W_in").at(0);
  c.validate();
  const int64_t C = c.emb_dim, H = c.n_heads, D = c.head_dim, F = c.hidden_dim, V = c.vocab_size;
  NamedTensors p;
  p.emplace_back("tok_emb.weight", t.get("embed.W_E", Shape{C, V}).mT().contiguous());
  p.emplace_back("pos_emb.weight", t.get("pos_embed.W_pos", Shape{c.context_length, C}));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = block + std::to_string(l) + ".", ours = "trf_blocks." + std::to_string(l) + ".";
    for (const auto& [w, name] : {std::pair{"W_Q", "W_query"}, {"W_K", "W_key"}, {"W_V", "W_value"}})
      p.emplace_back(ours + "att." + name + ".weight", t.get(b + "attn." + w, Shape{H, D, C}).reshape({H * D, C}));
    p.emplace_back(ours + "att.out_proj.weight", t.get(b + "attn.W_O", Shape{C, H * D}));
    if (attn_only) continue;
    p.emplace_back(ours + "ff.layers.0.weight", t.get(b + "mlp.W_in", Shape{F, C}));
    p.emplace_back(ours + "ff.layers.0.bias", t.get(b + "mlp.b_in", Shape{F}));
    p.emplace_back(ours + "ff.layers.2.weight", t.get(b + "mlp.W_out", Shape{C, F}));
    p.emplace_back(ours + "ff.layers.2.bias", t.get(b + "mlp.b_out", Shape{C}));
  }
  p.emplace_back("out_head.weight", t.get("unembed.W_U", Shape{C, c.out_vocab_size}).mT().contiguous());
  t.check_all_used("the grokking code's transformer");
  notes = std::string("layout: Nanda et al.'s grokking code (") + (cfg ? "model_config and " : "") +
          "the tensors' shapes; no norms)";
  return {c.to_json(), std::move(p), "", ""};
}

// TransformerLens's HookedTransformer state_dict, with its cfg where the file stores one ({"cfg": ..., "state_dict"
// or "model": ...}): LayerNorm (LN), LayerNorm folded (LNPre: its weight ones, bias zeros) or none; biases on every
// projection as the file has them; b_U.
FolderModel read_transformerlens(const WeightFiles& files, const ojson& value, const std::string& path,
                                 std::string& notes) {
  Tensors t(files, path);
  const ojson cfg = value.contains("cfg") && value.at("cfg").is_object() ? value.at("cfg") : ojson::object();
  const auto cfg_text = [&](const char* key, const std::string& fallback) {
    return cfg.contains(key) && cfg.at(key).is_string() ? cfg.at(key).get<std::string>() : fallback;
  };
  nn::DecoderConfig c = nn::hooked_family().config();
  const Shape we = t.shape("embed.W_E"), wq = t.shape("blocks.0.attn.W_Q");
  HL_CHECK(we.size() == 2 && wq.size() == 3, path, ": embed.W_E ", shape_str(we), " and blocks.0.attn.W_Q ",
           shape_str(wq), " are not TransformerLens's (vocab, d_model) and (heads, d_model, d_head)");
  c.vocab_size = we[0], c.emb_dim = we[1], c.n_heads = wq[0], c.head_dim = wq[2];
  c.n_layers = count_blocks(files, "blocks.");
  c.context_length = t.shape("pos_embed.W_pos").at(0);
  c.out_vocab_size = t.shape("unembed.W_U").at(1);
  c.attn_only = !files.contains("blocks.0.mlp.W_in");
  const std::string norm = cfg_text("normalization_type", files.contains("blocks.0.ln1.w") ? "LN" : "none");
  HL_CHECK(norm == "LN" || norm == "LNPre" || norm == "none" || norm == "None", path, ": cfg's normalization_type '",
           norm, "' is none headlab reads (LN, LNPre, None)");
  c.norm = norm == "LN" || norm == "LNPre" ? nn::NormKind::layer_norm : nn::NormKind::none;
  c.norm_eps = cfg.contains("eps") && cfg.at("eps").is_number() ? cfg.at("eps").get<double>() : 1e-5;
  const std::string act = cfg_text("act_fn", "gelu_new");
  HL_CHECK(act == "relu" || act == "gelu" || act == "gelu_new", path, ": cfg's act_fn '", act,
           "' is none headlab reads (relu, gelu, gelu_new)");
  c.mlp = act == "relu" ? nn::MlpKind::relu : act == "gelu" ? nn::MlpKind::gelu_exact : nn::MlpKind::gelu_tanh;
  HL_CHECK(cfg_text("positional_embedding_type", "standard") == "standard", path,
           ": cfg's positional_embedding_type '", cfg_text("positional_embedding_type", ""),
           "' is not the learned positions headlab reads for this layout");
  c.qkv_bias = files.contains("blocks.0.attn.b_Q");
  c.out_bias = files.contains("blocks.0.attn.b_O");
  c.unembed_bias = files.contains("unembed.b_U");
  if (!c.attn_only) c.hidden_dim = t.shape("blocks.0.mlp.W_in").at(1);
  c.validate();
  const int64_t C = c.emb_dim, H = c.n_heads, D = c.head_dim, F = c.hidden_dim;
  NamedTensors p;
  p.emplace_back("tok_emb.weight", t.get("embed.W_E", Shape{c.vocab_size, C}));
  p.emplace_back("pos_emb.weight", t.get("pos_embed.W_pos", Shape{c.context_length, C}));
  const auto layer_norm = [&](const std::string& tl, const std::string& ours) {
    if (c.norm == nn::NormKind::none) return;
    const bool stored = norm == "LN";
    p.emplace_back(ours + ".weight", stored ? t.get(tl + ".w", Shape{C}) : headlab::ones({C}));
    p.emplace_back(ours + ".bias", stored ? t.get(tl + ".b", Shape{C}) : headlab::zeros({C}));
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".", ours = "trf_blocks." + std::to_string(l) + ".";
    layer_norm(b + "ln1", ours + "norm1");
    for (const auto& [w, name] : {std::pair{"Q", "W_query"}, {"K", "W_key"}, {"V", "W_value"}}) {
      // (H, C, D) -> (H*D, C): head h's rows h*D .. h*D + D - 1, as the fused projection lays them out.
      p.emplace_back(ours + "att." + name + ".weight",
                     t.get(b + "attn.W_" + w, Shape{H, C, D}).permute({0, 2, 1}).contiguous().view({H * D, C}));
      if (c.qkv_bias) p.emplace_back(ours + "att." + name + ".bias", t.get(b + "attn.b_" + w, Shape{H, D}).view({H * D}));
    }
    p.emplace_back(ours + "att.out_proj.weight", t.get(b + "attn.W_O", Shape{H, D, C}).reshape({H * D, C}).mT().contiguous());
    if (c.has_out_bias()) p.emplace_back(ours + "att.out_proj.bias", t.get(b + "attn.b_O", Shape{C}));
    if (c.attn_only) continue;
    layer_norm(b + "ln2", ours + "norm2");
    p.emplace_back(ours + "ff.layers.0.weight", t.get(b + "mlp.W_in", Shape{C, F}).mT().contiguous());
    p.emplace_back(ours + "ff.layers.0.bias", t.get(b + "mlp.b_in", Shape{F}));
    p.emplace_back(ours + "ff.layers.2.weight", t.get(b + "mlp.W_out", Shape{F, C}).mT().contiguous());
    p.emplace_back(ours + "ff.layers.2.bias", t.get(b + "mlp.b_out", Shape{C}));
  }
  layer_norm("ln_final", "final_norm");
  p.emplace_back("out_head.weight", t.get("unembed.W_U", Shape{C, c.out_vocab_size}).mT().contiguous());
  if (c.unembed_bias) p.emplace_back("out_head.bias", t.get("unembed.b_U", Shape{c.out_vocab_size}));
  t.check_all_used("TransformerLens's HookedTransformer");
  notes = std::string("layout: TransformerLens's HookedTransformer (") +
          (cfg.empty() ? "no cfg stored: sizes from the tensors' shapes, act_fn " + act + " assumed"
                       : "its cfg") + ")";
  return {c.to_json(), std::move(p), "", ""};
}

// A token's name where the model's task says it: the grokking runs' "=" (and "+").
std::map<int64_t, std::string> token_names(const ojson& value, int64_t vocab, int64_t out) {
  std::map<int64_t, std::string> names;
  const ojson config = value.is_object() && value.contains("config") ? value.at("config") : ojson();
  if (config.is_object() && config.contains("p") && config.at("p").is_number_integer() &&
      vocab == config.at("p").get<int64_t>() + 1)
    names[vocab - 1] = "=";  // modular addition: [a, b, =]
  if (vocab == 12 && out == 10) names = {{10, "+"}, {11, "="}};  // 5-digit addition: digits, +, =
  return names;
}

bool find(const TorchStateDict& sd, const std::string& name) {
  for (const auto& [n, i] : sd.tensors)
    if (n == name) return true;
  return false;
}

// Names that say which layout a state_dict is in, for the refusal of one headlab does not read.
std::string first_names(const TorchStateDict& sd) {
  std::string out;
  for (size_t i = 0; i < sd.tensors.size() && i < 4; ++i) out += (i ? ", " : "") + sd.tensors[i].first;
  return out + (sd.tensors.size() > 4 ? ", ..." : "");
}

class TorchSource final : public ModelSource {
 public:
  std::string name() const override { return "PyTorch file"; }
  bool claims(const std::string& path) const override {
    return not_a_file_reason(path).empty() && TorchFile::claims(path);
  }
  SourceModel read(const std::string& path) const override {
    const auto file = std::make_shared<const TorchFile>(path);
    const TorchStateDict sd = find_state_dict(*file);
    SourceModel m;
    const ojson& v = file->value();
    if (v.is_object() && v.contains("model_args")) {
      m.pretrained = read_nanogpt(file, sd, path);
      m.notes = "layout: nanoGPT's ckpt.pt (model_args)";
    } else if (sd.tensors.size() > 0 && (find(sd, "embed.W_E"))) {
      const std::unique_ptr<WeightFiles> files = torch_weights(file, sd);
      const bool grokking = files->shape("embed.W_E").size() == 2 && files->contains("pos_embed.W_pos") &&
                            (files->contains("blocks.0.attn.W_O") ? files->shape("blocks.0.attn.W_O").size() == 2
                                                                   : files->contains("attn_blocks.0.attn.W_O"));
      m.pretrained = grokking ? read_grokking(*files, v, path, m.notes) : read_transformerlens(*files, v, path, m.notes);
    } else {
      const bool hf = !sd.tensors.empty() && (sd.tensors[0].first.starts_with("transformer.") ||
                                              sd.tensors[0].first.starts_with("model.") ||
                                              sd.tensors[0].first.starts_with("gpt_neox."));
      HL_CHECK(!hf, path, ": a Hugging Face state_dict (", first_names(sd),
               "): give its folder, with config.json beside pytorch_model.bin");
      HL_FAIL(path, ": a state_dict in a layout headlab does not read (", first_names(sd),
              "); it reads nanoGPT's ckpt.pt and Hugging Face folders");
    }
    const nlohmann::json& c = m.pretrained.config;
    const int64_t vocab = c.at("vocab_size").get<int64_t>(), out = c.value("out_vocab_size", vocab);
    m.embedded_tokenizer = std::make_shared<const tasks::IdTokenizer>(vocab, token_names(v, vocab, out));
    if (!sd.key.empty()) m.notes += "; state_dict under \"" + sd.key + "\"";
    std::set<std::string> skipped(file->unbuilt().begin(), file->unbuilt().end());
    std::string names;
    for (const std::string& n : skipped) names += (names.empty() ? "" : ", ") + n;
    if (!names.empty()) m.notes += "\nskipped, never built: " + names;
    return m;
  }
  nlohmann::json read_config(const std::string& path) const override { return read(path).pretrained.config; }
  TokenizerOption tokenizer_option() const override { return TokenizerOption::overrides; }
};

}  // namespace

const ModelSource& torch_source() {
  static const TorchSource source;
  return source;
}

}  // namespace headlab::io
