// A decoder family as the registry (io/families.h) sees it: a name, the keys of its checkpoint section (a
// subset of DecoderConfig's fields, under the same names) and the parts it fixes. Reading and writing the
// section, building the model and every count follow from DecoderConfig, once, here; a family's own file
// (nn/gpt.cpp, nn/llama.cpp, nn/neox.cpp) says only what differs: its keys, its parts, the rules among its
// keys, train's options, and one line describing a config.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/decoder.h"
#include "nn/decoder_config.h"
#include "nn/family.h"

namespace headlab::nn {

// A key of a family's section: required (from_json refuses a section without it), or written only when true
// (keys added after the family's first checkpoints, which mean false when absent).
struct SectionKey {
  const char* name;
  enum Presence { optional, required, omitted_when_false } presence = optional;
};

class DecoderFamily : public ModelFamily {
 public:
  // ---- what a family says ----
  virtual std::string model_name() const = 0;  // the model's type_name: "GPTModel"
  virtual const char* who() const = 0;         // errors: "GPT config"
  virtual std::vector<SectionKey> keys() const = 0;
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
};

// The decoder families, for the registry (io/families.cpp) and for building configs in C++.
const DecoderFamily& gpt_family();    // the book's GPTModel, GPT-2 (nn/gpt.cpp)
const DecoderFamily& llama_family();  // LLaMA, Mistral, Qwen2, llama2.c's models (nn/llama.cpp)
const DecoderFamily& neox_family();   // GPT-NeoX, Pythia (nn/neox.cpp)

}  // namespace headlab::nn
