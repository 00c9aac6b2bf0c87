// What every Hugging Face model folder shares, whatever its family: a folder holding config.json, that
// file read under a size cap, its model_type, and config values read with errors that name the file and
// key. The families' readers (io/hf_gpt2.h) build on these; the registry (io/families.h) picks the reader.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/tensor.h"
#include "base/error.h"
#include "base/json_fields.h"
#include "io/tokenizer_files.h"
#include "nn/attention.h"
#include "nn/decoder.h"

namespace headlab::io {

// A folder holding config.json: what the commands take for a Hugging Face model.
bool is_hf_model_folder(const std::string& path);

// The folder's config.json, checked to be a JSON object of at most 1 MiB; errors name the file.
nlohmann::json read_hf_config(const std::string& folder);
std::string hf_config_path(const std::string& folder);

// config.json's integer at the first of `keys` present, in [lo, hi] (required).
int64_t hf_config_int(const nlohmann::json& j, std::initializer_list<const char*> keys, int64_t lo, int64_t hi,
                      const std::string& file);

// The sizes most families' config.json give under the same keys, into c: num_hidden_layers (n_layers),
// num_attention_heads (n_heads), hidden_size (emb_dim), intermediate_size (hidden_dim), vocab_size and
// max_position_embeddings (context_length), each in its range (LLaMA's, GPT-NeoX's, BERT's); heads_divide: hidden_size
// must be a whole number of heads (a family without head_dim).
void read_hf_sizes(const nlohmann::json& j, const std::string& file, nn::DecoderConfig& c, bool heads_divide = true);

// config.json's value at `key`, or `fallback` where absent or null; the wrong type is an error.
template <typename T>
T hf_config_value(const nlohmann::json& j, const char* key, T fallback, const std::string& file) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    HL_FAIL(file, ": ", key, " has the wrong type: ", json_text(j.at(key)));
  }
}

// Layer `layer`'s attention in the fused form whatever the model's (a wrapper's heads stacked back into one module,
// one layer at a time, kept alive by `holder`): what a writer reads W_query, W_key, W_value and out_proj from.
const nn::CausalMultiHeadAttention& fused_attention(const nn::DecoderModel& model, int64_t layer,
                                                    std::shared_ptr<nn::CausalMultiHead>& holder);

// A pruned layer's projection rows at full width, as a folder stores them: unit u's D rows where it was kept
// (kept[i] == u: rows [i*D, (i+1)*D) of w), zeros where it was removed. w (kept.size() * D, ...) -> (units * D, ...).
Tensor full_width(const Tensor& w, const std::vector<int64_t>& kept, int64_t units, int64_t D);

// A tokenizer's files written into the folder under their own names (tokenizer.model, vocab.json, ...), each
// atomically, as export writes them beside the weights; nothing for an empty one.
void write_tokenizer_files(const std::string& folder, const TokenizerFiles& tokenizer);

}  // namespace headlab::io
