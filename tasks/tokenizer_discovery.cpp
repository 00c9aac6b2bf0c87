// A folder's tokenizer files by name (see tokenizer_discovery.h): the first kind present wins, and the reader
// of that kind says what is wrong with a file that is there but unreadable.
#include "tasks/tokenizer_discovery.h"

#include <filesystem>

#include "base/error.h"
#include "base/input_path.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/llama2c_tokenizer.h"
#include "tasks/sentencepiece_tokenizer.h"
#include "tasks/wordpiece_tokenizer.h"

namespace headlab::tasks {

namespace fs = std::filesystem;

FolderTokenizer folder_tokenizer(const std::string& folder, const std::string& vocab_path,
                                 const std::string& merges_path) {
  const auto file_in_folder = [&](const char* name) {
    const std::string p = (fs::path(folder) / name).string();
    return path_present(p) ? p : std::string();  // (the reader says what is wrong with it)
  };
  using Kind = FolderTokenizer::Kind;
  if (std::string p = file_in_folder("tokenizer.model"); !p.empty()) return {Kind::sentencepiece, p, ""};
  if (!vocab_path.empty() && !merges_path.empty()) return {Kind::gpt2_files, vocab_path, merges_path};
  if (std::string p = file_in_folder("tokenizer.json"); !p.empty()) {
    const Kind kind = is_wordpiece_tokenizer_json_file(p) ? Kind::wordpiece : Kind::tokenizer_json;
    return {kind, p, file_in_folder("tokenizer_config.json")};
  }
  if (std::string p = file_in_folder("vocab.txt"); !p.empty())
    return {Kind::wordpiece, p, file_in_folder("tokenizer_config.json")};
  if (std::string p = file_in_folder("tokenizer.bin"); !p.empty()) return {Kind::llama2c, p, ""};
  return {};
}

std::shared_ptr<const TextTokenizer> FolderTokenizer::make(int64_t vocab_size) const {
  switch (kind) {
    case Kind::sentencepiece:
      return SentencePieceTokenizer::from_file(path, vocab_size);
    case Kind::gpt2_files:
      return std::make_shared<const BpeTokenizer>(BpeTokenizer::from_files(path, second, vocab_size));
    case Kind::tokenizer_json:
      return std::make_shared<const BpeTokenizer>(BpeTokenizer::from_tokenizer_json_file(path, vocab_size, second));
    case Kind::wordpiece:
      return wordpiece_from_file(path, second, vocab_size);
    case Kind::llama2c:
      return Llama2cTokenizer::from_file(path, vocab_size);
    case Kind::none:
      break;
  }
  HL_FAIL("tokenizer: ", describe());
}

std::string FolderTokenizer::describe() const {
  switch (kind) {
    case Kind::sentencepiece:
      return path + " (SentencePiece)";
    case Kind::gpt2_files:
      return path + ", " + second;
    case Kind::tokenizer_json:
      return path + (second.empty() ? "" : ", " + second);
    case Kind::wordpiece:
      return path + (second.empty() ? "" : ", " + second) + " (BERT's WordPiece)";
    case Kind::llama2c:
      return path + " (llama2.c's)";
    case Kind::none:
      break;
  }
  return "none (no tokenizer.model, vocab.json and merges.txt, tokenizer.json, vocab.txt or tokenizer.bin)";
}

}  // namespace headlab::tasks
