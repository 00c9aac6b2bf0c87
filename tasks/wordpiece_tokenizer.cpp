// BERT's WordPiece (see wordpiece_tokenizer.h): Google's tokenization.py as Hugging Face's BertTokenizer runs it
// (BasicTokenizer, then WordpieceTokenizer): the characters' classes and encoding, decoding. Its two sources are
// read in wordpiece_sources.cpp.
#include "tasks/wordpiece_tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <algorithm>

#include "tasks/internal.h"

namespace headlab::tasks {

namespace {

// ---- characters, as BERT's tokenization.py classes them, over ICU's Unicode properties ----

// Cc, Cf, Cn, Co, Cs (Hugging Face's _is_control and tokenizers' is_other); tab and newlines are whitespace.
bool is_control(UChar32 c) { return c != '\t' && c != '\n' && c != '\r' && (U_GET_GC_MASK(c) & U_GC_C_MASK) != 0; }
// Every ASCII character that is not a letter, digit or space ("$", "^", "`" too), and Unicode's P*.
bool is_punctuation(UChar32 c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) ||
         (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0;
}
// The CJK Unified Ideographs blocks and their extensions and compatibility forms (not Hiragana, Katakana, Hangul).
bool is_cjk(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_utf16(std::u16string& s, UChar32 c) {
  if (c >= 0x10000) s += static_cast<char16_t>(U16_LEAD(c));
  s += static_cast<char16_t>(c >= 0x10000 ? U16_TRAIL(c) : c);
}

// An ICU call that writes UTF-16 to (dest, capacity): once with room to spare, again with the length it asked
// for when that was short (ICU's preflighting). A case mapping or normal form may lengthen a word.
template <typename Write>
std::u16string icu_result(size_t guess, const char* what, Write&& write) {
  std::u16string out(guess, u'\0');
  UErrorCode err = U_ZERO_ERROR;
  int32_t length = write(out.data(), static_cast<int32_t>(out.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    out.resize(static_cast<size_t>(length));
    length = write(out.data(), length, &err);
  }
  HL_CHECK(U_SUCCESS(err), "WordPiece tokenizer: ICU's ", what, " failed (", u_errorName(err), ")");
  out.resize(static_cast<size_t>(length));
  return out;
}

std::u16string normalized(const std::u16string& s, bool compose) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* form = compose ? unorm2_getNFCInstance(&err) : unorm2_getNFDInstance(&err);
  HL_CHECK(U_SUCCESS(err), "WordPiece tokenizer: ICU has no normaliser (", u_errorName(err), ")");
  return icu_result(s.size() + 16, compose ? "NFC" : "NFD", [&](UChar* dest, int32_t capacity, UErrorCode* e) {
    return unorm2_normalize(form, s.data(), static_cast<int32_t>(s.size()), dest, capacity, e);
  });
}

// Full lowercase mappings, as Python's str.lower() ("İ" -> "i̇", a final "Σ" -> "ς").
std::u16string lowercased(const std::u16string& s) {
  return icu_result(s.size() + 16, "lowercase mapping", [&](UChar* dest, int32_t capacity, UErrorCode* e) {
    return u_strToLower(dest, capacity, s.data(), static_cast<int32_t>(s.size()), "", e);
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Encoding

std::vector<int64_t> WordPieceTokenizer::encode(std::string_view text, std::string_view label) const {
  detail::check_utf8(text, label);  // the loops below may assume whole characters
  std::vector<int64_t> ids;
  size_t begin = 0;  // the text up to here is encoded
  for (size_t at = 0; at < text.size(); ++at) {
    for (const Special& s : specials_) {  // longest first: of two written at one place, the longer wins
      if (text[at] != s.content[0] || text.compare(at, s.content.size(), s.content) != 0) continue;
      encode_text(text.substr(begin, at - begin), ids);
      ids.push_back(s.id);
      begin = at + s.content.size();
      at = begin - 1;
      break;
    }
  }
  encode_text(text.substr(begin), ids);
  return ids;
}

std::vector<int64_t> WordPieceTokenizer::encode_with_specials(std::string_view text, std::string_view label) const {
  HL_CHECK(cls_ && sep_, name_, ": has no ", cls_ ? "[SEP]" : "[CLS]", " token to enclose a text with");
  std::vector<int64_t> ids = encode(text, label);
  ids.insert(ids.begin(), *cls_);
  ids.push_back(*sep_);
  return ids;
}

// BasicTokenizer's cleaning, CJK split and whitespace split; each word goes on to encode_word.
void WordPieceTokenizer::encode_text(std::string_view text, std::vector<int64_t>& out) const {
  std::u16string word;  // in UTF-16, ICU's unit
  const auto end_word = [&] {
    if (!word.empty()) encode_word(std::move(word), out);
    word.clear();
  };
  for (size_t pos = 0; pos < text.size();) {
    uint32_t c = 0;
    detail::next_code_point(text, pos, c);
    const auto ch = static_cast<UChar32>(c);
    if (options_.clean_text && (ch == 0 || ch == 0xFFFD || is_control(ch))) continue;
    if (u_isUWhiteSpace(ch)) {  // (what is left of it after cleaning: Zs and the line and paragraph separators)
      end_word();
      continue;
    }
    const bool alone = options_.chinese_chars && is_cjk(ch);
    if (alone) end_word();
    append_utf16(word, ch);
    if (alone) end_word();
  }
  end_word();
}

// A word between spaces: NFC, lowercased, accents stripped as the options say, then split on punctuation.
void WordPieceTokenizer::encode_word(std::u16string word, std::vector<int64_t>& out) const {
  HL_CHECK(word.size() < (1u << 30), name_, ": a word of ", word.size(), " characters is too long to normalise");
  if (std::all_of(word.begin(), word.end(), [](char16_t c) { return c < 0x80; })) {  // no ICU needed
    if (options_.lowercase)
      for (char16_t& c : word) c = c >= 'A' && c <= 'Z' ? static_cast<char16_t>(c + ('a' - 'A')) : c;
  } else {
    if (options_.nfc) word = normalized(word, true);
    if (options_.lowercase) word = lowercased(word);
    if (options_.strip_accents) word = normalized(word, false);  // the marks Mn are dropped below
  }
  std::string piece;  // UTF-8, as the vocabulary
  const auto length = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < length;) {
    UChar32 c = 0;
    U16_NEXT(word.data(), i, length, c);
    if (options_.strip_accents && u_charType(c) == U_NON_SPACING_MARK) continue;
    if (is_punctuation(c)) {
      word_pieces(piece, out);
      word_pieces(detail::encode_utf8(static_cast<uint32_t>(c)), out);
      piece.clear();
    } else {
      piece += detail::encode_utf8(static_cast<uint32_t>(c));
    }
  }
  word_pieces(piece, out);
}

// WordpieceTokenizer: the longest token the word starts with, then the longest "##" token that continues it,
// and so on; a word that cannot be cut so, or is too long, is [UNK] whole.
void WordPieceTokenizer::word_pieces(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  std::vector<size_t> ends;  // (characters,) the byte offset after each character
  for (size_t i = 1; i <= word.size(); ++i)
    if (i == word.size() || (static_cast<unsigned char>(word[i]) & 0xC0) != 0x80) ends.push_back(i);
  if (static_cast<int64_t>(ends.size()) > options_.max_chars_per_word) {
    out.push_back(*unk_);
    return;
  }
  const size_t first = out.size();
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    const size_t prefix = start > 0 ? options_.prefix.size() : 0;
    size_t next = start;
    for (auto end = ends.rbegin(); end != ends.rend() && *end > start && next == start; ++end) {
      if (prefix + (*end - start) > longest_) continue;
      candidate.assign(options_.prefix, 0, prefix).append(word.substr(start, *end - start));
      if (const auto it = ids_.find(candidate); it != ids_.end()) out.push_back(it->second), next = *end;
    }
    if (next == start) {
      out.resize(first);
      out.push_back(*unk_);
      return;
    }
    start = next;
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  bool after_word_piece = false;  // a continuation joins a word piece, not a special token
  for (const int64_t id : ids) {
    check_id(id);
    const std::string& token = tokens_[static_cast<size_t>(id)];
    const bool special = is_special_[static_cast<size_t>(id)];
    if (!special && after_word_piece && token.starts_with(options_.prefix)) {
      out.append(token, options_.prefix.size());
    } else {
      out.append(out.empty() ? "" : " ").append(token);
    }
    after_word_piece = !special;
  }
  return out;
}

std::string WordPieceTokenizer::token_text(int64_t id) const {
  check_id(id);
  return tokens_[static_cast<size_t>(id)];
}

std::optional<int64_t> WordPieceTokenizer::find(std::string_view token) const {
  const auto it = ids_.find(std::string(token));
  return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

void WordPieceTokenizer::check_id(int64_t id) const {
  HL_CHECK(id >= 0 && id < size(), name_, ": token id ", id, " is out of range for ", size(), " tokens");
}

std::string WordPieceTokenizer::describe() const {
  return "BERT's WordPiece tokenizer of " + std::to_string(size()) + " tokens (" +
         (options_.lowercase ? "lowercased" : "cased") + ")";
}

}  // namespace headlab::tasks
