// NeoXModel: x = drop_emb(tok_emb(idx)); per block, parallel: x += drop(att(norm1(x))) + drop(ff(norm2(x))),
// sequential: x += drop(att(norm1(x))); x += drop(ff(norm2(x))), the first rotary_dims of each query and key
// head rotated (halves, as rotate_half), ff = Linear(F, C)(gelu_exact(Linear(C, F) x));
// logits = out_head(final_norm(x)).
#include "nn/neox.h"

#include <optional>

#include "base/json_fields.h"

namespace headlab::nn {

namespace {

// NeoXConfig's JSON: "arch": "neox" (written by to_json) and these keys.
const auto kNeoXFields = std::tuple{
    field("vocab_size", &NeoXConfig::vocab_size, Need::required, kPositive),
    field("context_length", &NeoXConfig::context_length, Need::required, kPositive),
    field("emb_dim", &NeoXConfig::emb_dim, Need::required, kPositive),
    field("n_heads", &NeoXConfig::n_heads, Need::required, kPositive),
    field("n_layers", &NeoXConfig::n_layers, Need::required, kPositive),
    field("hidden_dim", &NeoXConfig::hidden_dim, Need::required, kPositive),
    field("rotary_dims", &NeoXConfig::rotary_dims, Need::required, kNonNegative),
    field("rope_theta", &NeoXConfig::rope_theta, kAboveOne),
    field("norm_eps", &NeoXConfig::norm_eps, kSmallEps),
    field("parallel_residual", &NeoXConfig::parallel_residual),
    field("qkv_bias", &NeoXConfig::qkv_bias),
    field("tie_embeddings", &NeoXConfig::tie_embeddings),
    field("drop_rate", &NeoXConfig::drop_rate, kFraction),
    field("attention", &NeoXConfig::attention),
    field("kept_heads", &NeoXConfig::kept_heads),
};

}  // namespace

int64_t NeoXConfig::heads_in_layer(int64_t layer) const {
  return kept_heads.empty() ? n_heads : static_cast<int64_t>(kept_heads.at(static_cast<size_t>(layer)).size());
}

CausalAttentionSizes NeoXConfig::attention_sizes(int64_t layer) const {
  CausalAttentionSizes s;
  s.d_in = s.d_out = emb_dim;  // a pruned layer keeps the model's width
  s.context_length = context_length;
  s.num_heads = heads_in_layer(layer);
  s.head_dim = head_size();
  s.dropout = drop_rate;
  s.qkv_bias = s.out_bias = qkv_bias;
  s.rotary = {.dims = rotary_dims, .theta = rope_theta, .interleaved = false};
  return s;
}

void NeoXConfig::validate() const {
  const char* who = "GPT-NeoX config";
  check_fields(*this, kNeoXFields, who);
  HL_CHECK(emb_dim % n_heads == 0, who, ": emb_dim ", emb_dim, " must be divisible by n_heads ", n_heads);
  HL_CHECK(rotary_dims % 2 == 0 && rotary_dims <= head_size(), who, ": rotary_dims ", rotary_dims,
           " must be even and at most the head size ", head_size());
  check_head_lists(kept_heads, n_layers, n_heads, who, "kept_heads");
}

nlohmann::json NeoXConfig::to_json() const {
  nlohmann::json j = fields_to_json(*this, kNeoXFields);
  j["arch"] = "neox";
  return j;
}

NeoXConfig NeoXConfig::from_json(const nlohmann::json& j) {
  NeoXConfig c;
  fields_from_json(j, c, kNeoXFields, "GPT-NeoX config");
  c.validate();
  return c;
}

double NeoXConfig::num_parameters() const {
  const double d = static_cast<double>(emb_dim), V = static_cast<double>(vocab_size),
               F = static_cast<double>(hidden_dim);
  double n = V * d + 2 * d;         // tok_emb, final_norm
  if (!tie_embeddings) n += d * V;  // out_head
  for (int64_t l = 0; l < n_layers; ++l)
    n += causal_attention_parameters(attention, attention_sizes(l)) + 4 * d + 2 * d * F + F + d;
  return n;
}

namespace {

class NeoXFamily : public ConfigFamily<NeoXConfig, NeoXModel> {
 public:
  std::string arch() const override { return "neox"; }
  std::string help() const override {
    return "neox (GPT-NeoX, Pythia: parallel attention and MLP, rotary on a quarter of each head)";
  }
  // An estimate from what the tape keeps per token (not measured against a run): per layer the norms' outputs,
  // q, k, v and their rotations, the context, the residuals and the MLP's three (..., F) tensors.
  double activation_floats(const nlohmann::json& s, bool training) const override {
    const NeoXConfig c = NeoXConfig::from_json(s);
    const double d = static_cast<double>(c.emb_dim), V = static_cast<double>(c.vocab_size),
                 F = static_cast<double>(c.hidden_dim);
    return training ? static_cast<double>(c.n_layers) * (14 * d + 3 * F) + 4 * V : 6 * d + 2 * F + 2 * V;
  }
  double cache_floats(const nlohmann::json& s) const override {
    const NeoXConfig c = NeoXConfig::from_json(s);
    return 2.0 * static_cast<double>(c.n_layers) * static_cast<double>(c.emb_dim);  // keys and values
  }
  std::string describe(const nlohmann::json& s) const override {
    const NeoXConfig c = NeoXConfig::from_json(s);
    return "neox, " + std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_heads) + " heads, emb " +
           std::to_string(c.emb_dim) + ", ffn " + std::to_string(c.hidden_dim) + ", rotary " +
           std::to_string(c.rotary_dims) + " of " + std::to_string(c.head_size()) + " dims, " +
           (c.parallel_residual ? "parallel" : "sequential") + " residual, context " + std::to_string(c.context_length);
  }
  // A fresh model as Pythia's: MLP 4x the width, rotary on a quarter of each head, the parallel residual.
  nlohmann::json from_options(const ModelOptions& o, const TaskSizes& t) const override {
    HL_CHECK(!o.attn_only, "--attn-only: the neox family has no attention-only form");
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: the neox family has multi-head attention only (grouped-query: --arch llama)");
    NeoXConfig c;
    c.vocab_size = t.vocab_size, c.context_length = t.context_length;
    c.emb_dim = o.emb_dim, c.n_heads = o.n_heads, c.n_layers = o.n_layers;
    c.hidden_dim = o.ffn_hiddens ? o.ffn_hiddens : 4 * o.emb_dim;
    HL_CHECK(o.n_heads > 0 && o.emb_dim % o.n_heads == 0, "train: --emb-dim ", o.emb_dim,
             " must be divisible by --n-heads ", o.n_heads);
    c.rotary_dims = o.emb_dim / o.n_heads / 4 / 2 * 2;
    c.drop_rate = o.drop_rate, c.qkv_bias = true, c.attention = o.attention;
    c.validate();
    return c.to_json();
  }
  ModelOptions options(const nlohmann::json& s) const override {
    const NeoXConfig c = NeoXConfig::from_json(s);
    ModelOptions o;
    o.arch = "neox";
    o.emb_dim = c.emb_dim, o.n_heads = c.n_heads, o.n_layers = c.n_layers, o.context_length = c.context_length;
    o.ffn_hiddens = c.hidden_dim == 4 * c.emb_dim ? 0 : c.hidden_dim;
    o.drop_rate = c.drop_rate, o.attention = c.attention;
    return o;
  }
};

}  // namespace

