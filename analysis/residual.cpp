// TransformerLens's residual-stream views over a run's cached hook points, the logit lens, and gradients at hook
// points through a taped run of the model's own forward.
#include "analysis/residual.h"

#include "analysis/files.h"
#include "analysis/hooked_run.h"
#include "autograd/engine.h"

namespace headlab::analysis {

namespace {

std::string block_hook(int64_t layer, const char* point) { return "blocks." + std::to_string(layer) + "." + point; }

// The activation at `name`, or an error naming the function and what it needs.
const Tensor& need(const Activations& cache, const std::string& name, const char* who) {
  const auto it = cache.find(name);
  HL_CHECK(it != cache.end() && it->second.defined(), who, ": the cache has no '", name,
           "' (run_with_cache keeps every hook point unless names= leaves it out)");
  return it->second;
}

// TransformerLens's layer: -1 (or L) the final stream, else 0..L.
int64_t layer_of(const nn::DecoderModel& model, int64_t layer, const char* who) {
  const int64_t L = model.n_layers();
  HL_CHECK(layer >= -1 && layer <= L, who, ": layer ", layer, " is outside -1..", L, " (", L, " layers)");
  return layer < 0 ? L : layer;
}

// Blocks with a hook_resid_mid: an MLP after the attention, in sequence.
bool has_resid_mid(const nn::DecoderModel& model) { return model.shape().has_mlp && !model.shape().parallel_residual; }

void check_mid(const nn::DecoderModel& model, const char* who, const char* what) {
  HL_CHECK(
      has_resid_mid(model), who, ": ", what, " needs blocks.L.hook_resid_mid, which ",
      model.shape().has_mlp ? "a parallel-residual block (its MLP reads the block's input)" : "an attention-only block",
      " has not");
}

// The stream as a sum of its parts: not where each block renorms it (post-LN: BERT).
void check_sum(const nn::DecoderModel& model, const char* who) {
  HL_CHECK(!model.shape().post_ln, who, ": ", model.type_name(),
           " norms the stream after every residual add (post-LN), so the stream is not the sum of the components "
           "written into it; not supported for post-LN models");
}

// x (B, T, ...) at position pos (B, ...), or x itself.
Tensor at_pos(const Tensor& x, std::optional<int64_t> pos, const char* who) {
  if (!pos) return x;
  const int64_t T = x.size(1), p = *pos < 0 ? T + *pos : *pos;
  HL_CHECK(p >= 0 && p < T, who, ": position ", *pos, " is outside the ", T, " tokens");
  return x.select(1, p);
}

// The stream entering `layer` (its MLP's with mlp_input), at o.pos.
Tensor stream_into(const nn::DecoderModel& model, const Activations& cache, int64_t layer, const StackOptions& o,
                   const char* who) {
  const int64_t L = model.n_layers();
  if (layer == L) {
    HL_CHECK(!o.mlp_input, who, ": mlp_input applies to a layer's MLP; layer ", L, " is the unembedding");
    return at_pos(need(cache, block_hook(L - 1, "hook_resid_post"), who), o.pos, who);
  }
  if (o.mlp_input) check_mid(model, who, "mlp_input");
  return at_pos(need(cache, block_hook(layer, o.mlp_input ? "hook_resid_mid" : "hook_resid_pre"), who), o.pos, who);
}

ResidualStack stacked(std::vector<Tensor> rows, std::vector<std::string> labels, const char* who) {
  HL_CHECK(!rows.empty(), who, ": nothing to stack (no component before this layer)");
  return {stack(rows, 0), std::move(labels)};
}

}  // namespace

// ---- from a run's activations ----

Tensor apply_ln_to_stack(const nn::DecoderModel& model, const Activations& cache, const Tensor& stack,
                         const StackOptions& o) {
  const char* who = "apply_ln_to_stack";
  const int64_t layer = layer_of(model, o.layer, who), L = model.n_layers();
  const Tensor stream = stream_into(model, cache, layer, o, who);  // (B, T, C) or (B, C)
  HL_CHECK(stack.defined() && stack.dim() == stream.dim() + 1 &&
               Shape(stack.shape().begin() + 1, stack.shape().end()) == stream.shape(),
           who, ": expected a stack (components, ...) of vectors shaped as the stream they join, ",
           shape_str(stream.shape()), " (a stack at one position needs that position), got ",
           stack.defined() ? shape_str(stack.shape()) : std::string("none"));
  const nn::Norm& norm = layer == L    ? model.ln_final()
                         : o.mlp_input ? *model.decoder_block(layer).ln2()
                                       : model.decoder_block(layer).ln1();
  const NoGradGuard no_grad;
  return nn::freeze(norm, stream.to(stack.dtype())).apply(stack);
}

ResidualStack accumulated_resid(nn::DecoderModel& model, const Activations& cache, const StackOptions& o) {
  const char* who = "accumulated_resid";
  const int64_t L = model.n_layers(), layer = layer_of(model, o.layer, who);
  if (o.incl_mid) check_mid(model, who, "incl_mid");
  HL_CHECK(!o.mlp_input || layer < L, who, ": mlp_input applies to a layer's MLP; layer ", L, " is the unembedding");
  if (o.mlp_input) check_mid(model, who, "mlp_input");
  std::vector<Tensor> rows;  // each (B, T, C) or (B, C)
  std::vector<std::string> labels;
  for (int64_t l = 0; l <= layer; ++l) {
    if (l == L) {
      rows.push_back(at_pos(need(cache, block_hook(L - 1, "hook_resid_post"), who), o.pos, who));
      labels.push_back("final_post");
      continue;
    }
    rows.push_back(at_pos(need(cache, block_hook(l, "hook_resid_pre"), who), o.pos, who));
    labels.push_back(std::to_string(l) + "_pre");
    if ((o.incl_mid && l < layer) || (o.mlp_input && l == layer)) {
      rows.push_back(at_pos(need(cache, block_hook(l, "hook_resid_mid"), who), o.pos, who));
      labels.push_back(std::to_string(l) + "_mid");
    }
  }
  ResidualStack r = stacked(std::move(rows), std::move(labels), who);
  if (o.apply_ln) {
    const NoGradGuard no_grad;
    // The logit lens reads every stream as the model reads its last one: its own scale.
    r.stack = layer == L ? model.ln_final().forward(r.stack) : apply_ln_to_stack(model, cache, r.stack, o);
  }
  return r;
}

ResidualStack decompose_resid(nn::DecoderModel& model, const Activations& cache, const StackOptions& o) {
  const char* who = "decompose_resid";
  check_sum(model, who);
  const int64_t L = model.n_layers(), layer = layer_of(model, o.layer, who);
  HL_CHECK(o.mode == "all" || o.mode == "attn" || o.mode == "mlp", who, ": mode is 'all', 'attn' or 'mlp', not '",
           o.mode, "'");
  HL_CHECK(!o.mlp_input || layer < L, who, ": mlp_input applies to a layer's MLP; layer ", L, " is the unembedding");
  if (o.mlp_input) check_mid(model, who, "mlp_input");
  const bool attn = o.mode != "mlp", mlp = o.mode != "attn" && model.shape().has_mlp;
  std::vector<Tensor> rows;
  std::vector<std::string> labels;
  const auto add_row = [&](const std::string& name, std::string label) {
    rows.push_back(at_pos(need(cache, name, who), o.pos, who));
    labels.push_back(std::move(label));
  };
  if (o.incl_embeds) {
    add_row("hook_embed", "embed");
    if (model.shape().learned_positions) add_row("hook_pos_embed", "pos_embed");
  }
  for (int64_t l = 0; l < layer; ++l) {
    if (attn) add_row(block_hook(l, "hook_attn_out"), std::to_string(l) + "_attn_out");
    if (mlp) add_row(block_hook(l, "hook_mlp_out"), std::to_string(l) + "_mlp_out");
  }
  if (o.mlp_input && attn) add_row(block_hook(layer, "hook_attn_out"), std::to_string(layer) + "_attn_out");
  ResidualStack r = stacked(std::move(rows), std::move(labels), who);
  if (o.apply_ln) r.stack = apply_ln_to_stack(model, cache, r.stack, o);
  return r;
}

ResidualStack stack_head_results(nn::DecoderModel& model, const Activations& cache, const StackOptions& o) {
  const char* who = "stack_head_results";
  check_sum(model, who);
  const int64_t layer = layer_of(model, o.layer, who);
  std::vector<Tensor> heads;  // each (H, B, T, C) or (H, B, C)
  std::vector<std::string> labels;
  for (int64_t l = 0; l < layer; ++l) {
    const Tensor r = at_pos(need(cache, block_hook(l, "attn.hook_result"), who), o.pos, who);  // (B, [T,] H, C)
    heads.push_back(r.dim() == 4 ? r.permute({2, 0, 1, 3}) : r.permute({1, 0, 2}));
    for (int64_t h = 0; h < r.size(-2); ++h) labels.push_back(head_name(model, l, h));
  }
  const Tensor stream = stream_into(model, cache, layer, StackOptions{.pos = o.pos}, who);  // (B, [T,] C)
  Shape none = stream.shape();
  none.insert(none.begin(), 0);
  ResidualStack s{heads.empty() ? zeros(none, stream.dtype(), stream.device()) : cat(heads, 0), std::move(labels)};
  if (o.incl_remainder) {
    s.stack = cat({s.stack, sub(stream, s.stack.sum({0})).unsqueeze(0)}, 0);
    s.labels.push_back("remainder");
  }
  if (o.apply_ln) s.stack = apply_ln_to_stack(model, cache, s.stack, StackOptions{.layer = layer, .pos = o.pos});
  return s;
}

// ---- from tokens ----

std::set<std::string> residual_hooks(const nn::DecoderModel& model, ResidualView view) {
  std::set<std::string> names;
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    names.insert(block_hook(l, "hook_resid_pre"));
    if (has_resid_mid(model)) names.insert(block_hook(l, "hook_resid_mid"));
    if (view == ResidualView::decomposed) {
      names.insert(block_hook(l, "hook_attn_out"));
      if (model.shape().has_mlp) names.insert(block_hook(l, "hook_mlp_out"));
    }
    if (view == ResidualView::head_results) names.insert(block_hook(l, "attn.hook_result"));
  }
  names.insert(block_hook(model.n_layers() - 1, "hook_resid_post"));
  if (view == ResidualView::decomposed) {
    names.insert("hook_embed");
    if (model.shape().learned_positions) names.insert("hook_pos_embed");
  }
  return names;
}

