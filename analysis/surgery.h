// Physical pruning and attention-layout conversion of parameters and checkpoints, for any model family:
// the model is built from its config section (io/families.h) and loaded, each attention module prunes or
// converts itself (nn::MultiHead::keep_heads, nn::convert_attention), and the family writes the config of
// the changed model (nn::Model::pruned_config, nn::DecoderModel::converted_config). Parameters come back
// in the order of the model the returned config describes.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "analysis/heads.h"
#include "io/checkpoint.h"

namespace headlab::analysis {

using io::Checkpoint;

// keep[i]: model-local heads of attention module i to keep (sorted, at least one; a decoder's modules are
// its layers). Returns the pruned model's config section (its kept heads by original index) and its
// parameters without the other heads: fewer projection rows (a fused form's W_query/W_key/W_value, d2l's
// W_q/W_k/W_v) or fewer heads.{j} modules, renumbered (the wrapper), and fewer output-projection columns.
std::pair<nlohmann::json, NamedTensors> prune_parameters(const nlohmann::json& model_config, const NamedTensors& params,
                                                         const std::vector<std::vector<int64_t>>& keep);
// A checkpoint of the pruned model: config["model"] replaced, config["pruning"] added (source, removed
// heads as [module, original head], kept heads), optimizer state dropped (its shapes no longer match);
// the trainer state is kept for the record.
Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source = "");
// A live model pruned: a new model of its family, in its dtype, device and mode.
std::shared_ptr<nn::Model> prune_model(const nn::Model& model, const std::vector<std::vector<int64_t>>& keep);
template <typename M>
std::shared_ptr<M> prune_model(const M& model, const std::vector<std::vector<int64_t>>& keep) {
  return std::dynamic_pointer_cast<M>(prune_model(static_cast<const nn::Model&>(model), keep));
}

// The same weights in another attention layout ("fused" <-> "wrapper"); pruned models too (decoders).
std::pair<nlohmann::json, NamedTensors> convert_parameters(const nlohmann::json& model_config,
                                                           const NamedTensors& params, nn::AttentionForm attention);
Checkpoint convert_checkpoint(const Checkpoint& ckpt, nn::AttentionForm attention);

}  // namespace headlab::analysis
