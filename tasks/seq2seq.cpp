// Encoder-decoder tasks: the batch layout every (source, target) task shares, copy/reverse/sort/add
// as pairs cut out of the GPT tasks' examples, and numbers (English number words -> digits).
//
// B = batch rows, S = source tokens, T = target tokens (answer + end), both per batch.
#include "tasks/seq2seq.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "tasks/algorithmic.h"
#include "tasks/internal.h"

namespace headlab::tasks {

using namespace detail;

// =============================================================================================
// What every seq2seq task shares

void Seq2SeqTask::check_context_length(int64_t T) const {
  const int64_t need = required_context_length();
  HL_CHECK(T >= need, "task ", name(), ": decoder context length ", T, " is too small: the longest target needs ", need,
           " tokens (", need - 1, " answer + 1 end); use a context length of at least ", need);
}

// T is not used: a row's length is its example's, so padding to a fixed T would only add work.
Batch Seq2SeqTask::batch(Split split, uint64_t index, int64_t B, int64_t /*T*/) const {
  HL_CHECK(B > 0, "task ", name(), ": batch size must be positive, got ", B);
  std::vector<Seq2SeqExample> rows(static_cast<size_t>(B));
  int64_t S = 0, T = 0;
  for (int64_t b = 0; b < B; ++b) {
    Seq2SeqExample& ex = rows[static_cast<size_t>(b)];
    ex = example(split, index * static_cast<uint64_t>(B) + static_cast<uint64_t>(b));
    S = std::max(S, static_cast<int64_t>(ex.source.size()));
    T = std::max(T, static_cast<int64_t>(ex.target.size()));
  }
  Batch batch;
  batch.B = B, batch.T = T, batch.S = S;
  batch.inputs.assign(static_cast<size_t>(B * T), target_pad_id());  // (B, T)
  batch.targets.assign(static_cast<size_t>(B * T), kIgnoreIndex);    // (B, T)
  batch.source.assign(static_cast<size_t>(B * S), source_pad_id());  // (B, S)
  batch.source_valid_lens.resize(static_cast<size_t>(B));            // (B,)
  batch.has_answers = true;
  batch.answer_begin.assign(static_cast<size_t>(B), 0);
  batch.answer_end.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const Seq2SeqExample& ex = rows[static_cast<size_t>(b)];
    const int64_t len = static_cast<int64_t>(ex.target.size());
    int64_t* in = batch.inputs.data() + b * T;
    int64_t* tg = batch.targets.data() + b * T;
    // Teacher forcing: position t sees bos and target[0..t) and predicts target[t].
    in[0] = bos_id();
    std::copy(ex.target.begin(), ex.target.end() - 1, in + 1);
    std::copy(ex.target.begin(), ex.target.end(), tg);
    std::copy(ex.source.begin(), ex.source.end(), batch.source.data() + b * S);
    batch.source_valid_lens[static_cast<size_t>(b)] = static_cast<int64_t>(ex.source.size());
    batch.answer_end[static_cast<size_t>(b)] = len;
  }
  return batch;
}

Prompt Seq2SeqTask::encode_prompt(const std::string& text) const {
  Prompt p;
  p.ids = encode_source(text);
  p.answer_length = -1;  // the decoder runs from bos until the end token
  p.text = decode_source(p.ids);
  return p;
}

namespace {

constexpr uint64_t kMaxAttempts = uint64_t{1} << 24;  // rejection sampling gives up (never in practice)

// The tail every description shares: decoder layout and what is scored.
std::string layout_text(const Seq2SeqTask& task) {
  const auto& vocab = task.tokenizer().vocab();
  std::ostringstream os;
  os << " The decoder starts from '" << vocab[static_cast<size_t>(task.bos_id())] << "' (bos) and must hold "
     << task.required_context_length() << " tokens (the longest "
     << "answer + the end '" << vocab[static_cast<size_t>(task.end_id())] << "'); sources have up "
     << "to " << task.max_source_length() << " tokens. Loss and scores on every target token "
     << "(answer and end); exact match needs the whole target.";
  return os.str();
}

// =============================================================================================
// copy, reverse, sort, add as pairs: the GPT task's example "prompt > answer ." is cut at the
// separator, which becomes the decoder's bos. Source and target share the GPT task's vocabulary.

class AlgorithmicPairs final : public Seq2SeqTask {
 public:
  AlgorithmicPairs(AlgorithmicTask::Kind kind, const TaskOptions& options) : gpt_(kind, options) {
    tokenizer_ = gpt_.tokenizer();
  }

