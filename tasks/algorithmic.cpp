// The algorithmic tasks (copy, reverse, sort, add): examples drawn from counter-based streams,
// train/val split by a hash of the prompt, prompts parsed and answers formatted for generation.
#include "tasks/algorithmic.h"

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
// Algorithmic tasks

namespace {
const char* kind_name(AlgorithmicTask::Kind kind) {
  switch (kind) {
    case AlgorithmicTask::Kind::copy:
      return "copy";
    case AlgorithmicTask::Kind::reverse:
      return "reverse";
    case AlgorithmicTask::Kind::sort:
      return "sort";
    case AlgorithmicTask::Kind::add:
      return "add";
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

AlgorithmicTask::AlgorithmicTask(Kind kind, const TaskOptions& options) : kind_(kind), options_(options) {
  const std::string e = err();
  if (kind_ == Kind::add) {
    HL_CHECK(options_.n_digits >= 1 && options_.n_digits <= kMaxAddDigits, e, ": n_digits must be between 1 and ",
             kMaxAddDigits, ", got ", options_.n_digits);
  } else {
    HL_CHECK(options_.min_len >= 1, e, ": min_len must be at least 1, got ", options_.min_len);
    HL_CHECK(options_.max_len <= kMaxLen, e, ": max_len must be at most ", kMaxLen, ", got ", options_.max_len);
    HL_CHECK(options_.min_len <= options_.max_len, e, ": min_len ", options_.min_len, " is greater than max_len ",
             options_.max_len);
  }
  tokenizer_ = Tokenizer(algorithmic_vocab(kind_), e);
  if (!options_.vocabulary.empty()) {
    HL_CHECK(options_.vocabulary == tokenizer_.vocab(), e, ": the given vocabulary ",
             Tokenizer(options_.vocabulary, e).describe(), " does not match this task's vocabulary ",
             tokenizer_.describe());
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
  return 2 * options_.max_len + 2;                           // digits > answer .
}

void AlgorithmicTask::check_context_length(int64_t T) const {
  HL_CHECK(T > 0, err(), ": context length must be positive, got ", T);
  const int64_t need = required_context_length();
  if (T >= need) return;
  const int64_t prompt = kind_ == Kind::add ? 2 * options_.n_digits + 1 : options_.max_len;
  const int64_t answer = kind_ == Kind::add ? options_.n_digits + 1 : options_.max_len;
  HL_FAIL(err(), ": context length ", T, " is too small: the longest example needs ", need, " tokens (", prompt,
          " prompt + 1 separator + ", answer, " answer + 1 end); use a context length of at least ", need);
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
  for (int64_t b = 0; b < B; ++b)
    put_row(batch, b, example(split, index * static_cast<uint64_t>(B) + static_cast<uint64_t>(b)));
  return batch;
}

void AlgorithmicTask::put_row(Batch& batch, int64_t b, const Example& ex) const {
  const int64_t T = batch.T, len = static_cast<int64_t>(ex.tokens.size());  // <= T by check_context_length
  int64_t* in = batch.inputs.data() + b * T;
  int64_t* tg = batch.targets.data() + b * T;
  std::fill_n(in, T, pad_id_);
  std::fill_n(tg, T, kIgnoreIndex);
  for (int64_t t = 0; t < len; ++t) in[t] = ex.tokens[static_cast<size_t>(t)];
  // Position t predicts token t+1: scored when that token is an answer token or the end.
  for (int64_t t = ex.answer_begin - 1; t < len - 1; ++t) tg[t] = ex.tokens[static_cast<size_t>(t + 1)];
  batch.answer_begin[static_cast<size_t>(b)] = ex.answer_begin - 1;
  batch.answer_end[static_cast<size_t>(b)] = len - 1;
}

Batch AlgorithmicTask::corrupt(const Batch& clean, uint64_t seed) const {
  HL_CHECK(clean.has_answers && static_cast<int64_t>(clean.inputs.size()) == clean.B * clean.T &&
               static_cast<int64_t>(clean.answer_begin.size()) == clean.B,
           err(), ": corrupt needs a batch of this task (with answers)");
  Batch out = clean;
  for (int64_t b = 0; b < clean.B; ++b) {
    const int64_t* row = clean.inputs.data() + b * clean.T;
    const int64_t sep = std::find(row, row + clean.T, sep_id_) - row;
    HL_CHECK(sep < clean.T, err(), ": row ", b, " of the batch has no separator");
    std::vector<int64_t> prompt(row, row + sep), digits;
    for (int64_t i = 0; i < sep; ++i)
      if (prompt[static_cast<size_t>(i)] != plus_id_) digits.push_back(i);
    CounterRng rng(hash_combine(seed, static_cast<uint64_t>(b)));
    int64_t& d = prompt[static_cast<size_t>(digits[rng.below(digits.size())])];
    d = (d + 1 + static_cast<int64_t>(rng.below(9))) % 10;  // another digit
    put_row(out, b, build(prompt));
  }
  return out;
}

std::vector<int64_t> AlgorithmicTask::parse_prompt(const std::string& raw) const {
  const std::string e = err();
  std::string text = trim(raw);
  const char sep = kind_ == Kind::add ? '=' : '>';
  if (!text.empty() && text.back() == sep) text.pop_back();  // "31415>" is the same prompt
  std::vector<int64_t> ids;
  if (kind_ == Kind::add) {
    const int64_t n = options_.n_digits;
    const std::string form = "of the form A+B with A and B of 1 to " + std::to_string(n) + " digits, e.g. '" +
                             std::string(static_cast<size_t>(n), '1') + "+" +
                             std::string(static_cast<size_t>(std::max<int64_t>(1, n - 1)), '2') + "'";
    HL_CHECK(!text.empty(), e, ": prompt is empty; expected a prompt ", form);
    const std::string bad = first_non_digit(text, "+");
    HL_CHECK(bad.empty(), e, ": prompt '", printable_text(text), "' has character '", printable(bad),
             "' outside the vocabulary \"0123456789+\"");
    const size_t plus = text.find('+');
    HL_CHECK(plus != std::string::npos && plus > 0 && plus + 1 < text.size() &&
                 text.find('+', plus + 1) == std::string::npos,
             e, ": prompt '", text, "' is not ", form);
    const std::string a = text.substr(0, plus), b = text.substr(plus + 1);
    for (const std::string& operand : {a, b})
      HL_CHECK(static_cast<int64_t>(operand.size()) <= n, e, ": operand '", operand, "' in prompt '", text, "' has ",
               operand.size(), " digits, at most n_digits = ", n);
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

Example AlgorithmicTask::make_example(const std::string& prompt_text) const { return build(parse_prompt(prompt_text)); }

Prompt AlgorithmicTask::encode_prompt(const std::string& text) const {
  Prompt p;
  p.ids = parse_prompt(text);
  p.ids.push_back(sep_id_);
  p.answer_length = kind_ == Kind::add ? options_.n_digits + 1 : static_cast<int64_t>(p.ids.size()) - 1;
  p.text = tokenizer_.decode(p.ids);
  return p;
}

std::string AlgorithmicTask::format_answer(const std::vector<int64_t>& ids) const {
  tokenizer_.decode(ids);  // validates every id
  std::vector<int64_t> answer(ids.begin(), std::find(ids.begin(), ids.end(), end_id_));
  if (kind_ != Kind::add) return tokenizer_.decode(answer);
  const bool digits =
      !answer.empty() && std::all_of(answer.begin(), answer.end(), [](int64_t id) { return id >= 0 && id <= 9; });
  if (!digits) return tokenizer_.decode(answer);  // not a number: show the tokens as generated
  std::reverse(answer.begin(), answer.end());     // the model writes least significant first
  std::string s = tokenizer_.decode(answer);
  const size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

std::string AlgorithmicTask::expected_answer(const std::string& text) const { return make_example(text).answer_text; }

}  // namespace headlab::tasks
