// libFuzzer target: any bytes as a safetensors file (io/safetensors): the header's checks, every
// tensor's view and float32 conversion, the model-level open, and the same bytes as a sharded
// model's index (model.safetensors.index.json) beside it.
// Seeds: tests/fuzz/corpus/safetensors (files of io::write_safetensors, F16/BF16/I64 files, an index).
#include "fuzz_util.h"
#include "io/safetensors.h"

using namespace headlab;

namespace {

void check_file(const std::string& path) {
  const io::SafetensorsFile f(path);
  for (const auto& [name, e] : f.entries()) {
    const auto bytes = f.bytes(name);
    if (bytes.size() != e.end - e.begin) __builtin_trap();
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16") continue;
    const Tensor t = f.to_float(name);
    if (t.shape() != e.shape || static_cast<size_t>(t.numel()) * io::safetensors_dtype_size(e.dtype) != bytes.size())
      __builtin_trap();
  }
  const io::SafetensorsModel m = io::SafetensorsModel::open(path);
  if (m.names().size() != f.entries().size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("model.safetensors");
  fuzz::write_file(path, data, size);
  try {
    check_file(path);
  } catch (const Error&) {}
  // As an index: its weight_map may name model.safetensors, the file just written.
  const std::string index = fuzz::scratch_path("model.safetensors.index.json");
  fuzz::write_file(index, data, size);
  try {
    const io::SafetensorsModel m = io::SafetensorsModel::open(index);
    for (const std::string& name : m.names()) m.file_of(name).entry(name);
  } catch (const Error&) {}
  return 0;
}
