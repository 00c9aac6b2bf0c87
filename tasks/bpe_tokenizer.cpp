// Byte-level BPE (see bpe_tokenizer.h): the engine (added tokens split out of the text, the
// pre-tokenizer's PCRE2 splits, the merge loop: a heap over adjacent pairs, O(n log n) per pre-token,
// and a cache of pre-token -> ids, which is what makes English text fast), then its two sources:
// GPT-2's vocab.json + merges.txt, and a Hugging Face tokenizer.json (+ tokenizer_config.json).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tasks/bpe_tokenizer.h"

#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "base/json_fields.h"
#include "base/json_text.h"
#include "tasks/internal.h"

namespace headlab::tasks {

namespace {

using json = nlohmann::json;

constexpr const char* kWho = "BPE tokenizer";
constexpr size_t kMaxCachedBytes = 64;         // longer pre-tokens are rare: merged each time
constexpr size_t kMaxCacheEntries = 1u << 18;  // the cache starts over past this many
constexpr int kMaxJsonDepth = 32;              // tokenizer.json nests 5 deep; deeper is refused early
constexpr const char* kDepthExpected = "expected at most 32 levels of nesting";
// EOS of a tokenizer.json without tokenizer_config.json: the first of these that is a token.
constexpr const char* kEosNames[] = {"<|endoftext|>", "<|end_of_text|>", "<|im_end|>"};

// bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 for 256, 257, ...
std::array<char32_t, 256> make_byte_to_unicode() {
  std::array<char32_t, 256> map{};
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) map[static_cast<size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
  return map;
}
const std::array<char32_t, 256> kByteToUnicode = make_byte_to_unicode();

// A hash that lets unordered maps keyed by std::string be searched with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

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

// "left right" -> its two tokens; false unless exactly one space separates two non-empty tokens (a
// byte-level token never holds a space: that is "Ġ").
bool split_merge(std::string_view merge, std::string_view& left, std::string_view& right) {
  const size_t space = merge.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == merge.size() ||
      merge.find(' ', space + 1) != std::string_view::npos)
    return false;
  left = merge.substr(0, space), right = merge.substr(space + 1);
  return true;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

// A JSON value in a message, cut short: a field may hold a whole vocabulary.
std::string shown(const json& v) {
  const std::string s = json_text(v);
  return s.size() <= 80 ? s : detail::valid_utf8(std::string_view(s).substr(0, 77)) + "...";
}

// ---- PCRE2 ----

std::string pcre2_message(int error) {
  std::array<PCRE2_UCHAR, 256> msg{};
  pcre2_get_error_message(error, msg.data(), msg.size());
  return reinterpret_cast<const char*>(msg.data());
}

struct CodeFree {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Pcre2Code = std::unique_ptr<pcre2_code, CodeFree>;

// A pre-tokenizer pattern as Hugging Face's Oniguruma reads it: over code points, with Unicode's
// categories and spaces (\p{L}, \s); literal for a Split whose pattern is {"String": ...}.
Pcre2Code compile_pattern(std::string_view pattern, bool literal, const std::string& what) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &error, &error_offset, nullptr);
  HL_CHECK(code != nullptr, what, ": PCRE2 cannot compile the pattern ", json_text(std::string(pattern)), " (",
           pcre2_message(error), " at offset ", error_offset, ")");
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where PCRE2 has no JIT, it interprets: same matches
  return Pcre2Code(code);
}

// One match's bounds, whatever the pattern (its groups are not read): shared by every split of an encode.
struct Pcre2MatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  Pcre2MatchData() { HL_CHECK(data != nullptr, kWho, ": out of memory for a PCRE2 match"); }
  ~Pcre2MatchData() { pcre2_match_data_free(data); }
  Pcre2MatchData(const Pcre2MatchData&) = delete;
  Pcre2MatchData& operator=(const Pcre2MatchData&) = delete;
};

// ---- ICU ----

