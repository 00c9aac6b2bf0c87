// libFuzzer target: BERT's WordPiece tokenizer (tasks/wordpiece_tokenizer.h). Any bytes as text to encode with a
// small uncased vocabulary (every id in range; decode and the specials' framing never fail on what encode gave), and
// any bytes as a vocab.txt or a tokenizer.json (split at the first NUL byte: the file, then a text), encoding the
// text with what loads. Seeds: tests/fuzz/corpus/wordpiece (texts of many scripts; vocabularies NUL texts).
#include "fuzz_util.h"
#include "tasks/wordpiece_tokenizer.h"

using namespace headlab;

namespace {

const tasks::WordPieceTokenizer& small_tokenizer() {
  static const auto tok = tasks::WordPieceTokenizer::from_vocab_txt(
      "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\n##s\n##at\nc\nh\n,\n.\n\xE6\x9D\xB1\n##\xC3\xA9\n", "vocab.txt");
  return *tok;
}

void check(const tasks::WordPieceTokenizer& tok, std::string_view text) {
  const std::vector<int64_t> ids = tok.encode(text, "fuzz input");  // throws on invalid UTF-8
  for (const int64_t id : ids)
    if (id < 0 || id >= tok.size()) __builtin_trap();
  (void)tok.decode(ids);
  if (tok.cls() && tok.encode_with_specials(text, "fuzz input").size() != ids.size() + 2) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    check(small_tokenizer(), bytes);
  } catch (const Error&) {}
  const size_t nul = bytes.find('\0');
  const std::string_view file = bytes.substr(0, nul);
  const std::string_view text =
      nul == std::string_view::npos ? std::string_view("the cats, Caf\xC3\xA9") : bytes.substr(nul + 1);
  try {
    const auto tok = tasks::is_wordpiece_tokenizer_json(file)
                         ? tasks::WordPieceTokenizer::from_tokenizer_json(file, "tokenizer.json")
                         : tasks::WordPieceTokenizer::from_vocab_txt(file, "vocab.txt");
    check(*tok, text);
  } catch (const Error&) {}
  return 0;
}
