// Toy sequence tasks for next-token training: a character tokenizer, the algorithmic tasks
// (copy, reverse, sort, add) and a character-level language model over a text (chars).
// Pure data: everything here produces int64 token ids; nothing knows about tensors or devices.
//
// B = batch rows, T = tokens per row (the model's context length).
//
// Determinism: a batch is a pure function of (task options, seed, split, batch index, B, T).
// Example n of a stream (n = index * B + row) is drawn from a counter-based generator keyed by
// splitmix64(seed, split, n), so batch k is identical on every run and machine, and resuming a
// run needs nothing but the batch index. Tasks are immutable after construction, so batch()
// may be called from several threads at once (e.g. a prefetching loader).
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
#include "ops/ops.h"     // kIgnoreIndex
#include "tasks/tokenizer.h"

namespace headlab::tasks {
class TextTokenizer;
}

namespace headlab::tasks {

// ---------------------------------------------------------------------------------------------
enum class Split { train, val };
const char* split_name(Split split);  // "train" / "val"

// One batch, row-major (B, T). inputs = sequence[0:T], targets = sequence[1:T+1].
// Algorithmic tasks: targets are kIgnoreIndex except where the next token is an answer token or
// the end token; row b's scored span is t in [answer_begin[b], answer_end[b]).
// chars: every target counts, has_answers = false and the span vectors are empty.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int64_t> inputs;        // (B, T)
  std::vector<int64_t> targets;       // (B, T), kIgnoreIndex where no loss is taken
  bool has_answers = false;           // whole answers exist, so exact match applies
  std::vector<int64_t> answer_begin;  // (B,) first t whose target is an answer token
  std::vector<int64_t> answer_end;    // (B,) one past the t whose target is the end token

  // Encoder-decoder tasks (tasks/seq2seq.h) only: the source sequence, each row padded to the batch's
  // longest (S). inputs are then the decoder's inputs (bos, target[0..]) and targets the target tokens
  // (answer, end), both padded to the batch's longest target (T); answer_begin = 0.
  int64_t S = 0;
  std::vector<int64_t> source;             // (B, S) source ids, the source pad after each row's length
  std::vector<int64_t> source_valid_lens;  // (B,) source tokens per row (d2l's valid_lens)
  bool has_source() const { return S > 0; }

  int64_t input(int64_t b, int64_t t) const { return inputs[static_cast<size_t>(b * T + t)]; }
  // Rows [first, first + count) with the same T and S (data parallelism: one rank's share).
  Batch rows(int64_t first, int64_t count) const;
  int64_t scored_targets() const;  // targets that are not kIgnoreIndex
  int64_t target(int64_t b, int64_t t) const { return targets[static_cast<size_t>(b * T + t)]; }
};

// Teacher-forced scores of argmax predictions. Accumulate over batches with +=.
struct Metrics {
  int64_t tokens = 0;  // targets scored (not kIgnoreIndex)
  int64_t tokens_correct = 0;
  int64_t rows = 0;          // rows with an answer (0 when exact match does not apply)
  int64_t rows_correct = 0;  // rows whose every answer target (answer digits + end) is right
  bool has_exact_match = false;
  double token_accuracy = std::numeric_limits<double>::quiet_NaN();  // tokens_correct / tokens
  double exact_match = std::numeric_limits<double>::quiet_NaN();     // rows_correct / rows; NaN
                                                                     // when !has_exact_match

  Metrics& operator+=(const Metrics& other);
};

// predicted_ids: (B, T) argmax of the logits for batch.inputs. Throws on a size mismatch.
Metrics score(const Batch& batch, const std::vector<int64_t>& predicted_ids);

// ---------------------------------------------------------------------------------------------
// What make_task needs; a checkpoint stores it (options_to_map) next to the tokenizer's
// vocabulary and restores it with options_from_map plus `vocabulary = <stored list>`.
struct TaskOptions {
  uint64_t seed = 1;
  // copy / reverse / sort: digit strings with a length drawn uniformly from [min_len, max_len].
  // 4..8 keeps padding and variable answer spans in play and is still easy: a 2-layer emb-64
  // GPT reaches ~100% exact match on reverse in about 200 AdamW steps of batch 64.
  int64_t min_len = 4;
  int64_t max_len = 8;
  // add: operands of n_digits digits (zero-padded), sum of n_digits + 1 digits.
  int64_t n_digits = 3;
  // numbers (encoder-decoder only, tasks/seq2seq.h): numbers 0..max_number (at most 999999) in
  // words -> digits. 99999 gives targets of 1 to 5 digits.
  int64_t max_number = 99999;
  // chars: the text is `text` when non-empty, else read from text_path.
  std::string text_path = "data/tiny.txt";
  std::string text;
  // chars / text from a file: its size and hash as the run read it ("<bytes> bytes, fnv1a64 <hex>"), so
  // that a resumed run or an analysis reads the same data; empty: not checked (another file was asked for).
  std::string text_digest;
  // chars / text: data with more repetition, for studying induction heads (Olsson et al.'s form on text
  // that repeats within a context): the token stream is cut into segments of uniform length in
  // [max(2, repeat_span / 6), repeat_span] and each is written twice with probability repeat_prob,
  // drawn from the seed. 0: the text as it is.
  double repeat_prob = 0;
  int64_t repeat_span = 96;
  // text: the masked-LM objective (an encoder's: BERT) where > 0: each row is [CLS], a window of the text, [SEP];
  // each window token is replaced by [MASK] with this probability (at least one a row, drawn from the seed) and
  // scored against the token it hid, nothing else scored. 0: next-token prediction.
  double mask_prob = 0;
  // chars: a fixed vocabulary (from a checkpoint); empty = sorted unique characters of the text.
  // Algorithmic tasks: must be empty or equal to the task's own vocabulary.
  std::vector<std::string> vocabulary;
  // text: a pretrained model's subword tokenizer (a model folder's, a checkpoint's stored files, --tokenizer).
  // Not an option a map holds: a checkpoint stores its files (io::TokenizerFiles).
  std::shared_ptr<const TextTokenizer> subword;
};