ResidualStack accumulated_resid(nn::DecoderModel& model, const Tensor& tokens, const StackOptions& o) {
  return accumulated_resid(model, run_hooked(model, tokens, residual_hooks(model, ResidualView::accumulated)).cache, o);
}

ResidualStack decompose_resid(nn::DecoderModel& model, const Tensor& tokens, const StackOptions& o) {
  return decompose_resid(model, run_hooked(model, tokens, residual_hooks(model, ResidualView::decomposed)).cache, o);
}

ResidualStack stack_head_results(nn::DecoderModel& model, const Tensor& tokens, const StackOptions& o) {
  return stack_head_results(model, run_hooked(model, tokens, residual_hooks(model, ResidualView::head_results)).cache,
                            o);
}

LogitLens logit_lens(nn::DecoderModel& model, const std::vector<int64_t>& ids) {
  const auto T = static_cast<int64_t>(ids.size());
  HL_CHECK(T >= 2, "logit_lens: needs at least 2 tokens (a position and the token after it), got ", T);
  HL_CHECK(model.shape().causal, "logit_lens: reads each position's prediction of the next token; ", model.type_name(),
           " is bidirectional (an encoder), whose positions predict themselves");
  const Tensor tokens = tensor(ids, {1, T}).to(model.device());
  const ResidualStack acc = accumulated_resid(model, tokens);  // (R, 1, T, C)
  const NoGradGuard no_grad;
  const int64_t V = model.shape().out_vocab_size;
  const Tensor next = tensor(std::vector<int64_t>(ids.begin() + 1, ids.end()), {T - 1, 1}).to(model.device());
  // (T-1, V) one-hot; a row of zeros where the next token is one the model does not predict (an input-only
  // token: out_vocab_size < vocab_size), which then gets probability 0 and rank V: below every token it predicts.
  const Tensor is_next = eq(arange(V, DType::i64, model.device()).unsqueeze(0), next);
  LogitLens lens{acc.labels, T, {}, {}};
  for (int64_t r = 0; r < acc.stack.size(0); ++r) {
    // The row's readout at every position but the last, (T-1, V): one selection from one tensor, so that the
    // next token's own value never counts as above itself.
    const Tensor logp = log_softmax(model.unembed(acc.stack.select(0, r)).select(0, 0).narrow(0, 0, T - 1), -1);
    const Tensor target = where(is_next, logp, zeros_like(logp)).sum({-1}, true);  // (T-1, 1)
    const Tensor above = gt(logp, target).to(DType::f64).sum({-1});                // (T-1)
    const std::vector<double> prob = exp(target).to(DType::f64).to_vector<double>(), rank = above.to_vector<double>();
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      const bool predicted = ids[t + 1] < V;
      lens.prob.push_back(predicted ? prob[t] : 0.0);
      lens.rank.push_back(predicted ? rank[t] : static_cast<double>(V));
    }
  }
  return lens;
}

