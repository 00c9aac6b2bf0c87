// llama2.c's tokenizer: the file read with every size checked against what is left of it, SentencePiece's BPE
// encoding by merge score (a heap of candidate pairs: O(n log n) in the text's characters), and decoding with
// byte tokens and the dummy space undone.
#include "tasks/llama2c_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <queue>

#include "base/error.h"
#include "base/input_path.h"
#include "base/sizes.h"
#include "tasks/internal.h"

namespace headlab::tasks {

namespace {

constexpr int64_t kBos = 1, kByteTokens = 3;  // <0x00> is id 3

// A little-endian int32 or float32 at `at` of the file, which must hold it.
template <typename T>
T read_at(std::string_view bytes, size_t at, const std::string& name, const char* what) {
  HL_CHECK(at + sizeof(T) <= bytes.size(), name, ": the file ends inside ", what, " at byte ", at, " (", bytes.size(),
           " bytes)");
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

// "<0x0A>" -> 10; -1 for any other piece.
int byte_of_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = p[static_cast<size_t>(i)];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

}  // namespace

Llama2cTokenizer::Llama2cTokenizer(std::string_view bytes, std::string name, int64_t vocab_size)
    : name_(std::move(name)), bytes_(bytes) {
  const int32_t max_len = read_at<int32_t>(bytes, 0, name_, "the header (int32 max_token_length)");
  HL_CHECK(max_len > 0 && max_len <= (1 << 16), name_, ": max_token_length ", max_len,
           " is not a token length (expected 1..65536): not a llama2.c tokenizer file?");
  for (size_t at = 4; at < bytes.size();) {
    const std::string what = "token " + std::to_string(pieces_.size());
    const float score = read_at<float>(bytes, at, name_, (what + "'s score").c_str());
    const int32_t len = read_at<int32_t>(bytes, at + 4, name_, (what + "'s length").c_str());
    HL_CHECK(len >= 0 && len <= max_len, name_, ": ", what, " has length ", len, ", outside 0..max_token_length ",
             max_len);
    HL_CHECK(at + 8 + static_cast<size_t>(len) <= bytes.size(), name_, ": the file ends inside ", what, "'s ", len,
             " bytes");
    HL_CHECK(std::isfinite(score), name_, ": ", what, " has a score that is not finite");
    pieces_.emplace_back(bytes.substr(at + 8, static_cast<size_t>(len)));
    scores_.push_back(score);
    at += 8 + static_cast<size_t>(len);
    if (vocab_size > 0 && size() == vocab_size) break;  // what follows is not the model's
  }
  HL_CHECK(size() > kByteTokens + 255, name_, ": ", size(),
           " tokens; a llama2.c vocabulary holds <unk>, <s>, </s> and ", "the 256 byte tokens at least");
  HL_CHECK(vocab_size <= 0 || size() == vocab_size, name_, ": ", size(), " tokens, but the model emits ", vocab_size);
  for (int b = 0; b < 256; ++b)
    HL_CHECK(byte_of_piece(pieces_[static_cast<size_t>(kByteTokens + b)]) == b, name_, ": token ", kByteTokens + b,
             " is '", pieces_[static_cast<size_t>(kByteTokens + b)], "', expected the byte token <0x",
             "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15], ">");
  for (int64_t id = 0; id < size(); ++id) ids_.emplace(pieces_[static_cast<size_t>(id)], id);  // the first id wins
  collapse_spaces_ = std::none_of(pieces_.begin(), pieces_.end(),
                                  [](const std::string& p) { return p.find("  ") != std::string::npos; });
}

std::shared_ptr<const Llama2cTokenizer> Llama2cTokenizer::from_file(const std::string& path, int64_t vocab_size) {
  const std::string bytes = read_whole_file(path, WholeFile::tokenizer, "tokenizer");
  return std::make_shared<const Llama2cTokenizer>(bytes, "tokenizer '" + path + "'", vocab_size);
}

std::shared_ptr<const Llama2cTokenizer> Llama2cTokenizer::from_pieces(const std::vector<std::string>& pieces,
                                                                      const std::vector<float>& scores,
                                                                      std::string name, int64_t vocab_size) {
  HL_CHECK(scores.size() == pieces.size(), name, ": ", pieces.size(), " pieces but ", scores.size(), " scores");
  std::string body;
  int32_t max_len = 1;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const int64_t i = static_cast<int64_t>(id);
    std::string text = i == kBos ? "\n<s>\n" : i == kBos + 1 ? "\n</s>\n" : "";
    if (text.empty())
      for (size_t at = 0; at < pieces[id].size();) {  // U+2581, SentencePiece's space, as llama2.c writes it
        const bool space = pieces[id].compare(at, 3, "\xE2\x96\x81") == 0;
        text += space ? std::string(" ") : pieces[id].substr(at, 1);
        at += space ? 3 : 1;
      }
    HL_CHECK(text.size() <= (1u << 16), name, ": piece ", id, " has ", text.size(), " bytes (at most 65536)");
    max_len = std::max(max_len, static_cast<int32_t>(text.size()));
    const int32_t len = static_cast<int32_t>(text.size());
    body.append(reinterpret_cast<const char*>(&scores[id]), 4).append(reinterpret_cast<const char*>(&len), 4);
    body += text;
  }
  std::string bytes(reinterpret_cast<const char*>(&max_len), 4);
  return std::make_shared<const Llama2cTokenizer>(bytes + body, std::move(name), vocab_size);
}

std::vector<int64_t> Llama2cTokenizer::encode(std::string_view text, std::string_view label) const {
  return encode_pieces(text, label, true);
}

std::vector<int64_t> Llama2cTokenizer::encode_continuation(std::string_view text, std::string_view label) const {
  return encode_pieces(text, label, false);
}

std::string Llama2cTokenizer::collapsed(std::string_view text, bool dummy_space) const {
  std::string out;
  for (const char c : text)
    if (c != ' ' || (!out.empty() ? out.back() != ' ' : !dummy_space)) out += c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<int64_t> Llama2cTokenizer::encode_pieces(std::string_view given, std::string_view label,
                                                     bool dummy_space) const {
  detail::check_utf8(given, label);
  const std::string kept = collapse_spaces_ ? collapsed(given, dummy_space) : std::string(given);
  const std::string_view text = kept;
  if (text.empty()) return {};
  // The symbols, a linked list of pieces: the dummy space, then each character (or its bytes).
  struct Symbol {
    std::string text;
    int64_t id;
    int prev, next;
  };
  std::vector<Symbol> syms;
  const auto push = [&](std::string piece, int64_t id) {
    const int n = static_cast<int>(syms.size());
    syms.push_back({std::move(piece), id, n - 1, n + 1});
  };
  if (dummy_space) {
    const auto space = ids_.find(" ");
    push(" ", space != ids_.end() ? space->second : kByteTokens + ' ');
  }
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    uint32_t cp;
    detail::next_code_point(text, pos, cp);  // checked above
    const std::string ch(text.substr(start, pos - start));
    const auto it = ids_.find(ch);
    if (it != ids_.end()) {
      push(ch, it->second);
    } else {  // byte fallback
      for (const char c : ch) push(std::string(1, c), kByteTokens + static_cast<unsigned char>(c));
    }
  }
  syms.back().next = -1;
  // Candidate merges, best first: highest score, then leftmost (llama2.c's scan keeps the first best).
  struct Pair {
    float score;
    int left, right;
    size_t length;  // of the merged text, to tell a pair whose right symbol has grown since
    bool operator<(const Pair& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  std::priority_queue<Pair> heap;
  const auto consider = [&](int left) {
    if (left < 0 || syms[static_cast<size_t>(left)].next < 0) return;
    const Symbol& a = syms[static_cast<size_t>(left)];
    const Symbol& b = syms[static_cast<size_t>(a.next)];
    const auto it = ids_.find(a.text + b.text);
    if (it != ids_.end())
      heap.push({scores_[static_cast<size_t>(it->second)], left, a.next, a.text.size() + b.text.size()});
  };
  for (int i = 0; i < static_cast<int>(syms.size()); ++i) consider(i);
  std::vector<bool> dead(syms.size(), false);
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    Symbol& a = syms[static_cast<size_t>(p.left)];
    if (dead[static_cast<size_t>(p.left)] || a.next != p.right) continue;
    Symbol& b = syms[static_cast<size_t>(p.right)];
    if (a.text.size() + b.text.size() != p.length) continue;
    a.text += b.text;
    a.id = ids_.at(a.text);
    dead[static_cast<size_t>(p.right)] = true;
    a.next = b.next;
    if (b.next >= 0) syms[static_cast<size_t>(b.next)].prev = p.left;
    consider(a.prev);
    consider(p.left);
  }
  std::vector<int64_t> ids;
  for (int i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) ids.push_back(syms[static_cast<size_t>(i)].id);
  return ids;
}

const std::string& Llama2cTokenizer::piece(int64_t id) const {
  HL_CHECK(id >= 0 && id < size(), name_, ": token id ", id, " is out of range for ", size(), " tokens");
  return pieces_[static_cast<size_t>(id)];
}

std::string Llama2cTokenizer::bytes_of(int64_t id) const {
  const std::string& p = piece(id);
  const int b = id >= kByteTokens && id < kByteTokens + 256 ? byte_of_piece(p) : -1;
  return b >= 0 ? std::string(1, static_cast<char>(b)) : p;
}

// As llama2.c's decode: a piece right after <s> loses its leading space (the dummy one); <s> and </s> stand for
// nothing.
std::string Llama2cTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == kBos || ids[i] == *eos()) {
      piece(ids[i]);  // range-checked all the same
      continue;
    }
    std::string s = bytes_of(ids[i]);
    if (i > 0 && ids[i - 1] == kBos && !s.empty() && s[0] == ' ') s.erase(0, 1);
    out += s;
  }
  return out;
}

std::string Llama2cTokenizer::token_text(int64_t id) const {
  std::string s = bytes_of(id);
  if (id < kByteTokens) {  // <unk>, <s>, </s>: llama2.c's file spells the last two "\n<s>\n", "\n</s>\n"
    const size_t first = s.find_first_not_of('\n'), last = s.find_last_not_of('\n');
    s = first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
  }
  return detail::valid_utf8(s);
}

std::string Llama2cTokenizer::describe() const {
  return "llama2.c's SentencePiece tokenizer of " + std::to_string(size()) + " tokens";
}

}  // namespace headlab::tasks