  std::string name() const override { return gpt_.name(); }
  std::string description() const override;
  TaskOptions options() const override { return gpt_.options(); }
  int64_t required_context_length() const override {
    return (is_add() ? gpt_.options().n_digits + 1 : gpt_.options().max_len) + 1;
  }
  int64_t end_id() const override { return gpt_.end_id(); }
  std::string format_answer(const std::vector<int64_t>& ids) const override { return gpt_.format_answer(ids); }
  std::string expected_answer(const std::string& text) const override { return gpt_.expected_answer(text); }

  std::vector<std::string> source_vocab() const override { return tokenizer_.vocab(); }
  int64_t source_pad_id() const override { return gpt_.pad_id(); }
  int64_t bos_id() const override { return gpt_.sep_id(); }
  int64_t target_pad_id() const override { return gpt_.pad_id(); }
  int64_t max_source_length() const override {
    return is_add() ? 2 * gpt_.options().n_digits + 1 : gpt_.options().max_len;
  }
  std::vector<int64_t> encode_source(const std::string& text) const override {
    std::vector<int64_t> ids = gpt_.encode_prompt(text).ids;
    ids.pop_back();  // the separator: here it is the decoder's bos, not part of the source
    return ids;
  }
  std::string decode_source(const std::vector<int64_t>& ids) const override { return tokenizer_.decode(ids); }
  Seq2SeqExample example(Split split, uint64_t n) const override {
    const Example ex = gpt_.example(split, n);
    const auto sep = ex.tokens.begin() + ex.answer_begin - 1;
    return {std::vector<int64_t>(ex.tokens.begin(), sep), std::vector<int64_t>(sep + 1, ex.tokens.end())};
  }

 private:
  bool is_add() const { return gpt_.kind() == AlgorithmicTask::Kind::add; }