// Text (valid UTF-8) in Unicode's normal form C, by ICU: UTF-8 -> UTF-16 -> NFC -> UTF-8.
std::string to_nfc(std::string_view text, const std::string& who) {
  HL_CHECK(text.size() < (1u << 30), who, ": a text of ", text.size(), " bytes is too long to normalise");
  const auto check = [&](UErrorCode err) {
    HL_CHECK(U_SUCCESS(err), who, ": ICU's NFC normaliser failed (", u_errorName(err), ")");
  };
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&err);
  check(err);
  std::u16string in(text.size(), u'\0');  // UTF-16 never needs more units than UTF-8 has bytes
  int32_t length = 0;
  u_strFromUTF8(in.data(), static_cast<int32_t>(in.size()), &length, text.data(), static_cast<int32_t>(text.size()),
                &err);
  check(err);
  in.resize(static_cast<size_t>(length));
  std::u16string normal(in.size(), u'\0');  // composing shortens; the rare longer result is measured first
  length = unorm2_normalize(nfc, in.data(), static_cast<int32_t>(in.size()), normal.data(),
                            static_cast<int32_t>(normal.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    normal.resize(static_cast<size_t>(length));
    length = unorm2_normalize(nfc, in.data(), static_cast<int32_t>(in.size()), normal.data(),
                              static_cast<int32_t>(normal.size()), &err);
  }
  check(err);
  normal.resize(static_cast<size_t>(length));
  std::string out(normal.size() * 3, '\0');  // a UTF-16 unit is at most 3 bytes of UTF-8
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &length, normal.data(), static_cast<int32_t>(normal.size()),
              &err);
  check(err);
  out.resize(static_cast<size_t>(length));
  return out;
}

// ---- JSON files ----

// text as JSON (base/json_text.h); `repeated` gets the first key seen twice in the object at `watch`.
json parse_json(std::string_view text, const std::string& name, int max_depth, std::string_view depth_expected,
                const std::vector<std::string>& watch, std::string& repeated) {
  return parse_json_text(text, name, {.max_depth = max_depth, .depth_expected = depth_expected, .watch = watch},
                         &repeated);
}

// A JSON file's fields, every error naming the file and the field's path ("model.merges[3]").
struct Fields {
  const std::string& file;

  static std::string join(const std::string& path, std::string_view key) {
    return path.empty() ? std::string(key) : path + "." + std::string(key);
  }
  // obj[key], nullptr when absent or null (optional fields).
  static const json* find(const json& obj, std::string_view key) {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& object(const json& v, const std::string& path) const {
    HL_CHECK(v.is_object(), file, ": ", path.empty() ? "the file" : path, " must be an object, got ", shown(v));
    return v;
  }
  const json& need(const json& obj, const std::string& path, std::string_view key) const {
    const json* v = find(obj, key);
    HL_CHECK(v != nullptr, file, ": ", join(path, key), " is missing");
    return *v;
  }
  std::string text(const json& obj, const std::string& path, std::string_view key) const {
    const json& v = need(obj, path, key);
    HL_CHECK(v.is_string(), file, ": ", join(path, key), " must be a string, got ", shown(v));
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& path, std::string_view key, bool fallback) const {
    const json* v = find(obj, key);
    if (v == nullptr) return fallback;
    HL_CHECK(v->is_boolean(), file, ": ", join(path, key), " must be true or false, got ", shown(*v));
    return v->get<bool>();
  }
  const json& array(const json& obj, const std::string& path, std::string_view key) const {
    const json& v = need(obj, path, key);
    HL_CHECK(v.is_array(), file, ": ", join(path, key), " must be a list, got ", shown(v));
    return v;
  }
};

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t b) { return kByteToUnicode[b]; }

