// PyTorch files as a model source (io/sources.h): a torch.save file's state_dict recognised by its layout and read
// into a family's parameters, its config from what the file stores beside it or from the tensors' shapes:
// - nanoGPT's ckpt.pt: {"model": state_dict, "model_args": {n_layer, n_head, n_embd, block_size, bias, vocab_size,
//   dropout}, ...}, GPT-2's names with nn.Linear's (out, in) and torch.compile's "_orig_mod." prefix; bias=False
//   read as zero biases (the same maths); the head tied to wte;
// - Hugging Face's pytorch_model.bin is read with its folder (io/weight_files.h), not here: a bare one is refused
//   naming the folder it needs.
// A file holds no tokenizer: its tokens are shown as numbers (tasks/id_tokenizer.h) unless --tokenizer gives one.
#pragma once
#include "io/sources.h"

namespace headlab::io {

const ModelSource& torch_source();

}  // namespace headlab::io
