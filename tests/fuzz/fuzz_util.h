// What the libFuzzer targets share: a scratch folder for the files they feed the loaders, and the
// path every command takes from a checkpoint file to a model run on its task.
//
// The contract under test: whatever the bytes, the library either works or throws headlab::Error.
// Targets catch headlab::Error only, so any other exception, a crash, a sanitizer report, a hang
// (-timeout) or an allocation past -malloc_limit_mb is a finding.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

#include "../process_util.h"
#include "io/checkpoint.h"
#include "nn/decoder_family.h"
#include "train/config.h"
#include "train/evaluate.h"

namespace headlab::fuzz {

// <scratch folder>/<name>, one folder per process, removed at exit. In memory where the machine
// has /dev/shm: the checkpoint writer fsyncs every file.
inline std::string scratch_path(const std::string& name) {
  static const testing::TempDir dir("headlab_fuzz", ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  return dir.path(name);
}

inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// What `headlab eval` does with a checkpoint, at a tiny size: load and validate the file, build
// the model and the task its config describes, score one batch of two rows. (The loader bounds the
// model by the file's size, so this stays small.)
inline void exercise_checkpoint(const std::string& path) {
  const io::Checkpoint ck = io::load_checkpoint(path);
  const auto model = io::model_from_checkpoint<nn::DecoderModel>(ck, path);
  // A chars config names its text by the absolute path it was trained on; use this tree's.
  const auto task = train::RunConfig::from_json(ck.config).make_task(HEADLAB_SOURCE_DIR "/data/tiny.txt");
  const int64_t T = model->config().context_length;
  task->check_context_length(T);
  train::evaluate(*model, *task, 1, 2, T);
}

}  // namespace headlab::fuzz
