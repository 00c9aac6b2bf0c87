// libFuzzer target: GPT-2's byte-level BPE tokenizer (tasks/bpe_tokenizer). Any bytes as text to
// encode with a small vocabulary (decode must give the text back), and any bytes as vocab.json and
// merges.txt (split at the first NUL byte), encoding a sample and the bytes with what loads.
// Seeds: tests/fuzz/corpus/bpe (texts of many scripts; small vocab.json NUL merges.txt pairs).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/internal.h"

using namespace headlab;

namespace {

// The 256 byte tokens, a few merges' results and <|endoftext|>, as vocab.json and merges.txt do.
const tasks::BpeTokenizer& small_tokenizer() {
  static const tasks::BpeTokenizer tok = [] {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b)
      vocab[tasks::detail::encode_utf8(tasks::gpt2_byte_to_unicode(static_cast<uint8_t>(b)))] = b;
    const std::string merges =
        "#version: 0.2\n\xC4\xA0 t\nh e\nt h\nth e\n\xC4\xA0t he\na a\naa a\ni n\n\xC4\xA0 \xC4\xA0\n";
    const char* results[] = {"\xC4\xA0t",        "he",           "th", "the", "\xC4\xA0the", "aa", "aaa", "in",
                             "\xC4\xA0\xC4\xA0", "<|endoftext|>"};
    int id = 256;
    for (const char* r : results) vocab[r] = id++;
    return tasks::BpeTokenizer(vocab.dump(), merges);
  }();
  return tok;
}

void check_round_trip(const tasks::BpeTokenizer& tok, std::string_view text) {
  const std::vector<int64_t> ids = tok.encode(text, "fuzz input");  // throws on invalid UTF-8
  for (const int64_t id : ids)
    if (id < 0 || id >= tok.size()) __builtin_trap();
  if (tok.decode(ids) != text) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    check_round_trip(small_tokenizer(), bytes);
  } catch (const Error&) {}
  const size_t nul = bytes.find('\0');
  const std::string_view vocab = bytes.substr(0, nul);
  const std::string_view merges = nul == std::string_view::npos ? std::string_view() : bytes.substr(nul + 1);
  try {
    const tasks::BpeTokenizer tok(vocab, merges);
    check_round_trip(tok, "Hello world, the  theaaaa\t<|endoftext|> 東京 🙂\n");
    check_round_trip(tok, merges);
  } catch (const Error&) {}
  return 0;
}
