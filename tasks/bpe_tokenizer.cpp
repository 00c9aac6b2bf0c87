// GPT-2's byte-level BPE tokenizer (see bpe_tokenizer.h): loading and checking vocab.json and
// merges.txt, the PCRE2 pre-tokenizer, the merge loop (a heap over adjacent pairs, O(n log n) per
// pre-token) and a cache of pre-token -> ids, which is what makes English text fast.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tasks/bpe_tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "base/json_fields.h"
#include "tasks/internal.h"

namespace headlab::tasks {

namespace {

constexpr const char* kWho = "BPE tokenizer";
constexpr size_t kMaxCachedBytes = 64;         // longer pre-tokens are rare: merged each time
constexpr size_t kMaxCacheEntries = 1u << 18;  // the cache starts over past this many

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

// The UTF-8 of a vocabulary spelling -> the bytes it stands for; the spelling itself when some
// character is not one of the 256 byte characters (a special token such as <|endoftext|> is all
// printable bytes, so it maps to itself either way).
std::string spelling_to_bytes(const std::string& spelling, const std::unordered_map<char32_t, uint8_t>& to_byte) {
  std::string out;
  size_t pos = 0;
  while (pos < spelling.size()) {
    uint32_t cp = 0;
    if (!detail::next_code_point(spelling, pos, cp)) return spelling;
    const auto it = to_byte.find(static_cast<char32_t>(cp));
    if (it == to_byte.end()) return spelling;
    out += static_cast<char>(it->second);
  }
  return out;
}

struct Pcre2Code {
  pcre2_code* code = nullptr;
  ~Pcre2Code() { pcre2_code_free(code); }
};
struct Pcre2MatchData {
  pcre2_match_data* data;
  explicit Pcre2MatchData(const pcre2_code* code) : data(pcre2_match_data_create_from_pattern(code, nullptr)) {
    HL_CHECK(data != nullptr, kWho, ": out of memory for a PCRE2 match");
  }
  ~Pcre2MatchData() { pcre2_match_data_free(data); }
  Pcre2MatchData(const Pcre2MatchData&) = delete;
  Pcre2MatchData& operator=(const Pcre2MatchData&) = delete;
};

}  // namespace

char32_t gpt2_byte_to_unicode(uint8_t b) { return kByteToUnicode[b]; }

struct BpeTokenizer::Impl {
  std::vector<std::string> spellings;  // (n,) id -> vocab.json key
  std::vector<std::string> bytes;      // (n,) id -> the bytes it stands for
  TokenIndex index;                    // vocab.json key -> id
  std::array<int32_t, 256> byte_id{};  // byte -> id of its single-byte token
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  std::unordered_map<uint64_t, Merge> merges;  // pair_key(left id, right id) -> rank, merged id
  std::optional<int32_t> eot;
  Pcre2Code pattern;
  std::string vocab_json, merges_txt;  // the files as given, for a checkpoint to carry

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;

