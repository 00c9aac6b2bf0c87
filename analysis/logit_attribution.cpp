// Direct logit attribution. The model runs block by block here (embeddings, then per block the
// attention with its head contexts kept, then the feed-forward) so that every component of the final
// residual stream is at hand; only the scored rows are kept, in double on the CPU, and projected on
// the frozen-scale unembedding directions once x_L (hence sigma) is known.
#include "analysis/logit_attribution.h"

#include <array>
#include <numeric>

#include "analysis/head_control.h"

namespace headlab::analysis {

namespace {

constexpr const char* kWho = "logit_attribution";

// The output projection of any attention form: weight (C, H*D), head h's columns [h*D, (h+1)*D).
const nn::Linear& out_proj_of(nn::CausalMultiHead& att, int64_t layer) {
  const nn::Linear* proj = att.output_projection();
  HL_CHECK(proj, kWho, ": the attention of layer ", layer, " (", att.type_name(), ") has no out_proj");
  return *proj;
}

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

LogitAttribution logit_attribution(nn::GPTModel& model, const EvalSet& data) {
  LogitAttribution r;
  r.tokens = data.tokens();
  HL_CHECK(r.tokens > 0, kWho, ": the evaluation data has no scored tokens");
  detail::ControlGuard guard(model);
  model.eval();  // no dropout: x_L is exactly the sum of the components
  detail::set_controls(model, {}, {});
  const int64_t L = model.n_layers(), V = model.config().vocab_size, T_max = model.config().context_length;
  const auto Ls = static_cast<size_t>(L);
  for (int64_t l = 0; l < L; ++l) model.attention(l).control().keep_context = true;
  NoGradGuard no_grad;
  const Device dev = model.device();

  const std::array<DirectAttribution*, 2> variants{&r.vs_mean, &r.logit};  // [0]: minus the mean row
  for (DirectAttribution* a : variants) {
    a->heads = head_matrix(model, 0.0);
    a->out_proj_bias.assign(Ls, 0.0);
    a->feed_forward.assign(Ls, 0.0);
  }
  const Tensor W_U = f64_cpu(model.out_head->weight);  // (V, C)
  const Tensor W_U_mean = W_U.mean({0});               // (C): its row gives the mean logit
  const Tensor gamma = f64_cpu(model.final_norm->weight), shift = f64_cpu(model.final_norm->bias);  // (C)
  std::vector<Tensor> W_O(Ls), b_O(Ls);                                                             // (C, H*D), (C)
  for (int64_t l = 0; l < L; ++l) {
    const nn::Linear& proj = out_proj_of(model.attention(l), l);
    W_O[static_cast<size_t>(l)] = f64_cpu(proj.weight);
    b_O[static_cast<size_t>(l)] = f64_cpu(proj.bias);
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

    const Tensor idx = train::batch_tensors(b, dev).first;  // (B, T)
    Tensor x = model.embed(idx);  // (B, T, C); drop_emb and drop_shortcut are identities in eval mode
    const Tensor emb = scored(x);
    std::vector<Tensor> ctx(Ls), ff(Ls);  // (N, H*D) heads concatenated as out_proj reads them, (N, C)
    for (int64_t l = 0; l < L; ++l) {
      const auto block = model.block(l);
      const Tensor h = add(x, block->att->forward(block->norm1->forward(x)));
      const Tensor ff_out = block->ff ? block->ff->forward(block->norm2->forward(h)) : zeros_like(h);
      x = add(h, ff_out);
      ff[static_cast<size_t>(l)] = scored(ff_out);
      if (block->att->head_count() > 0)  // context (B, H, T, D) -> (B, T, H*D)
        ctx[static_cast<size_t>(l)] = scored(block->att->control().context.permute({0, 2, 1, 3}));
    }

    // Frozen scale: comp . dirs[k, n] is comp's share of variant k at token n, with
    // dirs = centre_C(gamma * row) / sigma (centring the direction = centring the component).
    const Tensor x_L = scored(x);                                                   // (N, C)
    const Tensor sigma = sqrt(add(var(x_L, {1}, true, 0), model.final_norm->eps));  // (N, 1)
    const Tensor W_y = index_select(W_U, 0, tensor(ys, {N}));                       // (N, C)
    const Tensor unembed = stack({sub(W_y, W_U_mean), W_y}, 0);                     // (2, N, C)
    const Tensor g = mul(unembed, gamma);
    const Tensor dirs = div(sub(g, g.mean({2}, true)), sigma.unsqueeze(0));  // (2, N, C)
    // comp: (N, C), or (C) for one shared by every token -> its summed share of both variants
    const auto share = [&](const Tensor& comp) { return mul(dirs, comp).sum({1, 2}).to_vector<double>(); };
    const auto add_both = [&](double DirectAttribution::*field, const std::vector<double>& v) {
      for (size_t k = 0; k < 2; ++k) variants[k]->*field += v[k];
    };
    add_both(&DirectAttribution::embeddings, share(emb));
    add_both(&DirectAttribution::final_shift, mul(unembed, shift).sum({1, 2}).to_vector<double>());
    for (size_t l = 0; l < Ls; ++l) {
      const std::vector<double> bias = share(b_O[l]), ffw = share(ff[l]);
      for (size_t k = 0; k < 2; ++k) {
        variants[k]->out_proj_bias[l] += bias[k];
        variants[k]->feed_forward[l] += ffw[k];
      }
      const int64_t H = model.attention(static_cast<int64_t>(l)).head_count();
      if (H == 0) continue;
      // Head h's share is c_h . (W_O[:, h] ^T dirs): dirs taken back through out_proj once for all heads.
      const Tensor back = matmul(dirs.reshape({2 * N, -1}), W_O[l]).reshape({2, N, -1});  // (2, N, H*D)
      const std::vector<double> heads = mul(back, ctx[l]).reshape({2, N, H, -1}).sum({1, 3}).to_vector<double>();
      const auto Hs = static_cast<size_t>(H);
      for (size_t k = 0; k < 2; ++k)
        for (size_t h = 0; h < Hs; ++h) variants[k]->heads[l][h] += heads[k * Hs + h];
    }

    // The totals from the model's own final_norm and out_head, which the components must add up to.
    const Tensor out = model.unembed(x);  // (B, T, V)
    const std::vector<double> logits = scored(out).to_vector<double>();
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
