// Every head's attention weights for one input.
#include "analysis/attention_maps.h"

#include <algorithm>
#include <limits>
#include <set>

#include "analysis/head_control.h"

namespace headlab::analysis {

using namespace detail;

namespace {

// Maps of one kind with nothing filled in yet (NaN: pruned heads stay so).
AttentionMaps empty_maps(std::string kind, int64_t layers, int64_t heads, std::vector<int64_t> ids,
                         std::vector<int64_t> key_ids) {
  AttentionMaps m;
  m.kind = std::move(kind);
  m.layers = layers;
  m.heads = heads;
  m.T = static_cast<int64_t>(ids.size());
  m.S = static_cast<int64_t>(key_ids.size());
  m.ids = std::move(ids);
  m.key_ids = std::move(key_ids);
  m.weights.assign(static_cast<size_t>(m.layers * m.heads * m.T * m.S), std::numeric_limits<float>::quiet_NaN());
  return m;
}

// Layer l's kept weights (1, H_l, T, S) into m, each head at its original index (undefined: no heads).
void fill_layer(AttentionMaps& m, int64_t l, const Tensor& weights, const std::function<int64_t(int64_t)>& original) {
  const std::vector<float> w = weights.defined() ? weights.to_vector<float>() : std::vector<float>();
  const int64_t TS = m.T * m.S, H = static_cast<int64_t>(w.size()) / TS;
  std::vector<int64_t> kept;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t oh = original(h);
    kept.push_back(oh);
    std::copy(w.begin() + h * TS, w.begin() + (h + 1) * TS, m.weights.begin() + (l * m.heads + oh) * TS);
  }
  m.kept.push_back(kept);
}

}  // namespace

const std::vector<std::string>& checked_key_tokens(const char* who, const AttentionMaps& maps,
                                                   const std::vector<std::string>& tokens,
                                                   const std::vector<std::string>& key_tokens) {
  HL_CHECK(static_cast<int64_t>(tokens.size()) == maps.T, who, ": ", tokens.size(), " tokens for maps of ", maps.T);
  HL_CHECK(static_cast<int64_t>(maps.layer_names.size()) == maps.layers, who, ": ", maps.layer_names.size(),
           " layer names for maps of ", maps.layers, " layers");
  const std::vector<std::string>& keys = key_tokens.empty() ? tokens : key_tokens;
  HL_CHECK(static_cast<int64_t>(keys.size()) == maps.S, who, ": ", keys.size(), " key tokens for maps of ", maps.S,
           " keys");
  return keys;
}

AttentionMaps attention_maps(nn::DecoderModel& model, const std::vector<int64_t>& ids) {
  const nn::DecoderShape& shape = model.shape();
  const int64_t T = static_cast<int64_t>(ids.size());
  HL_CHECK(T > 0, "attention_maps: the input is empty");
  HL_CHECK(T <= shape.context_length, "attention_maps: ", T, " tokens exceed context_length ", shape.context_length);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  AttentionMaps m = empty_maps("attention", shape.n_layers, shape.n_heads, ids, ids);
  if (m.layers > 0 && model.attention(0).kv_head_count() != model.attention(0).head_count())
    m.kv_heads = model.attention(0).kv_head_count();  // grouped-query models are not pruned: every layer alike
  std::set<nn::HookKey> patterns;
  for (int64_t l = 0; l < m.layers; ++l) patterns.insert({nn::HookPoint::pattern, l});
  nn::ActivationCache cache(std::move(patterns));
  {
    NoGradGuard no_grad;
    model.forward(tensor(ids, {1, T}).to(model.device()), &cache);
  }
  for (int64_t l = 0; l < m.layers; ++l) {
    m.layer_names.push_back(model.attention_label(l));
    const auto found = cache.cache().find({nn::HookPoint::pattern, l});  // (none where every head is pruned)
    fill_layer(m, l, found == cache.cache().end() ? Tensor() : found->second,
               [&](int64_t h) { return model.original_head(l, h); });
  }
  return m;
}

std::vector<AttentionMaps> attention_maps(nn::EncoderDecoder& model, const std::vector<int64_t>& source,
                                          const std::vector<int64_t>& decoder_input) {
  const nn::TransformerConfig& cfg = model.config();
  const int64_t S = static_cast<int64_t>(source.size()), T = static_cast<int64_t>(decoder_input.size());
  HL_CHECK(S > 0 && T > 0, "attention_maps: the source (", S, " tokens) and the decoder input (", T,
           " tokens) must not be empty");
  HL_CHECK(S <= cfg.max_len && T <= cfg.max_len, "attention_maps: ", std::max(S, T),
           " tokens exceed the positional encoding's max_len ", cfg.max_len);
  ControlGuard guard(model);
  model.eval();
  set_controls(model, {}, {});
  std::vector<bool> kept_before;
  for (int64_t i = 0; i < model.attention_count(); ++i)
    kept_before.push_back(model.attention(i).attention->keep_attention_weights);
  model.keep_attention_weights(true);
  {
    NoGradGuard no_grad;
    const Device d = model.device();
    model.forward(tensor(source, {1, S}).to(d), tensor(decoder_input, {1, T}).to(d),
                  tensor(std::vector<int64_t>{S}, {1}).to(d));
  }
  const int64_t L = cfg.num_layers;
  std::vector<AttentionMaps> kinds = {
      empty_maps("encoder self-attention", L, cfg.num_heads, source, source),
      empty_maps("decoder self-attention", L, cfg.num_heads, decoder_input, decoder_input),
      empty_maps("encoder-decoder (cross) attention", L, cfg.num_heads, decoder_input, source)};
  for (int64_t i = 0; i < model.attention_count(); ++i) {  // encoder layers, decoder self, cross
    AttentionMaps& m = kinds[static_cast<size_t>(i / L)];
    m.layer_names.push_back(model.attention_label(i));
    fill_layer(m, i % L, model.attention_weights(i), [&](int64_t h) { return model.original_head(i, h); });
    model.attention(i).attention->keep_attention_weights = kept_before[static_cast<size_t>(i)];
  }
  return kinds;
}

}  // namespace headlab::analysis
