// Activation patching of attention heads (as TransformerLens's patching utilities and the IOI work
// of Wang et al. 2023 do it): a clean input and a corrupted one laid out alike (one prompt digit
// changed, so the answer changes; or other rows of the data), and for every head
//   noising:   the clean run with the head's context from the corrupted run: what the clean answer loses;
//   denoising: the corrupted run with the head's context from the clean run: what of it comes back.
// Both are scored against the clean targets, and as a fraction of the gap the corruption opens in
// the loss on them: noising (L_noised - L_clean) / (L_corrupted - L_clean), denoising
// (L_corrupted - L_denoised) / (L_corrupted - L_clean). Every run is one batched pass
// (evaluate_interventions).
#pragma once
#include <cstdint>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

struct HeadPatching {
  int64_t layer = 0, head = 0, original_head = 0;
  Scores noised, denoised;
  double noising = 0, denoising = 0;          // normalised effects (above)
  std::vector<double> denoising_by_position;  // (T) when asked: the head patched at one position only
};
struct PatchingResult {
  Scores clean, corrupted;          // against the clean targets
  std::vector<HeadPatching> heads;  // layer-major
  int64_t tokens = 0;               // scored clean targets
};
// corrupted: per clean batch, the corrupted batch (same B and T; its targets are not used).
PatchingResult patch_heads(nn::DecoderModel& model, const EvalSet& clean, const std::vector<Batch>& corrupted,
                           bool by_position = false);

}  // namespace headlab::analysis