struct BpeTokenizer::Impl {
  std::string name;                    // in errors: "BPE tokenizer", or the tokenizer.json's name
  bool gpt2_files = false;             // read from vocab.json + merges.txt
  std::vector<std::string> spellings;  // (n,) id -> its vocabulary spelling, or an added token's content
  std::vector<std::string> bytes;      // (n,) id -> the bytes it stands for
  TokenIndex index;                    // spelling -> id
  int64_t rows = 0;                    // size(): the model's embedding rows, n or more
  std::array<int32_t, 256> byte_id{};  // byte -> id of its single-byte token
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id) -> rank, merged id
  // Added tokens, split out of the text before anything else: longest first, so that of two
  // starting at the same place the longer wins (as Hugging Face's leftmost-longest matcher).
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added;
  bool nfc = false;  // the normalizer
  // The pre-tokenizer, a chain of steps: each splits its piece into matches and the stretches
  // between them (Hugging Face's "Isolated"), or prefixes a space (ByteLevel's add_prefix_space).
  struct Step {
    Pcre2Code split;  // null: the prefix space
  };
  std::vector<Step> steps;
  bool ignore_merges = false;  // a pre-token that is a model token is that token (Llama 3)
  TokenIndex model_bytes;      // ignore_merges: the bytes of each model token -> its id
  std::optional<int32_t> bos, eos;
  TokenizerFiles files;  // the files as given, for a checkpoint to carry

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  void read_vocab(const json& vocab, const std::string& vn);
  std::optional<int32_t> add_merge(std::string_view left, std::string_view right, const std::string& where,
                                   const std::string& vn);
  void add_token(const std::string& content, int64_t id, const std::string& where);
  void finish(size_t model_tokens, int64_t vocab_size, const std::string& vn);
  void check_id(int64_t id) const;
  // tokenizer.json's parts
  void read_model(const json& j, const Fields& f);
  void read_added_tokens(const json& j, const Fields& f);
  void read_normalizer(const json& j, const Fields& f);
  void read_pre_tokenizer(const json& v, const std::string& p, const Fields& f, bool& byte_level);
  std::optional<int32_t> read_post_processor(const json& v, const std::string& p, const Fields& f) const;
  std::optional<int32_t> config_token(const json& config, const char* key, const Fields& f) const;

  template <typename OnText>
  void split_added(std::string_view text, std::vector<int64_t>& out, OnText&& on_text) const;
  void pre_tokenize(std::string_view piece, size_t step, pcre2_match_data* match, std::vector<int64_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<int64_t>& out) const;
};

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

// ---------------------------------------------------------------------------------------------
// Encoding

// The text's stretches between added tokens go to on_text; each added token's id goes to out. The
// leftmost occurrence wins, the longest of those starting there (as Hugging Face's matcher).
template <typename OnText>
void BpeTokenizer::Impl::split_added(std::string_view text, std::vector<int64_t>& out, OnText&& on_text) const {
  std::vector<size_t> at(added.size());  // each token's next occurrence at or after `begin`
  for (size_t i = 0; i < added.size(); ++i) at[i] = text.find(added[i].content);
  size_t begin = 0;
  for (;;) {
    size_t best = std::string_view::npos, which = 0;
    for (size_t i = 0; i < added.size(); ++i) {
      if (at[i] < begin) at[i] = text.find(added[i].content, begin);  // overlapped by the last match
      if (at[i] < best) best = at[i], which = i;                      // ties: the first, the longest
    }
    if (best == std::string_view::npos) break;
    on_text(text.substr(begin, best - begin));
    out.push_back(added[which].id);
    begin = best + added[which].content.size();
  }
  on_text(text.substr(begin));
}

