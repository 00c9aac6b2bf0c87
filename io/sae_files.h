// Sparse autoencoders and transcoders in SAELens's folder layout: cfg.json and sae_weights.safetensors (W_enc (d_in,
// d_sae), W_dec (d_sae, d_out), b_enc, b_dec, and jumprelu's threshold), read in both layouts SAELens has written
// (v3-v5's flat cfg.json; v6's, with the model and hook under "metadata") and written in v6's, so that published
// SAEs load here and headlab's load in SAELens. A transcoder is SAELens's: architecture "transcoder" (relu) or
// "jumprelu_transcoder", with d_out and hook_name_out, and b_dec never subtracted from its input; a TopK transcoder,
// which SAELens has no name for, is written as "topk_transcoder". What SAELens would compute differently is refused
// by name: gated SAEs, skip transcoders, finetuning scaling factors, run-time activation norms, TopK rescaled by
// decoder norms.
#pragma once
#include <memory>
#include <string>

#include "nn/sae.h"

namespace headlab::io {

// Where an SAE reads its activations, as SAELens's cfg.json names it.
struct SaeOrigin {
  std::string model_name;        // "gpt2"
  std::string hook_name;         // "blocks.8.hook_resid_pre"
  int64_t hook_head_index = -1;  // -1: every head (null)
  int64_t context_size = 0;      // 0: unknown
  std::string hook_name_out;     // a transcoder's target ("blocks.8.hook_mlp_out"); empty: an SAE
  bool transcoder() const { return !hook_name_out.empty(); }
};

struct LoadedSae {
  std::unique_ptr<nn::SparseAutoencoder> sae;
  SaeOrigin origin;
  int layout_version = 6;  // the layout read: 5 (v3-v5's flat cfg.json) or 6
};

// Reads folder/cfg.json and folder/sae_weights.safetensors; errors name the file and the field.
LoadedSae read_sae_folder(const std::string& folder);
// Writes the v6 layout (cfg.json and sae_weights.safetensors, each through a temporary file) into folder, created if
// absent; a transcoder where origin names hook_name_out (a module with d_out != d_in must be one).
void write_sae_folder(const std::string& folder, const nn::SparseAutoencoder& sae, const SaeOrigin& origin);

// A trainer's state beside its SAE in a checkpoint (train/sae.h's SaeTrainerState tensors: float32, by name), as
// safetensors; errors name the file.
void write_sae_trainer_tensors(const std::string& path, const NamedTensors& tensors);
NamedTensors read_sae_trainer_tensors(const std::string& path);

}  // namespace headlab::io
