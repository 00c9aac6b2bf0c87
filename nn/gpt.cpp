// GPTModel: x = drop_emb(tok_emb(idx) + pos_emb(arange(T))); per block x += drop(att(norm1(x))),
// x += drop(ff(norm2(x))) (not in attention-only models); logits = out_head(final_norm(x)).
#include "nn/gpt.h"

#include <optional>

#include "base/json_fields.h"

namespace headlab::nn {

int64_t GPTConfig::heads_in_layer(int64_t layer) const {
  return kept_heads.empty() ? n_heads : static_cast<int64_t>(kept_heads.at(static_cast<size_t>(layer)).size());
}

CausalAttentionSizes GPTConfig::attention_sizes(int64_t layer) const {
  CausalAttentionSizes s;
  s.d_in = s.d_out = emb_dim;
  s.context_length = context_length;
  s.num_heads = heads_in_layer(layer);
  s.head_dim = head_dim();
  s.dropout = drop_rate;
  s.qkv_bias = qkv_bias;
  return s;
}

namespace {

// GPTConfig's JSON: the book's keys plus attention (absent in the oldest checkpoints: fused) and
// kept_heads (only in pruned models' configs); tie_embeddings absent before GPT-2's folders: false.
const auto kGptFields = std::tuple{
    field("vocab_size", &GPTConfig::vocab_size, Need::required, kPositive),
    field("context_length", &GPTConfig::context_length, Need::required, kPositive),
    field("emb_dim", &GPTConfig::emb_dim, Need::required, kPositive),
    field("n_heads", &GPTConfig::n_heads, Need::required, kPositive),
    field("n_layers", &GPTConfig::n_layers, Need::required, kPositive),
    field("drop_rate", &GPTConfig::drop_rate, Need::required, kFraction),
    field("qkv_bias", &GPTConfig::qkv_bias, Need::required),
    field("tie_embeddings", &GPTConfig::tie_embeddings),
    field("attn_only", &GPTConfig::attn_only),
    field("attention", &GPTConfig::attention),
    field("kept_heads", &GPTConfig::kept_heads),
};

}  // namespace

void GPTConfig::validate() const {
  check_fields(*this, kGptFields, "GPT config");
  HL_CHECK(emb_dim % n_heads == 0, "GPT config: emb_dim ", emb_dim, " must be divisible by n_heads ", n_heads);
  check_head_lists(kept_heads, n_layers, n_heads, "GPT config", "kept_heads");
}

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = fields_to_json(*this, kGptFields);
  // Absent means false, as in every config before these keys.
  if (!tie_embeddings) j.erase("tie_embeddings");
  if (!attn_only) j.erase("attn_only");
  return j;
}

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  GPTConfig c;
  fields_from_json(j, c, kGptFields, "GPT config");
  c.validate();
  return c;
}

double GPTConfig::num_parameters() const {
  const double d = static_cast<double>(emb_dim), V = static_cast<double>(vocab_size);
  double n = (V + static_cast<double>(context_length)) * d + 2 * d;  // embeddings, final norm
  if (!tie_embeddings) n += d * V;                                   // the head
  for (int64_t l = 0; l < n_layers; ++l) {
    n += causal_attention_parameters(attention, attention_sizes(l));
    n += 2 * d;                                                      // norm1
    if (!attn_only) n += d * 4 * d + 4 * d + 4 * d * d + d + 2 * d;  // feed-forward, norm2
  }
  return n;
}

namespace {

class GptFamily : public ConfigFamily<GPTConfig, GPTModel> {
 public:
  std::string arch() const override { return "gpt"; }
  std::string help() const override { return "gpt (the book's decoder-only GPTModel)"; }
  // Measured peak when training: 42 MiB of an estimated 52 for bench/gpt_step's default config.
  double activation_floats(const nlohmann::json& s, bool training) const override {
    const GPTConfig c = GPTConfig::from_json(s);
    const double d = static_cast<double>(c.emb_dim), V = static_cast<double>(c.vocab_size);
    return training ? static_cast<double>(c.n_layers) * 24 * d + 4 * V : 12 * d + 2 * V;
  }
  double cache_floats(const nlohmann::json& s) const override {
    const GPTConfig c = GPTConfig::from_json(s);
    return 2.0 * static_cast<double>(c.n_layers) * static_cast<double>(c.emb_dim);  // keys and values
  }
  std::string describe(const nlohmann::json& s) const override {
    const GPTConfig c = GPTConfig::from_json(s);
    return std::string(enum_name(c.attention)) + " attention, " + std::to_string(c.n_layers) + " layers x " +
           std::to_string(c.n_heads) + " heads, emb " + std::to_string(c.emb_dim) + ", context " +
           std::to_string(c.context_length);
  }
  nlohmann::json from_options(const ModelOptions& o, const TaskSizes& t) const override {
    HL_CHECK(o.n_kv_heads == 0 || o.n_kv_heads == o.n_heads,
             "train: --n-kv-heads: the gpt family has multi-head attention only (grouped-query: --arch llama)");
    GPTConfig c;
    c.vocab_size = t.vocab_size, c.context_length = t.context_length;
    c.emb_dim = o.emb_dim, c.n_heads = o.n_heads, c.n_layers = o.n_layers;
    c.drop_rate = o.drop_rate, c.qkv_bias = o.qkv_bias, c.attn_only = o.attn_only, c.attention = o.attention;
    c.validate();
    return c.to_json();
  }
  ModelOptions options(const nlohmann::json& s) const override {
    const GPTConfig c = GPTConfig::from_json(s);
    ModelOptions o;
    o.emb_dim = c.emb_dim, o.n_heads = c.n_heads, o.n_layers = c.n_layers, o.context_length = c.context_length;
    o.drop_rate = c.drop_rate, o.qkv_bias = c.qkv_bias, o.attn_only = c.attn_only, o.attention = c.attention;
    return o;
  }
};

}  // namespace

