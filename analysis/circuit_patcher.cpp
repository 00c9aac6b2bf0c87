// The patched forward over stored clean and corrupted runs (analysis/circuit.h). The model's own forward
// runs (nn/decoder.h); the patch is what its hook points do: each receiver group that is patched (or
// probed) takes its own input, the stream minus the patched senders' clean - corrupted outputs, through
// the per-head inputs (hook_q/k/v_input) or hook_mlp_in; each node's output is taken at hook_result /
// hook_mlp_out, kept against its corrupted output for the groups after it, and set where a copy replaces it.
// The patcher's state (its chunks of stored runs, their budgets, the public calls): circuit_runs.cpp.
#include <algorithm>

#include "analysis/circuit_internal.h"

namespace headlab::analysis {

namespace {

using Impl = CircuitPatcher::Impl;
using nn::HookPoint;
constexpr Replace::Value kValues[] = {Replace::Value::clean, Replace::Value::corrupt, Replace::Value::zero,
                                      Replace::Value::mean};

// One forward of K copies of a chunk's rows: the hooks that give each patched group its input and take
// each node's output. Streams are (K*B, T, C), copy k's rows [k*B, (k+1)*B).
class PatchedRun : public nn::Hooks {
 public:
  PatchedRun(Impl& s, const Chunk& c, const Impl::Pass& p, Impl::Recorded* rec)
      : s_(s), c_(c), p_(p), rec_(rec), K(p.copies), B(c.B), T(c.T), C(s.C), P(c.B * c.T * s.C) {
    N0 = p.first_layer == 0 ? 1 : s.graph.first_node_of_layer(p.first_layer);  // nodes before N0: the clean run's
    patched = std::any_of(p.patches.begin(), p.patches.end(), [](const Tensor& t) { return t.defined(); });
  }

  bool wants(nn::HookKey key) const override {
    switch (key.point) {
      case HookPoint::q_input:
      case HookPoint::k_input:
      case HookPoint::v_input:
        return reads_own_input(s_.attention_group[static_cast<size_t>(key.layer)], true);
      case HookPoint::mlp_in:
        return reads_own_input(s_.mlp_group[static_cast<size_t>(key.layer)], false);
      case HookPoint::resid_pre:
      case HookPoint::q:
      case HookPoint::k:
      case HookPoint::v:
        return probes_projections(key.layer);
      case HookPoint::result:
        return patched || rec_ || sets_a_node(first_head(key.layer), first_head(key.layer) + heads(key.layer));
      case HookPoint::mlp_out:
        return patched || rec_ || !p_.replaced.empty();
      case HookPoint::resid_post:
        return rec_ != nullptr;
      default:
        return false;
    }
  }

  Tensor at(nn::HookKey key, const Tensor& x) override {
    switch (key.point) {
      case HookPoint::q_input: {  // the stream per head (KB, T, H, C): the layer's q, k and v inputs at once
        H_ = x.size(2), Hkv_ = s_.model.attention(key.layer).kv_head_count();
        qkv_ = inputs_of(s_.attention_group[static_cast<size_t>(key.layer)], x.select(2, 0).reshape({K, P}),
                         H_ + 2 * Hkv_, false)
                   .view({H_ + 2 * Hkv_, K * B, T, C});
        return qkv_.narrow(0, 0, H_).permute({1, 2, 0, 3});
      }
      case HookPoint::k_input:
        return qkv_.narrow(0, H_, Hkv_).permute({1, 2, 0, 3});
      case HookPoint::v_input:
        return qkv_.narrow(0, H_ + Hkv_, Hkv_).permute({1, 2, 0, 3});
      case HookPoint::mlp_in:
        return inputs_of(s_.mlp_group[static_cast<size_t>(key.layer)], x.reshape({K, P}), 1, false).view({K * B, T, C});
      case HookPoint::result:
        return head_outputs(key.layer, x);
      case HookPoint::mlp_out:
        return mlp_output(key.layer, x);
      case HookPoint::resid_post:
        rec_->resid.push_back(x);
        return x;
      case HookPoint::resid_pre:
        probe_of(key.layer).stream = x;
        return x;
      case HookPoint::q:
      case HookPoint::k:
      case HookPoint::v: {
        Impl::Probe& probe = probe_of(key.layer);
        Tensor& leaf = key.point == HookPoint::q ? probe.q : key.point == HookPoint::k ? probe.k : probe.v;
        leaf = zeros(x.shape(), x.dtype(), x.device());
        leaf.requires_grad_(true);
        return add(x, leaf);
      }
      default:
        return x;
    }
  }

