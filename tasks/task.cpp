// What every task shares: splits, scoring of argmax predictions, options as key/value strings,
// and the factory that builds a task by name.
#include "tasks/task.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "base/error.h"
#include "tasks/algorithmic.h"
#include "tasks/chars.h"
#include "tasks/internal.h"
#include "tasks/seq2seq.h"

namespace headlab::tasks {

using namespace detail;

// =============================================================================================
// Splits, metrics

const char* split_name(Split split) { return split == Split::train ? "train" : "val"; }

namespace {
double ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : std::numeric_limits<double>::quiet_NaN();
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

Batch Batch::rows(int64_t first, int64_t count) const {
  HL_CHECK(first >= 0 && count >= 0 && first + count <= B, "batch: rows [", first, ", ", first + count,
           ") are outside a batch of ", B, " rows");
  // The rows of a (B, width) row-major vector; empty vectors (no spans, no source) stay empty.
  const auto take = [first, count](const std::vector<int64_t>& v, int64_t width) {
    if (v.empty()) return v;
    return std::vector<int64_t>(v.begin() + first * width, v.begin() + (first + count) * width);
  };
  Batch r = *this;
  r.B = count;
  r.inputs = take(inputs, T);
  r.targets = take(targets, T);
  r.answer_begin = take(answer_begin, 1);
  r.answer_end = take(answer_end, 1);
  r.source = take(source, S);
  r.source_valid_lens = take(source_valid_lens, 1);
  return r;
}

int64_t Batch::scored_targets() const {
  return static_cast<int64_t>(
      std::count_if(targets.begin(), targets.end(), [](int64_t t) { return t != kIgnoreIndex; }));
}

Metrics score(const Batch& batch, const std::vector<int64_t>& predicted_ids) {
  const int64_t B = batch.B, T = batch.T;
  HL_CHECK(B >= 0 && T >= 0 && static_cast<int64_t>(batch.targets.size()) == B * T, "score: batch targets have ",
           batch.targets.size(), " entries, expected B * T = ", B, " * ", T, " = ", B * T);
  HL_CHECK(static_cast<int64_t>(predicted_ids.size()) == B * T, "score: predicted_ids has ", predicted_ids.size(),
           " entries, expected B * T = ", B, " * ", T, " = ", B * T,
           " (argmax of the logits for every input position)");
  if (batch.has_answers)
    HL_CHECK(static_cast<int64_t>(batch.answer_begin.size()) == B && static_cast<int64_t>(batch.answer_end.size()) == B,
             "score: batch has answers but its answer spans have ", batch.answer_begin.size(), " and ",
             batch.answer_end.size(), " entries, expected B = ", B);
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
    HL_CHECK(0 <= begin && begin < end && end <= T, "score: row ", b, " has answer span [", begin, ", ", end,
             ") outside [0, T = ", T, ")");
    bool all = true;
    for (int64_t t = begin; t < end; ++t)
      all = all && predicted_ids[static_cast<size_t>(b * T + t)] == batch.target(b, t);
    ++m.rows;
    if (all) ++m.rows_correct;
  }
  m.token_accuracy = ratio(m.tokens_correct, m.tokens);
  m.exact_match = m.has_exact_match ? ratio(m.rows_correct, m.rows) : std::numeric_limits<double>::quiet_NaN();
  return m;
}

// =============================================================================================
// Options and factory

std::map<std::string, std::string> options_to_map(const std::string& name, const TaskOptions& o) {
  auto named = [&](const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  const bool any = !named(task_names()) && !named(seq2seq_task_names());
  std::map<std::string, std::string> m;
  m["seed"] = std::to_string(o.seed);
  if (any || name == "copy" || name == "reverse" || name == "sort") {
    m["min_len"] = std::to_string(o.min_len);
    m["max_len"] = std::to_string(o.max_len);
  }
  if (any || name == "add") m["n_digits"] = std::to_string(o.n_digits);
  if (any || name == "numbers") m["max_number"] = std::to_string(o.max_number);
  if (any || name == "chars" || name == "text") {
    m["text_path"] = o.text_path;
    if (!o.text.empty()) m["text"] = o.text;
    if (!o.text_digest.empty()) m["text_digest"] = o.text_digest;  // absent in older checkpoints
    if (o.repeat_prob > 0) {  // absent otherwise: checkpoints without it read as before
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.17g", o.repeat_prob);
      m["repeat_prob"] = buf;
      m["repeat_span"] = std::to_string(o.repeat_span);
    }
  }
  if ((any || name == "text") && o.mask_prob > 0) {  // absent for next-token prediction, as before
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", o.mask_prob);
    m["mask_prob"] = buf;
  }
  return m;
}

TaskOptions options_from_map(const std::map<std::string, std::string>& map) {
  TaskOptions o;
  auto parse = [](const std::string& key, const std::string& value, auto& out) {
    const char* first = value.data();
    const char* last = value.data() + value.size();
    const auto [ptr, ec] = std::from_chars(first, last, out);
    HL_CHECK(ec == std::errc() && ptr == last && !value.empty(), "task options: key '", key, "' has value '", value,
             "', expected an integer");
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
    } else if (key == "max_number") {
      parse(key, value, o.max_number);
    } else if (key == "text_path") {
      o.text_path = value;
    } else if (key == "text") {
      o.text = value;
    } else if (key == "text_digest") {
      o.text_digest = value;
    } else if (key == "repeat_prob") {
      char* end = nullptr;
      o.repeat_prob = std::strtod(value.c_str(), &end);
      HL_CHECK(!value.empty() && end == value.c_str() + value.size() && o.repeat_prob >= 0 && o.repeat_prob <= 1,
               "task options: key 'repeat_prob' has value '", value, "', expected a probability in [0, 1]");
    } else if (key == "repeat_span") {
      parse(key, value, o.repeat_span);
    } else if (key == "mask_prob") {
      char* end = nullptr;
      o.mask_prob = std::strtod(value.c_str(), &end);
      HL_CHECK(!value.empty() && end == value.c_str() + value.size() && o.mask_prob >= 0 && o.mask_prob <= 1,
               "task options: key 'mask_prob' has value '", value, "', expected a probability in [0, 1]");
    } else {
      HL_FAIL("task options: unknown key '", key,
              "'; known keys are seed, min_len, max_len, n_digits, max_number, text_path, text, text_digest, "
              "repeat_prob, repeat_span, mask_prob");
    }
  }
  return o;
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"copy", "reverse", "sort", "add", "chars", "text"};
  return names;
}