const ModelFamily& gpt_family() {
  static const GptFamily family;
  return family;
}

TransformerBlock::TransformerBlock(const GPTConfig& cfg, int64_t layer) {
  att = register_module("att", make_causal_attention(cfg.attention, cfg.attention_sizes(layer)));
  if (!cfg.attn_only) ff = register_module("ff", std::make_shared<FeedForward>(cfg.emb_dim));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(cfg.emb_dim, 1e-5, LayerNorm::Style::Book));
  if (!cfg.attn_only)
    norm2 = register_module("norm2", std::make_shared<LayerNorm>(cfg.emb_dim, 1e-5, LayerNorm::Style::Book));
  drop_shortcut = register_module("drop_shortcut", std::make_shared<Dropout>(cfg.drop_rate));
}

GPTModel::GPTModel(const GPTConfig& cfg) : cfg_(cfg) {
  cfg_.validate();
  shape_ = {.vocab_size = cfg.vocab_size,
            .context_length = cfg.context_length,
            .d_model = cfg.emb_dim,
            .n_layers = cfg.n_layers,
            .n_heads = cfg.n_heads,
            .has_mlp = !cfg.attn_only,
            .kept_heads = cfg.kept_heads};
  tok_emb = register_module("tok_emb", std::make_shared<Embedding>(cfg.vocab_size, cfg.emb_dim));
  pos_emb = register_module("pos_emb", std::make_shared<Embedding>(cfg.context_length, cfg.emb_dim));
  drop_emb = register_module("drop_emb", std::make_shared<Dropout>(cfg.drop_rate));
  trf_blocks = register_module("trf_blocks", std::make_shared<Sequential>());
  for (int64_t l = 0; l < cfg.n_layers; ++l) trf_blocks->push_back(std::make_shared<TransformerBlock>(cfg_, l));
  final_norm = register_module("final_norm", std::make_shared<LayerNorm>(cfg.emb_dim, 1e-5, LayerNorm::Style::Book));
  {
    std::optional<SkipInit> tied;  // a tied head's own weight is dropped at once: skip drawing it
    if (cfg.tie_embeddings) tied.emplace();
    out_head = register_module("out_head", std::make_shared<Linear>(cfg.emb_dim, cfg.vocab_size, false));
  }
  if (cfg.tie_embeddings) out_head->tie_weight(tok_emb->weight);
}

nlohmann::json GPTModel::pruned_config(const std::vector<std::vector<int64_t>>& kept) const {
  GPTConfig c = cfg_;
  c.kept_heads = kept;
  c.validate();
  return c.to_json();
}

nlohmann::json GPTModel::converted_config(AttentionForm form) const {
  GPTConfig c = cfg_;
  c.attention = form;
  return c.to_json();
}

Tensor GPTModel::embed(const Tensor& idx, int64_t offset, Hooks* hooks) {
  check_token_ids(idx, offset, "GPTModel");
  const int64_t B = idx.size(0), T = idx.size(1);
  const HookSite site{hooks, -1};
  const Tensor tok = site(HookPoint::embed, tok_emb->forward(idx));  // (B, T, C)
  Tensor pos = pos_emb->forward(
      arange(static_cast<double>(offset), static_cast<double>(offset + T), 1, DType::i64, idx.device()));  // (T, C)
  if (site.wants(HookPoint::pos_embed)) pos = site(HookPoint::pos_embed, pos.unsqueeze(0).expand({B, T, cfg_.emb_dim}));
  return drop_emb->forward(add(tok, pos));
}

std::shared_ptr<TransformerBlock> GPTModel::block(int64_t layer) const {
  HL_CHECK(layer >= 0 && layer < cfg_.n_layers, "GPTModel: layer ", layer, " is out of range for ", cfg_.n_layers,
           " layers");
  return trf_blocks->at<TransformerBlock>(static_cast<size_t>(layer));
}

}  // namespace headlab::nn
