// Toy sequence tasks: the character tokenizer, the algorithmic tasks (copy, reverse, sort, add),
// the chars language-model task, scoring of argmax predictions, and the task factory.
// Every stream is a stateless function of (seed, split, example number): see tasks.h.
#include "train/tasks.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "autograd/error.h"

namespace headlab {

namespace {

// ---------------------------------------------------------------------------------------------
// Counter-based randomness. splitmix64's finaliser is a bijective avalanche mix, so hashing the
// tuple (seed, split, n, attempt, counter) gives independent-looking draws that need no state:
// the same tuple gives the same number on every machine, in any order of evaluation.

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t hash_combine(uint64_t h, uint64_t v) { return splitmix64(h ^ splitmix64(v)); }

// Keys that separate the train and val streams (any two distinct constants would do).
constexpr uint64_t kTrainKey = 0x747261696e5f5f31ULL;  // "train__1"
constexpr uint64_t kValKey = 0x76616c5f5f5f5f32ULL;    // "val____2"
// Salt of the train/val partition of prompts. Deliberately independent of the seed: a model
// trained with one seed and validated with another must still never have seen its val prompts.
constexpr uint64_t kPartitionSalt = 0x6865616476616c31ULL;  // "headval1"
constexpr uint64_t kValModulus = 8;                         // 1/8 of prompts are validation

uint64_t split_key(Split split) { return split == Split::train ? kTrainKey : kValKey; }

class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t next() { return hash_combine(key_, counter_++); }
  // Uniform in [0, n) by the multiply-shift map; the bias (< n / 2^64) is irrelevant here.
  uint64_t below(uint64_t n) {
    __extension__ using u128 = unsigned __int128;
    return static_cast<uint64_t>((static_cast<u128>(next()) * n) >> 64);
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

uint64_t example_key(uint64_t seed, Split split, uint64_t n) {
  return hash_combine(hash_combine(splitmix64(seed), split_key(split)), n);
}

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
  if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
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

// A character as it should appear inside quotes in a message: control characters escaped.
std::string printable(std::string_view ch) {
  if (ch.size() != 1) return std::string(ch);
  const unsigned char c = static_cast<unsigned char>(ch[0]);
  switch (c) {
    case '\n': return "\\n";
    case '\t': return "\\t";
    case '\r': return "\\r";
    case '\\': return "\\\\";
    default: break;
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
std::string first_non_digit(std::string_view s, std::string_view also_allowed = "") {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    uint32_t cp;
    if (!next_code_point(s, pos, cp)) pos = start + 1;
    std::string_view ch = s.substr(start, pos - start);
    if (ch.size() == 1 && (is_digit(ch[0]) || also_allowed.find(ch[0]) != std::string_view::npos))
      continue;
    return std::string(ch);
  }
  return "";
}

std::string range_text(int64_t lo, int64_t hi) {
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi);
}

}  // namespace

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
    HL_CHECK(ok, owner_, ": vocabulary entry ", i, " '", printable_text(entry),
             "' is not a single character (", entry.size(), " bytes)");
    const auto [it, inserted] = index_.emplace(cp, static_cast<int64_t>(i));
    HL_CHECK(inserted, owner_, ": vocabulary entry ", i, " '", printable(entry),
             "' repeats entry ", it->second);
    if (cp < 128) ascii_[cp] = static_cast<int32_t>(i);
  }
}

Tokenizer Tokenizer::from_text(std::string_view text, std::string owner) {
  std::map<uint32_t, bool> seen;  // ordered by code point = the sorted vocabulary
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp;
    HL_CHECK(next_code_point(text, pos, cp), owner, ": text is not valid UTF-8 (byte 0x", std::hex,
             static_cast<int>(static_cast<unsigned char>(text[pos])), std::dec, " at offset ", pos,
             ")");
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

std::vector<int64_t> Tokenizer::encode(std::string_view text, std::string_view label,
                                       bool quote_text) const {
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
    HL_CHECK(next_code_point(text, pos, cp), owner_, ": ", label, " is not valid UTF-8 (byte 0x",
             std::hex, static_cast<int>(c), std::dec, " at offset ", start, ")");
    const auto it = index_.find(cp);
    if (it != index_.end()) {
      ids.push_back(it->second);
      continue;
    }
    const std::string ch = printable(text.substr(start, pos - start));
    const bool short_text =
        quote_text && text.size() <= 64 && text.find('\n') == std::string_view::npos;
    if (short_text)
      HL_FAIL(owner_, ": ", label, " '", printable_text(text), "' has character '", ch,
              "' outside the vocabulary ", describe());
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
    HL_CHECK(ids[i] >= 0 && ids[i] < size(), owner_, ": cannot decode id ", ids[i],
             " at position ", i, ": the vocabulary has ", size(), " tokens (ids 0 to ",
             size() - 1, ")");
    out += vocab_[static_cast<size_t>(ids[i])];
  }
  return out;
}

