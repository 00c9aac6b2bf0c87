// Activation patching of every head, both directions, through the batched interventions.
#include "analysis/patching.h"

namespace headlab::analysis {

PatchingResult patch_heads(nn::DecoderModel& model, const EvalSet& clean, const std::vector<Batch>& corrupted,
                           bool by_position) {
  HL_CHECK(corrupted.size() == clean.batches.size(), "patch_heads: ", corrupted.size(), " corrupted batches for ",
           clean.batches.size(), " clean ones");
  // The corrupted inputs scored against the clean targets; sources: the other run's batches.
  EvalSet hybrid = clean;
  for (size_t i = 0; i < corrupted.size(); ++i) {
    HL_CHECK(corrupted[i].B == clean.batches[i].B && corrupted[i].T == clean.batches[i].T,
             "patch_heads: corrupted batch ", i, " is ", corrupted[i].B, " x ", corrupted[i].T, ", the clean one ",
             clean.batches[i].B, " x ", clean.batches[i].T);
    hybrid.batches[i].inputs = corrupted[i].inputs;
  }
  const int64_t T = clean.batches.front().T;
  std::vector<HeadIntervention> whole = {HeadIntervention{}}, positions;
  for (int64_t l = 0; l < model.n_layers(); ++l)
    for (int64_t h = 0; h < model.attention(l).head_count(); ++h) {
      whole.push_back({l, h, Ablation::patch, -1});
      if (by_position)
        for (int64_t t = 0; t < T; ++t) positions.push_back({l, h, Ablation::patch, t});
    }
  InterventionOptions from_corrupted, from_clean;
  from_corrupted.source = &corrupted;
  from_clean.source = &clean.batches;
  const std::vector<Scores> noised = evaluate_interventions(model, clean, whole, from_corrupted);
  const std::vector<Scores> denoised = evaluate_interventions(model, hybrid, whole, from_clean);
  const std::vector<Scores> at =
      by_position ? evaluate_interventions(model, hybrid, positions, from_clean) : std::vector<Scores>{};
  PatchingResult r;
  r.clean = noised[0];
  r.corrupted = denoised[0];
  r.tokens = clean.tokens();
  const double gap = r.corrupted.loss - r.clean.loss;
  for (size_t i = 1; i < whole.size(); ++i) {
    HeadPatching p;
    p.layer = whole[i].layer;
    p.head = whole[i].head;
    p.original_head = model.original_head(p.layer, p.head);
    p.noised = noised[i];
    p.denoised = denoised[i];
    p.noising = (p.noised.loss - r.clean.loss) / gap;
    p.denoising = (r.corrupted.loss - p.denoised.loss) / gap;
    for (int64_t t = 0; by_position && t < T; ++t)
      p.denoising_by_position.push_back(
          (r.corrupted.loss - at[(i - 1) * static_cast<size_t>(T) + static_cast<size_t>(t)].loss) / gap);
    r.heads.push_back(p);
  }
  return r;
}

}  // namespace headlab::analysis
