// Physical pruning and attention-layout conversion of parameters and checkpoints.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "analysis/heads.h"
#include "io/checkpoint.h"
#include "nn/gpt.h"
#include "nn/transformer.h"

namespace headlab::analysis {

using io::Checkpoint;

// ------------------------------------------------------------------------------------------------
// Physical pruning and layout conversion of a model's parameters: the model is built from the config
// and loaded, and each attention module prunes or converts itself (nn::CausalMultiHead::prune_heads,
// nn::MultiHeadAttention::prune_heads, nn::convert_attention). Parameters come back in the order of
// the model the returned config describes.

// keep[l]: model-local heads of layer l to keep (sorted, at least one). Returns the config with
// kept_heads (original indices) and the parameters without the other heads: fewer W_query/W_key/
// W_value rows (fused) or fewer heads.{j} modules, renumbered (wrapper), and fewer out_proj columns.
std::pair<nn::GPTConfig, NamedTensors> prune_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                        const std::vector<std::vector<int64_t>>& keep);
// A checkpoint of the pruned model: config["model"] replaced (kept_heads), config["pruning"] added,
// optimizer state dropped (its shapes no longer match); the trainer state is kept for the record.
// GPT and encoder-decoder checkpoints alike (keep: per attention module in nn::Model's order).
Checkpoint prune_checkpoint(const Checkpoint& ckpt, const std::vector<std::vector<int64_t>>& keep,
                            const std::string& source = "");
// The encoder-decoder's pruning: keep[i] for module i (encoder layers, decoder self, cross); fewer W_q/W_k/W_v
// rows (and bias entries), fewer W_o columns; kept_encoder/kept_decoder/kept_cross hold the original indices.
std::pair<nn::TransformerConfig, NamedTensors> prune_parameters(const nn::TransformerConfig& cfg,
                                                                const NamedTensors& params,
                                                                const std::vector<std::vector<int64_t>>& keep);
std::shared_ptr<nn::GPTModel> prune_model(const nn::GPTModel& model, const std::vector<std::vector<int64_t>>& keep);

// The same weights in the other attention layout ("fused" <-> "wrapper"); pruned configs too.
std::pair<nn::GPTConfig, NamedTensors> convert_parameters(const nn::GPTConfig& cfg, const NamedTensors& params,
                                                          nn::AttentionForm attention);
Checkpoint convert_checkpoint(const Checkpoint& ckpt, nn::AttentionForm attention);

}  // namespace headlab::analysis