// The options that matter for task `name` as key/value strings: seed, and min_len + max_len
// (copy/reverse/sort), n_digits (add), max_number (numbers), text_path and, only when given
// inline, text, and only when repeat_prob > 0, repeat_prob and repeat_span (chars, text).
// An unknown name gives every key. The vocabulary is not included: it travels as the
// tokenizer's list.
std::map<std::string, std::string> options_to_map(const std::string& name, const TaskOptions& options);
// Inverse of options_to_map; unknown keys and malformed numbers throw.
TaskOptions options_from_map(const std::map<std::string, std::string>& map);

// What to feed the model to generate an answer.
struct Prompt {
  std::vector<int64_t> ids;   // prompt tokens then the separator ('>' or '=')
  int64_t answer_length = 0;  // answer tokens to generate before the end token; -1: open-ended
  std::string text;           // the normalised prompt as the model sees it ("123+045=")
};

// ---------------------------------------------------------------------------------------------
class Task {
 public:
  virtual ~Task() = default;

  virtual std::string name() const = 0;
  // One paragraph: the format, an example line, what is scored, how train/val are split.
  virtual std::string description() const = 0;
  // Everything make_task(name(), options()) needs to rebuild this task exactly.
  virtual TaskOptions options() const = 0;
  // The character tokenizer (every task but text, whose subword tokenizer is BpeTextTask::subword()).
  const Tokenizer& tokenizer() const { return tokenizer_; }
  virtual int64_t vocab_size() const { return tokenizer_.size(); }
  // One token as text to show (attention pages, tables).
  virtual std::string token_text(int64_t id) const { return tokenizer_.decode({id}); }

  // Smallest context length T that holds a whole example (prompt + separator + answer + end);
  // chars: 1 (the text length is checked by check_context_length).
  virtual int64_t required_context_length() const = 0;
  // Throws a clear error when context length T cannot be used (too small; text too short).
  virtual void check_context_length(int64_t T) const = 0;

  // Batch `index` of the split's stream: rows are examples index*B .. index*B + B-1.
  virtual Batch batch(Split split, uint64_t index, int64_t B, int64_t T) const = 0;

  // Generation (headlab generate): validate and encode a user prompt, then greedy-decode
  // answer_length tokens (stop early at end_id()), then format_answer(generated ids).
  virtual Prompt encode_prompt(const std::string& text) const = 0;
  // The ids of text as it follows a prompt (an answer token): encode_prompt's, without what starts a prompt.
  virtual std::vector<int64_t> encode_continuation(const std::string& text) const { return encode_prompt(text).ids; }
  virtual int64_t end_id() const = 0;  // -1 when there is no end token (chars)
  // Human-readable answer from generated ids (everything from the end token on is dropped).
  // Never throws on a wrong answer, only on ids outside the vocabulary.
  virtual std::string format_answer(const std::vector<int64_t>& ids) const = 0;
  // The prompt and its continuation as one text (what generate prints).
  virtual std::string format_continuation(const Prompt& p, const std::vector<int64_t>& ids) const {
    return p.text + format_answer(ids);
  }
  // Reference answer of a user prompt in the same form as format_answer ("" for chars).
  virtual std::string expected_answer(const std::string& text) const = 0;

 protected:
  Tokenizer tokenizer_;
};

// ---------------------------------------------------------------------------------------------
// "copy", "reverse", "sort", "add", "chars", "text".
const std::vector<std::string>& task_names();
// Builds a task by name; unknown names throw listing the valid ones.
std::unique_ptr<Task> make_task(const std::string& name, const TaskOptions& options);
// Help text for `headlab train --help`: every task's one-line format with default options.
std::string tasks_help();

}  // namespace headlab::tasks
