// Features of heads: what an SAE's features (nn/sae.h) are in terms of the model's heads and outputs.
//   - An attention-output SAE's features split over the heads that write them through W_O (Kissane et al. 2024).
//   - A feature's logit effects: its output direction read out through the final norm's weight and W_U, as
//     TransformerLens's folded unembedding reads it (Neuronpedia's top and bottom logits).
//   - On a prompt, each active feature's pre-activation split exactly over the heads that wrote what it reads: an
//     SAE reads x through pre = (x - b_dec) . W_enc[:, f] + b_enc[f], linear in x, and x is a sum of the heads'
//     outputs (their z, for hook_z) and what no head wrote (embeddings, MLPs, biases: "remainder"), so
//     sum of the heads' parts + remainder + bias = pre, exactly (the model's own forward, eval mode).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "io/sae_files.h"
#include "nn/decoder.h"

namespace headlab::analysis {

// An SAE on blocks.L.attn.hook_z reads the heads' z side by side (H x D), so feature f's decoder row is a block
// d_{f,h} a head, which W_O carries into the stream as d_{f,h} W_O[h]; the feature writes o_f = sum_h d_{f,h} W_O[h].
// Computed 1024 features at a time: memory H x 1024 x C doubles, whatever d_sae.
struct FeatureHeads {
  Tensor shares;        // (n, H) float64: head h's part projected on o_f / ||o_f||; a row sums to ||o_f||
  Tensor output_norms;  // (n) float64: ||o_f||
};
// n = d_sae, or the features named (in their order).
FeatureHeads feature_head_shares(const nn::DecoderModel& model, const nn::SparseAutoencoder& sae, int64_t layer,
                                 const std::vector<int64_t>& features = {});

// What feature f writes into the residual stream (n, C) for the features `features`: W_dec's rows for an SAE or
// transcoder whose output is C wide (resid, attn_out, mlp_out), o_f through W_O for hook_z; undefined for a hook the
// stream does not receive linearly (hook_q, hook_pattern, mlp.hook_post, ...).
Tensor feature_output_directions(const nn::DecoderModel& model, const nn::SparseAutoencoder& sae,
                                 const io::SaeOrigin& origin, const std::vector<int64_t>& features);

struct TokenEffect {
  int64_t token = 0;
  double effect = 0;
};

struct FeatureOnPrompt {
  int64_t feature = 0;
  std::vector<double> activations;            // at every position (T)
  int64_t position = 0;                       // where it is largest
  double activation = 0, pre_activation = 0;  // there
  // pre_activation split: labels[i]'s part; sum(parts) + bias == pre_activation
  std::vector<std::string> labels;  // "L1H3" (original head indices), "remainder"
  std::vector<double> parts;
  double bias = 0;                                     // b_enc[f] - b_dec . W_enc[:, f] (where the SAE subtracts b_dec)
  std::vector<double> head_shares;                     // hook_z SAEs: feature_head_shares's row; else empty
  std::vector<TokenEffect> top_logits, bottom_logits;  // its direction's logit effects; empty where it has none
};

struct FeatureOptions {
  int64_t features = 5;             // the most active features on the prompt (by their largest activation)
  std::optional<int64_t> position;  // rank them, and split them, at this position (negative: from the end)
  int64_t logits = 5;               // tokens a direction's top and bottom logit effects list
  std::vector<int64_t> chosen;      // these features instead of the most active ones
};

struct FeatureReport {
  std::string hook;          // what the SAE reads
  std::string split;         // how pre-activations are split: "heads of layer L (hook_z)", ...; empty: not split
  std::vector<int64_t> ids;  // the prompt
  std::vector<FeatureOnPrompt> features;
};

// The SAE's features on one prompt (ids within the model's context): each one's activations, the split of its
// pre-activation where it peaks over the heads that wrote its input, and its logit effects.
FeatureReport features_on_prompt(nn::DecoderModel& model, nn::SparseAutoencoder& sae, const io::SaeOrigin& origin,
                                 const std::vector<int64_t>& ids, const FeatureOptions& o = {});

}  // namespace headlab::analysis
