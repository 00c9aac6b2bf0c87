// copy, reverse, sort and add: digit-string tasks whose answers are scored whole (exact match).
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"  // every bad input throws headlab::Error
#include "tasks/task.h"

namespace headlab::tasks {

// One algorithmic example, unpadded.
struct Example {
  std::vector<int64_t> tokens;  // prompt, separator, answer, end
  int64_t answer_begin = 0;     // index in tokens of the first answer token
  std::string prompt_text;      // human readable ("123+45" for add, digits otherwise)
  std::string answer_text;      // human readable ("168" for add, digits otherwise)
};

// copy, reverse, sort, add. Vocabulary: digits first so that id == digit value.
//   copy/reverse/sort: 0-9 > . _   (ids 0-9, 10, 11, 12)
//   add:               0-9 + = . _ (ids 0-9, 10, 11, 12, 13)
// Train/val disjointness: an example belongs to val iff splitmix64 of its prompt (with a fixed
// salt, independent of the seed) is 0 mod 8; each stream rejection-samples prompts of its own
// part. So 1/8 of all prompts are never trained on, for every seed.
class AlgorithmicTask : public Task {
 public:
  enum class Kind { copy, reverse, sort, add };
  AlgorithmicTask(Kind kind, const TaskOptions& options);

  std::string name() const override;
  std::string description() const override;
  TaskOptions options() const override { return options_; }
  int64_t required_context_length() const override;
  void check_context_length(int64_t T) const override;
  Batch batch(Split split, uint64_t index, int64_t B, int64_t T) const override;
  Prompt encode_prompt(const std::string& text) const override;
  int64_t end_id() const override { return end_id_; }
  std::string format_answer(const std::vector<int64_t>& ids) const override;
  std::string expected_answer(const std::string& text) const override;

  Kind kind() const { return kind_; }
  // Example n of a split's stream (batch(split, i, B, T) row r is example i*B + r).
  Example example(Split split, uint64_t n) const;
  // The example for a user prompt ("31415", "123+45"); same validation as encode_prompt.
  Example make_example(const std::string& prompt_text) const;
  // Which part of the example space a prompt (its token ids, without separator) belongs to.
  Split split_of(const std::vector<int64_t>& prompt_ids) const;

  // The same rows with one prompt digit each changed to another digit (position and digit drawn from
  // seed and the row) and the answer recomputed: activation patching's corrupted input. The layout
  // is the clean one position by position (the length does not change).
  Batch corrupt(const Batch& clean, uint64_t seed) const;

  int64_t sep_id() const { return sep_id_; }
  int64_t pad_id() const { return pad_id_; }
  int64_t plus_id() const { return plus_id_; }  // add only; -1 otherwise

 private:
  std::vector<int64_t> parse_prompt(const std::string& text) const;  // -> prompt ids
  Example build(const std::vector<int64_t>& prompt_ids) const;
  void put_row(Batch& batch, int64_t b, const Example& ex) const;  // row b of a (B, T) batch
  std::string err() const { return "task " + name(); }

  Kind kind_;
  TaskOptions options_;
  int64_t sep_id_ = -1, end_id_ = -1, pad_id_ = -1, plus_id_ = -1;
};

// Character-level language model over a text: windows of T+1 characters; the first 90% of the
// text (in characters) is train, the last 10% validation. Every position is a target.
// A task made with a vocabulary but whose text file is missing still tokenizes (generate works);
// batch() then throws naming the file. Eval on another text: the stored options and vocabulary
// with text_path = FILE (characters outside the vocabulary throw), then e.g. Split::val batches

}  // namespace headlab::tasks
