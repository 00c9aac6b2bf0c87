// The chars task: a character-level language model over a text file, split 90/10 by position.
#include "tasks/chars.h"

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
// chars

namespace {}  // namespace

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
      HL_CHECK(!options_.vocabulary.empty(), e, ": text file '", options_.text_path, "' ", why_not,
               "; pass --text FILE with a plain-text file");
      missing_reason_ = "text file '" + options_.text_path + "' " + why_not;
    } else {
      HL_CHECK(!text.empty(), e, ": text file '", options_.text_path, "' is empty");
    }
  }
  text_loaded_ = missing_reason_.empty();

  tokenizer_ = options_.vocabulary.empty() ? Tokenizer::from_text(text, e) : Tokenizer(options_.vocabulary, e);
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
     << kTrainPercent << "% of the text is train, the last " << 100 - kTrainPercent << "% validation.";
  return os.str();
}

std::pair<int64_t, int64_t> CharsTask::region(Split split) const {
  const int64_t n = text_length();
  const int64_t cut = n * kTrainPercent / 100;
  return split == Split::train ? std::pair<int64_t, int64_t>{0, cut} : std::pair<int64_t, int64_t>{cut, n};
}

void CharsTask::check_region(Split split, int64_t T) const {
  const auto [begin, end] = region(split);
  const int64_t have = end - begin;
  HL_CHECK(have >= T + 1, "task chars: the ", split == Split::train ? "training" : "validation", " part of ", source(),
           " (its ", split == Split::train ? "first " : "last ",
           split == Split::train ? kTrainPercent : 100 - kTrainPercent, "%) has ", have,
           " characters, need at least context_length + 1 = ", T + 1,
           " for one window; use a longer text or a smaller context length");
}

void CharsTask::check_context_length(int64_t T) const {
  HL_CHECK(T > 0, "task chars: context length must be positive, got ", T);
  HL_CHECK(text_loaded_, "task chars: no text to read: ", missing_reason_, "; pass --text FILE with a plain-text file");
  HL_CHECK(text_length() >= T + 2, "task chars: ", source(), " has ", text_length(),
           " characters, need at least context_length + 2 = ", T + 2);
  check_region(Split::train, T);
  check_region(Split::val, T);
}

Batch CharsTask::batch(Split split, uint64_t index, int64_t B, int64_t T) const {
  HL_CHECK(B > 0, "task chars: batch size must be positive, got ", B);
  HL_CHECK(T > 0, "task chars: context length must be positive, got ", T);
  HL_CHECK(text_loaded_, "task chars: no text to read: ", missing_reason_, "; pass --text FILE with a plain-text file");
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
    CounterRng rng(example_key(options_.seed, split, index * static_cast<uint64_t>(B) + static_cast<uint64_t>(b)));
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

std::string CharsTask::format_answer(const std::vector<int64_t>& ids) const { return tokenizer_.decode(ids); }

}  // namespace headlab::tasks
