// libFuzzer target: any bytes as a PyTorch file (io/torch_file.h): the zip archive, the restricted unpickler,
// every tensor's float32 conversion, and the state_dict and layout a model source finds in it (io/sources.h).
// Seeds: tests/fuzz/corpus/torch (tests/fixtures/torch_files' small files: every dtype and view, big-endian,
// nested with optimizer state, nanoGPT's layout, the hostile ones).
#include "fuzz_util.h"
#include "io/sources.h"
#include "io/torch_file.h"
#include "io/weight_files.h"

using namespace headlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("model.pt");
  fuzz::write_file(path, data, size);
  try {
    const io::TorchFile f(path);
    for (int64_t i = 0; i < static_cast<int64_t>(f.tensors().size()); ++i) {
      const Tensor t = f.to_float(i, "t");
      if (t.shape() != f.tensors()[static_cast<size_t>(i)].shape) __builtin_trap();
    }
    io::find_state_dict(f);
  } catch (const Error&) {}
  try {
    if (const io::ModelSource* s = io::source_claiming(path)) s->read(path);
  } catch (const Error&) {}
  return 0;
}