// A piece through the pre-tokenizer's steps from `step` on, then merged. Each split sees its piece
// alone (a lookahead such as \s+(?!\S) stops at the piece's end), as in Hugging Face's library.
void BpeTokenizer::Impl::pre_tokenize(std::string_view piece, size_t step, pcre2_match_data* match,
                                      std::vector<int64_t>& out) const {
  if (piece.empty()) return;
  if (step == steps.size()) {
    merge_piece(piece, out);
    return;
  }
  const pcre2_code* code = steps[step].split.get();
  if (code == nullptr) {  // add_prefix_space, unless the piece starts with one
    if (piece[0] == ' ')
      pre_tokenize(piece, step + 1, match, out);
    else
      pre_tokenize(" " + std::string(piece), step + 1, match, out);
    return;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t gap = 0, at = 0;  // the stretch no match has covered starts at gap; the next search at `at`
  while (at < piece.size()) {
    // encode checked the text once: no UTF-8 check per match.
    const int rc = pcre2_match(code, subject, piece.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    HL_CHECK(rc >= 0, name, ": the pre-tokenizer failed at byte offset ", at, ": ", pcre2_message(rc));
    // Copied out: the next steps reuse the match data.
    const size_t begin = pcre2_get_ovector_pointer(match)[0], end = pcre2_get_ovector_pointer(match)[1];
    if (end == begin) {  // an empty match is no piece: search again from the next character
      at = begin + 1;
      while (at < piece.size() && (static_cast<unsigned char>(piece[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    pre_tokenize(piece.substr(gap, begin - gap), step + 1, match, out);
    pre_tokenize(piece.substr(begin, end - begin), step + 1, match, out);
    gap = at = end;
  }
  pre_tokenize(piece.substr(gap), step + 1, match, out);
}

// One pre-token's bytes -> ids. GPT-2's rule: repeatedly take the lowest-ranked adjacent pair and
// merge all its occurrences, left to right. The heap holds candidate pairs by (rank, position);
// all entries of the lowest rank are taken together, so a pair a merge creates waits for the next
// round exactly as in the reference (it can never have the rank being merged: its result is longer).
void BpeTokenizer::Impl::merge_piece(std::string_view piece, std::vector<int64_t>& out) const {
  if (ignore_merges) {
    if (const auto it = model_bytes.find(piece); it != model_bytes.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = n <= kMaxCachedBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Scratch arrays reused across calls on this thread: a new word costs no allocation.
  struct Candidate {
    int32_t rank, left, left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  struct Scratch {
    std::vector<int32_t> id, next, prev, ids;  // (n,) per byte: its symbol's token, the live list's links
    std::vector<char> dead;
    std::vector<Candidate> heap, round;
  };
  thread_local Scratch s;
  std::vector<int32_t>& id = s.id;
  std::vector<int32_t>& next = s.next;
  std::vector<int32_t>& prev = s.prev;
  id.resize(n), next.resize(n), prev.resize(n);
  s.dead.assign(n, 0);
  s.heap.clear();
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_id[static_cast<uint8_t>(piece[i])];
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  const auto push = [&](int32_t left) {  // the pair starting at symbol `left`, when it is a merge
    if (left < 0 || next[static_cast<size_t>(left)] < 0) return;
    const int32_t a = id[static_cast<size_t>(left)], b = id[static_cast<size_t>(next[static_cast<size_t>(left)])];
    const auto it = merges.find(pair_key(a, b));
    if (it == merges.end()) return;
    s.heap.push_back({it->second.rank, left, a, b});
    std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
  };
  const auto pop = [&] {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const Candidate c = s.heap.back();
    s.heap.pop_back();
    return c;
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!s.heap.empty()) {
    const int32_t rank = s.heap.front().rank;
    s.round.clear();
    while (!s.heap.empty() && s.heap.front().rank == rank) s.round.push_back(pop());
    for (const Candidate& c : s.round) {  // by position, left to right
      const size_t l = static_cast<size_t>(c.left);
      if (s.dead[l] || id[l] != c.left_id || next[l] < 0) continue;
      const size_t r = static_cast<size_t>(next[l]);
      if (id[r] != c.right_id) continue;  // stale: a neighbour merged first
      id[l] = merges.at(pair_key(c.left_id, c.right_id)).result;
      s.dead[r] = 1;
      next[l] = next[r];
      if (next[r] >= 0) prev[static_cast<size_t>(next[r])] = static_cast<int32_t>(l);
      push(prev[l]);
      push(static_cast<int32_t>(l));
    }
  }
  std::vector<int32_t>& ids = s.ids;
  ids.clear();
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) ids.push_back(id[static_cast<size_t>(i)]);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(piece), ids);
  }
}

// ---------------------------------------------------------------------------------------------
// GPT-2's files: vocab.json and merges.txt

BpeTokenizer::BpeTokenizer() : impl_(std::make_unique<Impl>()) {}

BpeTokenizer::BpeTokenizer(std::string_view vocab_json, std::string_view merges_txt, std::string vocab_name,
                           std::string merges_name, int64_t vocab_size)
    : BpeTokenizer() {
  Impl& m = *impl_;
  m.name = kWho;
  m.gpt2_files = true;
  m.files = {"bpe", {{"vocab.json", std::string(vocab_json)}, {"merges.txt", std::string(merges_txt)}}};
  // ---- vocab.json: an object of token -> id, ids 0..n-1 each once ----
  const std::string& vn = vocab_name;
  std::string repeated;
  m.read_vocab(parse_json(vocab_json, vn, 2, "expected an object of token -> id", {}, repeated), vn);
  HL_CHECK(repeated.empty(), vn, ": key ", json_text(repeated), " appears twice");
  const size_t n = m.spellings.size();
  HL_CHECK(vocab_size <= 0 || static_cast<size_t>(vocab_size) == n, vn, ": holds ", n,
           " tokens, but the model's vocab_size is ", vocab_size);

  // ---- merges.txt: "#version..." first line optional, then "left right" per line, by rank ----
  const std::string& mn = merges_name;
  size_t pos = 0;
  int64_t line_no = 0;
  std::vector<int64_t> line_of_rank;
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // '\r' is never part of a token ("č")
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty() && pos >= merges_txt.size()) break;  // the file's last newline
    std::string_view left, right;
    HL_CHECK(split_merge(line, left, right), mn, ": line ", line_no, " is ", json_text(std::string(line)),
             ", expected two tokens separated by one space");
    const std::string where = mn + ": line " + std::to_string(line_no);
    const auto earlier = m.add_merge(left, right, where, vn);
    HL_CHECK(!earlier, where, " repeats the merge of line ", earlier ? line_of_rank[static_cast<size_t>(*earlier)] : 0);
    line_of_rank.push_back(line_no);
  }
  // As the transformers tokenizer does: <|endoftext|> splits the text, each part is encoded alone.
  if (const auto it = m.index.find(std::string_view(kEndOfText)); it != m.index.end()) {
    m.added.push_back({kEndOfText, it->second});
    m.eos = it->second;
  }
  m.finish(m.spellings.size(), vocab_size, vn);
  m.steps.push_back({compile_pattern(kGpt2Pattern, false, kWho)});
}

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_path, const std::string& merges_path,
                                      int64_t vocab_size) {
  std::string why_not;
  const std::string vocab = detail::read_text_file(vocab_path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), vocab_path, ": ", why_not);
  const std::string merges = detail::read_text_file(merges_path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), merges_path, ": ", why_not);
  return BpeTokenizer(vocab, merges, vocab_path, merges_path, vocab_size);
}

// ---------------------------------------------------------------------------------------------
// Hugging Face's tokenizer.json

// model: BPE over a byte-level vocabulary; what would change its merges is refused.
void BpeTokenizer::Impl::read_model(const json& j, const Fields& f) {
  const std::string p = "model";
  const json& model = f.object(f.need(j, "", "model"), p);
  const std::string type = f.text(model, p, "type");
  HL_CHECK(type == "BPE", f.file, ": model.type is ", json_text(type), "; headlab reads byte-level BPE models only");
  HL_CHECK(!f.flag(model, p, "byte_fallback", false), f.file,
           ": model.byte_fallback is true (SentencePiece-style <0x..> byte tokens); headlab reads byte-level BPE, "
           "whose bytes are characters of the vocabulary");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = Fields::find(model, affix))
      HL_CHECK(v->is_string() && v->get<std::string>().empty(), f.file, ": model.", affix, " is ", shown(*v),
               "; headlab's byte-level BPE has none");
  if (const json* v = Fields::find(model, "dropout"))
    HL_CHECK(v->is_number() && v->get<double>() == 0, f.file, ": model.dropout is ", shown(*v),
             "; BPE-dropout skips merges at random, and headlab encodes deterministically");
  ignore_merges = f.flag(model, p, "ignore_merges", false);
  read_vocab(f.object(f.need(model, p, "vocab"), "model.vocab"), f.file + ": model.vocab");
  // merges: "left right" strings (older files) or [left, right] pairs (tokenizers >= 0.20).
  const json& merges = f.array(model, p, "merges");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& v = merges[i];
    const std::string where = f.file + ": model.merges[" + std::to_string(i) + "]";
    std::string_view left, right;
    if (v.is_string()) {
      HL_CHECK(split_merge(v.get_ref<const std::string&>(), left, right), where, " is ", shown(v),
               ", expected two tokens separated by one space");
    } else {
      HL_CHECK(v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string(), where, " is ", shown(v),
               ", expected \"left right\" or [\"left\", \"right\"]");
      left = v[0].get_ref<const std::string&>(), right = v[1].get_ref<const std::string&>();
    }
    const auto earlier = add_merge(left, right, where, "model.vocab");
    HL_CHECK(!earlier, where, " repeats model.merges[", earlier.value_or(0), "]");
  }
}

