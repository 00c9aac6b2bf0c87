// A decoder family as the registry (io/families.h) sees it: a name, the keys of its checkpoint section (a
// subset of DecoderConfig's fields, under the same names) and the parts it fixes. Reading and writing the
// section, building the model and every count follow from DecoderConfig, once, here; a family's own file
// (nn/gpt.cpp, nn/llama.cpp, nn/neox.cpp, nn/hooked.cpp) says only what differs: its keys, its parts, the rules among
// its keys, train's options, and one line describing a config.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/decoder.h"
#include "nn/decoder_config.h"
#include "nn/family.h"

namespace headlab::nn {

// A key of a family's section: required (from_json refuses a section without it), or written only when true or
// nonzero (keys added after the family's first checkpoints, which mean false or 0 when absent).
struct SectionKey {
  const char* name;
  enum Presence { optional, required, omitted_when_false } presence = optional;
};

// What names a family: its arch, --arch's help line, its model's type_name ("GPTModel": what repr and errors
// say) and what its config's errors start with ("GPT config").
struct FamilyNames {
  const char *arch, *help, *model_name, *who;
};

class DecoderFamily : public ModelFamily {
 public:
  // keys: the section's keys beyond those every decoder's has (vocab_size, context_length, emb_dim, n_heads,
  // n_layers: required; attention, kept_heads).
  DecoderFamily(FamilyNames names, std::vector<SectionKey> keys);
  std::string arch() const final { return names_.arch; }
  std::string help() const final { return names_.help; }
  std::string model_name() const { return names_.model_name; }
  const char* who() const { return names_.who; }
  const std::vector<SectionKey>& keys() const { return keys_; }

  // ---- what a family says beyond its names and keys ----
  // The parts the family fixes and its optional keys' defaults (the family pointer is set by config()).
  virtual DecoderConfig parts() const = 0;
  // Rules among the family's keys beyond DecoderConfig::validate's.
  virtual void check(const DecoderConfig&) const {}
  // Whether the section names its arch (GPT's sections predate the key: absent means gpt).
  virtual bool arch_in_section() const { return true; }
  // train's options beyond those every decoder shares (sizes, dropout, attention form, qkv_bias) into a fresh
  // config, refusing by name what the family cannot honour; and back, as a config answers them.
  virtual void take_options(const ModelOptions&, DecoderConfig&) const {}
  virtual void give_options(const DecoderConfig&, ModelOptions&) const {}

  // ---- what follows ----
  DecoderConfig config() const;  // the family's parts, no sizes yet: what a C++ caller fills in
  DecoderConfig config(const nlohmann::json& section) const;  // read and validated; errors name the key
  nlohmann::json section(const DecoderConfig& c) const;       // the family's keys only, with "arch"
  nlohmann::json from_options(const ModelOptions& o, const TaskSizes& t) const final;
  ModelOptions options(const nlohmann::json& s) const final;

  nlohmann::json canonical(const nlohmann::json& s) const final { return section(config(s)); }
  std::shared_ptr<Model> build(const nlohmann::json& s) const final;
  double parameter_count(const nlohmann::json& s) const final { return config(s).num_parameters(); }
  double activation_floats(const nlohmann::json& s, bool training) const final {
    return config(s).activation_floats(training);
  }
  double cache_floats(const nlohmann::json& s) const final { return config(s).cache_floats(); }
  int64_t row_tokens(const nlohmann::json& s) const final { return config(s).context_length; }
  int64_t vocab_size(const nlohmann::json& s) const final { return config(s).vocab_size; }
  nlohmann::json with_dropout(const nlohmann::json& s, double p) const final;

 private:
  FamilyNames names_;
  std::vector<SectionKey> keys_;
};

// The decoder families, for the registry (io/families.cpp) and for building configs in C++.
const DecoderFamily& gpt_family();      // the book's GPTModel, GPT-2 (nn/gpt.cpp)
const DecoderFamily& llama_family();    // LLaMA, Mistral, Qwen2, llama2.c's models (nn/llama.cpp)
const DecoderFamily& qwen3_family();    // Qwen3: llama with per-head q/k norms (nn/llama.cpp)
const DecoderFamily& olmo2_family();    // OLMo-2: llama with post norms and whole q/k norms (nn/llama.cpp)
const DecoderFamily& gemma_family();    // Gemma 1 (nn/llama.cpp)
const DecoderFamily& gemma2_family();   // Gemma 2 (nn/llama.cpp)
const DecoderFamily& gemma3_family();   // Gemma 3's text model (nn/llama.cpp)
const DecoderFamily& neox_family();     // GPT-NeoX, Pythia (nn/neox.cpp)
const DecoderFamily& gpt_neo_family();  // GPT-Neo, TinyStories (nn/gpt_neo.cpp)
const DecoderFamily& bert_family();     // BERT encoders: bidirectional, post-LN, a masked-LM head (nn/bert.cpp)
const DecoderFamily& hooked_family();   // TransformerLens's HookedTransformer, the grokking models (nn/hooked.cpp)

}  // namespace headlab::nn
