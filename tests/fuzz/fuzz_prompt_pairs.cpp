// libFuzzer target: any bytes as a prompt-pair JSONL file (headlab heads/circuit --pairs) read for a chars
// model over data/tiny.txt: each row's JSON, its four fields, their tokens, the alignment of clean and
// corrupt, one-token answers that differ. What reads must be rows of one length in the vocabulary with
// answer != wrong. Seeds: tests/fuzz/corpus/prompt_pairs (tools/make_fuzz_corpus.sh).
#include "analysis/prompt_pairs.h"
#include "fuzz_util.h"
#include "tasks/chars.h"

using namespace headlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tasks::CharsTask task = [] {
    tasks::TaskOptions o;
    o.text_path = HEADLAB_SOURCE_DIR "/data/tiny.txt";
    return tasks::CharsTask(o);
  }();
  const std::string path = fuzz::scratch_path("pairs.jsonl");
  fuzz::write_file(path, data, size);
  try {
    const analysis::PromptPairs p = analysis::read_prompt_pairs(path, task);
    const int64_t V = task.vocab_size();
    if (p.rows() < 1 || p.T < 1 || static_cast<int64_t>(p.clean.size()) != p.rows() * p.T ||
        p.corrupt.size() != p.clean.size())
      __builtin_trap();
    for (size_t i = 0; i < p.clean.size(); ++i)
      if (p.clean[i] < 0 || p.clean[i] >= V || p.corrupt[i] < 0 || p.corrupt[i] >= V) __builtin_trap();
    for (int64_t r = 0; r < p.rows(); ++r)
      if (p.answer[static_cast<size_t>(r)] == p.wrong[static_cast<size_t>(r)]) __builtin_trap();
  } catch (const Error&) {}
  return 0;
}
