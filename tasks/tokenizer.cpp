// The character tokenizer: a vocabulary of single code points, encode/decode with errors that
// point at the offending character.
#include "tasks/tokenizer.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "base/error.h"
#include "tasks/internal.h"

namespace headlab::tasks {

using namespace detail;

// =============================================================================================
// Tokenizer

Tokenizer::Tokenizer(std::vector<std::string> vocab, std::string owner)
    : vocab_(std::move(vocab)), owner_(std::move(owner)), ascii_(128, -1) {
  HL_CHECK(!vocab_.empty(), owner_, ": the vocabulary is empty; expected a list of characters");
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string& entry = vocab_[i];
    size_t pos = 0;
    uint32_t cp = 0;
    const bool ok = !entry.empty() && next_code_point(entry, pos, cp) && pos == entry.size();
    HL_CHECK(ok, owner_, ": vocabulary entry ", i, " '", printable_text(entry), "' is not a single character (",
             entry.size(), " bytes)");
    const auto [it, inserted] = index_.emplace(cp, static_cast<int64_t>(i));
    HL_CHECK(inserted, owner_, ": vocabulary entry ", i, " '", printable(entry), "' repeats entry ", it->second);
    if (cp < 128) ascii_[cp] = static_cast<int32_t>(i);
  }
}

Tokenizer Tokenizer::from_text(std::string_view text, std::string owner) {
  std::map<uint32_t, bool> seen;  // ordered by code point = the sorted vocabulary
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    HL_CHECK(next_code_point(text, pos, cp), owner, ": text is not valid UTF-8 (byte 0x", std::hex,
             static_cast<int>(static_cast<unsigned char>(text[pos])), std::dec, " at offset ", pos, ")");
    seen[cp] = true;
  }
  HL_CHECK(!seen.empty(), owner, ": cannot build a vocabulary from an empty text");
  std::vector<std::string> vocab;
  vocab.reserve(seen.size());
  for (const auto& kv : seen) vocab.push_back(encode_utf8(kv.first));
  return Tokenizer(std::move(vocab), std::move(owner));
}

std::optional<int64_t> Tokenizer::find(std::string_view ch) const {
  size_t pos = 0;
  uint32_t cp;
  if (ch.empty() || !next_code_point(ch, pos, cp) || pos != ch.size()) return std::nullopt;
  const auto it = index_.find(cp);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::describe() const {
  if (vocab_.size() > 40) return "of " + std::to_string(vocab_.size()) + " characters";
  std::string s = "\"";
  for (const auto& v : vocab_) s += printable(v);
  return s + "\"";
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, std::string_view label, bool quote_text) const {
  HL_CHECK(!vocab_.empty(), owner_, ": encode called on a tokenizer without a vocabulary");
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[pos]);
    if (c < 128 && ascii_[c] >= 0) {  // the common case: one byte, known
      ids.push_back(ascii_[c]);
      ++pos;
      continue;
    }
    const size_t start = pos;
    uint32_t cp = 0;
    HL_CHECK(next_code_point(text, pos, cp), owner_, ": ", label, " is not valid UTF-8 (byte 0x", std::hex,
             static_cast<int>(c), std::dec, " at offset ", start, ")");
    const auto it = index_.find(cp);
    if (it != index_.end()) {
      ids.push_back(it->second);
      continue;
    }
    const std::string ch = printable(text.substr(start, pos - start));
    const bool short_text = quote_text && text.size() <= 64 && text.find('\n') == std::string_view::npos;
    if (short_text)
      HL_FAIL(owner_, ": ", label, " '", printable_text(text), "' has character '", ch, "' outside the vocabulary ",
              describe());
    // Long texts: point at the place instead of echoing the text.
    int64_t line = 1, column = 1;
    for (size_t i = 0; i < start; ++i) {
      if (text[i] == '\n') {
        ++line, column = 1;
      } else if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
        ++column;  // count characters, not UTF-8 continuation bytes
      }
    }
    HL_FAIL(owner_, ": ", label, " has character '", ch, "' at line ", line, ", column ", column,
            " outside the vocabulary ", describe());
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    HL_CHECK(ids[i] >= 0 && ids[i] < size(), owner_, ": cannot decode id ", ids[i], " at position ", i,
             ": the vocabulary has ", size(), " tokens (ids 0 to ", size() - 1, ")");
    out += vocab_[static_cast<size_t>(ids[i])];
  }
  return out;
}

}  // namespace headlab::tasks
