// The GPT-Neo family in the Hugging Face layout: a folder whose config.json says model_type gpt_neo
// (GPTNeoForCausalLM: EleutherAI's GPT-Neo, roneneldan's TinyStories-1M..33M), with its weights in model.safetensors
// or pytorch_model.bin. Local layers (attention_layers "local") see the last window_size positions; what the
// family does not compute (another activation, an untied head) is refused by name.
#pragma once
#include "io/families.h"

namespace headlab::io {

// The gpt_neo family's folders for the registry (io/families.h).
const FolderFormat& hf_gpt_neo_format();

}  // namespace headlab::io
