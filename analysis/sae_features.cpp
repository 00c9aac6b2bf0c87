// Features of heads (analysis/sae_features.h): head shares, logit effects, and pre-activations split over heads.
#include "analysis/sae_features.h"

#include <algorithm>
#include <numeric>

#include "analysis/files.h"
#include "analysis/hooked_run.h"
#include "nn/hooks.h"

namespace headlab::analysis {

namespace {

std::vector<double> values(const Tensor& t) { return to_dtype(to_device(t, kCPU), DType::f64).to_vector<double>(); }

double dot(const double* a, const double* b, int64_t n) { return std::inner_product(a, a + n, b, 0.0); }

// How an SAE's input is split over heads: its own heads' z (hook_z), or the outputs of the heads of layers [first,
// last] that the stream (or attn_out) it reads received. A head's output is z_h W_O[h], so its part of
// x . w is z_h . (W_O[h] w): the split reads each layer's z (T, H, D), not its results (T, H, C).
struct InputSplit {
  enum Kind { none, z, head_results } kind = none;
  int64_t first = 0, last = -1;
  std::string text;
};

InputSplit input_split(const nn::HookKey& key) {
  using P = nn::HookPoint;
  const int64_t L = key.layer;
  const std::string layer = std::to_string(L);
  switch (key.point) {
    case P::z:
      return {InputSplit::z, L, L, "the heads of layer " + layer + " (each one's z)"};
    case P::attn_out:
      return {InputSplit::head_results, L, L, "the heads of layer " + layer + " (attn.hook_result), the rest its bias"};
    case P::resid_pre:
      return {InputSplit::head_results, 0, L - 1, "every head before layer " + layer + ", the rest a remainder"};
    case P::resid_mid:
    case P::resid_post:
      return {InputSplit::head_results, 0, L, "every head up to layer " + layer + ", the rest a remainder"};
    default:
      return {};
  }
}

// The (n, C) directions through the final norm's weight (centred where it centres): what W_U reads of them.
Tensor through_final_norm(const nn::DecoderModel& model, Tensor d) {
  const nn::Norm& n = model.ln_final();
  if (n.identity()) return d;
  if (n.centres()) d = sub(d, mean(d, {-1}, true));
  return mul(d, to_dtype(to_device(n.gain().detach(), d.device()), d.dtype()));
}

std::vector<TokenEffect> extreme(const std::vector<double>& row, int64_t n, bool largest) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  n = std::min<int64_t>(n, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int64_t a, int64_t b) {
    return largest ? row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)]
                   : row[static_cast<size_t>(a)] < row[static_cast<size_t>(b)];
  });
  std::vector<TokenEffect> out;
  for (int64_t i = 0; i < n; ++i) out.push_back({order[static_cast<size_t>(i)], row[static_cast<size_t>(order[i])]});
  return out;
}

}  // namespace

FeatureHeads feature_head_shares(const nn::DecoderModel& model, const nn::SparseAutoencoder& sae, int64_t layer,
                                 const std::vector<int64_t>& features) {
  const NoGradGuard no_grad;
  const nn::HeadWeights w = model.head_weights(layer, false, DType::f64);
  const int64_t H = w.W_O.size(0), D = w.W_O.size(1);
  HL_CHECK(sae.config().d_in == H * D, "sae: an SAE on blocks.", layer, ".attn.hook_z reads ", H, " heads x ", D, " = ",
           H * D, " values a token; this one's d_in is ", sae.config().d_in);
  std::vector<int64_t> rows = features;
  if (rows.empty())
    for (int64_t j = 0; j < sae.config().d_sae; ++j) rows.push_back(j);
  constexpr int64_t kChunk = 1024;
  std::vector<Tensor> shares, norms;
  for (size_t at = 0; at < rows.size(); at += kChunk) {
    const auto n = static_cast<int64_t>(std::min<size_t>(kChunk, rows.size() - at));
    const Tensor index = tensor(std::vector<int64_t>(rows.begin() + static_cast<std::ptrdiff_t>(at),
                                                     rows.begin() + static_cast<std::ptrdiff_t>(at) + n),
                                {n})
                             .to(sae.W_dec.device());
    // (H, n, D) @ (H, D, C) -> each head's part of each feature's output direction, (H, n, C)
    const Tensor dec = to_dtype(index_select(sae.W_dec.detach(), 0, index), DType::f64);
    const Tensor blocks = permute(reshape(dec, {n, H, D}), {1, 0, 2});
    const Tensor parts = matmul(blocks, to_device(w.W_O, blocks.device()));
    const Tensor out = sum(parts, {0});                 // (n, C)
    const Tensor norm = sqrt(sum(mul(out, out), {1}));  // (n)
    const Tensor unit = div(out, unsqueeze(maximum(norm, scalar_tensor(1e-300, DType::f64, norm.device())), 1));
    shares.push_back(transpose(sum(mul(parts, unsqueeze(unit, 0)), {2}), 0, 1));  // (n, H)
    norms.push_back(norm);
  }
  return {contiguous(cat(shares, 0)), contiguous(cat(norms, 0))};
}

