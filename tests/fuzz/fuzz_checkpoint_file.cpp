// libFuzzer target: any bytes as a checkpoint file, through the path every command takes
// (HDF5 open, format checks, config, every dataset, model, task, one evaluation).
// Seeds: tests/fuzz/corpus/checkpoint_file (real checkpoints: trained, pruned, imported, chars).
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = headlab::fuzz::scratch_path("input.h5");
  headlab::fuzz::write_file(path, data, size);
  try {
    headlab::fuzz::exercise_checkpoint(path);
  } catch (const headlab::Error&) {}
  return 0;
}