  AlgorithmicTask gpt_;  // the examples, the train/val partition, prompt parsing and formatting
};

std::string AlgorithmicPairs::description() const {
  std::ostringstream os;
  const TaskOptions& o = gpt_.options();
  switch (gpt_.kind()) {
    case AlgorithmicTask::Kind::copy:
      os << "copy (encoder-decoder): the source digits again. Source <digits>, target "
            "<answer>., e.g. 31415 -> 31415.";
      break;
    case AlgorithmicTask::Kind::reverse:
      os << "reverse (encoder-decoder): the source digits in reverse order. Source <digits>, "
            "target <answer>., e.g. 31415 -> 51413.";
      break;
    case AlgorithmicTask::Kind::sort:
      os << "sort (encoder-decoder): the source digits in ascending order. Source <digits>, "
            "target <answer>., e.g. 31415 -> 11345.";
      break;
    case AlgorithmicTask::Kind::add:
      os << "add (encoder-decoder): the sum of two " << o.n_digits << "-digit numbers. Source "
         << "A+B with A and B zero-padded to " << o.n_digits << " digits, target the sum in " << o.n_digits + 1
         << " digits LEAST SIGNIFICANT DIGIT FIRST then '.', e.g. 123+045 -> "
         << "8610.; generate prints the ordinary sum (168).";
      break;
  }
  if (!is_add()) os << " Digit strings of length " << range_text(o.min_len, o.max_len) << ".";
  os << layout_text(*this)
     << " The examples and the train/val split are the GPT task's: validation prompts (1/8 of "
        "all prompts, picked by a hash of the prompt that does not depend on the seed) never "
        "occur in training.";
  return os.str();
}

// =============================================================================================
// numbers: English number words (British, with "and") -> decimal digits.

constexpr int64_t kMaxNumber = 999999;  // the words below stop at thousands

// Source vocabulary. Ids: "<pad>" 0, zero..nineteen 1..20 (value + 1), twenty..ninety 21..28,
// hundred 29, thousand 30, and 31.
const std::vector<std::string>& number_vocab() {
  static const std::vector<std::string> v = {
      "<pad>",   "zero",    "one",       "two",      "three",    "four",    "five",     "six",
      "seven",   "eight",   "nine",      "ten",      "eleven",   "twelve",  "thirteen", "fourteen",
      "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty",  "thirty",   "forty",
      "fifty",   "sixty",   "seventy",   "eighty",   "ninety",   "hundred", "thousand", "and"};
  return v;
}
constexpr int64_t kWordPad = 0, kHundred = 29, kThousand = 30, kAnd = 31;
constexpr int64_t unit_id(int64_t v) { return v + 1; }        // 0..19
constexpr int64_t tens_id(int64_t v) { return 19 + v / 10; }  // 20, 30, ..., 90

void append_below_hundred(std::vector<int64_t>& out, int64_t r) {  // r in [1, 99]
  if (r < 20) {
    out.push_back(unit_id(r));
    return;
  }
  out.push_back(tens_id(r));
  if (r % 10) out.push_back(unit_id(r % 10));
}

void append_below_thousand(std::vector<int64_t>& out, int64_t m) {  // m in [1, 999]
  if (m < 100) return append_below_hundred(out, m);
  out.push_back(unit_id(m / 100));
  out.push_back(kHundred);
  if (m % 100 == 0) return;
  out.push_back(kAnd);
  append_below_hundred(out, m % 100);
}

// n in [0, kMaxNumber] as word ids: the one canonical spelling.
void append_number_words(std::vector<int64_t>& out, int64_t n) {
  if (n == 0) return out.push_back(unit_id(0));
  const int64_t thousands = n / 1000, rest = n % 1000;
  if (thousands > 0) {
    append_below_thousand(out, thousands);
    out.push_back(kThousand);
  }
  if (rest == 0) return;
  if (thousands > 0 && rest < 100) out.push_back(kAnd);  // "one thousand and five"
  append_below_thousand(out, rest);
}

// The value the words add up to, read leniently ("and" ignored); nullopt past kMaxNumber. The
// caller checks that the words are the value's canonical spelling.
std::optional<int64_t> words_value(const std::vector<int64_t>& ids) {
  int64_t total = 0, current = 0;
  for (int64_t id : ids) {
    if (id >= unit_id(0) && id <= unit_id(19))
      current += id - unit_id(0);
    else if (id >= tens_id(20) && id <= tens_id(90))
      current += (id - tens_id(20) + 2) * 10;
    else if (id == kHundred)
      current *= 100;
    else if (id == kThousand)
      total += current * 1000, current = 0;
    else if (id != kAnd)
      return std::nullopt;
    if (total > kMaxNumber || current > kMaxNumber) return std::nullopt;  // also keeps int64 safe
  }
  if (total + current > kMaxNumber) return std::nullopt;
  return total + current;
}

// Seed-independent, like the GPT tasks' partition of prompts.
Split split_of_number(int64_t n) {
  return hash_combine(kPartitionSalt, static_cast<uint64_t>(n)) % kValModulus == 0 ? Split::val : Split::train;
}

int64_t pow10(int64_t k) {
  int64_t p = 1;
  for (int64_t i = 0; i < k; ++i) p *= 10;
  return p;
}

class NumbersTask final : public Seq2SeqTask {
 public:
  explicit NumbersTask(const TaskOptions& options);

  std::string name() const override { return "numbers"; }
  std::string description() const override;
  TaskOptions options() const override { return options_; }
  int64_t required_context_length() const override { return max_digits_ + 1; }
  int64_t end_id() const override { return end_id_; }
  std::string format_answer(const std::vector<int64_t>& ids) const override {
    tokenizer_.decode(ids);  // validates every id
    return tokenizer_.decode(std::vector<int64_t>(ids.begin(), std::find(ids.begin(), ids.end(), end_id_)));
  }
  std::string expected_answer(const std::string& text) const override {
    return std::to_string(*words_value(encode_source(text)));
  }