Tensor feature_output_directions(const nn::DecoderModel& model, const nn::SparseAutoencoder& sae,
                                 const io::SaeOrigin& origin, const std::vector<int64_t>& features) {
  const NoGradGuard no_grad;
  const std::string& writes = origin.transcoder() ? origin.hook_name_out : origin.hook_name;
  const std::optional<nn::HookKey> key = nn::parse_hook_name(writes);
  if (!key) return {};
  using P = nn::HookPoint;
  const Tensor index = tensor(features, {static_cast<int64_t>(features.size())}).to(sae.W_dec.device());
  const Tensor rows = to_dtype(index_select(sae.W_dec.detach(), 0, index), DType::f64);  // (n, d_out)
  const int64_t C = model.shape().d_model;
  switch (key->point) {
    case P::z: {
      const nn::HeadWeights w = model.head_weights(key->layer, false, DType::f64);
      const int64_t H = w.W_O.size(0), D = w.W_O.size(1), n = rows.size(0);
      if (rows.size(1) != H * D) return {};
      const Tensor blocks = permute(reshape(rows, {n, H, D}), {1, 0, 2});  // (H, n, D)
      return sum(matmul(blocks, to_device(w.W_O, blocks.device())), {0});  // (n, C)
    }
    case P::embed:
    case P::pos_embed:
    case P::resid_pre:
    case P::resid_mid:
    case P::resid_post:
    case P::attn_out:
    case P::mlp_out:
      return rows.size(1) == C ? rows : Tensor();
    default:
      return {};
  }
}