// added_tokens: split out of the text as they are; space-stripping variants are refused.
void BpeTokenizer::Impl::read_added_tokens(const json& j, const Fields& f) {
  const json* list = Fields::find(j, "added_tokens");
  if (list == nullptr) return;
  HL_CHECK(list->is_array(), f.file, ": added_tokens must be a list, got ", shown(*list));
  const size_t model_tokens = spellings.size();
  const int64_t ids = static_cast<int64_t>(model_tokens + list->size());  // the most ids they can number
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string p = "added_tokens[" + std::to_string(i) + "]";
    const json& t = f.object((*list)[i], p);
    const std::string content = f.text(t, p, "content");
    int64_t id = -1;
    HL_CHECK(json_to_integer(f.need(t, p, "id"), id), f.file, ": ", p, ".id must be an integer, got ", shown(t["id"]));
    HL_CHECK(id >= 0 && id < ids, f.file, ": ", p, ".id is ", id, ", outside 0..", ids - 1, " (model.vocab's ",
             model_tokens, " tokens and the ", list->size(), " added tokens number ids from 0 with none left out)");
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      HL_CHECK(!f.flag(t, p, key, false), f.file, ": ", p, " (", json_text(content), ") has ", key,
               " true; headlab matches added tokens exactly as written");
    // "normalized" and "special" are read as they come: either way the token is matched in the text
    // before normalisation (as transformers.js does), and decodes to its content.
    f.flag(t, p, "normalized", false);
    f.flag(t, p, "special", false);
    add_token(content, id, f.file + ": " + p);
  }
}

