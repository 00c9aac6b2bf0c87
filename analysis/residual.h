// The residual stream as TransformerLens's ActivationCache shows it, computed from one run's cached hook points
// (analysis/hooked_run.h): the streams entering each layer (accumulated_resid), the outputs that sum to the
// stream (decompose_resid), every head's share of it (stack_head_results), a stack through a norm frozen at the
// stream that norm reads (apply_ln_to_stack), the logit lens, and the gradients of a metric of the logits at hook
// points (TransformerLens's backward hooks, for attribution patching). The same functions serve Python's cache
// and the command line. S = stacked vectors, B = batch, T = tokens, C = d_model, V = vocabulary, L = layers.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nn/decoder.h"

namespace headlab::analysis {

// One run's activations by hook name (HookedRun::cache; Python's cache).
using Activations = std::map<std::string, Tensor>;

// A stack of residual-stream vectors with TransformerLens's labels (its return_labels).
struct ResidualStack {
  Tensor stack;                     // (S, B, T, C); (S, B, C) at one position
  std::vector<std::string> labels;  // S of them: "0_pre", "final_post"; "embed", "0_attn_out"; "L0H1"
};

// TransformerLens's arguments of the functions below; each reads the ones it names.
struct StackOptions {
  // The stream entering this layer (its attention's input; its MLP's with mlp_input) is what is stacked up to
  // and what apply_ln normalises at; -1 or L: the final stream, which ln_final reads.
  int64_t layer = -1;
  bool apply_ln = false;        // through the norm of that stream (accumulated_resid: see there)
  std::optional<int64_t> pos;   // one position (negative: from the end), its T dimension dropped; none: every one
  bool mlp_input = false;       // the stream entering the layer's MLP: its resid_mid (sequential blocks with an MLP)
  bool incl_mid = false;        // accumulated_resid: each earlier layer's resid_mid too
  bool incl_embeds = true;      // decompose_resid: hook_embed and hook_pos_embed first
  std::string mode = "all";     // decompose_resid: "all", "attn" (attention outputs only) or "mlp"
  bool incl_remainder = false;  // stack_head_results: the stream less every head's result, as a last "remainder"
};

// ---- from a run's activations (each needs the hook points it reads; residual_hooks lists them) ----

// The stream entering each layer, then the final one: blocks.l.hook_resid_pre for l < layer (labels "l_pre", with
// "l_mid" rows where incl_mid / mlp_input), and blocks.(L-1).hook_resid_post ("final_post") when layer is L.
// apply_ln with layer L (the logit lens): every row through ln_final as the model applies it to its own last
// stream, with the row's own scale, weight and bias (TransformerLens's recompute); for another layer: that
// layer's norm frozen at the stream it reads (apply_ln_to_stack).
ResidualStack accumulated_resid(nn::DecoderModel& model, const Activations& cache, const StackOptions& o = {});

// The outputs that sum to the stream entering `layer`: "embed", "pos_embed" (learned positions only), then each
// earlier layer's "l_attn_out" and "l_mlp_out" (none in attention-only blocks); in a parallel-residual
// (GPT-NeoX) block both read the block's input, and the sum is the same. With mlp_input, the layer's own
// attn_out last. In eval mode (no dropout) the rows sum to that stream exactly.
ResidualStack decompose_resid(nn::DecoderModel& model, const Activations& cache, const StackOptions& o = {});

// Every head's blocks.l.attn.hook_result (out_proj's bias excluded) for l < layer, labelled "L0H0", ... (original
// head indices after pruning); with incl_remainder, the stream less their sum last.
ResidualStack stack_head_results(nn::DecoderModel& model, const Activations& cache, const StackOptions& o = {});

// stack (S, B, T, C), or (S, B, C) with o.pos, as it reaches the output of the norm that reads the stream
// entering o.layer (ln_final for L; ln1, or ln2 with mlp_input), the norm's scale frozen at that stream's
// (TransformerLens's apply_ln_to_stack): each vector centred (LayerNorm), times that stream's 1 / scale, times
// the norm's weight. Headlab keeps norms unfolded, so the weight is applied here (TransformerLens folds it into
// W_U), and not the bias, which no component contributes: a stack of head results at layer L, times W_U, is
// each head's direct logit attribution.
Tensor apply_ln_to_stack(const nn::DecoderModel& model, const Activations& cache, const Tensor& stack,
                         const StackOptions& o = {});

// ---- from tokens: one run keeping only what the function reads ----

enum class ResidualView { accumulated, decomposed, head_results };
// The hook points a view reads: the streams (resid_pre, resid_mid, resid_post), and for decomposed the
// embeddings, attn_out and mlp_out, for head_results every attn.hook_result.
std::set<std::string> residual_hooks(const nn::DecoderModel& model, ResidualView view);

// tokens: (B, T) int64.
ResidualStack accumulated_resid(nn::DecoderModel& model, const Tensor& tokens, const StackOptions& o = {});
ResidualStack decompose_resid(nn::DecoderModel& model, const Tensor& tokens, const StackOptions& o = {});
ResidualStack stack_head_results(nn::DecoderModel& model, const Tensor& tokens, const StackOptions& o = {});

// The logit lens (nostalgebraist's) on one prompt: each row of accumulated_resid (the stream entering every
// layer, then the final one) read out as the model reads its last stream, through ln_final with the row's own
// scale and the unembedding; at each position t, how likely that readout finds the prompt's next token ids[t+1].
// The "final_post" row is the model's own prediction.
struct LogitLens {
  std::vector<std::string> rows;  // accumulated_resid's labels: "0_pre", "1_pre", ..., "final_post"
  int64_t T = 0;                  // the prompt's tokens; positions 0 .. T-2 have a next token
  // rows.size() x (T - 1), row-major: [r * (T - 1) + t] for row r at position t.
  // Where ids[t + 1] is a token the model does not predict (out_vocab_size < vocab_size): 0 and out_vocab_size.
  std::vector<double> prob;  // softmax probability of ids[t + 1]
  std::vector<double> rank;  // how many tokens get a higher logit than ids[t + 1] (0: it is the top token)
  double prob_at(size_t r, int64_t t) const { return prob[r * static_cast<size_t>(T - 1) + static_cast<size_t>(t)]; }
  double rank_at(size_t r, int64_t t) const { return rank[r * static_cast<size_t>(T - 1) + static_cast<size_t>(t)]; }
};
// ids: at least 2 tokens, within the model's context.
LogitLens logit_lens(nn::DecoderModel& model, const std::vector<int64_t>& ids);

// ---- gradients at hook points ----

// d metric / d activation at each of `gradients`' hook points, for a metric of the logits: one forward with a
// tape (the model's own, eval mode, its head controls as they stand) and one backward from d metric / d logits,
// which dlogits(logits) gives (B, T, V) for the run's logits (detached), e.g. from a PyTorch metric's backward.
struct HookedBackward {
  Tensor logits;          // (B, T, V)
  Activations cache;      // the forward's activations at `cache`'s names (detached)
  Activations gradients;  // d metric / d activation at `gradients`' names, each its activation's shape
};
HookedBackward run_hooked_backward(nn::DecoderModel& model, const Tensor& tokens, const std::set<std::string>& cache,
                                   const std::set<std::string>& gradients,
                                   const std::function<Tensor(const Tensor& logits)>& dlogits);

}  // namespace headlab::analysis