// =============================================================================================
// Splits, metrics

const char* split_name(Split split) { return split == Split::train ? "train" : "val"; }

namespace {
double ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den)
                 : std::numeric_limits<double>::quiet_NaN();
}
}  // namespace

Metrics& Metrics::operator+=(const Metrics& other) {
  tokens += other.tokens;
  tokens_correct += other.tokens_correct;
  rows += other.rows;
  rows_correct += other.rows_correct;
  has_exact_match = has_exact_match || other.has_exact_match;
  token_accuracy = ratio(tokens_correct, tokens);
  exact_match = has_exact_match ? ratio(rows_correct, rows) : std::numeric_limits<double>::quiet_NaN();
  return *this;
}

Metrics score(const Batch& batch, const std::vector<int64_t>& predicted_ids) {
  const int64_t B = batch.B, T = batch.T;
  HL_CHECK(B >= 0 && T >= 0 && static_cast<int64_t>(batch.targets.size()) == B * T,
           "score: batch targets have ", batch.targets.size(), " entries, expected B * T = ", B,
           " * ", T, " = ", B * T);
  HL_CHECK(static_cast<int64_t>(predicted_ids.size()) == B * T, "score: predicted_ids has ",
           predicted_ids.size(), " entries, expected B * T = ", B, " * ", T, " = ", B * T,
           " (argmax of the logits for every input position)");
  if (batch.has_answers)
    HL_CHECK(static_cast<int64_t>(batch.answer_begin.size()) == B &&
                 static_cast<int64_t>(batch.answer_end.size()) == B,
             "score: batch has answers but its answer spans have ", batch.answer_begin.size(),
             " and ", batch.answer_end.size(), " entries, expected B = ", B);
  Metrics m;
  m.has_exact_match = batch.has_answers;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t target = batch.target(b, t);
      if (target == kIgnoreIndex) continue;
      ++m.tokens;
      if (predicted_ids[static_cast<size_t>(b * T + t)] == target) ++m.tokens_correct;
    }
    if (!batch.has_answers) continue;
    const int64_t begin = batch.answer_begin[static_cast<size_t>(b)];
    const int64_t end = batch.answer_end[static_cast<size_t>(b)];
    HL_CHECK(0 <= begin && begin < end && end <= T, "score: row ", b, " has answer span [", begin,
             ", ", end, ") outside [0, T = ", T, ")");
    bool all = true;
    for (int64_t t = begin; t < end; ++t)
      all = all && predicted_ids[static_cast<size_t>(b * T + t)] == batch.target(b, t);
    ++m.rows;
    if (all) ++m.rows_correct;
  }
  m.token_accuracy = ratio(m.tokens_correct, m.tokens);
  m.exact_match = m.has_exact_match ? ratio(m.rows_correct, m.rows)
                                    : std::numeric_limits<double>::quiet_NaN();
  return m;
}

// =============================================================================================
// Algorithmic tasks

