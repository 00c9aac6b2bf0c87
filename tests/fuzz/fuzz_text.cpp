// libFuzzer target: any bytes as the text file of a chars task (headlab train --task chars --text F):
// reading, UTF-8 decoding, the vocabulary, both splits' batches, and encode/decode of a prompt.
// Also the same bytes as a tokenizer's stored vocabulary (one entry per line).
// Seeds: tests/fuzz/corpus/text (data/tiny.txt, accented and multi-byte text, tiny files).
#include <sstream>

#include "fuzz_util.h"
#include "tasks/chars.h"

using namespace headlab;

namespace {

void check_text(const std::string& path) {
  tasks::TaskOptions options;
  options.text_path = path;
  const tasks::CharsTask task(options);
  const tasks::Tokenizer& tok = task.tokenizer();
  for (tasks::Split split : {tasks::Split::train, tasks::Split::val}) {
    const auto [begin, end] = task.region(split);
    const int64_t T = std::min<int64_t>(end - begin - 1, 8);
    if (T < 1) continue;
    task.check_context_length(T);
    const tasks::Batch b = task.batch(split, 3, 2, T);
    for (size_t i = 0; i < b.inputs.size(); ++i)
      if (b.inputs[i] < 0 || b.inputs[i] >= tok.size() || b.targets[i] < 0 || b.targets[i] >= tok.size())
        __builtin_trap();
  }
  // Every character of the text is in its vocabulary, and ids decode back to the text.
  const std::vector<int32_t>& ids32 = task.text_ids();
  const std::vector<int64_t> ids(ids32.begin(), ids32.begin() + std::min<size_t>(ids32.size(), 64));
  const std::string prefix = tok.decode(ids);
  if (tok.encode(prefix) != ids) __builtin_trap();
  const tasks::Prompt p = task.encode_prompt(prefix);
  if (task.format_answer(p.ids) != prefix) __builtin_trap();
}

void check_vocabulary(const std::string& text) {
  std::vector<std::string> entries;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) entries.push_back(line);
  const tasks::Tokenizer tok(entries, "fuzz");
  for (int64_t id = 0; id < tok.size(); ++id)
    if (tok.find(tok.decode({id})) != id) __builtin_trap();
  tok.encode(text, "text", false);  // throws unless every character is an entry
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch_path("input.txt");
  fuzz::write_file(path, data, size);
  try {
    check_text(path);
  } catch (const Error&) {}
  try {
    check_vocabulary(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const Error&) {}
  return 0;
}
