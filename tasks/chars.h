// Language modelling over a text file, split 90/10 by position: chars (a character vocabulary of the
// text's own characters) and text (GPT-2's byte-level BPE, for GPT-2 models and their fine-tuning).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"  // every bad input throws headlab::Error
#include "tasks/bpe_tokenizer.h"
#include "tasks/task.h"
#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

// What chars and text share: the text read once and tokenized, and batches of windows of T + 1
// tokens at positions hashed from (seed, split, batch index, row); every target is scored.
class TextWindowsTask : public Task {
 public:
  std::string name() const override { return name_; }
  int64_t required_context_length() const override { return 1; }
  void check_context_length(int64_t T) const override;
  Batch batch(Split split, uint64_t index, int64_t B, int64_t T) const override;
  std::string expected_answer(const std::string&) const override { return ""; }

  bool has_text() const { return text_loaded_; }
  int64_t text_length() const { return static_cast<int64_t>(ids_.size()); }  // in tokens
  // [begin, end) token positions of a split's region of the text.
  std::pair<int64_t, int64_t> region(Split split) const;
  // The text as token ids (int32 to keep large texts small; ids are < vocab_size()).
  const std::vector<int32_t>& text_ids() const { return ids_; }
  // The text file's size and hash ("<bytes> bytes, fnv1a64 <hex>"; "" for an inline text or none).
  const std::string& text_digest() const { return digest_; }

 protected:
  // unit names the tokens in messages ("characters", "tokens"). Reads options.text, else
  // options.text_path; when the file cannot be read and may_lack_text (the tokenizer is known
  // without it: generate needs nothing more), the task is built without a text and batch() says why.
  TextWindowsTask(const TaskOptions& options, std::string name, std::string unit, bool may_lack_text);
  void set_ids(const std::vector<int64_t>& ids);
  std::string source() const;  // "text 'path'" or "text"
  // The text as read, until drop_text() (once tokenized); empty when it could not be read.
  const std::string& text() const { return text_; }
  void drop_text() { std::string().swap(text_); }
  // description(): "<name>: <what> (<source>, <length>, <vocabulary>). " and how batches are drawn and scored.
  std::string describe(const std::string& what, const std::string& vocabulary) const;

  TaskOptions options_;
  std::string name_, unit_;

 private:
  void check_region(Split split, int64_t T) const;
  void check_text(int64_t T) const;
  bool text_loaded_ = false;
  std::string missing_reason_;  // why the text could not be read
  std::string text_;            // until the derived task has tokenized it
  std::string digest_;          // text_digest()
  std::vector<int32_t> ids_;
};

// chars: the vocabulary is the text's sorted unique characters (or a checkpoint's stored list).
class CharsTask : public TextWindowsTask {
 public:
  explicit CharsTask(const TaskOptions& options);
  std::string description() const override;
  TaskOptions options() const override;
  Prompt encode_prompt(const std::string& text) const override;
  int64_t end_id() const override { return -1; }
  std::string format_answer(const std::vector<int64_t>& ids) const override;
};

// text: a pretrained model's subword tokenizer (options.subword, required: GPT-2's byte-level BPE, llama2.c's),
// so a pretrained model trains further on a text. Prompts start with the tokenizer's BOS where it has one;
// generation stops at its EOS (<|endoftext|>, </s>).
class BpeTextTask : public TextWindowsTask {
 public:
  explicit BpeTextTask(const TaskOptions& options);
  std::string description() const override;
  Batch batch(Split split, uint64_t index, int64_t B, int64_t T) const override;  // masked where mask_prob > 0
  TaskOptions options() const override { return options_; }
  int64_t vocab_size() const override { return subword_->size(); }
  std::string token_text(int64_t id) const override { return subword_->token_text(id); }
  Prompt encode_prompt(const std::string& text) const override;
  int64_t end_id() const override { return subword_->eos().value_or(-1); }
  std::string format_answer(const std::vector<int64_t>& ids) const override;
  std::string format_continuation(const Prompt& p, const std::vector<int64_t>& ids) const override;
  std::vector<int64_t> encode_continuation(const std::string& text) const override {
    return subword_->encode_continuation(text, "prompt");
  }
  const TextTokenizer& subword() const { return *subword_; }

 private:
  std::shared_ptr<const TextTokenizer> subword_;
};

}  // namespace headlab::tasks