  void merge_piece(std::string_view piece, std::vector<int64_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int64_t>& out) const;
};

// One pre-token's bytes -> ids. GPT-2's rule: repeatedly take the lowest-ranked adjacent pair and
// merge all its occurrences, left to right. The heap holds candidate pairs by (rank, position);
// all entries of the lowest rank are taken together, so a pair a merge creates waits for the next
// round exactly as in the reference (it can never have the rank being merged: its result is longer).
void BpeTokenizer::Impl::merge_piece(std::string_view piece, std::vector<int64_t>& out) const {
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

// Text without special tokens (valid UTF-8) -> ids: each match of GPT-2's pattern is merged alone.
void BpeTokenizer::Impl::encode_ordinary(std::string_view text, std::vector<int64_t>& out) const {
  if (text.empty()) return;
  Pcre2MatchData match(pattern.code);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    // The text was checked once by encode: no second UTF-8 check per match.
    const int rc = pcre2_match(pattern.code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match.data, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // every character matches some branch: not reached
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(rc, msg.data(), msg.size());
      HL_FAIL(kWho, ": the pre-tokenizer failed at byte offset ", offset, ": ",
              reinterpret_cast<const char*>(msg.data()));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.data);
    HL_CHECK(ov[1] > ov[0], kWho, ": the pre-tokenizer matched nothing at byte offset ", ov[0]);
    merge_piece(text.substr(ov[0], ov[1] - ov[0]), out);
    offset = ov[1];
  }
}

BpeTokenizer::BpeTokenizer(std::string_view vocab_json, std::string_view merges_txt, std::string vocab_name,
                           std::string merges_name, int64_t vocab_size)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.vocab_json = vocab_json;
  m.merges_txt = merges_txt;
  // ---- vocab.json: an object of token -> id, ids 0..n-1 each once ----
  const std::string& vn = vocab_name;
  std::unordered_set<std::string> keys_seen;
  std::string duplicate_key;
  // nlohmann keeps the last of repeated keys silently; the callback sees every key of the object.
  // It also stops deep nesting early (ids are numbers: depth 1), before it costs time or stack.
  const nlohmann::json::parser_callback_t on_key = [&](int depth, nlohmann::json::parse_event_t event,
                                                       nlohmann::json& parsed) {
    HL_CHECK(depth <= 2, vn, ": expected an object of token -> id, got values nested ", depth, " deep");
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && duplicate_key.empty() &&
        !keys_seen.insert(parsed.get<std::string>()).second)
      duplicate_key = parsed.get<std::string>();
    return true;
  };
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_json.begin(), vocab_json.end(), on_key);
  } catch (const nlohmann::json::exception& e) {
    HL_FAIL(vn, ": not JSON (", e.what(), ")");
  }
  keys_seen.clear();
  HL_CHECK(vocab.is_object(), vn, ": expected a JSON object of token -> id, got a ", vocab.type_name());
  HL_CHECK(duplicate_key.empty(), vn, ": key ", json_text(duplicate_key), " appears twice");
  const size_t n = vocab.size();
  HL_CHECK(n > 0 && n <= static_cast<size_t>(INT32_MAX), vn, ": expected 1 to 2^31-1 tokens, got ", n);
  HL_CHECK(vocab_size <= 0 || static_cast<size_t>(vocab_size) == n, vn, ": holds ", n,
           " tokens, but the model's vocab_size is ", vocab_size);
  m.spellings.assign(n, std::string());
  std::vector<char> taken(n, 0);
  m.index.reserve(n);
  for (const auto& [key, value] : vocab.items()) {
    int64_t id = -1;
    HL_CHECK(json_to_integer(value, id), vn, ": key ", json_text(key), " has id ", json_text(value),
             ", expected an integer");
    HL_CHECK(id >= 0 && static_cast<size_t>(id) < n, vn, ": key ", json_text(key), " has id ", id, ", outside 0..",
             n - 1, " (ids must number the ", n, " tokens)");
    HL_CHECK(!taken[static_cast<size_t>(id)], vn, ": id ", id, " is given to both ",
             json_text(m.spellings[static_cast<size_t>(id)]), " and ", json_text(key));
    HL_CHECK(!key.empty(), vn, ": the empty string is not a token (id ", id, ")");
    taken[static_cast<size_t>(id)] = 1;
    m.spellings[static_cast<size_t>(id)] = key;
    m.index.emplace(key, static_cast<int32_t>(id));
  }
  vocab = nlohmann::json();
  std::unordered_map<char32_t, uint8_t> to_byte;
  for (int b = 0; b < 256; ++b) {
    const char32_t u = kByteToUnicode[static_cast<size_t>(b)];
    to_byte.emplace(u, static_cast<uint8_t>(b));
    const auto it = m.index.find(detail::encode_utf8(u));
    HL_CHECK(it != m.index.end(), vn, ": lacks the token ", json_text(detail::encode_utf8(u)), " of byte ", b,
             " (a byte-level vocabulary has all 256)");
    m.byte_id[static_cast<size_t>(b)] = it->second;
  }
  m.bytes.reserve(n);
  for (const std::string& s : m.spellings) m.bytes.push_back(spelling_to_bytes(s, to_byte));
  if (const auto it = m.index.find(std::string_view(kEndOfText)); it != m.index.end()) m.eot = it->second;

  // ---- merges.txt: "#version..." first line optional, then "left right" per line, by rank ----
  const std::string& mn = merges_name;
  size_t pos = 0;
  int64_t line_no = 0;
  int32_t rank = 0;
  std::unordered_map<uint64_t, int64_t> merge_line;  // pair -> line, for repeats
  while (pos < merges_txt.size()) {
    size_t end = merges_txt.find('\n', pos);
    if (end == std::string_view::npos) end = merges_txt.size();
    std::string_view line = merges_txt.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // '\r' is never part of a token ("č")
    if (line_no == 1 && line.starts_with("#version")) continue;
    if (line.empty() && pos >= merges_txt.size()) break;  // the file's last newline
    const size_t space = line.find(' ');
    HL_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                 line.find(' ', space + 1) == std::string_view::npos,
             mn, ": line ", line_no, " is ", json_text(std::string(line)),
             ", expected two tokens separated by one space");
    const std::string_view left = line.substr(0, space), right = line.substr(space + 1);
    const auto a = m.index.find(left), b = m.index.find(right);
    HL_CHECK(a != m.index.end(), mn, ": line ", line_no, ": ", json_text(std::string(left)), " is not in ", vn);
    HL_CHECK(b != m.index.end(), mn, ": line ", line_no, ": ", json_text(std::string(right)), " is not in ", vn);
    const std::string joined = std::string(left) + std::string(right);
    const auto c = m.index.find(joined);
    HL_CHECK(c != m.index.end(), mn, ": line ", line_no, ": the merge's result ", json_text(joined), " is not in ", vn);
    const uint64_t key = pair_key(a->second, b->second);
    const auto [it, fresh] = merge_line.emplace(key, line_no);
    HL_CHECK(fresh, mn, ": line ", line_no, " repeats the merge of line ", it->second);
    m.merges.emplace(key, Impl::Merge{rank++, c->second});
  }

  // ---- the pre-tokenizer: GPT-2's pattern over Unicode categories ----
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  m.pattern.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (m.pattern.code == nullptr) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(error, msg.data(), msg.size());
    HL_FAIL(kWho, ": PCRE2 cannot compile GPT-2's pattern: ", reinterpret_cast<const char*>(msg.data()));
  }
  pcre2_jit_compile(m.pattern.code, PCRE2_JIT_COMPLETE);  // where PCRE2 has no JIT, it interprets: same matches
}

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_path, const std::string& merges_path,
                                      int64_t vocab_size) {
  std::string why_not;
  const std::string vocab = detail::read_text_file(vocab_path, why_not);
  HL_CHECK(why_not.empty(), vocab_path, ": ", why_not);
  const std::string merges = detail::read_text_file(merges_path, why_not);
  HL_CHECK(why_not.empty(), merges_path, ": ", why_not);
  return BpeTokenizer(vocab, merges, vocab_path, merges_path, vocab_size);
}

BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

const std::string& BpeTokenizer::vocab_json() const { return impl_->vocab_json; }
const std::string& BpeTokenizer::merges_txt() const { return impl_->merges_txt; }

int64_t BpeTokenizer::size() const { return static_cast<int64_t>(impl_->spellings.size()); }

std::vector<int64_t> BpeTokenizer::encode(std::string_view text, std::string_view label) const {
  // Check the whole text first: the error names the first bad byte, and PCRE2 then skips its own check.
  detail::check_utf8(text, label);
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 4 + 1);
  // As the transformers tokenizer does: the special token splits the text, each part is encoded alone.
  if (!impl_->eot) {
    impl_->encode_ordinary(text, ids);
    return ids;
  }
  const std::string_view eot = kEndOfText;
  size_t begin = 0;
  for (size_t at = text.find(eot); at != std::string_view::npos; at = text.find(eot, begin)) {
    impl_->encode_ordinary(text.substr(begin, at - begin), ids);
    ids.push_back(*impl_->eot);
    begin = at + eot.size();
  }
  impl_->encode_ordinary(text.substr(begin), ids);
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) out += token_bytes(id);
  return out;
}

const std::string& BpeTokenizer::token_string(int64_t id) const {
  HL_CHECK(id >= 0 && id < size(), kWho, ": expected a token id in 0..", size() - 1, ", got ", id);
  return impl_->spellings[static_cast<size_t>(id)];
}

const std::string& BpeTokenizer::token_bytes(int64_t id) const {
  HL_CHECK(id >= 0 && id < size(), kWho, ": expected a token id in 0..", size() - 1, ", got ", id);
  return impl_->bytes[static_cast<size_t>(id)];
}

std::string BpeTokenizer::token_text(int64_t id) const { return detail::valid_utf8(token_bytes(id)); }

std::optional<int64_t> BpeTokenizer::find(std::string_view token) const {
  const auto it = impl_->index.find(token);
  if (it == impl_->index.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> BpeTokenizer::end_of_text() const {
  if (!impl_->eot) return std::nullopt;
  return *impl_->eot;
}

std::string BpeTokenizer::describe() const {
  return "GPT-2's byte-level BPE tokenizer of " + std::to_string(size()) + " tokens";
}

}  // namespace headlab::tasks
