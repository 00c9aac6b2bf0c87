// A byte-level BPE tokenizer as its two files' contents (GPT-2's vocab.json and merges.txt): how a
// checkpoint carries the tokenizer it was trained with, and what export writes beside the weights.
#pragma once
#include <string>

namespace headlab::io {

struct TokenizerFiles {
  std::string vocab_json, merges_txt;
  bool empty() const { return vocab_json.empty() && merges_txt.empty(); }
};

}  // namespace headlab::io