  // The stream entering the first layer the pass runs, (K*B, T, C).
  Tensor start() {
    if (p_.record) {
      const Tensor embedded = s_.model.embed(p_.tokens);  // (B, T, C): the embeddings node's output
      if (rec_) rec_->outputs.select(0, 0).copy_(embedded.reshape({P}));
      return embedded;
    }
    const Tensor from = p_.start.defined() ? p_.start : c_.clean_resid[static_cast<size_t>(p_.first_layer)];
    Tensor resid = from.unsqueeze(0).expand({K, B, T, C});
    if (p_.first_layer == 0 && !p_.replaced.empty()) resid = with_embeddings_set(resid);
    return resid.reshape({K * B, T, C});
  }

  // Group g's inputs: the stream (K, width) minus the patch, plus a probe leaf; (R, K, width), or undefined
  // (the stream itself) when nothing is patched there and nothing probed. width: P, or B*C at the last
  // position (last).
  Tensor inputs_of(int64_t g, const Tensor& stream, int64_t R, bool last) const {
    const Tensor patch = patch_of(static_cast<size_t>(g), last);
    if (!patch.defined() && !p_.probes) return Tensor();
    const int64_t width = stream.size(1);
    Tensor x = patch.defined() ? sub(stream.unsqueeze(0), patch) : stream.unsqueeze(0).expand({R, K, width});
    if (p_.probes) {
      Tensor& probe = (*p_.probes)[static_cast<size_t>(g)].input;
      probe = zeros({R, K, width}, stream.dtype(), stream.device());
      probe.requires_grad_(true);
      x = add(x, probe);
    }
    return x;
  }

 private:
  int64_t heads(int64_t layer) const { return s_.model.attention(layer).head_count(); }
  int64_t first_head(int64_t layer) const { return s_.graph.first_node_of_layer(layer); }
  // An attention group reads per-receiver inputs only where patched: probes go on its projections.
  bool reads_own_input(int64_t g, bool attention) const {
    return g >= 0 && ((p_.probes != nullptr && !attention) ||
                      (static_cast<size_t>(g) < p_.patches.size() && p_.patches[static_cast<size_t>(g)].defined()));
  }
  bool probes_projections(int64_t layer) const {
    return p_.probes != nullptr && s_.attention_group[static_cast<size_t>(layer)] >= 0;
  }
  Impl::Probe& probe_of(int64_t layer) const {
    return (*p_.probes)[static_cast<size_t>(s_.attention_group[static_cast<size_t>(layer)])];
  }
  bool sets_a_node(int64_t first, int64_t end) const {
    return std::any_of(p_.replaced.begin(), p_.replaced.end(),
                       [&](const Replace& r) { return r.node >= first && r.node < end; });
  }

  // The patch of group g's receivers, (R, K, width): the stored senders' deltas (nodes before N0) and
  // this pass's own (nodes from N0), weighted by each copy's patch fractions.
  Tensor patch_of(size_t g, bool last) const {
    if (g >= p_.patches.size() || !p_.patches[g].defined()) return Tensor();
    const Tensor& M = p_.patches[g];  // (K, R, S)
    const int64_t S = M.size(2), S0 = std::min(S, N0);
    const Tensor& stored = last ? c_.delta_last : c_.delta;
    Tensor out = matmul(M.narrow(2, 0, S0).permute({1, 0, 2}), stored.narrow(0, 0, S0));  // (R, K, S0) @ (S0, width)
    if (S > N0) {
      std::vector<Tensor> own;
      for (int64_t j = 0; j < S - N0; ++j) {
        const Tensor& d = own_delta_[static_cast<size_t>(j)];
        own.push_back(last ? d.reshape({K, B, T, C}).select(2, T - 1).reshape({K, B * C}) : d);
      }
      const Tensor mine = matmul(M.narrow(2, N0, S - N0), stack(own, 1));  // (K, R, n) @ (K, n, width)
      out = add(out, mine.permute({1, 0, 2}));
    }
    return out;
  }

