// The GPT-NeoX family in the Hugging Face layout: a folder whose config.json says model_type gpt_neox
// (GPTNeoXForCausalLM: Pythia), with model.safetensors or its shards in float32, float16 or bfloat16, and its
// tokenizer.json. The fused query_key_value projection (rows per head: [q | k | v]) is split into NeoXModel's
// W_query, W_key and W_value and fused back on export; the buffers older files carry (attention.bias,
// attention.masked_bias, attention.rotary_emb.inv_freq) are ignored. What NeoXModel does not compute
// (rope_scaling, another activation than the exact GELU) is refused by name.
#pragma once
#include <string>

#include "io/families.h"
#include "nn/decoder_family.h"

namespace headlab::io {

// The neox family's folders for the registry (io/families.h).
const FolderFormat& hf_neox_format();

// config.json alone, checked; errors name the file and key.
nn::DecoderConfig read_hf_neox_config(const std::string& folder);

}  // namespace headlab::io
