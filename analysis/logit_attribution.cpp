// Direct logit attribution: one forward of the model per batch keeping what the components are made of
// (the stream entering block 0, every layer's z and MLP output, the last stream); only the scored rows
// are kept, in double on the CPU, and projected on the frozen-norm unembedding directions.
#include "analysis/logit_attribution.h"

#include <array>
#include <numeric>
#include <set>

#include "analysis/head_control.h"

namespace headlab::analysis {

namespace {

constexpr const char* kWho = "logit_attribution";

Tensor f64_cpu(const Tensor& t) { return t.to(kCPU).to(DType::f64); }

void scale(DirectAttribution& a, double s) {
  for (auto& row : a.heads)
    for (double& v : row) v *= s;
  for (double& v : a.out_proj_bias) v *= s;
  for (double& v : a.feed_forward) v *= s;
  a.embeddings *= s;
  a.final_shift *= s;
  a.total *= s;
}

}  // namespace

double DirectAttribution::sum() const {
  double s = embeddings + final_shift;
  for (const auto& row : heads) s = std::accumulate(row.begin(), row.end(), s);
  s = std::accumulate(out_proj_bias.begin(), out_proj_bias.end(), s);
  return std::accumulate(feed_forward.begin(), feed_forward.end(), s);
}

LogitAttribution logit_attribution(nn::DecoderModel& model, const EvalSet& data) {
  using nn::HookPoint;
  LogitAttribution r;
  r.tokens = data.tokens();
  HL_CHECK(r.tokens > 0, kWho, ": the evaluation data has no scored tokens");
  detail::ControlGuard guard(model);
  model.eval();  // no dropout: x_L is exactly the sum of the components
  detail::set_controls(model, {}, {});
  const nn::DecoderShape& shape = model.shape();
  HL_CHECK(!shape.post_ln && !model.mlm_dense, kWho, ": ", model.type_name(),
           " norms the stream after every residual add (post-LN) and reads it through a masked-LM head's GELU, so no "
           "component's share of a logit is linear; direct logit attribution of post-LN models is not supported yet");
  const int64_t L = model.n_layers(), V = shape.out_vocab_size, T_max = shape.context_length;
  const auto Ls = static_cast<size_t>(L);
  NoGradGuard no_grad;
  const Device dev = model.device();

  const std::array<DirectAttribution*, 2> variants{&r.vs_mean, &r.logit};  // [0]: minus the mean row
  for (DirectAttribution* a : variants) {
    a->heads = head_matrix(model, 0.0);
    a->out_proj_bias.assign(Ls, 0.0);
    a->feed_forward.assign(Ls, 0.0);
  }
  const Tensor W_U = f64_cpu(model.lm_head().weight);                          // (V, C): the unembedding's rows
  const Tensor W_U_mean = W_U.mean({0});                                       // (C): its row gives the mean logit
  const Tensor b_U = model.b_U().defined() ? f64_cpu(model.b_U()) : Tensor();  // (V) or undefined
  std::vector<Tensor> W_O(Ls), b_O(Ls);                                        // (H*D, C), (C) or undefined
  std::set<nn::HookKey> keep{{HookPoint::resid_pre, 0}, {HookPoint::resid_post, L - 1}};
  for (int64_t l = 0; l < L; ++l) {
    const int64_t H = model.attention(l).head_count();
    if (H > 0) {
      const nn::HeadWeights w = model.head_weights(l);
      W_O[static_cast<size_t>(l)] = f64_cpu(w.W_O).reshape({H * model.attention(l).head_size(), -1});
      if (w.b_O.defined()) b_O[static_cast<size_t>(l)] = f64_cpu(w.b_O);
      keep.insert({HookPoint::z, l});
    }
    if (shape.has_mlp) keep.insert({HookPoint::mlp_out, l});
  }

  for (const Batch& b : data.batches) {
    std::vector<int64_t> rows, ys;  // scored (b, t) as rows of the (B*T) flattening, and their targets
    for (int64_t i = 0; i < b.B * b.T; ++i) {
      const int64_t y = b.targets[static_cast<size_t>(i)];
      if (y == kIgnoreIndex) continue;
      HL_CHECK(y >= 0 && y < V, kWho, ": target ", y, " is outside the vocabulary of ", V, " tokens");
      rows.push_back(i);
      ys.push_back(y);
    }
    if (rows.empty()) continue;
    HL_CHECK(b.T <= T_max, kWho, ": ", b.T, " tokens exceed context_length ", T_max);
    const int64_t N = static_cast<int64_t>(rows.size());
    const Tensor row_idx = tensor(rows, {N}).to(dev);
    // (B, T, ...) -> the scored rows (N, prod(...)) in double on the CPU
    const auto scored = [&](const Tensor& t) { return f64_cpu(index_select(t.reshape({b.B * b.T, -1}), 0, row_idx)); };

    nn::ActivationCache acts(keep);
    const Tensor out = model.forward(train::batch_tensors(b, dev).first, &acts);  // (B, T, V)
    const auto cached = [&](HookPoint p, int64_t l) { return acts.cache().at({p, l}); };

    // Frozen scale: comp . dirs[k, n] is comp's share of variant k at token n.
    const Tensor x_L = scored(cached(HookPoint::resid_post, L - 1));  // (N, C)
    const nn::FrozenNorm frozen = model.freeze_final_norm(x_L);
    const Tensor W_y = index_select(W_U, 0, tensor(ys, {N}));    // (N, C)
    const Tensor unembed = stack({sub(W_y, W_U_mean), W_y}, 0);  // (2, N, C)
    const Tensor dirs = frozen.back(unembed);                    // (2, N, C)
    // comp: (N, C), or (C) for one shared by every token -> its summed share of both variants
    const auto share = [&](const Tensor& comp) { return mul(dirs, comp).sum({1, 2}).to_vector<double>(); };
    const auto add_both = [&](double DirectAttribution::*field, const std::vector<double>& v) {
      for (size_t k = 0; k < 2; ++k) variants[k]->*field += v[k];
    };
    add_both(&DirectAttribution::embeddings, share(scored(cached(HookPoint::resid_pre, 0))));
    add_both(&DirectAttribution::final_shift, frozen.bias_along(unembed).sum({1}).to_vector<double>());
    if (b_U.defined()) {  // the unembedding's own bias: b_U[y] - mean(b_U), and b_U[y]
      const double b_y = index_select(b_U, 0, tensor(ys, {N})).sum().item<double>();
      add_both(&DirectAttribution::final_shift, {b_y - static_cast<double>(N) * b_U.mean().item<double>(), b_y});
    }
    for (size_t l = 0; l < Ls; ++l) {
      const auto layer = static_cast<int64_t>(l);
      if (shape.has_mlp) {  // hook_mlp_out: what the stream adds, after any post norm
        const std::vector<double> ffw = share(scored(cached(HookPoint::mlp_out, layer)));
        for (size_t k = 0; k < 2; ++k) variants[k]->feed_forward[l] += ffw[k];
      }
      const int64_t H = model.attention(layer).head_count();
      if (H == 0) continue;
      const Tensor z = scored(cached(HookPoint::z, layer));  // (N, H*D)
      // dirs as the attention's output sees them: through its post norm (no bias) frozen at that output, if any
      Tensor dirs_l = dirs;
      if (const nn::Norm* post = model.decoder_block(layer).ln1_post()) {
        const Tensor attn = matmul(z, W_O[l]);  // (N, C)
        dirs_l = nn::freeze(*post, b_O[l].defined() ? add(attn, b_O[l]) : attn).back(dirs);
      }
      if (b_O[l].defined()) {
        const std::vector<double> bias = mul(dirs_l, b_O[l]).sum({1, 2}).to_vector<double>();
        for (size_t k = 0; k < 2; ++k) variants[k]->out_proj_bias[l] += bias[k];
      }
      // Head h's share is z_h . (W_O[h] dirs): dirs taken back through W_O once for all heads.
      const Tensor back = matmul(dirs_l.reshape({2 * N, -1}), W_O[l].mT()).reshape({2, N, -1});  // (2, N, H*D)
      const std::vector<double> heads = mul(back, z).reshape({2, N, H, -1}).sum({1, 3}).to_vector<double>();
      const auto Hs = static_cast<size_t>(H);
      for (size_t k = 0; k < 2; ++k)
        for (size_t h = 0; h < Hs; ++h) variants[k]->heads[l][h] += heads[k * Hs + h];
    }

    // The totals from the model's own final norm and unembedding, which the components must add up to: the
    // logits before a soft-cap (Gemma 2's), which the components are linear in.
    const Tensor logits_split =
        model.config().logit_softcap > 0
            ? model.unembed_uncapped(model.normalize_final(cached(HookPoint::resid_post, L - 1)))
            : out;
    const std::vector<double> logits = scored(logits_split).to_vector<double>();
    for (size_t n = 0; n < rows.size(); ++n) {
      const double* row = logits.data() + n * static_cast<size_t>(V);
      const double correct = row[ys[n]], mean = std::accumulate(row, row + V, 0.0) / static_cast<double>(V);
      r.vs_mean.total += correct - mean;
      r.logit.total += correct;
    }
  }
  for (DirectAttribution* a : variants) scale(*a, 1.0 / static_cast<double>(r.tokens));
  return r;
}

}  // namespace headlab::analysis