void BpeTokenizer::Impl::read_normalizer(const json& j, const Fields& f) {
  const json* n = Fields::find(j, "normalizer");
  if (n == nullptr) return;
  const std::string type = f.text(f.object(*n, "normalizer"), "normalizer", "type");
  HL_CHECK(type == "NFC", f.file, ": normalizer.type is ", json_text(type),
           "; headlab reads no normalizer (null) or NFC");
  nfc = true;
}

// pre_tokenizer: ByteLevel, Split, Digits, or a Sequence of them, ending in ByteLevel (which maps the
// text to byte characters: a split after it would see those, not the text).
void BpeTokenizer::Impl::read_pre_tokenizer(const json& v, const std::string& p, const Fields& f, bool& byte_level) {
  const json& pt = f.object(v, p);
  const std::string type = f.text(pt, p, "type");
  if (type == "Sequence") {
    const json& list = f.array(pt, p, "pretokenizers");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], p + ".pretokenizers[" + std::to_string(i) + "]", f, byte_level);
    return;
  }
  HL_CHECK(!byte_level, f.file, ": ", p, " (", type,
           ") comes after ByteLevel, which maps the text to byte characters; headlab reads ByteLevel last");
  const std::string what = f.file + ": " + p;
  if (type == "ByteLevel") {
    const json& prefix = f.need(pt, p, "add_prefix_space");
    HL_CHECK(prefix.is_boolean(), what, ".add_prefix_space must be true or false, got ", shown(prefix));
    if (prefix.get<bool>()) steps.push_back({nullptr});
    if (f.flag(pt, p, "use_regex", true)) steps.push_back({compile_pattern(kGpt2Pattern, false, what)});
    byte_level = true;
  } else if (type == "Split") {
    const json& pattern = f.object(f.need(pt, p, "pattern"), p + ".pattern");
    const json* regex = Fields::find(pattern, "Regex");
    const json* literal = Fields::find(pattern, "String");
    HL_CHECK((regex != nullptr) != (literal != nullptr) && (regex ? regex : literal)->is_string(), what, ".pattern is ",
             shown(pattern), ", expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    const std::string behavior = f.text(pt, p, "behavior");
    HL_CHECK(behavior == "Isolated", what, ".behavior is ", json_text(behavior),
             "; headlab reads Isolated splits (each match a piece) only");
    HL_CHECK(!f.flag(pt, p, "invert", false), what, ".invert is true; headlab reads invert false only");
    steps.push_back({compile_pattern((regex ? regex : literal)->get<std::string>(), literal != nullptr, what)});
  } else if (type == "Digits") {
    // Rust's char::is_numeric, as Hugging Face's library: the categories Nd, Nl and No.
    const bool individual = f.flag(pt, p, "individual_digits", false);
    steps.push_back({compile_pattern(individual ? "\\p{N}" : "\\p{N}+", false, what)});
  } else {
    HL_FAIL(what, ".type is ", json_text(type), "; headlab reads ByteLevel, Split, Digits and Sequence");
  }
}

