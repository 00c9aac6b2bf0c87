// PyTorch files as a model source (io/sources.h): a torch.save file's state_dict recognised by its layout and read
// into a family's parameters, its config from what the file stores beside it or from the tensors' shapes:
// - nanoGPT's ckpt.pt: {"model": state_dict, "model_args": {n_layer, n_head, n_embd, block_size, bias, vocab_size,
//   dropout}, ...}, GPT-2's names with nn.Linear's (out, in) and torch.compile's "_orig_mod." prefix; bias=False
//   read as zero biases (the same maths); the head tied to wte;
// - TransformerLens's HookedTransformer state_dicts (embed.W_E (vocab, d_model), blocks.L.attn.W_Q (heads, d_model,
//   d_head), ..., unembed.W_U, b_U), with the cfg where the file stores one, else sized from the tensors' shapes;
// - the progress-measures layout of Nanda et al.'s grokking code (embed.W_E (d_model, vocab), W_Q (heads, d_head,
//   d_model), W_O (d_model, heads x d_head), no norms; attn_blocks.L. where attention-only), sized from the shapes;
//   both as the hooked family (nn/hooked.cpp);
// - Hugging Face's pytorch_model.bin is read with its folder (io/weight_files.h), not here: a bare one is refused
//   naming the folder it needs.
// A file holds no tokenizer: its tokens are shown as numbers (tasks/id_tokenizer.h) unless --tokenizer gives one.
#pragma once
#include "io/sources.h"

namespace headlab::io {

const ModelSource& torch_source();

}  // namespace headlab::io
