// LlamaModel: x = drop_emb(tok_emb(idx)); per block x += drop(att(norm1(x))) with rotary queries and keys,
// x += drop(ff(norm2(x))) with ff = fc3(silu(fc1 x) * fc2 x); logits = out_head(final_norm(x)).
#include "nn/llama.h"

#include <limits>
#include <optional>

#include "base/json_fields.h"

namespace headlab::nn {

namespace {

// LlamaConfig's JSON: "arch": "llama" (written by to_json) and these keys.
const auto kLlamaFields = std::tuple{
    field("vocab_size", &LlamaConfig::vocab_size, Need::required, kPositive),
    field("context_length", &LlamaConfig::context_length, Need::required, kPositive),
    field("emb_dim", &LlamaConfig::emb_dim, Need::required, kPositive),
    field("n_heads", &LlamaConfig::n_heads, Need::required, kPositive),
    field("n_kv_heads", &LlamaConfig::n_kv_heads, kNonNegative),
    field("n_layers", &LlamaConfig::n_layers, Need::required, kPositive),
    field("hidden_dim", &LlamaConfig::hidden_dim, Need::required, kPositive),
    field("head_dim", &LlamaConfig::head_dim, kNonNegative),
    field("norm_eps", &LlamaConfig::norm_eps, kSmallEps),
    field("rope_theta", &LlamaConfig::rope_theta, kAboveOne),
    field("rope_interleaved", &LlamaConfig::rope_interleaved),
    field("qkv_bias", &LlamaConfig::qkv_bias),
    field("tie_embeddings", &LlamaConfig::tie_embeddings),
    field("drop_rate", &LlamaConfig::drop_rate, kFraction),
    field("attention", &LlamaConfig::attention),
    field("kept_heads", &LlamaConfig::kept_heads),
};

}  // namespace

int64_t LlamaConfig::heads_in_layer(int64_t layer) const {
  return kept_heads.empty() ? n_heads : static_cast<int64_t>(kept_heads.at(static_cast<size_t>(layer)).size());
}

CausalAttentionSizes LlamaConfig::attention_sizes(int64_t layer) const {
  CausalAttentionSizes s;
  s.d_in = s.d_out = emb_dim;  // a pruned layer keeps the model's width
  s.context_length = context_length;
  s.num_heads = heads_in_layer(layer);
  s.num_kv_heads = s.num_heads / group_size();  // whole groups (validate); a layer pruned to nothing: 0
  s.head_dim = head_size();
  s.dropout = drop_rate;
  s.qkv_bias = qkv_bias;
  s.out_bias = false;
  s.rotary = {.dims = head_size(), .theta = rope_theta, .interleaved = rope_interleaved};
  return s;
}

void LlamaConfig::validate() const {
  const char* who = "Llama config";
  check_fields(*this, kLlamaFields, who);
  HL_CHECK(n_kv_heads == 0 || n_heads % n_kv_heads == 0, who, ": n_kv_heads ", n_kv_heads, " must divide n_heads ",
           n_heads);
  HL_CHECK(head_dim != 0 || emb_dim % n_heads == 0, who, ": emb_dim ", emb_dim, " must be divisible by n_heads ",
           n_heads, " (or head_dim given)");
  HL_CHECK(head_size() % 2 == 0, who, ": the head size ", head_size(), " must be even (rotary pairs)");
  check_head_lists(kept_heads, n_layers, n_heads, who, "kept_heads");
  const int64_t G = group_size();
  for (size_t l = 0; l < kept_heads.size(); ++l) {
    const std::vector<int64_t>& kept = kept_heads[l];
    for (size_t i = 0; i < kept.size(); ++i) {
      HL_CHECK(i == 0 || kept[i] > kept[i - 1], who, ": kept_heads of layer ", l, " must be increasing, got ",
               kept[i - 1], " before ", kept[i]);
      // A key/value group serves all its query heads: a pruned layer keeps a group whole or drops it.
      const int64_t g = kept[i] / G, first = static_cast<int64_t>(i) - kept[i] % G;
      HL_CHECK(first >= 0 && first + G <= static_cast<int64_t>(kept.size()) && kept[first] == g * G &&
                   kept[first + G - 1] == g * G + G - 1,
               who, ": kept_heads of layer ", l, " keeps head ", kept[i], " but not all of its key/value group ", g,
               " (heads ", g * G, "-", g * G + G - 1, "): grouped-query layers keep whole groups");
    }
  }
}

nlohmann::json LlamaConfig::to_json() const {
  nlohmann::json j = fields_to_json(*this, kLlamaFields);
  j["arch"] = "llama";
  return j;
}

LlamaConfig LlamaConfig::from_json(const nlohmann::json& j) {
  LlamaConfig c;
  fields_from_json(j, c, kLlamaFields, "Llama config");
  c.validate();
  return c;
}

double LlamaConfig::num_parameters() const {
  const double d = static_cast<double>(emb_dim), V = static_cast<double>(vocab_size),
               F = static_cast<double>(hidden_dim);
  double n = V * d + d;             // tok_emb, final_norm
  if (!tie_embeddings) n += d * V;  // out_head
  for (int64_t l = 0; l < n_layers; ++l)
    n += causal_attention_parameters(attention, attention_sizes(l)) + 2 * d + 3 * d * F;
  return n;
}

namespace {

// LLaMA's MLP width for a fresh model: 8/3 of the stream's (the parameters of GPT's 4x GELU MLP), rounded up to
// a multiple of 8.
int64_t default_hidden_dim(int64_t emb_dim) { return (8 * emb_dim / 3 + 7) / 8 * 8; }

class LlamaFamily : public ConfigFamily<LlamaConfig, LlamaModel> {
 public:
  std::string arch() const override { return "llama"; }
  std::string help() const override {
    return "llama (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention: --n-kv-heads)";
  }
  // An estimate from what the tape keeps per token (not yet measured against a run): per layer the norms'
  // outputs, q, k, v and their rotations, the context, the residuals and the SwiGLU's five (..., F) tensors.
  double activation_floats(const nlohmann::json& s, bool training) const override {
    const LlamaConfig c = LlamaConfig::from_json(s);
    const double d = static_cast<double>(c.emb_dim), V = static_cast<double>(c.vocab_size),
                 F = static_cast<double>(c.hidden_dim);
    return training ? static_cast<double>(c.n_layers) * (14 * d + 5 * F) + 4 * V : 6 * d + 3 * F + 2 * V;
  }
  double cache_floats(const nlohmann::json& s) const override {
    const LlamaConfig c = LlamaConfig::from_json(s);  // keys and values of the key/value heads
    return 2.0 * static_cast<double>(c.n_layers) * static_cast<double>(c.kv_heads() * c.head_size());
  }
  std::string describe(const nlohmann::json& s) const override {
    const LlamaConfig c = LlamaConfig::from_json(s);
    return "llama, " + std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_heads) + " heads (" +
           std::to_string(c.kv_heads()) + " key/value), emb " + std::to_string(c.emb_dim) + ", ffn " +
           std::to_string(c.hidden_dim) + ", context " + std::to_string(c.context_length);
  }
  nlohmann::json from_options(const ModelOptions& o, const TaskSizes& t) const override {
    HL_CHECK(!o.attn_only, "--attn-only: the llama family has no attention-only form");
    LlamaConfig c;
    c.vocab_size = t.vocab_size, c.context_length = t.context_length;
    c.emb_dim = o.emb_dim, c.n_heads = o.n_heads, c.n_layers = o.n_layers, c.n_kv_heads = o.n_kv_heads;
    c.hidden_dim = o.ffn_hiddens ? o.ffn_hiddens : default_hidden_dim(o.emb_dim);
    c.drop_rate = o.drop_rate, c.qkv_bias = o.qkv_bias, c.attention = o.attention;
    c.validate();
    return c.to_json();
  }
  ModelOptions options(const nlohmann::json& s) const override {
    const LlamaConfig c = LlamaConfig::from_json(s);
    ModelOptions o;
    o.arch = "llama";
    o.emb_dim = c.emb_dim, o.n_heads = c.n_heads, o.n_layers = c.n_layers, o.context_length = c.context_length;
    o.n_kv_heads = c.n_kv_heads, o.ffn_hiddens = c.hidden_dim == default_hidden_dim(c.emb_dim) ? 0 : c.hidden_dim;
    o.drop_rate = c.drop_rate, o.qkv_bias = c.qkv_bias, o.attention = c.attention;
    return o;
  }
};

}  // namespace