std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options) {
  using Kind = AlgorithmicTask::Kind;
  if (name == "copy") return std::make_unique<AlgorithmicTask>(Kind::copy, options);
  if (name == "reverse") return std::make_unique<AlgorithmicTask>(Kind::reverse, options);
  if (name == "sort") return std::make_unique<AlgorithmicTask>(Kind::sort, options);
  if (name == "add") return std::make_unique<AlgorithmicTask>(Kind::add, options);
  if (name == "chars") return std::make_unique<CharsTask>(options);
  if (name == "text") return std::make_unique<BpeTextTask>(options);
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
     << "  chars    character-level language model over --text FILE (default " << d.text_path << ")\n"
     << "  text     (with --init FOLDER, a GPT-2 model) GPT-2's BPE language model over --text FILE\n"
     << "  numbers  (encoder-decoder only) number words to digits:\n"
     << "           one thousand and five -> 1005.   three hundred and twelve -> 312.\n"
     << "copy/reverse/sort use " << range_text(d.min_len, d.max_len) << " digits (min_len, max_len); add uses "
     << d.n_digits << "-digit operands (n_digits); numbers 0 to " << d.max_number
     << " (max_number). Loss and accuracy count only the answer and its end '.'; "
        "1/8 of all prompts (by a hash) are held out for validation. chars: first "
     << kTrainPercent << "% of the text trains, the last " << 100 - kTrainPercent << "% validates.\n";
  return os.str();
}

}  // namespace headlab::tasks
