// A Hugging Face family's weights as one invertible table: each entry names a tensor of the folder, the
// headlab parameters it holds and how (as stored, transposed as Conv1D stores it, or q|k|v fused in blocks or
// per head; q and k rows in the rotary halves layout). Reading, writing and the names both sides use all come
// from the one table, so a family states its layout once (io/hf_gpt2.cpp, io/hf_llama.cpp, io/hf_neox.cpp).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.h"
#include "io/families.h"
#include "io/hf_folder.h"
#include "io/weight_files.h"
#include "nn/decoder_family.h"

namespace headlab::io {

// How the folder's tensor holds the parameters.
enum class Fused {
  none,      // one parameter
  blocks,    // [p0 | p1 | p2] along the first dim (GPT-2's c_attn, after its transpose)
  per_head,  // per head h: [p0_h | p1_h | p2_h], head_dim rows each (GPT-NeoX's query_key_value)
};

struct WeightEntry {
  std::string hf;                 // the folder's name ("gpt_neox.layers.0.attention.dense.weight")
  std::vector<std::string> ours;  // headlab's parameters it holds, in order ("trf_blocks.0.att.out_proj.weight")
  Shape shape;                    // as the folder stores it
  bool transposed = false;        // stored (in, out), as GPT-2's Conv1D; headlab's nn.Linear is (out, in)
  Fused fused = Fused::none;
  std::vector<int64_t> rows;  // Fused::blocks: each parameter's rows (Phi-3's q | k | v of grouped-query); empty: equal
  bool rotary = false;        // q or k rows: halves in the folder; a model with interleaved pairs is permuted
  std::string missing;        // what to say when the folder lacks it ("" : "missing tensor '<hf>'")
};

struct WeightMap {
  std::string what;                          // for errors: "a GPT-2", "a GPT-NeoX model"
  std::vector<WeightEntry> entries;          // in the model's parameter order
  std::vector<std::string> ignored;          // names read past: a tied head saved beside the embedding
  std::vector<std::string> buffer_suffixes;  // older files' buffers, recomputed here (".rotary_emb.inv_freq")
  int64_t head_dim = 0;                      // for Fused::per_head and the rotary permutation

  // A new entry, its flags left to set on what this returns.
  WeightEntry& add(std::string hf, std::vector<std::string> ours, Shape shape) {
    WeightEntry& e = entries.emplace_back();
    e.hf = std::move(hf), e.ours = std::move(ours), e.shape = std::move(shape);
    return e;
  }
};

// Every entry's tensor (from a folder's safetensors or PyTorch files, or a PyTorch file's state_dict), shape checked,
// as headlab's parameters (float32, CPU, in the table's order); a tensor no entry names (nor a buffer) is an error
// naming the file and tensor. `where` names the files in errors.
NamedTensors read_weights(const WeightFiles& files, const std::string& where, const WeightMap& map);

// The folder's tensors from a decoder: each attention through its fused form, a pruned layer at full width
// (the heads it removed, and their key/value groups, as zeros), a bias the model lacks as zeros where the
// folder's layout has one, q and k rows permuted to halves where the model rotates interleaved pairs.
std::vector<std::pair<std::string, Tensor>> weights_to_write(const nn::DecoderModel& model, const WeightMap& map);

// config.json, model.safetensors (float32) and the tokenizer's files, each written atomically; errors start
// with "export".
void write_hf_folder(const std::string& folder, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const nlohmann::json& config, const TokenizerFiles& tokenizer);

// A decoder family's folders, from what the family says: its model_types, config.json <-> its config, its table.
class DecoderFolderFormat : public FolderFormat {
 public:
  virtual const nn::DecoderFamily& family() const = 0;
  // config.json (checked; errors name the file and key) as the family's config.
  virtual nn::DecoderConfig config_from_hf(const nlohmann::json& j, const std::string& file) const = 0;
  virtual nlohmann::json hf_config(const nn::DecoderConfig& c) const = 0;  // what write() puts in config.json
  // The table for a config; `folder` is the one being read and `files` its weights, opened once for the table and
  // the read (a layout told by the names it holds); "" and null when writing.
  virtual WeightMap weight_map(const nn::DecoderConfig& c, const std::string& folder,
                               const WeightFiles* files) const = 0;
  virtual std::string describe(const nn::DecoderConfig& c) const = 0;  // beside inspect's config

  nlohmann::json read_config(const std::string& folder) const final { return config(folder).to_json(); }
  FolderModel read(const std::string& folder) const override;
  void write(const std::string& folder, const nn::Model& model, const TokenizerFiles& tokenizer) const override;
  std::string describe(const FolderModel& m) const final { return describe(family().config(m.config)); }
  nn::DecoderConfig config(const std::string& folder) const {
    return config_from_hf(read_hf_config(folder), hf_config_path(folder));
  }

 protected:
  // The model as this family's decoder, or an error naming what it is.
  const nn::DecoderModel& decoder_of(const nn::Model& model) const;
};

}  // namespace headlab::io
