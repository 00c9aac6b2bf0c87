// The BERT family in the Hugging Face layout: a folder whose config.json says model_type bert (BertForMaskedLM:
// BERT, MiniLM and other models of its layout), weights in model.safetensors or pytorch_model.bin, older files'
// LayerNorm.gamma / beta names too. What the family does not compute (relative positions, a decoder's cross
// attention, another activation, a folder without the masked-LM head) is refused by name.
#pragma once
#include "io/families.h"

namespace headlab::io {

// The bert family's folders for the registry (io/families.h).
const FolderFormat& hf_bert_format();

}  // namespace headlab::io
