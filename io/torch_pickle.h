// The pickle inside a PyTorch file (torch.save's data.pkl), read by a restricted machine: it builds dicts (and
// OrderedDicts), lists, tuples, sets as lists, numbers, text, bytes and tensor rebuilds (torch._utils.
// _rebuild_tensor_v2 and the parameters', whose storages come as persistent ids), and nothing else: any other global
// (an optimizer's class, os.system) is kept as its name and never called, and what is built from it stays unbuilt.
// Every tensor's elements are checked to lie in its storage; the value's nesting and size are bounded.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/torch_file.h"

namespace headlab::io {

// A storage the pickle names by its persistent id: its bytes are <archive>/data/<key>.
struct TorchStorage {
  std::string key;
  std::string dtype;  // torch's name: "float32"
  int64_t element_size = 0;
  int64_t numel = 0;
};

struct Unpickled {
  nlohmann::ordered_json value;          // as TorchFile::value() says
  std::vector<TorchStorage> storages;    // in the order first named
  std::vector<TorchTensor> tensors;      // {"__tensor__": i} in value is tensors[i]
  std::vector<std::string> unbuilt;      // the globals called or instantiated, never run
};

// who names the pickle in errors ("x.pt: data.pkl"): a damaged pickle says its byte and what is wrong.
Unpickled unpickle(std::string_view bytes, const std::string& who);

}  // namespace headlab::io