  std::vector<std::string> source_vocab() const override { return number_vocab(); }
  int64_t source_pad_id() const override { return kWordPad; }
  int64_t bos_id() const override { return bos_id_; }
  int64_t target_pad_id() const override { return pad_id_; }
  int64_t max_source_length() const override { return max_source_length_; }
  std::vector<int64_t> encode_source(const std::string& text) const override;
  std::string decode_source(const std::vector<int64_t>& ids) const override;
  Seq2SeqExample example(Split split, uint64_t n) const override;

 private:
  std::string err() const { return "task numbers"; }

  TaskOptions options_;
  int64_t max_digits_ = 0;         // digits of max_number
  int64_t max_source_length_ = 0;  // most words of any n <= max_number
  int64_t bos_id_ = -1, end_id_ = -1, pad_id_ = -1;
};

NumbersTask::NumbersTask(const TaskOptions& options) : options_(options) {
  const std::string e = err();
  const int64_t max = options_.max_number;
  HL_CHECK(max >= 0 && max <= kMaxNumber, e, ": max_number must be between 0 and ", kMaxNumber,
           " (the words stop at thousands), got ", max);
  // The target is copy/reverse/sort's character vocabulary: digits first (id == digit), > . _
  tokenizer_ = Tokenizer(AlgorithmicTask(AlgorithmicTask::Kind::copy, TaskOptions{}).tokenizer().vocab(), e);
  if (!options_.vocabulary.empty()) {
    HL_CHECK(options_.vocabulary == tokenizer_.vocab(), e, ": the given vocabulary ",
             Tokenizer(options_.vocabulary, e).describe(), " does not match this task's vocabulary ",
             tokenizer_.describe());
  }
  options_.vocabulary.clear();  // fixed; options() stays minimal
  bos_id_ = *tokenizer_.find(">");
  end_id_ = *tokenizer_.find(".");
  pad_id_ = *tokenizer_.find("_");
  max_digits_ = static_cast<int64_t>(std::to_string(max).size());

  std::vector<int64_t> words;
  bool seen[2] = {false, false};
  for (int64_t n = 0; n <= max; ++n) {
    words.clear();
    append_number_words(words, n);
    max_source_length_ = std::max(max_source_length_, static_cast<int64_t>(words.size()));
    seen[split_of_number(n) == Split::val ? 1 : 0] = true;
  }
  // A tiny range may put every number on one side of the partition; sampling would never end.
  HL_CHECK(seen[0] && seen[1], e, ": max_number ", max, " gives only ", max + 1,
           " distinct numbers, too few to hold out a validation part (1/8 of numbers, chosen by a "
           "hash); use a larger max_number");
}

std::string NumbersTask::description() const {
  std::ostringstream os;
  os << "numbers (encoder-decoder): English number words to digits. Source: the words of a "
        "number n from 0 to max_number = "
     << options_.max_number
     << " (lower case, British style with 'and'), target: its decimal digits then '.', e.g. "
        "'twelve thousand three hundred and forty five' -> 12345. The digit count is drawn "
        "uniformly from 1 to "
     << max_digits_ << " first, so short numbers are common." << layout_text(*this)
     << " Validation numbers (1/8 of all numbers, picked by a hash of the number that does not "
        "depend on the seed) never occur in training.";
  return os.str();
}

std::vector<int64_t> NumbersTask::encode_source(const std::string& raw) const {
  const std::string e = err();
  const char* example = "e.g. 'twelve thousand three hundred and forty five'";
  std::vector<std::string> words;
  std::string word;
  for (char c : raw + " ") {
    if (c == ' ' || c == '-' || c == '\t' || c == '\n' || c == '\r') {  // "twenty-one" too
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  HL_CHECK(!words.empty(), e, ": prompt is empty; expected a number in words, ", example);
  const auto& vocab = number_vocab();
  std::vector<int64_t> ids;
  for (const std::string& w : words) {
    const auto it = std::find(vocab.begin() + 1, vocab.end(), w);  // "<pad>" is no number word
    if (it == vocab.end()) {
      std::string allowed;
      for (auto v = vocab.begin() + 1; v != vocab.end(); ++v) allowed += (allowed.empty() ? "" : ", ") + *v;
      HL_FAIL(e, ": prompt '", printable_text(raw), "' has word '", printable_text(w), "' outside the vocabulary (",
              allowed, ")");
    }
    ids.push_back(it - vocab.begin());
  }
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  // Well-formed means: exactly the canonical spelling of the value the words add up to.
  const std::optional<int64_t> value = words_value(ids);
  std::vector<int64_t> canonical;
  if (value) append_number_words(canonical, *value);
  HL_CHECK(value && canonical == ids, e, ": prompt '", printable_text(text), "' is not a number from 0 to ", kMaxNumber,
           " written in this task's style (British, with 'and'), e.g. 'twenty one', 'one hundred "
           "and one', 'one thousand and five', 'one thousand two hundred'");
  HL_CHECK(*value <= options_.max_number, e, ": prompt '", text, "' is ", *value,
           ", above max_number = ", options_.max_number);
  return ids;
}

std::string NumbersTask::decode_source(const std::vector<int64_t>& ids) const {
  const auto& vocab = number_vocab();
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    HL_CHECK(ids[i] >= 0 && ids[i] < static_cast<int64_t>(vocab.size()), err(), ": cannot decode source id ", ids[i],
             " at position ", i, ": the source vocabulary has ", vocab.size(), " words (ids 0 to ", vocab.size() - 1,
             ")");
    text += (i ? " " : "") + vocab[static_cast<size_t>(ids[i])];
  }
  return text;
}

Seq2SeqExample NumbersTask::example(Split split, uint64_t n) const {
  const uint64_t key = example_key(options_.seed, split, n);
  // Rejection sampling keeps each stream inside its part of the partition (8/7 attempts for
  // train, 8 for val, on average).
  for (uint64_t attempt = 0; attempt < kMaxAttempts; ++attempt) {
    CounterRng rng(hash_combine(key, attempt));
    const int64_t digits = 1 + static_cast<int64_t>(rng.below(static_cast<uint64_t>(max_digits_)));
    const int64_t lo = digits == 1 ? 0 : pow10(digits - 1);
    const int64_t hi = std::min(pow10(digits) - 1, options_.max_number);
    const int64_t value = lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(hi - lo + 1)));
    if (split_of_number(value) != split) continue;
    Seq2SeqExample ex;
    append_number_words(ex.source, value);
    for (char c : std::to_string(value)) ex.target.push_back(c - '0');  // id == digit
    ex.target.push_back(end_id_);
    return ex;
  }
  HL_FAIL(err(), ": found no ", split_name(split), " example in ", kMaxAttempts,
          " draws; the example space is too small");
}

}  // namespace

