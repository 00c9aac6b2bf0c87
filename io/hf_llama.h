// The LLaMA layout in Hugging Face's folders: config.json's model_type llama, mistral, qwen2, phi3, qwen3, olmo2, gemma
// or gemma3_text (LlamaForCausalLM, ..., Gemma3ForCausalLM), with model.safetensors or
// its shards in float32, float16 or bfloat16. Read into LlamaModel's parameters (rotary on halves, as rotate_half);
// written back from them, q and k rows permuted from interleaved pairs to halves where the model rotates pairs (a
// llama2.c model), as llama2.c's export does. What LlamaModel does not compute (rope_scaling, a sliding window
// shorter than the context, another activation, biases beyond q/k/v) is refused by name.
#pragma once
#include <string>

#include "io/families.h"
#include "nn/decoder_family.h"

namespace headlab::io {

// The llama family's folders for the registry (io/families.h), and those of the families in its layout (the same
// reader and table: Qwen3's q_norm and k_norm, OLMo-2's and Gemma 3's norms after attention and MLP).
const FolderFormat& hf_llama_format();
const FolderFormat& hf_qwen3_format();
const FolderFormat& hf_olmo2_format();   // model_type olmo2
const FolderFormat& hf_gemma_format();   // model_type gemma (Gemma 1)
const FolderFormat& hf_gemma2_format();  // model_type gemma2
const FolderFormat& hf_gemma3_format();  // model_type gemma3_text

// config.json alone, checked; errors name the file and key.
nn::DecoderConfig read_hf_llama_config(const std::string& folder);

}  // namespace headlab::io