namespace {
const char* kind_name(AlgorithmicTask::Kind kind) {
  switch (kind) {
    case AlgorithmicTask::Kind::copy: return "copy";
    case AlgorithmicTask::Kind::reverse: return "reverse";
    case AlgorithmicTask::Kind::sort: return "sort";
    case AlgorithmicTask::Kind::add: return "add";
  }
  return "?";
}

std::vector<std::string> algorithmic_vocab(AlgorithmicTask::Kind kind) {
  std::vector<std::string> v;
  for (char c = '0'; c <= '9'; ++c) v.emplace_back(1, c);  // digits first: id == digit value
  if (kind == AlgorithmicTask::Kind::add) {
    v.emplace_back("+");
    v.emplace_back("=");
  } else {
    v.emplace_back(">");
  }
  v.emplace_back(".");
  v.emplace_back("_");
  return v;
}

constexpr int64_t kMaxLen = 256;       // copy/reverse/sort digits: far beyond any toy context
constexpr int64_t kMaxAddDigits = 18;  // sums of two 18-digit numbers still fit in int64
constexpr uint64_t kMaxAttempts = uint64_t{1} << 24;

uint64_t pow10(int64_t k) {
  uint64_t p = 1;
  for (int64_t i = 0; i < k; ++i) p *= 10;
  return p;
}

// Appends value as exactly `width` digit ids, most significant first.
void push_digits(std::vector<int64_t>& out, uint64_t value, int64_t width) {
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(width));
  for (int64_t i = width - 1; i >= 0; --i) {
    out[at + static_cast<size_t>(i)] = static_cast<int64_t>(value % 10);
    value /= 10;
  }
}

uint64_t digits_value(const std::vector<int64_t>& ids, size_t begin, size_t end) {
  uint64_t v = 0;
  for (size_t i = begin; i < end; ++i) v = v * 10 + static_cast<uint64_t>(ids[i]);
  return v;
}
}  // namespace

AlgorithmicTask::AlgorithmicTask(Kind kind, const TaskOptions& options)
    : kind_(kind), options_(options) {
  const std::string e = err();
  if (kind_ == Kind::add) {
    HL_CHECK(options_.n_digits >= 1 && options_.n_digits <= kMaxAddDigits, e,
             ": n_digits must be between 1 and ", kMaxAddDigits, ", got ", options_.n_digits);
  } else {
    HL_CHECK(options_.min_len >= 1, e, ": min_len must be at least 1, got ", options_.min_len);
    HL_CHECK(options_.max_len <= kMaxLen, e, ": max_len must be at most ", kMaxLen, ", got ",
             options_.max_len);
    HL_CHECK(options_.min_len <= options_.max_len, e, ": min_len ", options_.min_len,
             " is greater than max_len ", options_.max_len);
  }
  tokenizer_ = Tokenizer(algorithmic_vocab(kind_), e);
  if (!options_.vocabulary.empty()) {
    HL_CHECK(options_.vocabulary == tokenizer_.vocab(), e, ": the given vocabulary ",
             Tokenizer(options_.vocabulary, e).describe(),
             " does not match this task's vocabulary ", tokenizer_.describe());
  }
  options_.vocabulary.clear();  // fixed by the kind; options() stays minimal
  sep_id_ = *tokenizer_.find(kind_ == Kind::add ? "=" : ">");
  end_id_ = *tokenizer_.find(".");
  pad_id_ = *tokenizer_.find("_");
  plus_id_ = kind_ == Kind::add ? *tokenizer_.find("+") : -1;

  // A tiny example space (e.g. length-1 digit strings: 10 prompts) may put every prompt on one
  // side of the hash partition; the rejection sampler would then never finish. Enumerate small
  // spaces until both sides have a member (a handful of prompts normally).
  const bool small = kind_ == Kind::add ? options_.n_digits <= 3 : options_.max_len <= 5;
  if (small) {
    bool seen[2] = {false, false};
    std::vector<int64_t> p;
    auto visit = [&](const std::vector<int64_t>& ids) {
      seen[split_of(ids) == Split::val ? 1 : 0] = true;
      return seen[0] && seen[1];
    };
    bool done = false;
    uint64_t count = 0;
    if (kind_ == Kind::add) {
      const uint64_t lim = pow10(options_.n_digits);
      count = lim * lim;
      for (uint64_t a = 0; a < lim && !done; ++a)
        for (uint64_t b = 0; b < lim && !done; ++b) {
          p.clear();
          push_digits(p, a, options_.n_digits);
          p.push_back(plus_id_);
          push_digits(p, b, options_.n_digits);
          done = visit(p);
        }
    } else {
      for (int64_t len = options_.min_len; len <= options_.max_len && !done; ++len) {
        count += pow10(len);
        for (uint64_t v = 0; v < pow10(len) && !done; ++v) {
          p.clear();
          push_digits(p, v, len);
          done = visit(p);
        }
      }
    }
    HL_CHECK(done, e, ": the options give only ", count,
             " distinct prompts, too few to hold out a validation part (1/8 of prompts, chosen "
             "by a hash); use longer ",
             kind_ == Kind::add ? "operands (n_digits)" : "digit strings (min_len, max_len)");
  }
}

