// Direct logit attribution (as TransformerLens computes it): the final residual stream x_L of a decoder
// is a sum of components (embeddings; per layer each head's z_h W_O[h], the out_proj bias and the MLP's
// output), and with the final norm's scale frozen at its value on the real x_L (nn::FrozenNorm; for a
// LayerNorm sigma = sqrt(var(x_L) + eps)), a logit is linear in them:
//   logit_y = sum_i ((comp_i - mean_C(comp_i)) / sigma * gamma) . W_U[y]  +  shift . W_U[y]  (+ b_U[y]).
// So every component gets its share of the correct token's logit, exactly (eval mode, no dropout).
// With post norms (Gemma 2/3, OLMo-2) each layer's attention post norm is frozen too, at the output it normed,
// so the heads' shares stay exact; with a logit soft-cap (Gemma 2) the logit split is the one before the cap.
// Without norms sigma is 1 and there is no centring or shift. L = layers, H = heads of a layer, D = head size,
// C = d_model, V = the predicted vocabulary (out_vocab_size).
#pragma once
#include <cstdint>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

// One quantity split over the components; means over the scored tokens, so that they sum to `total`.
struct DirectAttribution {
  HeadMatrix heads;  // [layer][head], heads in the model's order (original_head for labels)
  std::vector<double> out_proj_bias, feed_forward;  // [layer]
  double embeddings = 0;                            // token + position embedding
  double final_shift = 0;                           // the final LayerNorm's shift . W_U row, and b_U[y]
  double total = 0;                                 // the quantity itself, from the model's own final_norm and out_head
  double sum() const;                               // of the components: equals total up to rounding
};

struct LogitAttribution {
  // logit(correct) - mean logit over the vocabulary. Shown first: softmax ignores an offset shared by
  // every logit, and raw logits carry one (a component along the mean unembedding row moves them all),
  // so only this says whether a component helps the correct token win.
  DirectAttribution vs_mean;
  DirectAttribution logit;  // the raw correct-token logit
  int64_t tokens = 0;       // scored targets averaged over
};

// Over every scored target (targets != kIgnoreIndex) of the data, in double. The model's head gates
// and offsets are not applied (the attribution is of the unaltered model, as mean_head_contexts);
// its head controls and train/eval mode are restored afterwards, also when this throws.
LogitAttribution logit_attribution(nn::DecoderModel& model, const EvalSet& data);

}  // namespace headlab::analysis
