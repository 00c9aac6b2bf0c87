// A model family as the rest of headlab sees it: everything is asked of its config section (a
// checkpoint's "model" JSON), so that no caller knows a family's config type. The decoder families are
// DecoderFamily's (nn/decoder_family.h); d2l's encoder-decoder defines its own (nn/transformer.h). The
// registry (io/families.h) lists them with their file formats, one line each.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "nn/model.h"

namespace headlab::nn {

// What `headlab train` chooses of a model, by its options' names, whatever the family: each family maps
// the ones it has into its config (and refuses, by name, a choice it cannot honour).
struct ModelOptions {
  std::string arch = "gpt";           // --arch: the family
  int64_t emb_dim = 64;               // --emb-dim: the stream's width (d2l: num_hiddens)
  int64_t n_heads = 4, n_layers = 2;  // --n-heads, --n-layers
  int64_t n_kv_heads = 0;      // --n-kv-heads: key/value heads where a family has grouped-query attention; 0: n_heads
  int64_t context_length = 0;  // --context-length; 0: what the task needs
  int64_t ffn_hiddens = 0;     // --ffn-hiddens: the MLP's width where a family lets it be chosen; 0: its default
  double drop_rate = 0.0;      // --drop-rate
  bool qkv_bias = false;       // --qkv-bias
  bool attn_only = false;      // --attn-only
  AttentionForm attention = AttentionForm::fused;  // --attention
};

// What the task decides of a fresh model: its vocabularies and lengths.
struct TaskSizes {
  std::string task;               // its name, for errors
  int64_t vocab_size = 0;         // the tokens the model predicts
  int64_t source_vocab_size = 0;  // a source -> target task's source tokens
  int64_t context_length = 0;     // the tokens of a row: --context-length, or what the task needs
  int64_t longest_sequence = 0;   // a source -> target task's longest source or target
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string arch() const = 0;           // the section's "arch" (absent: "gpt")
  virtual std::string help() const = 0;           // one line for --arch's help
  virtual bool seq2seq() const { return false; }  // source -> target: its tasks and batches carry a source
  // The section checked (errors name the key) and written as the family writes it.
  virtual nlohmann::json canonical(const nlohmann::json& section) const = 0;
  // A model of the section, its initial values from the default generator.
  virtual std::shared_ptr<Model> build(const nlohmann::json& section) const = 0;
  // What build(section)->num_parameters() will be, without building (a double: a size someone mistyped may
  // not fit an int64).
  virtual double parameter_count(const nlohmann::json& section) const = 0;
  // Activations per token of a batch row, in floats: a training step's peak (forward and backward), or one
  // forward without a tape (0 where a family cannot tell them from its config).
  virtual double activation_floats(const nlohmann::json& section, bool training) const = 0;
  // A generation's key/value cache per token, all layers, in floats (0 where a family decodes without one).
  virtual double cache_floats(const nlohmann::json& section) const = 0;
  // A batch row's tokens (the decoder's context; the seq2seq's longest target) and the predicted vocabulary.
  virtual int64_t row_tokens(const nlohmann::json& section) const = 0;
  virtual int64_t vocab_size(const nlohmann::json& section) const = 0;
  // "fused attention, 2 layers x 4 heads, emb 64, context 18"
  virtual std::string describe(const nlohmann::json& section) const = 0;
  // A fresh run's section from train's options and the task's sizes; and the options a section answers to
  // (what --resume compares the command line with).
  virtual nlohmann::json from_options(const ModelOptions& options, const TaskSizes& task) const = 0;
  virtual ModelOptions options(const nlohmann::json& section) const = 0;
  // The section with another dropout probability (fine-tuning a model with --drop-rate).
  virtual nlohmann::json with_dropout(const nlohmann::json& section, double p) const = 0;
};

}  // namespace headlab::nn
