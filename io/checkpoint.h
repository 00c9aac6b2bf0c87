// HDF5 checkpoints (ARCHITECTURE.md section 7): one self-describing file holding the model config,
// tokenizer, task and training settings (root attribute `config`, JSON), every parameter under its
// state_dict name, the optimizer state and the trainer state needed for a bit-exact resume.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/tokenizer_files.h"
#include "nn/decoder.h"
#include "optim/optim.h"

namespace headlab::io {

constexpr int64_t kCheckpointVersion = 1;

struct MetricRow {
  int64_t step = 0;
  double train_loss = 0, val_loss = 0, val_accuracy = 0, val_exact_match = 0, lr = 0, grad_norm = 0, tokens_per_s = 0;
};

struct TrainerState {
  int64_t step = 0;       // optimizer steps done
  uint64_t rng_seed = 0;  // the default Generator (dropout), so resume replays the same masks
  uint64_t rng_offset = 0;
  uint64_t data_index = 0;     // next training batch index
  double elapsed_seconds = 0;  // training time so far
  std::vector<MetricRow> metrics;
};

struct Checkpoint {
  nlohmann::json config;  // {"model": the family's section, "tokenizer": {...}, "task": {...}, "training": {...}}
  NamedTensors model;     // CPU tensors by state_dict name
  // A subword tokenizer's files (config "tokenizer": {"type": files' type}); empty for the character
  // tokenizer, whose vocabulary the config holds.
  TokenizerFiles tokenizer;
  bool has_optimizer = false;
  optim::OptimizerOptions optimizer;
  NamedTensors optimizer_state;
  std::vector<std::pair<std::string, int64_t>> optimizer_steps;
  bool has_trainer = false;
  TrainerState trainer;
};

// Writes atomically (temp file, fsync, rename). Parameters are stored as float32.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);
// Reads and validates everything (format, version, config, every dataset's dtype, shape against the
// config's model, checksum); the first problem is one Error naming the file and the item.
Checkpoint load_checkpoint(const std::string& path);

// The model described by a checkpoint's config (any family: io/families.h), its parameters loaded, in eval mode.
std::shared_ptr<nn::Model> load_model(const Checkpoint& ckpt, const std::string& path, Device device = kCPU);
// The same, each parameter taking over its tensor's memory where it can (nn::Module::adopt_parameters): ckpt.model
// then holds the model's own parameters (on the CPU; as a folder's are), so the weights are held once, not twice.
std::shared_ptr<nn::Model> adopt_model(Checkpoint& ckpt, const std::string& path, Device device = kCPU);
// The same as M (a decoder by default, or a family's own class): another kind of model is a clear error.
template <typename M = nn::DecoderModel>
std::shared_ptr<M> model_from_checkpoint(const Checkpoint& ckpt, const std::string& path, Device device = kCPU) {
  std::shared_ptr<nn::Model> model = load_model(ckpt, path, device);
  auto typed = std::dynamic_pointer_cast<M>(model);
  HL_CHECK(typed, "checkpoint '", path, "': holds a ", model->type_name(), "; this needs a decoder (a GPT checkpoint)");
  return typed;
}
// Snapshot of a live model's parameters (CPU float32 copies).
NamedTensors snapshot_parameters(const nn::Module& model);

}  // namespace headlab::io