// =============================================================================================
// Factory

std::string number_words(int64_t n) {
  HL_CHECK(n >= 0 && n <= kMaxNumber, "number_words: ", n, " is outside [0, ", kMaxNumber, "]");
  std::vector<int64_t> ids;
  append_number_words(ids, n);
  std::string text;
  for (int64_t id : ids) text += (text.empty() ? "" : " ") + number_vocab()[static_cast<size_t>(id)];
  return text;
}

const std::vector<std::string>& seq2seq_task_names() {
  static const std::vector<std::string> names = {"copy", "reverse", "sort", "add", "numbers"};
  return names;
}

std::unique_ptr<Seq2SeqTask> make_seq2seq_task(const std::string& name, const TaskOptions& options) {
  using Kind = AlgorithmicTask::Kind;
  if (name == "copy") return std::make_unique<AlgorithmicPairs>(Kind::copy, options);
  if (name == "reverse") return std::make_unique<AlgorithmicPairs>(Kind::reverse, options);
  if (name == "sort") return std::make_unique<AlgorithmicPairs>(Kind::sort, options);
  if (name == "add") return std::make_unique<AlgorithmicPairs>(Kind::add, options);
  if (name == "numbers") return std::make_unique<NumbersTask>(options);
  std::string valid;
  for (const auto& n : seq2seq_task_names()) valid += (valid.empty() ? "" : ", ") + n;
  const bool gpt_only = std::find(task_names().begin(), task_names().end(), name) != task_names().end();
  HL_FAIL("unknown seq2seq task '", name, "': valid seq2seq tasks are ", valid,
          gpt_only ? " (" + name + " has no source/target pairs; it is a GPT task only)" : "");
}

}  // namespace headlab::tasks