std::string AlgorithmicTask::name() const { return kind_name(kind_); }

std::string AlgorithmicTask::description() const {
  std::ostringstream os;
  const std::string lens = range_text(options_.min_len, options_.max_len);
  switch (kind_) {
    case Kind::copy:
      os << "copy: repeat the digits. Format <digits>><answer>. then '_' padding, e.g. "
            "31415>31415.";
      break;
    case Kind::reverse:
      os << "reverse: the digits in reverse order. Format <digits>><answer>. then '_' padding, "
            "e.g. 31415>51413.";
      break;
    case Kind::sort:
      os << "sort: the digits in ascending order. Format <digits>><answer>. then '_' padding, "
            "e.g. 31415>11345.";
      break;
    case Kind::add: {
      const int64_t n = options_.n_digits;
      os << "add: the sum of two " << n << "-digit numbers. Format A+B=S. with A and B zero-padded "
         << "to " << n << " digits and the sum S written with " << n + 1
         << " digits LEAST SIGNIFICANT DIGIT FIRST (reversed, so that each carry is produced "
            "before the digit it changes), e.g. 123+45 = 168 is 123+045=8610. and 999+1 = 1000 "
            "is 999+001=0001.; generate prints the ordinary sum (168).";
      break;
    }
  }
  if (kind_ != Kind::add) os << " Digit strings of length " << lens << ".";
  os << " Sequences need " << required_context_length()
     << " tokens (context length). Loss and scores only on the answer and the end token '.'."
        " Validation prompts (1/8 of all prompts, picked by a hash of the prompt that does not "
        "depend on the seed) never occur in training.";
  return os.str();
}

int64_t AlgorithmicTask::required_context_length() const {
  if (kind_ == Kind::add) return 3 * options_.n_digits + 4;  // A + B = S(n+1) .
  return 2 * options_.max_len + 2;                            // digits > answer .
}

void AlgorithmicTask::check_context_length(int64_t T) const {
  HL_CHECK(T > 0, err(), ": context length must be positive, got ", T);
  const int64_t need = required_context_length();
  if (T >= need) return;
  const int64_t prompt = kind_ == Kind::add ? 2 * options_.n_digits + 1 : options_.max_len;
  const int64_t answer = kind_ == Kind::add ? options_.n_digits + 1 : options_.max_len;
  HL_FAIL(err(), ": context length ", T, " is too small: the longest example needs ", need,
          " tokens (", prompt, " prompt + 1 separator + ", answer,
          " answer + 1 end); use a context length of at least ", need);
}

Split AlgorithmicTask::split_of(const std::vector<int64_t>& prompt_ids) const {
  uint64_t h = kPartitionSalt;
  for (int64_t id : prompt_ids) h = hash_combine(h, static_cast<uint64_t>(id));
  h = hash_combine(h, prompt_ids.size());
  return h % kValModulus == 0 ? Split::val : Split::train;
}

Example AlgorithmicTask::build(const std::vector<int64_t>& prompt) const {
  Example ex;
  std::vector<int64_t> answer;
  if (kind_ == Kind::add) {
    const size_t n = static_cast<size_t>(options_.n_digits);
    const uint64_t a = digits_value(prompt, 0, n), b = digits_value(prompt, n + 1, 2 * n + 1);
    const uint64_t sum = a + b;
    push_digits(answer, sum, options_.n_digits + 1);
    std::reverse(answer.begin(), answer.end());  // least significant digit first
    ex.prompt_text = std::to_string(a) + "+" + std::to_string(b);
    ex.answer_text = std::to_string(sum);
  } else {
    answer = prompt;
    if (kind_ == Kind::reverse) std::reverse(answer.begin(), answer.end());
    if (kind_ == Kind::sort) std::sort(answer.begin(), answer.end());
    ex.prompt_text = tokenizer_.decode(prompt);
    ex.answer_text = tokenizer_.decode(answer);
  }
  ex.tokens = prompt;
  ex.tokens.push_back(sep_id_);
  ex.answer_begin = static_cast<int64_t>(ex.tokens.size());
  ex.tokens.insert(ex.tokens.end(), answer.begin(), answer.end());
  ex.tokens.push_back(end_id_);
  return ex;
}

