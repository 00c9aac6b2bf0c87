// chars: a character-level language model over a text file.
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

// (the last 10% of FILE).
class CharsTask : public Task {
 public:
  explicit CharsTask(const TaskOptions& options);

  std::string name() const override { return "chars"; }
  std::string description() const override;
  TaskOptions options() const override;
  int64_t required_context_length() const override { return 1; }
  void check_context_length(int64_t T) const override;
  Batch batch(Split split, uint64_t index, int64_t B, int64_t T) const override;
  Prompt encode_prompt(const std::string& text) const override;
  int64_t end_id() const override { return -1; }
  std::string format_answer(const std::vector<int64_t>& ids) const override;
  std::string expected_answer(const std::string&) const override { return ""; }

  bool has_text() const { return text_loaded_; }
  int64_t text_length() const { return static_cast<int64_t>(ids_.size()); }  // in characters
  // [begin, end) character positions of a split's region of the text.
  std::pair<int64_t, int64_t> region(Split split) const;
  // The text as token ids (int32 to keep large texts small; ids are < vocab_size()).
  const std::vector<int32_t>& text_ids() const { return ids_; }

 private:
  void check_region(Split split, int64_t T) const;
  std::string source() const;  // "text 'path'" or "text"

  TaskOptions options_;
  bool text_loaded_ = false;
  std::string missing_reason_;  // why the text could not be read (vocabulary-only task)
  std::vector<int32_t> ids_;
};

}  // namespace headlab::tasks