// The BOS of a post_processor's template "<special> $A", if it has one; a template that adds more
// than a token before the text is refused (headlab's prompts get at most the BOS).
std::optional<int32_t> BpeTokenizer::Impl::read_post_processor(const json& v, const std::string& p,
                                                               const Fields& f) const {
  const json& pp = f.object(v, p);
  const std::string type = f.text(pp, p, "type");
  if (type == "ByteLevel") return std::nullopt;  // it adjusts offsets only
  std::optional<int32_t> bos;
  if (type == "Sequence") {
    const json& list = f.array(pp, p, "processors");
    for (size_t i = 0; i < list.size(); ++i) {
      const auto b = read_post_processor(list[i], p + ".processors[" + std::to_string(i) + "]", f);
      if (b) bos = b;
    }
    return bos;
  }
  HL_CHECK(type == "TemplateProcessing", f.file, ": ", p, ".type is ", json_text(type),
           "; headlab reads ByteLevel, TemplateProcessing and Sequence post-processors");
  const json& single = f.array(pp, p, "single");
  const auto is = [](const json& item, const char* kind) { return item.is_object() && item.contains(kind); };
  const bool plain = single.size() == 1 && is(single[0], "Sequence");
  const bool with_bos = single.size() == 2 && is(single[0], "SpecialToken") && is(single[1], "Sequence");
  HL_CHECK(plain || with_bos, f.file, ": ", p, ".single is ", shown(single),
           "; headlab reads the templates \"$A\" and \"<special token> $A\"");
  if (plain) return std::nullopt;
  const json& special = f.object(single[0]["SpecialToken"], p + ".single[0].SpecialToken");
  const std::string token = f.text(special, p + ".single[0].SpecialToken", "id");
  const json& ids = f.object(f.need(pp, p, "special_tokens"), p + ".special_tokens");
  const std::string q = p + ".special_tokens." + token;
  const json& entry = f.object(f.need(ids, p + ".special_tokens", token), q);
  const json& list = f.array(entry, q, "ids");
  int64_t id = -1;
  HL_CHECK(list.size() == 1 && json_to_integer(list[0], id), f.file, ": ", q, ".ids is ", shown(list),
           ", expected one token id");
  HL_CHECK(id >= 0 && id < static_cast<int64_t>(spellings.size()), f.file, ": ", q, ".ids holds ", id,
           ", which is not a token id (0..", spellings.size() - 1, ")");
  return static_cast<int32_t>(id);
}

// tokenizer_config.json's bos_token or eos_token: a string, {"content": "..."} or null; it must name a token.
std::optional<int32_t> BpeTokenizer::Impl::config_token(const json& config, const char* key, const Fields& f) const {
  const json* v = Fields::find(config, key);
  if (v == nullptr) return std::nullopt;
  HL_CHECK(v->is_object() || v->is_string(), f.file, ": ", key, " must be a string or an object with content, got ",
           shown(*v));
  const std::string content = v->is_object() ? f.text(*v, key, "content") : v->get<std::string>();
  const auto it = index.find(content);
  HL_CHECK(it != index.end(), f.file, ": ", key, " ", json_text(content), " is not a token of ", name);
  return it->second;
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(std::string_view tokenizer_json, std::string name, int64_t vocab_size,
                                               std::string_view tokenizer_config_json, std::string config_name) {
  BpeTokenizer t;
  Impl& m = *t.impl_;
  m.name = std::move(name);
  const Fields f{m.name};
  std::string repeated;
  const json j = parse_json(tokenizer_json, m.name, kMaxJsonDepth, kDepthExpected, {"model", "vocab"}, repeated);
  f.object(j, "");
  HL_CHECK(repeated.empty(), m.name, ": model.vocab: key ", json_text(repeated), " appears twice");
  m.read_model(j, f);
  const size_t model_tokens = m.spellings.size();
  m.read_added_tokens(j, f);
  m.finish(model_tokens, vocab_size, m.name);
  m.read_normalizer(j, f);
  const json* pre = Fields::find(j, "pre_tokenizer");
  bool byte_level = false;
  if (pre != nullptr) m.read_pre_tokenizer(*pre, "pre_tokenizer", f, byte_level);
  HL_CHECK(byte_level, m.name,
           ": pre_tokenizer has no ByteLevel step, so the text would not be mapped to byte characters (headlab "
           "reads byte-level BPE)");
  const json* decoder = Fields::find(j, "decoder");
  const std::string decoder_type = decoder ? f.text(f.object(*decoder, "decoder"), "decoder", "type") : "null";
  HL_CHECK(decoder_type == "ByteLevel", m.name, ": decoder is ", decoder_type,
           "; headlab decodes byte-level BPE (ByteLevel)");
  const json* post = Fields::find(j, "post_processor");
  const std::optional<int32_t> template_bos = post ? m.read_post_processor(*post, "post_processor", f) : std::nullopt;

  // ---- BOS and EOS: tokenizer_config.json's where it says, else the template's and the usual names ----
  json config = json::object();
  if (!tokenizer_config_json.empty()) {
    config = parse_json(tokenizer_config_json, config_name, kMaxJsonDepth, kDepthExpected, {}, repeated);
    Fields{config_name}.object(config, "");
    HL_CHECK(repeated.empty(), config_name, ": key ", json_text(repeated), " appears twice");
  }
  const Fields cf{config_name};
  const std::optional<int32_t> config_bos = m.config_token(config, "bos_token", cf);
  if (Fields::find(config, "add_bos_token") != nullptr) {
    if (cf.flag(config, "", "add_bos_token", false)) {
      HL_CHECK(config_bos, config_name, ": add_bos_token is true, but bos_token is not given");
      m.bos = config_bos;
    }
  } else {
    m.bos = template_bos;
  }
  m.eos = m.config_token(config, "eos_token", cf);
  for (const char* eos : kEosNames)
    if (const auto it = m.index.find(std::string_view(eos)); !m.eos && it != m.index.end()) m.eos = it->second;
  m.files = {"tokenizer.json", {{"tokenizer.json", std::string(tokenizer_json)}}};
  if (!tokenizer_config_json.empty()) m.files.files.emplace_back("tokenizer_config.json", tokenizer_config_json);
  return t;
}

BpeTokenizer BpeTokenizer::from_tokenizer_json_file(const std::string& path, int64_t vocab_size,
                                                    const std::string& config_path) {
  std::string why_not;
  const std::string text = detail::read_text_file(path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), path, ": ", why_not);
  std::string config;
  if (!config_path.empty()) {
    config = detail::read_text_file(config_path, WholeFile::config, why_not);
    HL_CHECK(why_not.empty(), config_path, ": ", why_not);
  }
  return from_tokenizer_json(text, path, vocab_size, config, config_path);
}