  // Where each copy sets `node` to `with`, (K, 1, T, 1) of 0/1; undefined when no copy does.
  Tensor replaced_at(int64_t node, Replace::Value with, const Tensor& like) const {
    std::vector<double> m(static_cast<size_t>(K * T), 0.0);
    bool any = false;
    for (size_t k = 0; k < p_.replaced.size(); ++k)
      if (p_.replaced[k].node == node && p_.replaced[k].with == with)
        for (int64_t t = 0; t < T; ++t)
          if (p_.replaced[k].position < 0 || p_.replaced[k].position == t) m[k * T + t] = 1.0, any = true;
    return any ? tensor(m, {K, 1, T, 1}).to(like.dtype()).to(like.device()) : Tensor();
  }
  // Node `node`'s value `with`, (1, B, T, C) or (1, 1, T, C) for the mean; undefined for zero.
  Tensor value_of(int64_t node, Replace::Value with) const {
    const Tensor corrupt = c_.corrupt_out.select(0, node).reshape({1, B, T, C});
    switch (with) {
      case Replace::Value::clean:
        return add(corrupt, c_.delta.select(0, node).reshape({1, B, T, C}));
      case Replace::Value::corrupt:
        return corrupt;
      case Replace::Value::mean:
        return s_.mean_out.select(0, node).reshape({1, 1, T, C});
      case Replace::Value::zero:
        break;
    }
    return Tensor();
  }
  // out (K, P) of node `node` with the copies that set it given their value there instead.
  Tensor replace(const Tensor& out, int64_t node) const {
    Tensor o = out.reshape({K, B, T, C});
    for (Replace::Value with : kValues) {
      const Tensor m = replaced_at(node, with, o);
      if (!m.defined()) continue;
      const Tensor v = value_of(node, with);
      o = v.defined() ? add(o, mul(m, sub(v, o))) : sub(o, mul(m, o));
    }
    return o.reshape({K, P});
  }
  // The embeddings set at some positions. Clean: the corrupted ones elsewhere (copies setting them
  // everywhere subtract zeros); another value: the clean ones elsewhere (the stream starts clean).
  Tensor with_embeddings_set(Tensor resid) const {  // resid (K, B, T, C)
    const Tensor m = replaced_at(0, Replace::Value::clean, resid);
    if (m.defined()) {
      std::vector<double> restoring(static_cast<size_t>(K), 0.0);
      for (size_t k = 0; k < p_.replaced.size(); ++k)
        restoring[k] = p_.replaced[k].node == 0 && p_.replaced[k].with == Replace::Value::clean ? 1.0 : 0.0;
      const Tensor r = tensor(restoring, {K, 1, 1, 1}).to(resid.dtype()).to(resid.device());
      resid = sub(resid, mul(sub(r, m), c_.delta.select(0, 0).reshape({1, B, T, C})));
    }
    const Tensor clean_embed = value_of(0, Replace::Value::clean);
    for (Replace::Value with : kValues) {
      const Tensor mw = with == Replace::Value::clean ? Tensor() : replaced_at(0, with, resid);
      if (!mw.defined()) continue;
      const Tensor v = value_of(0, with);
      resid = add(resid, mul(mw, v.defined() ? sub(v, clean_embed) : neg(clean_embed)));
    }
    return resid;
  }

  // Node `node`'s output (K, P), kept against its corrupted output for later groups.
  void emit(const Tensor& out, int64_t node) {
    if (!patched) return;
    HL_CHECK(node == N0 + static_cast<int64_t>(own_delta_.size()), "circuit: node ", node, " came out of order");
    own_delta_.push_back(sub(out, c_.corrupt_out.select(0, node).unsqueeze(0)));
  }
  // The layer's heads' outputs r (K*B, T, H, C), laid out head-major: emitted, replaced where a copy sets one.
  Tensor head_outputs(int64_t layer, const Tensor& r) {
    const int64_t H = r.size(2), first = first_head(layer);
    Tensor out;
    if (rec_) {  // straight into the recording, whose rows [first, first + H) are the layer's heads
      out = rec_->outputs.narrow(0, first, H).view({H, K, P});
      out.view({H, K * B, T, C}).copy_(r.permute({2, 0, 1, 3}));
    } else {
      out = r.permute({2, 0, 1, 3}).reshape({H, K, P});
    }
    if (sets_a_node(first, first + H)) {  // only then are the heads taken apart and stacked again
      std::vector<Tensor> each;
      for (int64_t h = 0; h < H; ++h) each.push_back(replace(out.select(0, h), first + h));
      out = stack(each, 0);
    }
    for (int64_t h = 0; h < H; ++h) emit(out.select(0, h), first + h);
    return out.view({H, K * B, T, C}).permute({1, 2, 0, 3});
  }
  Tensor mlp_output(int64_t layer, const Tensor& x) {  // x (K*B, T, C)
    const int64_t node = first_head(layer) + heads(layer);
    Tensor out = x.reshape({K, P});
    if (!p_.replaced.empty()) out = replace(out, node);
    if (rec_) rec_->outputs.select(0, node).copy_(out.reshape({P}));
    emit(out, node);
    return out.view({K * B, T, C});
  }