const ModelFamily& neox_family() {
  static const NeoXFamily family;
  return family;
}

NeoXBlock::NeoXBlock(const NeoXConfig& cfg, int64_t layer) : parallel(cfg.parallel_residual) {
  att = register_module("att", make_causal_attention(cfg.attention, cfg.attention_sizes(layer)));
  ff = register_module("ff", std::make_shared<FeedForward>(cfg.emb_dim, cfg.hidden_dim, false));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(cfg.emb_dim, cfg.norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(cfg.emb_dim, cfg.norm_eps));
  drop_shortcut = register_module("drop_shortcut", std::make_shared<Dropout>(cfg.drop_rate));
}

NeoXModel::NeoXModel(const NeoXConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  shape_ = {.vocab_size = cfg.vocab_size,
            .context_length = cfg.context_length,
            .d_model = cfg.emb_dim,
            .n_layers = cfg.n_layers,
            .n_heads = cfg.n_heads,
            .has_mlp = true,
            .learned_positions = false,
            .rotary = cfg.rotary_dims > 0,
            .parallel_residual = cfg.parallel_residual,
            .kept_heads = cfg.kept_heads};
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.emb_dim));
  drop_emb = register_module("drop_emb", std::make_shared<Dropout>(cfg.drop_rate));
  trf_blocks = register_module("trf_blocks", std::make_shared<Sequential>());
  for (int64_t l = 0; l < cfg.n_layers; ++l) trf_blocks->push_back(std::make_shared<NeoXBlock>(cfg_, l));
  final_norm = register_module("final_norm", std::make_shared<LayerNorm>(cfg.emb_dim, cfg.norm_eps));
  {
    std::optional<SkipInit> tied;  // a tied head's own weight is dropped at once: skip drawing it
    if (cfg.tie_embeddings) tied.emplace();
    out_head = register_module("out_head", std::make_shared<Linear>(cfg.emb_dim, cfg.vocab_size, false));
  }
  if (cfg.tie_embeddings) out_head->tie_weight(tok_emb->weight);
}

nlohmann::json NeoXModel::pruned_config(const std::vector<std::vector<int64_t>>& kept) const {
  NeoXConfig c = cfg_;
  c.kept_heads = kept;
  c.validate();
  return c.to_json();
}

nlohmann::json NeoXModel::converted_config(AttentionForm form) const {
  NeoXConfig c = cfg_;
  c.attention = form;
  c.validate();
  return c.to_json();
}

Tensor NeoXModel::embed(const Tensor& idx, int64_t offset, Hooks* hooks) {
  check_token_ids(idx, offset, "GPTNeoX");
  return drop_emb->forward(HookSite{hooks, -1}(HookPoint::embed, tok_emb->forward(idx)));  // (B, T, C)
}

std::shared_ptr<NeoXBlock> NeoXModel::block(int64_t layer) const {
  HL_CHECK(layer >= 0 && layer < cfg_.n_layers, "GPTNeoX: layer ", layer, " is out of range for ", cfg_.n_layers,
           " layers");
  return trf_blocks->at<NeoXBlock>(static_cast<size_t>(layer));
}

}  // namespace headlab::nn
