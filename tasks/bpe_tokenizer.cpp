// Byte-level BPE (see bpe_tokenizer.h): the engine (added tokens split out of the text, the
// pre-tokenizer's PCRE2 splits, the merge loop: a heap over adjacent pairs, O(n log n) per pre-token,
// and a cache of pre-token -> ids, which is what makes English text fast) and the tokenizer's calls.
// Its vocabulary is built in bpe_vocab.cpp; its two sources, GPT-2's vocab.json + merges.txt and a
// Hugging Face tokenizer.json (+ tokenizer_config.json), are read in bpe_sources.cpp.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tasks/bpe_tokenizer.h"

#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tasks/bpe_internal.h"
#include "tasks/internal.h"

namespace headlab::tasks {

using namespace detail;

namespace {

constexpr size_t kMaxCachedBytes = 64;         // longer pre-tokens are rare: merged each time
constexpr size_t kMaxCacheEntries = 1u << 18;  // the cache starts over past this many

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
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

}  // namespace

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
    else  // (appended, not " " + ...: GCC 12 warns falsely of an overlapping memcpy there, its bug 105329)
      pre_tokenize(std::string(" ").append(piece), step + 1, match, out);
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
