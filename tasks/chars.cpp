// chars and text: language models over a text file, split 90/10 by position.
#include "tasks/chars.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "base/error.h"
#include "base/hash.h"
#include "tasks/internal.h"

namespace headlab::tasks {

using namespace detail;

// =============================================================================================
// The shared windows

TextWindowsTask::TextWindowsTask(const TaskOptions& options, std::string name, std::string unit, bool may_lack_text)
    : options_(options), name_(std::move(name)), unit_(std::move(unit)) {
  const std::string e = "task " + name_;
  if (!options_.text.empty()) {
    text_ = options_.text;
  } else if (options_.text_path.empty()) {
    HL_CHECK(may_lack_text, e, ": no text given; set a text file (--text FILE)");
    missing_reason_ = "no text file was given";
  } else {
    std::string why_not;
    text_ = read_text_file(options_.text_path, WholeFile::text, why_not);
    if (!why_not.empty()) {
      HL_CHECK(may_lack_text, e, ": text file '", options_.text_path, "' ", why_not,
               "; pass --text FILE with a plain-text file");
      missing_reason_ = "text file '" + options_.text_path + "' " + why_not;
    } else {
      HL_CHECK(!text_.empty(), e, ": text file '", options_.text_path, "' is empty");
      char hex[17];
      std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(text_.data(), text_.size())));
      digest_ = std::to_string(text_.size()) + " bytes, fnv1a64 " + hex;
      HL_CHECK(options_.text_digest.empty() || options_.text_digest == digest_, e, ": text file '", options_.text_path,
               "' is not the text this run was trained on (", options_.text_digest, "; now ", digest_,
               "): restore that file, or give the text to read with --text where the command takes it");
    }
  }
  text_loaded_ = missing_reason_.empty();
}

void TextWindowsTask::set_ids(const std::vector<int64_t>& ids) {
  const double p = options_.repeat_prob;
  const int64_t span = options_.repeat_span;
  if (p <= 0) {
    ids_.assign(ids.begin(), ids.end());
    return;
  }
  HL_CHECK(p <= 1 && span >= 2, "task ", name_,
           ": repeated segments need a probability in [0, 1] and a span >= 2; got ", p, " and ", span);
  const int64_t lo = std::max<int64_t>(2, span / 6), n = static_cast<int64_t>(ids.size());
  CounterRng rng(hash_combine(splitmix64(options_.seed), 0x7265706561ULL));  // "repea": apart from the batches'
  ids_.clear();
  ids_.reserve(static_cast<size_t>(n + n * p));
  for (int64_t at = 0; at < n;) {
    const int64_t len = std::min(n - at, lo + static_cast<int64_t>(rng.below(static_cast<uint64_t>(span - lo + 1))));
    const bool twice = static_cast<double>(rng.below(uint64_t{1} << 53)) < p * static_cast<double>(uint64_t{1} << 53);
    for (int copy = 0; copy < (twice ? 2 : 1); ++copy)
      ids_.insert(ids_.end(), ids.begin() + at, ids.begin() + at + len);
    at += len;
  }
}

std::string TextWindowsTask::source() const {
  return options_.text.empty() ? "text '" + options_.text_path + "'" : std::string("text");
}

std::string TextWindowsTask::describe(const std::string& what, const std::string& vocabulary) const {
  std::ostringstream os;
  os << name_ << ": " << what << " (" << source() << ", ";
  if (has_text())
    os << text_length() << " " << unit_;
  else
    os << "not loaded";
  os << ", " << vocabulary << ")";
  if (options_.repeat_prob > 0)
    os << ", with more repetition: segments of " << std::max<int64_t>(2, options_.repeat_span / 6) << ".."
       << options_.repeat_span << " " << unit_ << " each written twice with probability " << options_.repeat_prob;
  os << ". Each row is a window of context length + 1 " << unit_
     << " at a position hashed from (seed, split, batch index, row); inputs are its first T " << unit_
     << ", targets its last T, and every position is scored (token accuracy; exact match does not apply). "
        "The first "
     << kTrainPercent << "% of the text is train, the last " << 100 - kTrainPercent << "% validation.";
  return os.str();
}

std::pair<int64_t, int64_t> TextWindowsTask::region(Split split) const {
  const int64_t n = text_length();
  const int64_t cut = n * kTrainPercent / 100;
  return split == Split::train ? std::pair<int64_t, int64_t>{0, cut} : std::pair<int64_t, int64_t>{cut, n};
}

void TextWindowsTask::check_region(Split split, int64_t T) const {
  const auto [begin, end] = region(split);
  const int64_t have = end - begin;
  HL_CHECK(have >= T + 1, "task ", name_, ": the ", split == Split::train ? "training" : "validation", " part of ",
           source(), " (its ", split == Split::train ? "first " : "last ",
           split == Split::train ? kTrainPercent : 100 - kTrainPercent, "%) has ", have, " ", unit_,
           ", need at least context_length + 1 = ", T + 1,
           " for one window; use a longer text or a smaller context length");
}

void TextWindowsTask::check_text(int64_t T) const {
  HL_CHECK(T > 0, "task ", name_, ": context length must be positive, got ", T);
  HL_CHECK(text_loaded_, "task ", name_, ": no text to read: ", missing_reason_,
           "; pass --text FILE with a plain-text file");
  HL_CHECK(text_length() >= T + 2, "task ", name_, ": ", source(), " has ", text_length(), " ", unit_,
           ", need at least context_length + 2 = ", T + 2);
}

void TextWindowsTask::check_context_length(int64_t T) const {
  check_text(T);
  check_region(Split::train, T);
  check_region(Split::val, T);
}