// ---- gradients ----

HookedBackward run_hooked_backward(nn::DecoderModel& model, const Tensor& tokens, const std::set<std::string>& cache,
                                   const std::set<std::string>& gradients,
                                   const std::function<Tensor(const Tensor& logits)>& dlogits) {
  const char* who = "run_with_cache(backward=...)";
  HL_CHECK(dlogits != nullptr, who, ": no metric (d metric / d logits) was given");
  // A zero leaf added at each point: its gradient is the activation's, and the forward goes on unchanged.
  std::map<std::string, Tensor> leaves;
  std::map<std::string, Hook> hooks;
  for (const std::string& name : gradients)
    hooks[name] = [&leaves](const std::string& n, const Tensor& x) {
      Tensor leaf = zeros(x.shape(), x.dtype(), x.device());
      leaf.requires_grad_(true);
      leaves[n] = leaf;
      return add(x, leaf);
    };
  HookedRun run = run_hooked(model, tokens, cache, hooks, /*tape=*/true);
  HookedBackward out;
  out.logits = run.logits.detach();
  for (auto& [name, x] : run.cache) out.cache[name] = x.detach();
  const Tensor d = dlogits(out.logits);
  HL_CHECK(d.defined() && d.shape() == out.logits.shape(), who, ": d metric / d logits must have the logits' shape ",
           shape_str(out.logits.shape()), ", got ", d.defined() ? shape_str(d.shape()) : std::string("none"));
  std::vector<std::string> names;
  std::vector<Tensor> inputs;
  for (const auto& [name, leaf] : leaves) names.push_back(name), inputs.push_back(leaf);
  if (inputs.empty()) return out;
  const std::vector<Tensor> g = grad({run.logits}, inputs, {d.to(out.logits.device()).to(out.logits.dtype())});
  for (size_t i = 0; i < names.size(); ++i) out.gradients[names[i]] = g[i];
  return out;
}

}  // namespace headlab::analysis
