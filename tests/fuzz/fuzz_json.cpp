// libFuzzer target: any bytes as JSON text through base/json_text.h, the one reader of every JSON file and
// string (config.json, tokenizer files, vocab.json, safetensors headers and indexes, prompt-pair rows, checkpoint
// attributes). It parses or throws headlab::Error; what it parses has no NUL byte, is nested no deeper than the
// limit, and dumps and parses back to itself.
// Seeds: tests/fuzz/corpus/json (a config.json, a tokenizer.json with a repeated vocab key, a prompt-pair row).
#include <algorithm>
#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "base/json_text.h"

using namespace headlab;

namespace {

int depth_of(const nlohmann::json& j) {
  int deepest = 0;
  if (j.is_structured())
    for (const auto& v : j) deepest = std::max(deepest, depth_of(v));
  return j.is_structured() ? deepest + 1 : 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const JsonLimits limits{.max_depth = 16, .depth_expected = {}, .watch = {"model", "vocab"}};
  try {
    std::string repeated;
    const nlohmann::json j = parse_json_text(text, "fuzz.json", limits, &repeated);
    if (text.find('\0') != std::string_view::npos || depth_of(j) > limits.max_depth) __builtin_trap();
    if (parse_json_text(j.dump(), "dump", limits) != j) __builtin_trap();
    if (!repeated.empty() && !j.at("model").at("vocab").contains(repeated)) __builtin_trap();
  } catch (const Error&) {}
  return 0;
}