Example AlgorithmicTask::example(Split split, uint64_t n) const {
  const uint64_t key = example_key(options_.seed, split, n);
  std::vector<int64_t> prompt;
  // Rejection sampling keeps each stream inside its part of the partition; the expected number
  // of attempts is 8/7 for train and 8 for val.
  for (uint64_t attempt = 0; attempt < kMaxAttempts; ++attempt) {
    CounterRng rng(hash_combine(key, attempt));
    prompt.clear();
    if (kind_ == Kind::add) {
      const uint64_t lim = pow10(options_.n_digits);
      push_digits(prompt, rng.below(lim), options_.n_digits);
      prompt.push_back(plus_id_);
      push_digits(prompt, rng.below(lim), options_.n_digits);
    } else {
      const int64_t len =
          options_.min_len +
          static_cast<int64_t>(rng.below(static_cast<uint64_t>(options_.max_len - options_.min_len + 1)));
      for (int64_t i = 0; i < len; ++i) prompt.push_back(static_cast<int64_t>(rng.below(10)));
    }
    if (split_of(prompt) == split) return build(prompt);
  }
  HL_FAIL(err(), ": found no ", split_name(split), " example in ", kMaxAttempts,
          " draws; the example space is too small");
}

Batch AlgorithmicTask::batch(Split split, uint64_t index, int64_t B, int64_t T) const {
  HL_CHECK(B > 0, err(), ": batch size must be positive, got ", B);
  check_context_length(T);
  Batch batch;
  batch.B = B, batch.T = T;
  batch.inputs.assign(static_cast<size_t>(B * T), pad_id_);
  batch.targets.assign(static_cast<size_t>(B * T), kIgnoreIndex);
  batch.has_answers = true;
  batch.answer_begin.resize(static_cast<size_t>(B));
  batch.answer_end.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const Example ex = example(split, index * static_cast<uint64_t>(B) + static_cast<uint64_t>(b));
    const int64_t len = static_cast<int64_t>(ex.tokens.size());  // <= T by check_context_length
    int64_t* in = batch.inputs.data() + b * T;
    int64_t* tg = batch.targets.data() + b * T;
    for (int64_t t = 0; t < len; ++t) in[t] = ex.tokens[static_cast<size_t>(t)];
    // Position t predicts token t+1: scored when that token is an answer token or the end.
    for (int64_t t = ex.answer_begin - 1; t < len - 1; ++t)
      tg[t] = ex.tokens[static_cast<size_t>(t + 1)];
    batch.answer_begin[static_cast<size_t>(b)] = ex.answer_begin - 1;
    batch.answer_end[static_cast<size_t>(b)] = len - 1;
  }
  return batch;
}

