// llama2.c's checkpoints (Karpathy's run.c / export.py), read into the llama family's parameters:
// - the legacy header: seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a
//   negative vocab_size means an untied classifier follows the weights), then float32 weights grouped by kind
//   over the layers (token embedding, attention norms, wq, wk, wv, wo, FFN norms, w1, w2, w3, final norm, the
//   old freq_cis tables), then the classifier if untied;
// - the versioned format: uint32 magic "ak42", int32 version 1 (float32), the seven int32, uint8
//   shared_classifier, zeros to byte 256, then the norms, the token embedding, wq ... w3 and an untied classifier.
// Rotary pairs are interleaved (rope_interleaved), theta 10000, RMSNorm eps 1e-5. Every size is checked against
// the file's length before anything of the claimed size is allocated.
#pragma once
#include <string>

#include "io/families.h"

namespace headlab::io {

// A file that starts with the magic, or whose legacy header's sizes give exactly its length.
bool is_llama2c_checkpoint(const std::string& path);
// The model (config: the llama family's section; parameters by headlab's names); errors name the file and field.
FolderModel read_llama2c(const std::string& path);

}  // namespace headlab::io