  Impl& s_;
  const Chunk& c_;
  const Impl::Pass& p_;
  Impl::Recorded* rec_;
  const int64_t K, B, T, C, P;
  int64_t N0 = 1;
  bool patched = false;
  std::vector<Tensor> own_delta_;  // nodes N0..: out - corrupt_out, (K, P)
  Tensor qkv_;                     // the current layer's q, k and v inputs (H + 2 Hkv, K*B, T, C)
  int64_t H_ = 0, Hkv_ = 0;        // the current layer's query and key/value heads
};

}  // namespace

// ---- the patched forward ----
Impl::Pass Impl::pass_for(const std::vector<const EdgePatch*>& copies) const {
  Pass p;
  p.copies = static_cast<int64_t>(copies.size());
  p.first_layer = graph.n_layers();
  const DType dt = detail::model_dtype(model);
  for (const CircuitGraph::Group& g : graph.groups()) {
    const int64_t e0 = graph.receivers()[static_cast<size_t>(g.first)].first_edge, n = g.count * g.senders;
    std::vector<double> m(static_cast<size_t>(p.copies * n), 0.0);
    bool any = false;
    for (size_t k = 0; k < copies.size(); ++k)
      for (int64_t i = 0; i < n; ++i) {
        const double v = (*copies[k])[static_cast<size_t>(e0 + i)];
        m[k * static_cast<size_t>(n) + static_cast<size_t>(i)] = v;
        any = any || v != 0;
      }
    p.patches.push_back(any ? tensor(m, {p.copies, g.count, g.senders}).to(dt).to(model.device()) : Tensor());
    if (any) p.first_layer = std::min(p.first_layer, g.layer);
  }
  return p;
}

Tensor Impl::forward(const Chunk& c, const Pass& p, Recorded* rec) {
  const int64_t K = p.copies, B = c.B, T = c.T;
  HL_CHECK(!p.probes || (p.probes->size() == graph.groups().size() && K == 1 &&
                         std::none_of(p.patches.begin(), p.patches.end(), [](const Tensor& t) { return t.defined(); })),
           "circuit: probes take one slot per group, one copy and no patches");
  PatchedRun run(*this, c, p, rec);
  const Tensor resid = model.run_blocks(run.start(), p.first_layer, graph.n_layers(), &run);  // (K*B, T, C)
  // The logits: at the last position only, along each row's answer - wrong direction.
  const Tensor last = resid.select(1, T - 1).reshape({K, B * C});
  const Tensor X = run.inputs_of(static_cast<int64_t>(graph.groups().size()) - 1, last, 1, true);
  const Tensor y = model.normalize_final((X.defined() ? X.select(0, 0) : last).reshape({K, B, C}));
  if (c.candidates.defined()) {  // sum_m weights[b, m] * p(candidates[m]): every logit, then the softmax
    const Tensor logits = model.unembed_normalized(y);  // (K, B, V)
    return mul(index_select(softmax(logits, 2), 2, c.candidates), c.weights).sum({2});
  }
  return add(mul(y, c.direction).sum({2}), c.bias_diff);  // (K, B)
}

Tensor Impl::receiver_gradients(size_t g, const Probe& probe, const std::vector<Tensor>& leaf_grads) const {
  if (probe.input.defined()) return leaf_grads.at(0).select(1, 0);  // (R, width) of copy 0
  const int64_t layer = graph.groups()[g].layer;
  const Tensor &dq = leaf_grads.at(0), &dk = leaf_grads.at(1), &dv = leaf_grads.at(2);  // (B, T, heads, D)
  const int64_t H = dq.size(2), D = dq.size(3), rows = dq.size(0) * dq.size(1);
  const nn::HeadWeights w = model.attention(layer).head_weights();  // (H, C, D); keys' and values' repeated per head
  // Each head's gradient at the norm's output: its own (rows, D) through its projection's rows, (D, C).
  const auto through = [&](const Tensor& d, const Tensor& W) {
    const int64_t heads = d.size(2);
    const Tensor own = W.reshape({heads, H / heads, C, D}).select(1, 0);         // a key/value group's first head's
    return matmul(d.permute({2, 0, 1, 3}).reshape({heads, rows, D}), own.mT());  // (heads, rows, C)
  };
  const Tensor dy = cat({through(dq, w.W_Q), through(dk, w.W_K), through(dv, w.W_V)}, 0);  // (R, rows, C)
  // Then back through the layer's norm at the stream, once per receiver: every receiver reads the same stream,
  // so the norm runs forward once and only its backward R times (not R copies of the stream, each normalised).
  const int64_t R = dy.size(0);
  Tensor x = probe.stream.detach().reshape({rows, C});
  x.requires_grad_(true);
  const Tensor y = model.decoder_block(layer).ln1().forward(x);
  std::vector<Tensor> dx;
  dx.reserve(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) dx.push_back(grad({y}, {x}, {dy.select(0, r)}, r + 1 < R).front());
  return stack(dx, 0).reshape({R, rows * C});
}

}  // namespace headlab::analysis