std::vector<int64_t> AlgorithmicTask::parse_prompt(const std::string& raw) const {
  const std::string e = err();
  std::string text = trim(raw);
  const char sep = kind_ == Kind::add ? '=' : '>';
  if (!text.empty() && text.back() == sep) text.pop_back();  // "31415>" is the same prompt
  std::vector<int64_t> ids;
  if (kind_ == Kind::add) {
    const int64_t n = options_.n_digits;
    const std::string form = "of the form A+B with A and B of 1 to " + std::to_string(n) +
                             " digits, e.g. '" + std::string(static_cast<size_t>(n), '1') + "+" +
                             std::string(static_cast<size_t>(std::max<int64_t>(1, n - 1)), '2') +
                             "'";
    HL_CHECK(!text.empty(), e, ": prompt is empty; expected a prompt ", form);
    const std::string bad = first_non_digit(text, "+");
    HL_CHECK(bad.empty(), e, ": prompt '", printable_text(text), "' has character '",
             printable(bad), "' outside the vocabulary \"0123456789+\"");
    const size_t plus = text.find('+');
    HL_CHECK(plus != std::string::npos && plus > 0 && plus + 1 < text.size() &&
                 text.find('+', plus + 1) == std::string::npos,
             e, ": prompt '", text, "' is not ", form);
    const std::string a = text.substr(0, plus), b = text.substr(plus + 1);
    for (const std::string& operand : {a, b})
      HL_CHECK(static_cast<int64_t>(operand.size()) <= n, e, ": operand '", operand,
               "' in prompt '", text, "' has ", operand.size(), " digits, at most n_digits = ", n);
    push_digits(ids, std::stoull(a), n);
    ids.push_back(plus_id_);
    push_digits(ids, std::stoull(b), n);
    return ids;
  }
  const int64_t lo = options_.min_len, hi = options_.max_len;
  const std::string want = range_text(lo, hi) + " digits";
  HL_CHECK(!text.empty(), e, ": prompt is empty; expected ", want, ", e.g. '",
           std::string("31415926").substr(0, static_cast<size_t>(std::min<int64_t>(hi, 8))), "'");
  const std::string bad = first_non_digit(text);
  HL_CHECK(bad.empty(), e, ": prompt '", printable_text(text), "' has character '", printable(bad),
           "' outside the vocabulary \"0123456789\"");
  const int64_t len = static_cast<int64_t>(text.size());
  HL_CHECK(len >= lo && len <= hi, e, ": prompt '", text, "' has ", len, " digits, expected ", want);
  for (char c : text) ids.push_back(c - '0');
  return ids;
}

Example AlgorithmicTask::make_example(const std::string& prompt_text) const {
  return build(parse_prompt(prompt_text));
}

Prompt AlgorithmicTask::encode_prompt(const std::string& text) const {
  Prompt p;
  p.ids = parse_prompt(text);
  p.ids.push_back(sep_id_);
  p.answer_length = kind_ == Kind::add ? options_.n_digits + 1
                                       : static_cast<int64_t>(p.ids.size()) - 1;
  p.text = tokenizer_.decode(p.ids);
  return p;
}

std::string AlgorithmicTask::format_answer(const std::vector<int64_t>& ids) const {
  tokenizer_.decode(ids);  // validates every id
  std::vector<int64_t> answer(ids.begin(), std::find(ids.begin(), ids.end(), end_id_));
  if (kind_ != Kind::add) return tokenizer_.decode(answer);
  const bool digits = !answer.empty() && std::all_of(answer.begin(), answer.end(),
                                                     [](int64_t id) { return id >= 0 && id <= 9; });
  if (!digits) return tokenizer_.decode(answer);  // not a number: show the tokens as generated
  std::reverse(answer.begin(), answer.end());     // the model writes least significant first
  std::string s = tokenizer_.decode(answer);
  const size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

std::string AlgorithmicTask::expected_answer(const std::string& text) const {
  return make_example(text).answer_text;
}

// =============================================================================================
// chars

namespace {
constexpr int64_t kTrainPercent = 90;  // first 90% of the characters train, the rest val

std::string read_text_file(const std::string& path, std::string& why_not) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    why_not = "does not exist";
    return "";
  }
  if (fs::is_directory(path, ec)) {
    why_not = "is a directory, not a text file";
    return "";
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why_not = "cannot be opened for reading";
    return "";
  }
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) why_not = "could not be read";
  return s;
}
}  // namespace

CharsTask::CharsTask(const TaskOptions& options) : options_(options) {
  const std::string e = "task chars";
  std::string text;
  if (!options_.text.empty()) {
    text = options_.text;
  } else {
    HL_CHECK(!options_.text_path.empty(), e, ": no text given; set a text file (--text FILE)");
    std::string why_not;
    text = read_text_file(options_.text_path, why_not);
    if (!why_not.empty()) {
      // With a stored vocabulary the task can still tokenize (generate needs nothing more);
      // batches need a text, and batch() says which file is missing.
      HL_CHECK(!options_.vocabulary.empty(), e, ": text file '", options_.text_path, "' ",
               why_not, "; pass --text FILE with a plain-text file");
      missing_reason_ = "text file '" + options_.text_path + "' " + why_not;
    } else {
      HL_CHECK(!text.empty(), e, ": text file '", options_.text_path, "' is empty");
    }
  }
  text_loaded_ = missing_reason_.empty();

  tokenizer_ = options_.vocabulary.empty() ? Tokenizer::from_text(text, e)
                                           : Tokenizer(options_.vocabulary, e);
  if (!text_loaded_) return;
  std::vector<int64_t> ids;
  try {
    ids = tokenizer_.encode(text, source(), false);
  } catch (const Error& err) {
    if (options_.vocabulary.empty()) throw;
    throw Error(std::string(err.what()) +
                " (the vocabulary is fixed by the model's training text; this text uses a "
                "character the model has never seen)");
  }
  ids_.assign(ids.begin(), ids.end());
}

