// Encoder-decoder ("seq2seq") toy tasks for d2l's encoder-decoder Transformer: copy, reverse, sort
// and add as (source, target) pairs with exactly the GPT tasks' examples and split, and numbers
// (English number words -> digits). Each batch is padded to its own longest source and target.
//
// B = batch rows, S = source tokens, T = target tokens (answer + end), both per batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace headlab::tasks {

// One (source, target) pair, unpadded.
struct Seq2SeqExample {
  std::vector<int64_t> source;  // source ids (source vocabulary), no bos or end
  std::vector<int64_t> target;  // answer ids then the end id (target vocabulary)
};

// A task whose examples are (source, target) pairs for an encoder-decoder. Its Task face:
// tokenizer() is the TARGET vocabulary (a character Tokenizer), end_id() the target's end token,
// batch() returns seq2seq batches (Batch::has_source()): T is ignored, each batch is padded to its
// own longest target (answer + end) and S to its longest source; inputs = bos, target[0..len-1),
// targets = target then kIgnoreIndex, answer span [0, len), so score() applies unchanged.
// encode_prompt(text) -> Prompt{ids = SOURCE ids of the user's text, answer_length = -1,
// text = the source normalised}; generation feeds bos and decodes until end_id().
// required_context_length() is the longest possible target incl. end (what a decoder must hold);
// check_context_length(T) throws when T is shorter.
class Seq2SeqTask : public Task {
 public:
  // Token id = position; what a checkpoint stores.
  virtual std::vector<std::string> source_vocab() const = 0;
  int64_t source_vocab_size() const { return static_cast<int64_t>(source_vocab().size()); }
  virtual int64_t source_pad_id() const = 0;
  virtual int64_t bos_id() const = 0;  // the decoder's first input (target vocabulary)
  virtual int64_t target_pad_id() const = 0;
  // The longest possible source (a positional encoding must hold it).
  virtual int64_t max_source_length() const = 0;
  // The user's text as source ids (same validation as encode_prompt; a clear error naming the task
  // and the bad token, listing what is allowed).
  virtual std::vector<int64_t> encode_source(const std::string& text) const = 0;
  // The source ids back as text (words joined by spaces for word-level sources). Ids outside the
  // source vocabulary throw.
  virtual std::string decode_source(const std::vector<int64_t>& ids) const = 0;

  // Example n of a split's stream (batch(split, i, B, T) row r is example i*B + r).
  virtual Seq2SeqExample example(Split split, uint64_t n) const = 0;

  void check_context_length(int64_t T) const override;
  Batch batch(Split split, uint64_t index, int64_t B, int64_t T) const final;
  Prompt encode_prompt(const std::string& text) const final;
};

// "copy", "reverse", "sort", "add", "numbers".
const std::vector<std::string>& seq2seq_task_names();
// Builds a seq2seq task by name; unknown names throw listing the valid ones.
std::unique_ptr<Seq2SeqTask> make_seq2seq_task(const std::string& name, const TaskOptions& options);

// numbers: n in [0, 999999] in words, British style with "and" ("one thousand and five",
// "twelve thousand three hundred and forty five"). Out of range throws.
std::string number_words(int64_t n);

}  // namespace headlab::tasks
