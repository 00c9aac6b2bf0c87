// Sparse autoencoders in SAELens's folder layout: cfg.json and sae_weights.safetensors (W_enc (d_in, d_sae),
// W_dec (d_sae, d_in), b_enc, b_dec, and jumprelu's threshold), read in both layouts SAELens has written (v3-v5's
// flat cfg.json; v6's, with the model and hook under "metadata") and written in v6's, so that published SAEs load
// here and headlab's load in SAELens. What SAELens would compute differently is refused by name: gated SAEs,
// finetuning scaling factors, run-time activation norms, TopK rescaled by decoder norms.
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
};

struct LoadedSae {
  std::unique_ptr<nn::SparseAutoencoder> sae;
  SaeOrigin origin;
  int layout_version = 6;  // the layout read: 5 (v3-v5's flat cfg.json) or 6
};

// Reads folder/cfg.json and folder/sae_weights.safetensors; errors name the file and the field.
LoadedSae read_sae_folder(const std::string& folder);
// Writes the v6 layout (cfg.json and sae_weights.safetensors, each through a temporary file) into folder, created if
// absent. A transcoder (d_out != d_in) is refused: SAELens keeps those in another layout.
void write_sae_folder(const std::string& folder, const nn::SparseAutoencoder& sae, const SaeOrigin& origin);

}  // namespace headlab::io
