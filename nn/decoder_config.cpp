// DecoderConfig's rules and counts, and what every decoder family shares: its section read and written
// through one table of fields, its model built, its counts.
#include "nn/decoder_config.h"

#include <algorithm>
#include <cmath>

#include "base/json_fields.h"
#include "nn/decoder.h"
#include "nn/decoder_family.h"

namespace headlab::nn {

namespace {

using C = DecoderConfig;

// Every key a family's section may have, with its bounds; a family picks its keys (DecoderFamily::keys).
const auto kDecoderFields = std::tuple{
    field("vocab_size", &C::vocab_size, kPositive),
    field("out_vocab_size", &C::out_vocab_size, kNonNegative),
    field("context_length", &C::context_length, kPositive),
    field("emb_dim", &C::emb_dim, kPositive),
    field("n_heads", &C::n_heads, kPositive),
    field("n_kv_heads", &C::n_kv_heads, kNonNegative),
    field("n_layers", &C::n_layers, kPositive),
    field("hidden_dim", &C::hidden_dim, kNonNegative),
    field("head_dim", &C::head_dim, kNonNegative),
    field("rotary_dims", &C::rotary_dims, kNonNegative),
    field("norm", &C::norm),
    field("norm_eps", &C::norm_eps, kSmallEps),
    field("norm_weight_offset", &C::norm_weight_offset, kNonNegative),
    field("pre_norms", &C::pre_norms),
    field("post_norms", &C::post_norms),
    field("embed_scale", &C::embed_scale),
    field("causal", &C::causal),
    field("post_ln", &C::post_ln),
    field("type_vocab_size", &C::type_vocab_size, kNonNegative),
    field("embed_norm", &C::embed_norm),
    field("mlm_head", &C::mlm_head),
    field("mlp", &C::mlp),
    field("rope_theta", &C::rope_theta, kAboveOne),
    field("rope_local_theta", &C::rope_local_theta, kNonNegative),
    field("rope_interleaved", &C::rope_interleaved),
    field("rope_scaling", &C::rope_scaling),
    field("rope_factor", &C::rope_factor, kNonNegative),
    field("rope_low_freq_factor", &C::rope_low_freq_factor, kNonNegative),
    field("rope_high_freq_factor", &C::rope_high_freq_factor, kNonNegative),
    field("rope_original_context", &C::rope_original_context, kNonNegative),
    field("parallel_residual", &C::parallel_residual),
    field("drop_rate", &C::drop_rate, kFraction),
    field("attn_scale", &C::attn_scale, kNonNegative),
    field("attn_softcap", &C::attn_softcap, kNonNegative),
    field("logit_softcap", &C::logit_softcap, kNonNegative),
    field("qkv_bias", &C::qkv_bias),
    field("sliding_window", &C::sliding_window, kNonNegative),
    field("window_layers", &C::window_layers),
    field("out_bias", &C::out_bias),
    field("unembed_bias", &C::unembed_bias),
    field("tie_embeddings", &C::tie_embeddings),
    field("attn_only", &C::attn_only),
    field("attention", &C::attention),
    field("kept_heads", &C::kept_heads),
};

const SectionKey* find_key(const std::vector<SectionKey>& keys, const char* name) {
  const auto it =
      std::find_if(keys.begin(), keys.end(), [&](const SectionKey& k) { return k.name == std::string(name); });
  return it == keys.end() ? nullptr : &*it;
}

double norm_parameters(const DecoderConfig& c) {  // weight (and bias); none without a norm
  return static_cast<double>(c.emb_dim) * (c.norm == NormKind::layer_norm ? 2 : c.norm == NormKind::rms_norm ? 1 : 0);
}

double block_norms(const DecoderConfig& c) {  // a norm's place taken: before and after the part it serves
  return (c.pre_norms ? 1.0 : 0.0) + (c.post_norms ? 1.0 : 0.0);
}

}  // namespace

// ---- DecoderConfig ----
int64_t DecoderConfig::rotary_size() const {
  return rotary_dims ? rotary_dims : static_cast<int64_t>(static_cast<double>(head_size()) * rotary_fraction);
}

int64_t DecoderConfig::heads_in_layer(int64_t layer) const {
  return kept_heads.empty() ? n_heads : static_cast<int64_t>(kept_heads.at(static_cast<size_t>(layer)).size());
}

int64_t DecoderConfig::window_of(int64_t layer) const {
  if (sliding_window == 0) return 0;
  const bool windowed =
      window_layers.empty() || std::find(window_layers.begin(), window_layers.end(), layer) != window_layers.end();
  return windowed ? sliding_window : 0;
}

CausalAttentionSizes DecoderConfig::attention_sizes(int64_t layer) const {
  CausalAttentionSizes s;
  s.d_in = s.d_out = emb_dim;  // a pruned layer keeps the model's width
  s.context_length = context_length;
  s.num_heads = heads_in_layer(layer);
  s.num_kv_heads = s.num_heads / group_size();  // whole groups (validate); a layer pruned to nothing: 0
  s.head_dim = head_size();
  s.dropout = drop_rate;
  s.qkv_bias = qkv_bias;
  s.out_bias = has_out_bias();
  const bool local = rope_local_theta > 0 && window_of(layer) > 0;  // Gemma 3's local layers: plain rotary
  s.rotary = {.dims = rotary_size(),
              .theta = local ? rope_local_theta : rope_theta,
              .interleaved = rope_interleaved,
              .scaling = local ? RopeScaling{} : rope_scaling_of()};
  s.qk_norm = qk_norm, s.qk_norm_eps = norm_eps, s.qk_norm_offset = norm_weight_offset;
  s.window = window_of(layer);
  s.scale = attn_scale;
  s.softcap = attn_softcap;
  s.causal = causal;
  return s;
}

RopeScaling DecoderConfig::rope_scaling_of() const {
  if (rope_scaling == RopeScalingKind::none) return {};
  RopeScaling s{.kind = rope_scaling, .factor = rope_factor};
  if (rope_scaling == RopeScalingKind::llama3)
    s.low_freq_factor = rope_low_freq_factor, s.high_freq_factor = rope_high_freq_factor,
    s.original_context = rope_original_context;
  return s;
}

void DecoderConfig::validate() const {
  const char* who = family->who();
  check_fields(*this, kDecoderFields, who);
  family->check(*this);
  HL_CHECK(n_kv_heads == 0 || n_heads % n_kv_heads == 0, who, ": n_kv_heads ", n_kv_heads, " must divide n_heads ",
           n_heads);
  HL_CHECK(head_dim != 0 || emb_dim % n_heads == 0, who, ": emb_dim ", emb_dim, " must be divisible by n_heads ",
           n_heads);
  HL_CHECK(rotary_fraction >= 0 && rotary_fraction <= 1, who, ": rotary_fraction ", rotary_fraction,
           " must be in [0, 1]");
  HL_CHECK(rotary_size() % 2 == 0 && rotary_size() <= head_size(), who, ": rotary_dims ", rotary_size(),
           " must be even and at most the head size ", head_size());
  HL_CHECK(!(attn_only && parallel_residual), who, ": an attention-only model has no parallel residual");
  HL_CHECK(!tie_embeddings || output_vocab() == vocab_size, who, ": a tied head predicts the ", vocab_size,
           " input tokens; out_vocab_size is ", out_vocab_size);
  HL_CHECK(window_layers.empty() || sliding_window > 0, who, ": window_layers needs a sliding_window");
  if (rope_scaling != RopeScalingKind::none) {
    HL_CHECK(rotary_size() > 0, who, ": rope_scaling ", enum_name(rope_scaling), " needs rotary embeddings");
    HL_CHECK(rope_factor > 0, who, ": rope_scaling ", enum_name(rope_scaling), " needs rope_factor > 0, got ",
             rope_factor);
    if (rope_scaling == RopeScalingKind::llama3)
      HL_CHECK(rope_original_context > 0 && rope_low_freq_factor > 0 && rope_high_freq_factor > rope_low_freq_factor,
               who,
               ": rope_scaling llama3 needs rope_original_context > 0 and rope_high_freq_factor > "
               "rope_low_freq_factor > 0, got ",
               rope_original_context, ", ", rope_high_freq_factor, " and ", rope_low_freq_factor);
  }
  HL_CHECK(rope_local_theta == 0 || rope_local_theta > 1, who,
           ": rope_local_theta must be above 1 (or 0: rope_theta), got ", rope_local_theta);
  HL_CHECK(norm_weight_offset == 0 || norm == NormKind::rms_norm, who, ": norm_weight_offset applies to rms_norm only");
  HL_CHECK(pre_norms || post_norms || norm == NormKind::none, who, ": a block needs its norms before or after");
  HL_CHECK(!post_ln || (pre_norms && !post_norms && !parallel_residual && !attn_only), who,
           ": post_ln (norms after the residual adds) takes sequential blocks with an MLP and no other norms");
  HL_CHECK(causal || sliding_window == 0, who, ": a sliding window applies to causal attention only");
  HL_CHECK(!mlm_head || norm != NormKind::none, who, ": the masked-LM head's transform ends in a norm");
  HL_CHECK(attn_scale >= 0 && std::isfinite(attn_scale), who, ": attn_scale must be finite and >= 0, got ", attn_scale);
  for (size_t i = 0; i < window_layers.size(); ++i)
    HL_CHECK(
        window_layers[i] >= 0 && window_layers[i] < n_layers && (i == 0 || window_layers[i] > window_layers[i - 1]),
        who, ": window_layers must be increasing layers 0..", n_layers - 1, ", got ", window_layers[i],
        i ? " after " + std::to_string(window_layers[i - 1]) : std::string());
  check_head_lists(kept_heads, n_layers, n_heads, who, "kept_heads");
  const int64_t G = group_size();
  if (G == 1) return;
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

nlohmann::json DecoderConfig::to_json() const { return family->section(*this); }

double DecoderConfig::num_parameters() const {
  const double d = static_cast<double>(emb_dim), V = static_cast<double>(vocab_size),
               V_out = static_cast<double>(output_vocab()), F = static_cast<double>(mlp_width());
  double n = V * d + (post_ln ? 0.0 : norm_parameters(*this));          // tok_emb, final_norm (post-LN: none)
  if (learned_positions) n += static_cast<double>(context_length) * d;  // pos_emb
  n += static_cast<double>(type_vocab_size) * d + (embed_norm ? norm_parameters(*this) : 0.0);  // type_emb, emb_norm
  if (mlm_head) n += d * d + d + norm_parameters(*this);                                        // mlm_dense, mlm_norm
  if (!tie_embeddings) n += d * V_out;                                  // out_head
  if (unembed_bias) n += V_out;
  const double mlp_parameters = gated_mlp() ? 3 * d * F : 2 * d * F + F + d;
  const double norms = block_norms(*this) * norm_parameters(*this);  // a part's norms, before and after
  for (int64_t l = 0; l < n_layers; ++l) {
    n += causal_attention_parameters(attention, attention_sizes(l)) + norms;  // att, norm1 (norm1_post)
    if (!attn_only) n += norms + mlp_parameters;                              // norm2 (norm2_post), ff
  }
  return n;
}

// Training: what the tape keeps per token and layer: the norms' outputs, q, k, v (and their rotations), the
// context and the residuals (14 C), and the MLP's (..., F) tensors (three; a gated MLP's five); the logits and
// their gradient (4 V, V the logits' width). One forward: a layer's stream, norm, projections and context at
// once (8 C), the MLP's live (..., F) tensors, the logits (2 V). Estimates for the memory checks (train/memory.h),
// held to a measured run's peak in tests/test_decoder.cpp.
double DecoderConfig::activation_floats(bool training) const {
  const double d = static_cast<double>(emb_dim), V = static_cast<double>(output_vocab()),
               F = attn_only ? 0.0 : static_cast<double>(mlp_width());
  const double wide = gated_mlp() ? 5 : 3;
  // q/k norms keep their normalised queries and keys (and the tape their inputs) beside the projections
  const double qk = qk_norm == QkNorm::none ? 0.0 : 2.0 * static_cast<double>((n_heads + kv_heads()) * head_size());
  const double post = post_norms ? 2 * d : 0.0;  // the post norms' inputs, which their backward reads
  return training ? static_cast<double>(n_layers) * (14 * d + post + qk + wide * F) + 4 * V
                  : 8 * d + qk / 2 + (wide - 1) * F + 2 * V;
}

double DecoderConfig::cache_floats() const {  // keys and values of each layer's key/value heads
  double n = 0;
  for (int64_t l = 0; l < n_layers; ++l) n += 2.0 * static_cast<double>(attention_sizes(l).kv_heads() * head_size());
  return n;
}

// ---- DecoderFamily ----
DecoderFamily::DecoderFamily(FamilyNames names, std::vector<SectionKey> keys) : names_(names) {
  for (const char* size : {"vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"})
    keys_.push_back({size, SectionKey::required});
  keys_.insert(keys_.end(), keys.begin(), keys.end());
  keys_.insert(keys_.end(), {{"attention"}, {"kept_heads"}});
}

DecoderConfig DecoderFamily::config() const {
  DecoderConfig c = parts();
  c.family = this;
  return c;
}

DecoderConfig DecoderFamily::config(const nlohmann::json& j) const {
  DecoderConfig c = config();
  HL_CHECK(j.is_object(), who(), ": expected a JSON object, got ", j.type_name());
  const std::vector<SectionKey>& ks = keys();
  for_each_field(kDecoderFields, [&](const auto& f) {
    const SectionKey* k = find_key(ks, f.key);
    if (k == nullptr) return;  // not this family's: the part stays as the family fixes it
    HL_CHECK(k->presence != SectionKey::required || j.contains(f.key), who(), ": missing key '", f.key, "'");
    read_json_field(j, f.key, c.*f.member, who());
  });
  c.validate();
  return c;
}

nlohmann::json DecoderFamily::section(const DecoderConfig& c) const {
  nlohmann::json j = nlohmann::json::object();
  const std::vector<SectionKey>& ks = keys();
  for_each_field(kDecoderFields, [&](const auto& f) {
    const SectionKey* k = find_key(ks, f.key);
    if (k == nullptr) return;
    using T = typename std::decay_t<decltype(f)>::Type;
    if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>)
      if (k->presence == SectionKey::omitted_when_false && c.*f.member == T{}) return;
    write_json_field(j, f.key, c.*f.member);
  });
  if (arch_in_section()) j["arch"] = arch();
  return j;
}

nlohmann::json DecoderFamily::from_options(const ModelOptions& o, const TaskSizes& t) const {
  DecoderConfig c = config();
  c.vocab_size = t.vocab_size, c.context_length = t.context_length;
  c.emb_dim = o.emb_dim, c.n_heads = o.n_heads, c.n_layers = o.n_layers;
  c.drop_rate = o.drop_rate, c.qkv_bias = o.qkv_bias, c.attention = o.attention;
  take_options(o, c);
  c.validate();
  return section(c);
}

ModelOptions DecoderFamily::options(const nlohmann::json& s) const {
  const DecoderConfig c = config(s);
  ModelOptions o;
  o.arch = arch();
  o.emb_dim = c.emb_dim, o.n_heads = c.n_heads, o.n_layers = c.n_layers, o.context_length = c.context_length;
  o.drop_rate = c.drop_rate, o.qkv_bias = c.qkv_bias, o.attention = c.attention;
  give_options(c, o);
  return o;
}

std::shared_ptr<Model> DecoderFamily::build(const nlohmann::json& s) const {
  return std::make_shared<DecoderModel>(config(s));
}

nlohmann::json DecoderFamily::with_dropout(const nlohmann::json& s, double p) const {
  DecoderConfig c = config(s);
  c.drop_rate = p;
  c.validate();
  return section(c);
}

}  // namespace headlab::nn
