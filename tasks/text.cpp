// Text helpers of tasks/: UTF-8 decoding (the tokenizer works on code points, so a text with
// accents is a sequence of characters, not bytes), printable forms for error messages, file reading.
#include "tasks/internal.h"

#include "base/error.h"
#include "base/input_path.h"
#include "base/sizes.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace headlab::tasks::detail {

// ---------------------------------------------------------------------------------------------
// UTF-8: the tokenizer works on code points so that a text with accents or curly quotes is a
// sequence of characters, not of bytes (and every vocabulary entry stays valid JSON text).

// Decodes the code point at s[pos], advancing pos; false on malformed input (pos unchanged).
bool next_code_point(std::string_view s, size_t& pos, uint32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(pos);
  int extra;
  if (c < 0x80) {
    cp = c, extra = 0;
  } else if (c >= 0xC2 && c <= 0xDF) {
    cp = c & 0x1Fu, extra = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    cp = c & 0x0Fu, extra = 2;
  } else if (c >= 0xF0 && c <= 0xF4) {
    cp = c & 0x07u, extra = 3;
  } else {
    return false;
  }
  if (pos + static_cast<size_t>(extra) >= s.size()) return false;  // truncated sequence
  for (int k = 1; k <= extra; ++k) {
    const unsigned char d = byte(pos + static_cast<size_t>(k));
    if ((d & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (d & 0x3Fu);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
    return false;
  pos += static_cast<size_t>(extra) + 1;
  return true;
}

std::string encode_utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

void check_utf8(std::string_view text, std::string_view label) {
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {  // ASCII: the common case, no decoding
      ++pos;
      continue;
    }
    const size_t start = pos;
    uint32_t cp = 0;
    HL_CHECK(next_code_point(text, pos, cp), label, ": invalid UTF-8 at byte offset ", start, " (byte 0x", std::hex,
             static_cast<int>(static_cast<unsigned char>(text[start])), std::dec, ")");
  }
}

std::string valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const size_t start = pos;
    uint32_t cp = 0;
    if (next_code_point(bytes, pos, cp)) {
      out.append(bytes.substr(start, pos - start));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
      pos = start + 1;
    }
  }
  return out;
}

// A character as it should appear inside quotes in a message: control characters escaped.
std::string printable(std::string_view ch) {
  if (ch.size() != 1) return std::string(ch);
  const unsigned char c = static_cast<unsigned char>(ch[0]);
  switch (c) {
    case '\n':
      return "\\n";
    case '\t':
      return "\\t";
    case '\r':
      return "\\r";
    case '\\':
      return "\\\\";
    default:
      break;
  }
  if (c < 0x20 || c == 0x7F) {
    static const char* hex = "0123456789abcdef";
    return std::string("\\x") + hex[c >> 4] + hex[c & 15];
  }
  return std::string(ch);
}

std::string printable_text(std::string_view s) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp;
    if (!next_code_point(s, pos, cp)) pos = start + 1;  // show a stray byte as-is
    out += printable(s.substr(start, pos - start));
  }
  return out;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The first character of s that is not a digit (as UTF-8), or "".
std::string first_non_digit(std::string_view s, std::string_view also_allowed) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp;
    if (!next_code_point(s, pos, cp)) pos = start + 1;
    std::string_view ch = s.substr(start, pos - start);
    if (ch.size() == 1 && (is_digit(ch[0]) || also_allowed.find(ch[0]) != std::string_view::npos)) continue;
    return std::string(ch);
  }
  return "";
}

std::string range_text(int64_t lo, int64_t hi) {
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
}

std::string read_text_file(const std::string& path, WholeFile kind, std::string& why_not) {
  why_not = whole_file_reason(path, kind);  // a device or a pipe could block or be endless (/dev/zero)
  if (!why_not.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why_not = "cannot be opened for reading";
    return "";
  }
  remember_input(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) why_not = "could not be read";
  return s;
}

}  // namespace headlab::tasks::detail