const ModelFamily& llama_family() {
  static const LlamaFamily family;
  return family;
}

SwiGLUFeedForward::SwiGLUFeedForward(int64_t emb_dim, int64_t hidden_dim) {
  fc1 = register_module("fc1", std::make_shared<Linear>(emb_dim, hidden_dim, false));
  fc2 = register_module("fc2", std::make_shared<Linear>(emb_dim, hidden_dim, false));
  fc3 = register_module("fc3", std::make_shared<Linear>(hidden_dim, emb_dim, false));
}

Tensor SwiGLUFeedForward::forward(const Tensor& x, const HookSite& site) {
  const Tensor gate = site(HookPoint::mlp_pre, fc1->forward(x));  // (..., F)
  const Tensor post = site(HookPoint::mlp_post, mul(silu(gate), fc2->forward(x)));
  return fc3->forward(post);
}

LlamaBlock::LlamaBlock(const LlamaConfig& cfg, int64_t layer) {
  att = register_module("att", make_causal_attention(cfg.attention, cfg.attention_sizes(layer)));
  ff = register_module("ff", std::make_shared<SwiGLUFeedForward>(cfg.emb_dim, cfg.hidden_dim));
  norm1 = register_module("norm1", std::make_shared<RMSNorm>(cfg.emb_dim, cfg.norm_eps));
  norm2 = register_module("norm2", std::make_shared<RMSNorm>(cfg.emb_dim, cfg.norm_eps));
  drop_shortcut = register_module("drop_shortcut", std::make_shared<Dropout>(cfg.drop_rate));
}

