// The model families headlab knows, one registration line each (families.cpp): a family is its nn/
// modules and config (nn::ModelFamily, beside its modules) and, where it has one, its Hugging Face folder
// format (FolderFormat, beside its reader in io/). The registry answers which family a config section
// or a folder is, builds its model, counts its parameters, and hands the folders to their readers.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/tokenizer_files.h"
#include "nn/family.h"

namespace headlab::io {

// What a model folder holds, in headlab's terms.
struct FolderModel {
  nlohmann::json config;                // the family's config section
  NamedTensors parameters;              // float32 CPU tensors by headlab's state_dict names
  std::string vocab_path, merges_path;  // the tokenizer's files; "" where the folder lacks them
};

// A family's Hugging Face folders: the config.json model_types it reads, reading a folder (every tensor's
// presence and shape checked against its config; errors name the file and tensor) and writing a model
// back as a folder the family's PyTorch class loads.
class FolderFormat {
 public:
  virtual ~FolderFormat() = default;
  virtual std::vector<std::string> model_types() const = 0;
  virtual nlohmann::json read_config(const std::string& folder) const = 0;  // config.json alone, as a section
  virtual FolderModel read(const std::string& folder) const = 0;
  virtual void write(const std::string& folder, const nn::Model& model, const TokenizerFiles& tokenizer) const = 0;
  // What inspect says of a folder beside its config and parameters ("head: tied to wte").
  virtual std::string describe(const FolderModel& m) const = 0;
};

struct Family {
  const nn::ModelFamily& model;
  const FolderFormat* folder = nullptr;  // null: no folder format
};

const std::vector<Family>& families();
// The family of a config section, by its "arch" (absent: "gpt"); errors name the value and the families.
const Family& family_of(const nlohmann::json& section);
// The family named by --arch; errors start with who.
const Family& family_named(const std::string& arch, const std::string& who);
std::vector<std::string> family_names();  // for --arch's choices
std::string families_help();              // "gpt (...) | encoder-decoder (...)"

// A model of a config section (checked first; errors name the key), initial values from the default generator.
std::shared_ptr<nn::Model> make_model(const nlohmann::json& section);
double num_parameters(const nlohmann::json& section);  // without building

// The family reading a Hugging Face folder, by its config.json's model_type; errors name the file.
const Family& family_of_folder(const std::string& folder);
// The folder's model on the CPU in eval mode: built without initial values (nn::SkipInit), each parameter
// taking over its tensor's memory (adopt_parameters), so the weights are held once.
std::shared_ptr<nn::Model> build_folder_model(FolderModel&& m, const std::string& folder);

}  // namespace headlab::io