FeatureReport features_on_prompt(nn::DecoderModel& model, nn::SparseAutoencoder& sae, const io::SaeOrigin& origin,
                                 const std::vector<int64_t>& ids, const FeatureOptions& o) {
  const NoGradGuard no_grad;
  const auto T = static_cast<int64_t>(ids.size());
  HL_CHECK(T > 0, "sae features: the prompt is empty");
  HL_CHECK(T <= model.shape().context_length, "sae features: the prompt is ", T,
           " tokens, longer than the model's context (", model.shape().context_length, ")");
  const std::optional<nn::HookKey> key = nn::parse_hook_name(origin.hook_name);
  InputSplit in_split = key ? input_split(*key) : InputSplit{};
  if (in_split.kind == InputSplit::head_results && (model.shape().post_ln || model.shape().post_norms))
    in_split = {};  // the stream is normed after the heads write: their outputs no longer sum to it
  std::set<std::string> names = {origin.hook_name};
  for (int64_t l = in_split.first; in_split.kind == InputSplit::head_results && l <= in_split.last; ++l)
    names.insert(nn::hook_name({nn::HookPoint::z, l}));
  const HookedRun run = run_hooked(model, tensor(ids, {1, T}).to(model.device()), names);
  const nn::SaeConfig& c = sae.config();
  const Tensor act = run.cache.at(origin.hook_name);
  HL_CHECK(act.numel() == T * c.d_in, "sae features: ", origin.hook_name, "'s activations are ", act.numel() / T,
           " wide a token, the SAE's d_in is ", c.d_in);
  const Tensor x = reshape(act, {T, c.d_in});
  // (T, d_sae) in the SAE's own dtype (a float64 SAE's stay exact; a float32 one's take no more than they need)
  const Tensor codes = contiguous(to_device(sae.encode(x), kCPU));
  const bool wide = codes.dtype() == DType::f64;
  const Tensor f = wide ? codes : to_dtype(codes, DType::f32);
  const std::vector<double> xs = values(x);  // (T, d_in)
  const auto at = [&, f64 = wide ? f.data<double>() : nullptr, f32 = wide ? nullptr : f.data<float>()](int64_t t,
                                                                                                       int64_t j) {
    const int64_t i = t * c.d_sae + j;
    return f64 ? f64[i] : static_cast<double>(f32[i]);
  };

  FeatureReport r;
  r.hook = origin.hook_name, r.split = in_split.text, r.ids = ids;
  std::optional<int64_t> pos = o.position;
  if (pos) {
    HL_CHECK(*pos >= -T && *pos < T, "sae features: --position ", *pos, " is outside the prompt's ", T, " tokens");
    if (*pos < 0) *pos += T;
  }
  // the features: chosen, or the most active (largest activation over the prompt, or at the position)
  std::vector<int64_t> chosen = o.chosen;
  for (int64_t j : chosen)
    HL_CHECK(j >= 0 && j < c.d_sae, "sae features: feature ", j, " is not one of the SAE's ", c.d_sae);
  if (chosen.empty()) {
    std::vector<std::pair<double, int64_t>> score;
    for (int64_t j = 0; j < c.d_sae; ++j) {
      double s = 0;
      for (int64_t t = pos.value_or(0); t < (pos ? *pos + 1 : T); ++t) s = std::max(s, at(t, j));
      if (s > 0) score.emplace_back(-s, j);
    }
    const auto n = std::min<size_t>(static_cast<size_t>(o.features), score.size());
    std::partial_sort(score.begin(), score.begin() + static_cast<std::ptrdiff_t>(n), score.end());
    for (size_t i = 0; i < n; ++i) chosen.push_back(score[i].second);
  }
  if (chosen.empty()) return r;

  const std::vector<double> W_enc = values(sae.W_enc), b_enc = values(sae.b_enc);
  const std::vector<double> b_dec = c.apply_b_dec_to_input ? values(sae.b_dec) : std::vector<double>();
  std::vector<double> head_shares;  // (chosen, H)
  int64_t H = 0;
  if (in_split.kind == InputSplit::z) {
    const FeatureHeads fh = feature_head_shares(model, sae, key->layer, chosen);
    H = fh.shares.size(1), head_shares = values(fh.shares);
  }
  struct HeadLayer {
    int64_t layer, H, D;
    Tensor z;    // (T, H, D), the model's dtype
    Tensor W_O;  // (H, D, C) float64
  };
  std::vector<HeadLayer> head_layers;
  for (int64_t l = in_split.first; in_split.kind == InputSplit::head_results && l <= in_split.last; ++l) {
    const Tensor z = run.cache.at(nn::hook_name({nn::HookPoint::z, l}));  // (1, T, H, D)
    head_layers.push_back({l, z.size(2), z.size(3), z.select(0, 0), model.head_weights(l, false, DType::f64).W_O});
  }
  const Tensor dirs = feature_output_directions(model, sae, origin, chosen);
  std::vector<double> logits;
  int64_t V = 0;
  if (dirs.defined()) {
    const Tensor W_U = model.W_U();
    const Tensor l = matmul(through_final_norm(model, to_dtype(dirs, W_U.dtype())), W_U);  // (n, V)
    V = l.size(1), logits = values(l);
  }

  for (size_t i = 0; i < chosen.size(); ++i) {
    const int64_t j = chosen[i];
    FeatureOnPrompt p;
    p.feature = j;
    for (int64_t t = 0; t < T; ++t) p.activations.push_back(at(t, j));
    p.position = pos ? *pos : std::max_element(p.activations.begin(), p.activations.end()) - p.activations.begin();
    p.activation = p.activations[static_cast<size_t>(p.position)];
    std::vector<double> w(static_cast<size_t>(c.d_in));  // W_enc[:, j]
    for (int64_t d = 0; d < c.d_in; ++d) w[static_cast<size_t>(d)] = W_enc[static_cast<size_t>(d * c.d_sae + j)];
    const double* x_t = xs.data() + p.position * c.d_in;
    p.bias = b_enc[static_cast<size_t>(j)] - (b_dec.empty() ? 0.0 : dot(b_dec.data(), w.data(), c.d_in));
    p.pre_activation = dot(x_t, w.data(), c.d_in) + p.bias;
    if (in_split.kind == InputSplit::z) {
      const int64_t D = c.d_in / H;
      for (int64_t h = 0; h < H; ++h) {
        p.labels.push_back(head_name(model, key->layer, h));
        p.parts.push_back(dot(x_t + h * D, w.data() + h * D, D));
        p.head_shares.push_back(head_shares[i * static_cast<size_t>(H) + static_cast<size_t>(h)]);
      }
    } else if (in_split.kind == InputSplit::head_results) {
      const int64_t C = c.d_in;
      const Tensor w_t = tensor(w, {C, 1});
      double heads = 0;
      for (const HeadLayer& hl : head_layers) {
        // (H, D, C) @ (C, 1): what each head's z is read along, then z at the position against it
        const std::vector<double> read = values(matmul(hl.W_O, to_device(w_t, hl.W_O.device())));  // (H, D)
        const std::vector<double> z = values(hl.z.select(0, p.position));                          // (H, D)
        for (int64_t h = 0; h < hl.H; ++h) {
          p.labels.push_back(head_name(model, hl.layer, h));
          p.parts.push_back(dot(z.data() + h * hl.D, read.data() + h * hl.D, hl.D));
          heads += p.parts.back();
        }
      }
      p.labels.push_back("remainder");  // what no head wrote: embeddings, MLPs, attention biases
      p.parts.push_back(dot(x_t, w.data(), C) - heads);
    }
    if (!logits.empty()) {
      const std::vector<double> row(logits.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(V)),
                                    logits.begin() + static_cast<std::ptrdiff_t>((i + 1) * static_cast<size_t>(V)));
      p.top_logits = extreme(row, o.logits, true), p.bottom_logits = extreme(row, o.logits, false);
    }
    r.features.push_back(std::move(p));
  }
  return r;
}

}  // namespace headlab::analysis
