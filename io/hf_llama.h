// The LLaMA family in the Hugging Face layout: a folder whose config.json says model_type llama, mistral,
// qwen2 or qwen3 (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM), with model.safetensors or
// its shards in float32, float16 or bfloat16. Read into LlamaModel's parameters (rotary on halves, as rotate_half);
// written back from them, q and k rows permuted from interleaved pairs to halves where the model rotates pairs (a
// llama2.c model), as llama2.c's export does. What LlamaModel does not compute (rope_scaling, a sliding window
// shorter than the context, another activation, biases beyond q/k/v) is refused by name.
#pragma once
#include <string>

#include "io/families.h"
#include "nn/decoder_family.h"

namespace headlab::io {

// The llama family's folders for the registry (io/families.h), and Qwen3's (the same reader and table, its q_norm
// and k_norm besides).
const FolderFormat& hf_llama_format();
const FolderFormat& hf_qwen3_format();

// config.json alone, checked; errors name the file and key.
nn::DecoderConfig read_hf_llama_config(const std::string& folder);

}  // namespace headlab::io