LlamaModel::LlamaModel(const LlamaConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  shape_ = {.vocab_size = cfg.vocab_size,
            .context_length = cfg.context_length,
            .d_model = cfg.emb_dim,
            .n_layers = cfg.n_layers,
            .n_heads = cfg.n_heads,
            .has_mlp = true,
            .learned_positions = false,
            .rotary = true,
            .parallel_residual = false,
            .kept_heads = cfg.kept_heads};
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.emb_dim));
  drop_emb = register_module("drop_emb", std::make_shared<Dropout>(cfg.drop_rate));
  trf_blocks = register_module("trf_blocks", std::make_shared<Sequential>());
  for (int64_t l = 0; l < cfg.n_layers; ++l) trf_blocks->push_back(std::make_shared<LlamaBlock>(cfg_, l));
  final_norm = register_module("final_norm", std::make_shared<RMSNorm>(cfg.emb_dim, cfg.norm_eps));
  {
    std::optional<SkipInit> tied;  // a tied head's own weight is dropped at once: skip drawing it
    if (cfg.tie_embeddings) tied.emplace();
    out_head = register_module("out_head", std::make_shared<Linear>(cfg.emb_dim, cfg.vocab_size, false));
  }
  if (cfg.tie_embeddings) out_head->tie_weight(tok_emb->weight);
}

nlohmann::json LlamaModel::pruned_config(const std::vector<std::vector<int64_t>>& kept) const {
  LlamaConfig c = cfg_;
  c.kept_heads = kept;
  c.validate();
  return c.to_json();
}

nlohmann::json LlamaModel::converted_config(AttentionForm form) const {
  LlamaConfig c = cfg_;
  c.attention = form;
  c.validate();
  return c.to_json();
}

Tensor LlamaModel::embed(const Tensor& idx, int64_t offset, Hooks* hooks) {
  check_token_ids(idx, offset, "Llama");
  return drop_emb->forward(HookSite{hooks, -1}(HookPoint::embed, tok_emb->forward(idx)));  // (B, T, C)
}

std::shared_ptr<LlamaBlock> LlamaModel::block(int64_t layer) const {
  HL_CHECK(layer >= 0 && layer < cfg_.n_layers, "Llama: layer ", layer, " is out of range for ", cfg_.n_layers,
           " layers");
  return trf_blocks->at<LlamaBlock>(static_cast<size_t>(layer));
}

}  // namespace headlab::nn
