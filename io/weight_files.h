// A model's weights by name, whichever files hold them: safetensors files (io/safetensors.h) or PyTorch files
// (io/torch_file.h), one file or shards through their index. What a family's weight table (io/hf_weights.h) and
// the PyTorch layouts (io/torch_layouts.cpp) read from.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.h"

namespace headlab::io {

class TorchFile;

class WeightFiles {
 public:
  virtual ~WeightFiles() = default;
  virtual std::vector<std::string> names() const = 0;  // sorted
  virtual bool contains(const std::string& name) const = 0;
  virtual Shape shape(const std::string& name) const = 0;
  virtual std::string file_of(const std::string& name) const = 0;  // the file holding it, for errors
  virtual Tensor to_float(const std::string& name) const = 0;      // a new float32 CPU tensor of its shape
};

// A folder's weights: model.safetensors or model.safetensors.index.json, else pytorch_model.bin or
// pytorch_model.bin.index.json (shards beside it); errors name the folder and what it lacks.
std::unique_ptr<WeightFiles> open_folder_weights(const std::string& folder);

// Where a PyTorch file's state_dict is: the saved object itself where it maps names to tensors, else the first of
// its "model", "state_dict", "model_state_dict", "module" that does (nanoGPT's ckpt.pt, training scripts' dicts).
struct TorchStateDict {
  std::string key;  // "" (the object itself) or the key it is under
  std::vector<std::pair<std::string, int64_t>> tensors;  // name -> TorchFile::tensors() index, in the file's order
};
// Errors name the file and say what it holds instead (its keys); a value in the state_dict that is not a tensor
// (an object the file would build, an optimizer's state) is named. Prefixes torch.compile and DataParallel add
// to every name ("_orig_mod.", "module.") are taken off.
TorchStateDict find_state_dict(const TorchFile& file);

// A PyTorch file's state_dict as weight files (the file kept open for the reads).
std::unique_ptr<WeightFiles> torch_weights(std::shared_ptr<const TorchFile> file, const TorchStateDict& sd);

}  // namespace headlab::io