// ---------------------------------------------------------------------------------------------

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

TokenizerFiles BpeTokenizer::files() const { return impl_->files; }

int64_t BpeTokenizer::size() const { return impl_->rows; }
int64_t BpeTokenizer::tokens() const { return static_cast<int64_t>(impl_->spellings.size()); }

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, std::string_view label) const {
  // Check the whole text first: the error names the first bad byte, and PCRE2 then skips its own check.
  detail::check_utf8(text, label);
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 4 + 1);
  const Pcre2MatchData match;
  impl_->split_added(text, ids, [&](std::string_view part) {
    if (impl_->nfc && !is_ascii(part))  // ASCII is its own normal form
      impl_->pre_tokenize(to_nfc(part, impl_->name), 0, match.data, ids);
    else
      impl_->pre_tokenize(part, 0, match.data, ids);
  });
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) out += token_bytes(id);
  return out;
}

const std::string& BpeTokenizer::token_string(int64_t id) const {
  impl_->check_id(id);
  return impl_->spellings[static_cast<size_t>(id)];
}

const std::string& BpeTokenizer::token_bytes(int64_t id) const {
  impl_->check_id(id);
  return impl_->bytes[static_cast<size_t>(id)];
}

std::string BpeTokenizer::token_text(int64_t id) const {
  if (id >= tokens() && id < size()) return "<unused " + std::to_string(id) + ">";
  return detail::valid_utf8(token_bytes(id));
}

std::optional<int64_t> BpeTokenizer::find(std::string_view token) const {
  const auto it = impl_->index.find(token);
  if (it == impl_->index.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> BpeTokenizer::end_of_text() const { return find(kEndOfText); }
std::optional<int64_t> BpeTokenizer::bos() const { return impl_->bos; }
std::optional<int64_t> BpeTokenizer::eos() const { return impl_->eos; }

std::string BpeTokenizer::describe() const {
  if (impl_->gpt2_files) return "GPT-2's byte-level BPE tokenizer of " + std::to_string(size()) + " tokens";
  std::string s = "a byte-level BPE tokenizer (tokenizer.json) of " + std::to_string(tokens()) + " tokens";
  if (size() > tokens()) s += " for a vocabulary of " + std::to_string(size());
  return s;
}

}  // namespace headlab::tasks