std::string CharsTask::source() const {
  return options_.text.empty() ? "text '" + options_.text_path + "'" : std::string("text");
}

TaskOptions CharsTask::options() const {
  TaskOptions o = options_;
  o.vocabulary = tokenizer_.vocab();
  return o;
}

std::string CharsTask::description() const {
  std::ostringstream os;
  os << "chars: character-level language model over a text (" << source() << ", ";
  if (text_loaded_)
    os << text_length() << " characters";
  else
    os << "not loaded: " << missing_reason_;
  os << ", vocabulary of " << vocab_size()
     << " characters: its sorted unique characters). Each row is a window of context length + 1 "
        "characters at a position hashed from (seed, split, batch index, row); inputs are its "
        "first T characters, targets its last T, and every position is scored (token accuracy; "
        "exact match does not apply). The first "
     << kTrainPercent << "% of the text is train, the last " << 100 - kTrainPercent
     << "% validation.";
  return os.str();
}

std::pair<int64_t, int64_t> CharsTask::region(Split split) const {
  const int64_t n = text_length();
  const int64_t cut = n * kTrainPercent / 100;
  return split == Split::train ? std::pair<int64_t, int64_t>{0, cut}
                               : std::pair<int64_t, int64_t>{cut, n};
}

void CharsTask::check_region(Split split, int64_t T) const {
  const auto [begin, end] = region(split);
  const int64_t have = end - begin;
  HL_CHECK(have >= T + 1, "task chars: the ", split == Split::train ? "training" : "validation",
           " part of ", source(), " (its ", split == Split::train ? "first " : "last ",
           split == Split::train ? kTrainPercent : 100 - kTrainPercent, "%) has ", have,
           " characters, need at least context_length + 1 = ", T + 1,
           " for one window; use a longer text or a smaller context length");
}

void CharsTask::check_context_length(int64_t T) const {
  HL_CHECK(T > 0, "task chars: context length must be positive, got ", T);
  HL_CHECK(text_loaded_, "task chars: no text to read: ", missing_reason_,
           "; pass --text FILE with a plain-text file");
  HL_CHECK(text_length() >= T + 2, "task chars: ", source(), " has ", text_length(),
           " characters, need at least context_length + 2 = ", T + 2);
  check_region(Split::train, T);
  check_region(Split::val, T);
}

Batch CharsTask::batch(Split split, uint64_t index, int64_t B, int64_t T) const {
  HL_CHECK(B > 0, "task chars: batch size must be positive, got ", B);
  HL_CHECK(T > 0, "task chars: context length must be positive, got ", T);
  HL_CHECK(text_loaded_, "task chars: no text to read: ", missing_reason_,
           "; pass --text FILE with a plain-text file");
  HL_CHECK(text_length() >= T + 2, "task chars: ", source(), " has ", text_length(),
           " characters, need at least context_length + 2 = ", T + 2);
  check_region(split, T);  // only this split's part is read (eval may use a short val text)
  const auto [begin, end] = region(split);
  const uint64_t starts = static_cast<uint64_t>(end - begin - T);  // windows of T+1 that fit
  Batch batch;
  batch.B = B, batch.T = T;
  batch.inputs.resize(static_cast<size_t>(B * T));
  batch.targets.resize(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    CounterRng rng(example_key(options_.seed, split,
                               index * static_cast<uint64_t>(B) + static_cast<uint64_t>(b)));
    const int64_t start = begin + static_cast<int64_t>(rng.below(starts));
    const int32_t* w = ids_.data() + start;
    for (int64_t t = 0; t < T; ++t) {
      batch.inputs[static_cast<size_t>(b * T + t)] = w[t];
      batch.targets[static_cast<size_t>(b * T + t)] = w[t + 1];
    }
  }
  return batch;
}

