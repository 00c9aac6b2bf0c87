// libFuzzer target: any bytes as the JSON config a checkpoint carries (its root attribute
// `config`): parse, RunConfig::from_json, the round trip through to_json, the task it names,
// one batch of it. Seeds: tests/fuzz/corpus/config (configs of real checkpoints).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"

using namespace headlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON: the loader reports nlohmann's message (io/checkpoint.cpp)
  }
  try {
    const train::RunConfig config = train::RunConfig::from_json(j);
    // What a checkpoint stores must read back as the same config.
    const nlohmann::json stored = config.to_json();
    if (train::RunConfig::from_json(stored).to_json() != stored) __builtin_trap();
    const auto task = config.make_task();
    const int64_t T = std::min<int64_t>(config.batch_tokens(), 64);
    task->check_context_length(T);
    const tasks::Batch batch = task->batch(tasks::Split::val, 0, 2, T);
    for (int64_t id : batch.inputs)
      if (id < 0 || id >= task->vocab_size()) __builtin_trap();  // every input id is a token
  } catch (const Error&) {}
  return 0;
}
