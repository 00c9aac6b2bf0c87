// PyTorch's files (torch.save: .pt, .pth, .bin), read without running anything. A torch.save file is a zip
// archive: <name>/data.pkl (a pickle of the saved object), <name>/data/<key> (each storage's raw bytes) and
// <name>/byteorder ("little" or "big"; absent: little). The pickle is read by a restricted machine (io/torch_pickle.h) that knows
// containers, numbers, text and tensor rebuilds only (torch._utils._rebuild_tensor_v2, parameters,
// OrderedDict, the storage types); any other global it meets (an optimizer's class, os.system) is kept as a
// name and never called, and is an error only where what is asked for depends on it. The legacy format
// (before PyTorch 1.6) and TorchScript archives are refused by name.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/tensor.h"

namespace headlab::io {

// A tensor the pickle rebuilds: its elements in one of the archive's storages, as torch lays them out.
struct TorchTensor {
  std::string storage;          // the storage's key: its bytes are <archive>/data/<key>
  std::string dtype;            // the storage's element type, torch's name: "float32", "bfloat16", "int64", ...
  int64_t element_size = 0;     // its bytes
  int64_t storage_numel = 0;    // the storage's elements
  Shape shape;                  // sizes
  std::vector<int64_t> stride;  // in elements, one per size
  int64_t offset = 0;           // the first element's index in the storage
};

class TorchFile {
 public:
  // A zip archive (the reader says what else it lacks), or a file starting with the legacy format's magic number
  // (refused on reading with its name): a cheap look, never an error.
  static bool claims(const std::string& path);

  // Reads the archive's directory and its pickle (every storage's length checked against what the pickle
  // claims of it); the tensors' data is read on request. Errors name the file and the item.
  explicit TorchFile(const std::string& path);
  ~TorchFile();
  TorchFile(TorchFile&&) noexcept;
  TorchFile& operator=(TorchFile&&) noexcept;

  const std::string& path() const { return path_; }
  // The saved object as JSON: dicts as objects in their order (keys as text: 0 -> "0"), lists and tuples as
  // arrays, numbers, text and None as themselves, bytes as {"__bytes__": n}, a tensor as {"__tensor__": i}
  // (tensors()[i]), and an object it did not build as {"__object__": "torch.optim.adam.Adam"}.
  const nlohmann::ordered_json& value() const { return value_; }
  const std::vector<TorchTensor>& tensors() const { return tensors_; }
  // Tensor i as a new float32 CPU tensor of its shape (any storage dtype converted, byte order honoured); its
  // bytes read straight into it where they are float32 and contiguous. `name` is what errors call it.
  Tensor to_float(int64_t i, const std::string& name) const;
  // The globals the pickle asked to call or instantiate, never run (an optimizer's class, argparse.Namespace).
  const std::vector<std::string>& unbuilt() const { return unbuilt_; }

 private:
  struct Archive;
  std::string path_;
  std::unique_ptr<Archive> archive_;
  nlohmann::ordered_json value_;
  std::vector<TorchTensor> tensors_;
  std::vector<std::string> unbuilt_;
};

// The tensor index of a value written as {"__tensor__": i}, or -1.
int64_t torch_tensor_index(const nlohmann::ordered_json& v);
// The name of the first object the value holds that was not built ({"__object__": name}), anywhere inside; "".
std::string torch_unbuilt_object(const nlohmann::ordered_json& v);

}  // namespace headlab::io
