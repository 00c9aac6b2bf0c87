// Byte-level BPE's vocabulary (tasks/bpe_internal.h), as either source gives it: the model's tokens and
// their ids, the merges by rank, the added tokens, then the bytes each token stands for through GPT-2's
// bytes_to_unicode map and the 256 single-byte tokens.
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/json_fields.h"
#include "tasks/bpe_internal.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/internal.h"

namespace headlab::tasks {

using namespace detail;

namespace {

// bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 for 256, 257, ...
std::array<char32_t, 256> make_byte_to_unicode() {
  std::array<char32_t, 256> map{};
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[static_cast<size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
  return map;
}
const std::array<char32_t, 256> kByteToUnicode = make_byte_to_unicode();

// The UTF-8 of a vocabulary spelling -> the bytes it stands for; nullopt when some character is not
// one of the 256 byte characters (a special token such as <|endoftext|> is all printable bytes, so it
// maps to itself).
std::optional<std::string> spelling_to_bytes(const std::string& spelling,
                                             const std::unordered_map<char32_t, uint8_t>& to_byte) {
  std::string out;
  size_t pos = 0;
  while (pos < spelling.size()) {
    uint32_t cp = 0;
    if (!detail::next_code_point(spelling, pos, cp)) return std::nullopt;
    const auto it = to_byte.find(static_cast<char32_t>(cp));
    if (it == to_byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
  }
  return out;
}

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t b) { return kByteToUnicode[b]; }

// ---------------------------------------------------------------------------------------------
// Building: the model vocabulary, merges, added tokens, then the bytes of every token

// The model vocabulary: an object of spelling -> id, its ids numbering its n tokens 0..n-1.
void BpeTokenizer::Impl::read_vocab(const json& vocab, const std::string& vn) {
  HL_CHECK(vocab.is_object(), vn, ": expected a JSON object of token -> id, got a ", vocab.type_name());
  const size_t n = vocab.size();
  HL_CHECK(n > 0 && n <= static_cast<size_t>(INT32_MAX), vn, ": expected 1 to 2^31-1 tokens, got ", n);
  spellings.assign(n, std::string());
  std::vector<char> taken(n, 0);
  index.reserve(n);
  for (const auto& [key, value] : vocab.items()) {
    int64_t id = -1;
    HL_CHECK(json_to_integer(value, id), vn, ": key ", json_text(key), " has id ", json_text(value),
             ", expected an integer");
    HL_CHECK(id >= 0 && static_cast<size_t>(id) < n, vn, ": key ", json_text(key), " has id ", id, ", outside 0..",
             n - 1, " (ids must number the ", n, " tokens)");
    HL_CHECK(!taken[static_cast<size_t>(id)], vn, ": id ", id, " is given to both ",
             json_text(spellings[static_cast<size_t>(id)]), " and ", json_text(key));
    HL_CHECK(!key.empty(), vn, ": the empty string is not a token (id ", id, ")");
    taken[static_cast<size_t>(id)] = 1;
    spellings[static_cast<size_t>(id)] = key;
    index.emplace(key, static_cast<int32_t>(id));
  }
}

// The merge of two tokens, next in rank; where names it in errors ("merges.txt: line 3"), vn the
// vocabulary. A merge seen before is not added: its rank comes back.
std::optional<int32_t> BpeTokenizer::Impl::add_merge(std::string_view left, std::string_view right,
                                                     const std::string& where, const std::string& vn) {
  const auto a = index.find(left), b = index.find(right);
  HL_CHECK(a != index.end(), where, ": ", json_text(std::string(left)), " is not in ", vn);
  HL_CHECK(b != index.end(), where, ": ", json_text(std::string(right)), " is not in ", vn);
  const std::string joined = std::string(left) + std::string(right);
  const auto c = index.find(joined);
  HL_CHECK(c != index.end(), where, ": the merge's result ", json_text(joined), " is not in ", vn);
  const auto [it, fresh] =
      merges.emplace(pair_key(a->second, b->second), Merge{static_cast<int32_t>(merges.size()), c->second});
  if (!fresh) return it->second.rank;
  return std::nullopt;
}

// An added token: the model's token of that spelling (same id), or a new one.
void BpeTokenizer::Impl::add_token(const std::string& content, int64_t id, const std::string& where) {
  HL_CHECK(!content.empty(), where, ": content is empty");
  HL_CHECK(id >= 0 && id < INT32_MAX, where, ": id ", id, " is not a token id");
  if (const auto it = index.find(content); it != index.end()) {
    HL_CHECK(it->second == id, where, ": ", json_text(content), " has id ", id, ", but it is token ", it->second);
  } else {
    if (static_cast<size_t>(id) >= spellings.size()) spellings.resize(static_cast<size_t>(id) + 1);
    HL_CHECK(spellings[static_cast<size_t>(id)].empty(), where, ": id ", id, " is given to both ",
             json_text(spellings[static_cast<size_t>(id)]), " and ", json_text(content));
    spellings[static_cast<size_t>(id)] = content;
    index.emplace(content, static_cast<int32_t>(id));
  }
  added.push_back({content, static_cast<int32_t>(id)});
}

// Once every token is known: no id left without one, the 256 byte tokens, each token's bytes (model
// tokens by the byte characters, added tokens their content as written), the model's size.
void BpeTokenizer::Impl::finish(size_t model_tokens, int64_t vocab_size, const std::string& vn) {
  const size_t n = spellings.size();
  for (size_t id = 0; id < n; ++id)
    HL_CHECK(!spellings[id].empty(), vn, ": id ", id, " names no token (ids must number the ", n, " tokens)");
  HL_CHECK(vocab_size <= 0 || static_cast<int64_t>(n) <= vocab_size, vn, ": ", n,
           " tokens, more than the model's vocab_size ", vocab_size);
  rows = std::max(static_cast<int64_t>(n), vocab_size);
  std::unordered_map<char32_t, uint8_t> to_byte;
  for (int b = 0; b < 256; ++b) {
    const char32_t u = kByteToUnicode[static_cast<size_t>(b)];
    to_byte.emplace(u, static_cast<uint8_t>(b));
    const auto it = index.find(detail::encode_utf8(u));
    HL_CHECK(it != index.end() && static_cast<size_t>(it->second) < model_tokens, vn, ": lacks the token ",
             json_text(detail::encode_utf8(u)), " of byte ", b, " (a byte-level vocabulary has all 256)");
    byte_id[static_cast<size_t>(b)] = it->second;
  }
  bytes.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::optional<std::string> b = id < model_tokens ? spelling_to_bytes(spellings[id], to_byte) : std::nullopt;
    bytes.push_back(b.value_or(spellings[id]));
    if (ignore_merges && b) model_bytes.emplace(*b, static_cast<int32_t>(id));
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
}

void BpeTokenizer::Impl::check_id(int64_t id) const {
  const int64_t n = static_cast<int64_t>(spellings.size());
  HL_CHECK(id < n || id >= rows, name, ": id ", id, " is a padding row of the model's vocabulary of ", rows,
           " (the tokenizer's tokens are ids 0..", n - 1, ")");
  HL_CHECK(id >= 0 && id < n, name, ": expected a token id in 0..", n - 1, ", got ", id);
}

}  // namespace headlab::tasks
