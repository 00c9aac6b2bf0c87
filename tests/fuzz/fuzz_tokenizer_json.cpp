// libFuzzer target: a Hugging Face tokenizer.json read into the byte-level BPE engine (tasks/bpe_tokenizer).
// The bytes up to the first NUL are the tokenizer.json, the rest a text; when the file loads, a sample and
// the text are encoded (ids within the tokenizer) and the ids decoded. Fuzzed patterns reach PCRE2: its
// match limits turn a catastrophic pattern into headlab::Error, not a hang.
// Seeds: tests/fuzz/corpus/tokenizer_json (tools/make_fuzz_corpus.sh).
#include "fuzz_util.h"
#include "tasks/bpe_tokenizer.h"

using namespace headlab;

namespace {

void check_encode(const tasks::BpeTokenizer& tok, std::string_view text) {
  std::vector<int64_t> ids;
  try {
    ids = tok.encode(text, "fuzz text");
  } catch (const Error&) {
    return;  // invalid UTF-8, or a pattern PCRE2 gave up on
  }
  for (const int64_t id : ids)
    if (id < 0 || id >= tok.tokens()) __builtin_trap();
  tok.decode(ids);  // what encode gives, decode takes: an Error here escapes and is a finding
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const size_t nul = bytes.find('\0');
  const std::string_view json = bytes.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : bytes.substr(nul + 1);
  std::optional<tasks::BpeTokenizer> tok;
  try {
    tok.emplace(tasks::BpeTokenizer::from_tokenizer_json(json, "fuzz tokenizer.json", 0, text, "fuzz config"));
  } catch (const Error&) {
    try {  // the rest as a text instead of a tokenizer_config.json
      tok.emplace(tasks::BpeTokenizer::from_tokenizer_json(json, "fuzz tokenizer.json"));
    } catch (const Error&) {
      return 0;
    }
  }
  check_encode(*tok,
               "Hello world, it's 2024!\n\n  \xE6\x9D\xB1\xE4\xBA\xAC Cafe\xCC\x81 \xF0\x9F\x99\x82<|endoftext|>");
  check_encode(*tok, text);
  return 0;
}
