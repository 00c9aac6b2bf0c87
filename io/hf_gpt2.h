// GPT-2 in the Hugging Face layout: a folder with config.json (GPT2Config), model.safetensors (or
// model.safetensors.index.json and its shards), vocab.json and merges.txt. Read into the parameters
// of headlab's GPTModel (the book's GPT with qkv_bias, which is GPT-2's maths) and written back from
// them, so a model goes PyTorch -> headlab -> PyTorch unchanged (bitwise for float32).
//
// The variants real files come in are all read: names with or without the `transformer.` prefix
// (GPT2LMHeadModel vs GPT2Model), lm_head.weight present (untied) or absent (tied to wte), the
// causal-mask buffers h.N.attn.bias / h.N.attn.masked_bias of older files (ignored), F32, F16 or
// BF16 on disk, Conv1D weights stored (in, out), one file or shards.
#pragma once
#include <string>

#include "io/families.h"
#include "io/hf_weights.h"
#include "io/tokenizer_files.h"
#include "nn/decoder_family.h"
#include "nn/module.h"

namespace headlab::io {

// The GPT family's folders for the registry (io/families.h): model_type gpt2, read and written below.
const FolderFormat& hf_gpt2_format();

// GPT-2's weight table: `prefix` ("transformer." or "") before every name but lm_head's; the head's entry where
// untied. nanoGPT's ckpt.pt (io/torch_layouts.cpp) is this table with nn.Linear's (out, in) for Conv1D's.
WeightMap gpt2_weights(const nn::DecoderConfig& c, const std::string& prefix, bool tied);

struct HfGpt2Config {
  // qkv_bias true, the fused attention form, drop_rate resid_pdrop, tie_embeddings from
  // tie_word_embeddings (GPT-2's default true: the head is wte, one parameter)
  nn::DecoderConfig config;
};
// config.json alone, checked: a GPT-2 whose maths headlab's GPTModel has (gelu_new, 4 x n_embd inner
// size, LayerNorm eps 1e-5, attention scaled by 1 / sqrt(head size)). Errors name the file and key.
HfGpt2Config read_hf_gpt2_config(const std::string& folder);

struct HfGpt2 : HfGpt2Config {
  // float32 CPU tensors by headlab's state_dict names (a tied head has none of its own)
  NamedTensors parameters;
  std::string vocab_path, merges_path;  // the tokenizer's files; "" where the folder lacks them
};

// Reads and checks the folder: its config (read_hf_gpt2_config), every tensor's presence and shape
// against it, nothing else in the weights but the old mask buffers. Errors name the file and tensor.
HfGpt2 read_hf_gpt2(const std::string& folder);

// The folder's GPTModel on the CPU in eval mode, from read_hf_gpt2's result: built without initial
// values (nn::SkipInit), each parameter taking over its tensor's memory (adopt_parameters), so the
// weights are held once (the file's pages are released as they are read: SafetensorsFile::to_float).
std::shared_ptr<nn::DecoderModel> build_hf_gpt2(HfGpt2&& hf, const std::string& folder);

// A GPTModel (either attention form) as a GPT2LMHeadModel folder: config.json, model.safetensors
// (float32, Conv1D layout, `transformer.`-prefixed names, as save_pretrained writes them;
// lm_head.weight only when the head differs from wte) and, when given, the tokenizer's files. A physically pruned model
// is written at its full width: the heads it removed come back with zero query, key and value weights and zero
// output-projection columns, so the folder computes exactly what the pruned model computes. Every file is replaced
// atomically.
void write_hf_gpt2(const std::string& folder, const nn::DecoderModel& model, const TokenizerFiles& tokenizer = {});

}  // namespace headlab::io
