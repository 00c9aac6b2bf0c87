// Token ids written as numbers: the tokenizer of a model whose file holds none (the checkpoints papers publish,
// such as Nanda et al.'s modular addition, whose tokens are numbers and an "=" to begin with). A text is ids
// separated by spaces, each a number in [0, size) or one of the tokens' names ("="); a token shows as its name
// or its number.
#pragma once
#include <map>
#include <string>

#include "tasks/text_tokenizer.h"

namespace headlab::tasks {

class IdTokenizer : public TextTokenizer {
 public:
  // names: the tokens shown by a name rather than their number ({113: "="}); names are single words.
  IdTokenizer(int64_t size, std::map<int64_t, std::string> names = {});
  // From its file, ids.json ({"size": N, "names": {"113": "="}}); where names it in errors.
  static IdTokenizer from_json(const std::string& text, const std::string& where);

  int64_t size() const override { return size_; }
  std::vector<int64_t> encode(std::string_view text, std::string_view label = "prompt") const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string token_text(int64_t id) const override;
  std::optional<int64_t> eos() const override { return std::nullopt; }
  std::string describe() const override;
  TokenizerFiles files() const override;

 private:
  int64_t size_;
  std::map<int64_t, std::string> names_;
};

}  // namespace headlab::tasks