Prompt CharsTask::encode_prompt(const std::string& text) const {
  HL_CHECK(!text.empty(), "task chars: prompt is empty; give at least one character");
  Prompt p;
  p.ids = tokenizer_.encode(text, "prompt");
  p.answer_length = -1;
  p.text = text;
  return p;
}

std::string CharsTask::format_answer(const std::vector<int64_t>& ids) const {
  return tokenizer_.decode(ids);
}

// =============================================================================================
// Options and factory

std::map<std::string, std::string> options_to_map(const std::string& name,
                                                  const TaskOptions& o) {
  const bool any = std::find(task_names().begin(), task_names().end(), name) == task_names().end();
  std::map<std::string, std::string> m;
  m["seed"] = std::to_string(o.seed);
  if (any || name == "copy" || name == "reverse" || name == "sort") {
    m["min_len"] = std::to_string(o.min_len);
    m["max_len"] = std::to_string(o.max_len);
  }
  if (any || name == "add") m["n_digits"] = std::to_string(o.n_digits);
  if (any || name == "chars") {
    m["text_path"] = o.text_path;
    if (!o.text.empty()) m["text"] = o.text;
  }
  return m;
}

TaskOptions options_from_map(const std::map<std::string, std::string>& map) {
  TaskOptions o;
  auto parse = [](const std::string& key, const std::string& value, auto& out) {
    const char* first = value.data();
    const char* last = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(first, last, out);
    HL_CHECK(ec == std::errc() && ptr == last && !value.empty(), "task options: key '", key,
             "' has value '", value, "', expected an integer");
  };
  for (const auto& [key, value] : map) {
    if (key == "seed") {
      parse(key, value, o.seed);
    } else if (key == "min_len") {
      parse(key, value, o.min_len);
    } else if (key == "max_len") {
      parse(key, value, o.max_len);
    } else if (key == "n_digits") {
      parse(key, value, o.n_digits);
    } else if (key == "text_path") {
      o.text_path = value;
    } else if (key == "text") {
      o.text = value;
    } else {
      HL_FAIL("task options: unknown key '", key,
              "'; known keys are seed, min_len, max_len, n_digits, text_path, text");
    }
  }
  return o;
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"copy", "reverse", "sort", "add", "chars"};
  return names;
}

std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options) {
  using Kind = AlgorithmicTask::Kind;
  if (name == "copy") return std::make_unique<AlgorithmicTask>(Kind::copy, options);
  if (name == "reverse") return std::make_unique<AlgorithmicTask>(Kind::reverse, options);
  if (name == "sort") return std::make_unique<AlgorithmicTask>(Kind::sort, options);
  if (name == "add") return std::make_unique<AlgorithmicTask>(Kind::add, options);
  if (name == "chars") return std::make_unique<CharsTask>(options);
  std::string valid;
  for (const auto& n : task_names()) valid += (valid.empty() ? "" : ", ") + n;
  HL_FAIL("unknown task '", name, "': valid tasks are ", valid);
}

std::string tasks_help() {
  const TaskOptions d;
  std::ostringstream os;
  os << "Tasks (--task NAME):\n"
     << "  copy     repeat digits                31415926>31415926.\n"
     << "  reverse  reverse digits               31415926>62951413.\n"
     << "  sort     sort digits ascending        31415926>11234569.\n"
     << "  add      add two numbers, the sum written least significant digit first:\n"
     << "           123+45=168 is 123+045=8610.   999+1=1000 is 999+001=0001.\n"
     << "  chars    character-level language model over --text FILE (default " << d.text_path
     << ")\n"
     << "copy/reverse/sort use " << range_text(d.min_len, d.max_len)
     << " digits (min_len, max_len); add uses " << d.n_digits
     << "-digit operands (n_digits). Loss and accuracy count only the answer and its end '.'; "
        "1/8 of all prompts (by a hash) are held out for validation. chars: first "
     << kTrainPercent << "% of the text trains, the last " << 100 - kTrainPercent
     << "% validates.\n";
  return os.str();
}

}  // namespace headlab