Batch TextWindowsTask::batch(Split split, uint64_t index, int64_t B, int64_t T) const {
  HL_CHECK(B > 0, "task ", name_, ": batch size must be positive, got ", B);
  check_text(T);
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

// ---------------------------------------------------------------------------------------------
// chars

// With a stored vocabulary the task can still tokenize without its text.
CharsTask::CharsTask(const TaskOptions& options)
    : TextWindowsTask(options, "chars", "characters", !options.vocabulary.empty()) {
  const std::string e = "task chars";
  tokenizer_ = options_.vocabulary.empty() ? Tokenizer::from_text(text(), e) : Tokenizer(options_.vocabulary, e);
  if (!has_text()) return;
  try {
    set_ids(tokenizer_.encode(text(), source(), false));
  } catch (const Error& err) {
    if (options_.vocabulary.empty()) throw;
    throw Error(std::string(err.what()) +
                " (the vocabulary is fixed by the model's training text; this text uses a "
                "character the model has never seen)");
  }
  drop_text();
}

TaskOptions CharsTask::options() const {
  TaskOptions o = options_;
  o.vocabulary = tokenizer_.vocab();
  return o;
}

std::string CharsTask::description() const {
  return describe("character-level language model over a text",
                  "vocabulary of " + std::to_string(vocab_size()) + " characters: its sorted unique characters");
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

// ---------------------------------------------------------------------------------------------
// text (GPT-2's BPE)

BpeTextTask::BpeTextTask(const TaskOptions& options)
    : TextWindowsTask(options, "text", "tokens", true), subword_(options.subword) {
  HL_CHECK(subword_ != nullptr,
           "task text: needs a subword tokenizer; start from a pretrained model (train --init FOLDER or FILE)");
  HL_CHECK(options_.mask_prob == 0 || (subword_->mask() && subword_->bos() && subword_->eos()),
           "task text: the masked-LM objective needs a tokenizer with [MASK], [CLS] and [SEP] (BERT's WordPiece); ",
           subword_->describe(), " has not");
  if (has_text()) {
    set_ids(subword_->encode_prompt(text(), true, options_.text.empty() ? options_.text_path : "text"));
  }
  drop_text();
}

std::string BpeTextTask::description() const {
  if (options_.mask_prob == 0) return describe("language model over a text", subword_->describe());
  return describe("masked language model over a text (each token masked with probability " +
                      std::to_string(options_.mask_prob) + ", rows framed by [CLS] and [SEP])",
                  subword_->describe());
}

// Windows of T - 2 text tokens framed as BERT reads a sentence, [CLS] window [SEP]; the masked positions, drawn from
// their own stream of the row's key, hold [MASK] and are the only ones scored (all [MASK]: BERT's evaluation form,
// not its 80/10/10 training rule).
Batch BpeTextTask::batch(Split split, uint64_t index, int64_t B, int64_t T) const {
  if (options_.mask_prob == 0) return TextWindowsTask::batch(split, index, B, T);
  HL_CHECK(T >= 3, "task text: the masked-LM rows need a context of at least 3 tokens ([CLS], one, [SEP]), got ", T);
  Batch window = TextWindowsTask::batch(split, index, B, T - 2);
  Batch b;
  b.B = B, b.T = T;
  b.inputs.assign(static_cast<size_t>(B * T), *subword_->eos());
  b.targets.assign(static_cast<size_t>(B * T), kIgnoreIndex);
  constexpr uint64_t kMaskSalt = 0x6d61736b6c6d3031ULL;  // "masklm01": the masks' stream, apart from the windows'
  for (int64_t r = 0; r < B; ++r) {
    CounterRng rng(
        example_key(options_.seed ^ kMaskSalt, split, index * static_cast<uint64_t>(B) + static_cast<uint64_t>(r)));
    const auto at = [&](int64_t t) { return static_cast<size_t>(r * T + t); };
    b.inputs[at(0)] = *subword_->bos();
    const auto threshold = static_cast<uint64_t>(options_.mask_prob * 1e9);
    bool any = false;
    for (int64_t t = 1; t < T - 1; ++t) {
      const int64_t id = window.input(r, t - 1);
      b.inputs[at(t)] = id;
      if (rng.below(1000000000) < threshold) b.inputs[at(t)] = *subword_->mask(), b.targets[at(t)] = id, any = true;
    }
    if (!any) {  // every row scores a token
      const auto t = static_cast<int64_t>(1 + rng.below(static_cast<uint64_t>(T - 2)));
      b.targets[at(t)] = b.inputs[at(t)], b.inputs[at(t)] = *subword_->mask();
    }
  }
  return b;
}

Prompt BpeTextTask::encode_prompt(const std::string& text) const {
  Prompt p;
  p.ids = subword_->encode_prompt(text);  // SentencePiece LLaMA models: <s> first
  HL_CHECK(!p.ids.empty(), "task text: prompt is empty; give at least one character");
  p.answer_length = -1;
  p.text = text;
  return p;
}

std::string BpeTextTask::format_answer(const std::vector<int64_t>& ids) const {
  std::vector<int64_t> kept = ids;  // everything from <|endoftext|> on is dropped, as the Task contract says
  const int64_t end = end_id();
  if (end >= 0) kept.erase(std::find(kept.begin(), kept.end(), end), kept.end());
  return subword_->decode(kept);
}

std::string BpeTextTask::format_continuation(const Prompt& p, const std::vector<int64_t>& ids) const {
  std::vector<int64_t> all = p.ids;  // decoded as one sequence: a tokenizer's rules at the start (<s>) hold
  const int64_t end = end_id();
  all.insert(all.end(), ids.begin(), end >= 0 ? std::find(ids.begin(), ids.end(), end) : ids.end());
  return subword_->decode(all);
}

}  // namespace headlab::tasks
