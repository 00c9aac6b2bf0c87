// Composition between heads of different layers (Elhage et al. 2021, "A Mathematical Framework for
// Transformer Circuits"; TransformerLens's all_composition_scores): how much of what head a (layer l)
// writes, W_OV^a = W_V^a W_O^a (C x C, row vectors: x W_V W_O is what it adds to the residual stream),
// a later head b (layer m > l) reads through its query (Q), key (K) or value (V) side:
//   Q: |W_OV^a W_QK^b|_F / (|W_OV^a|_F |W_QK^b|_F),  W_QK^b = W_Q^b W_K^b^T
//   K: |W_OV^a W_QK^b^T|_F / (...)
//   V: |W_OV^a W_OV^b|_F / (...)
// Each head's norm scale (its layer's ln1) is folded into its W_Q, W_K, W_V, as TransformerLens's
// fold_ln does (nn::DecoderModel::head_weights); the norm's centring and bias are left out. Computed in
// float64 through D x D Gram matrices, so a GPT-2's 9,504 pairs of heads take a second, not hours of
// C x C products.
#pragma once
#include <string>
#include <vector>

#include "analysis/head_scores.h"
#include "analysis/heads.h"

namespace headlab::analysis {

struct CompositionScore {
  int64_t layer_a = 0, head_a = 0, layer_b = 0, head_b = 0;  // heads by original index
  double q = 0, k = 0, v = 0;
};
// Every pair (a, b) with a in an earlier layer than b, layer-major in a, then in b.
std::vector<CompositionScore> composition_scores(const nn::DecoderModel& model);

// An induction head (a head of layer >= 1 labelled "induction" by head_types) and the earlier head its keys
// read most (the largest K-composition score): Elhage et al.'s circuit, where that partner is a
// previous-token head. k_mean is the mean K score over all of the head's earlier partners, the baseline.
struct InductionPair {
  HeadTypeScores induction, partner;  // the partner's own scores: its previous-token score says what it is
  CompositionScore k;
  double k_mean = 0;
};
std::vector<InductionPair> induction_pairs(const HeadTypes& types, const std::vector<CompositionScore>& comp);

}  // namespace headlab::analysis
