// SentencePiece through libsentencepiece: the processor owns the model; this adds headlab's errors (the file
// and what was wrong), the range checks and the continuation encoding.
#include "tasks/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/input_path.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/id_tokenizer.h"
#include "tasks/internal.h"
#include "tasks/llama2c_tokenizer.h"
#include "tasks/wordpiece_tokenizer.h"

namespace headlab::tasks {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
  std::string name;
  std::string model;  // the serialized model as read (a checkpoint carries it)
  void check_id(int64_t id) const {
    HL_CHECK(id >= 0 && id < sp.GetPieceSize(), name, ": token id ", id, " is out of range for ", sp.GetPieceSize(),
             " tokens");
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::shared_ptr<const SentencePieceTokenizer> SentencePieceTokenizer::from_file(const std::string& path,
                                                                                int64_t vocab_size) {
  check_input_file(path, "tokenizer");
  std::string why_not;
  const std::string bytes = detail::read_text_file(path, WholeFile::tokenizer, why_not);
  HL_CHECK(why_not.empty(), "tokenizer '", path, "': ", why_not);
  return from_bytes(bytes, "tokenizer '" + path + "'", vocab_size);
}

std::shared_ptr<const SentencePieceTokenizer> SentencePieceTokenizer::from_bytes(std::string bytes, std::string name,
                                                                                 int64_t vocab_size) {
  auto impl = std::make_unique<Impl>();
  impl->name = std::move(name);
  impl->model = std::move(bytes);
  const auto status = impl->sp.LoadFromSerializedProto(impl->model);
  HL_CHECK(status.ok(), impl->name, ": not a SentencePiece model (", status.ToString(), ")");
  const int64_t n = impl->sp.GetPieceSize();
  HL_CHECK(vocab_size <= 0 || n == vocab_size, impl->name, ": ", n, " tokens, but the model emits ", vocab_size);
  return std::shared_ptr<const SentencePieceTokenizer>(new SentencePieceTokenizer(std::move(impl)));
}

int64_t SentencePieceTokenizer::size() const { return impl_->sp.GetPieceSize(); }

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text, std::string_view label) const {
  detail::check_utf8(text, label);
  const std::vector<int> ids = impl_->sp.EncodeAsIds(text);
  return {ids.begin(), ids.end()};
}

std::vector<int64_t> SentencePieceTokenizer::encode_continuation(std::string_view text, std::string_view label) const {
  std::vector<int64_t> ids = encode(text, label);
  if (ids.empty()) return ids;
  const std::string& first = impl_->sp.IdToPiece(static_cast<int>(ids[0]));
  if (first == kSpace && (ids.size() > 1 || text.empty() || text[0] != ' ')) {
    ids.erase(ids.begin());  // the dummy space alone
  } else if (!text.empty() && text[0] != ' ' && first.starts_with(kSpace)) {
    const int bare = impl_->sp.PieceToId(first.substr(3));  // the dummy space merged into the first piece
    if (!impl_->sp.IsUnknown(bare)) ids[0] = bare;
  }
  return ids;
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> in;
  for (const int64_t id : ids) {
    impl_->check_id(id);
    in.push_back(static_cast<int>(id));
  }
  return impl_->sp.DecodeIds(in);
}

std::string SentencePieceTokenizer::token_text(int64_t id) const {
  impl_->check_id(id);
  const int i = static_cast<int>(id);
  if (impl_->sp.IsControl(i) || impl_->sp.IsUnknown(i)) return impl_->sp.IdToPiece(i);
  const std::string s = impl_->sp.IsByte(i) ? impl_->sp.DecodeIds({i}) : impl_->sp.IdToPiece(i);
  std::string spaced;  // SentencePiece's space as a space (built anew: GCC 12 warns falsely on replace)
  for (size_t at = 0; at < s.size();) {
    const bool space = s.compare(at, 3, kSpace) == 0;
    spaced += space ? ' ' : s[at];
    at += space ? 3 : 1;
  }
  return detail::valid_utf8(spaced);
}

std::optional<int64_t> SentencePieceTokenizer::bos() const {
  const int id = impl_->sp.bos_id();
  return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
}

std::optional<int64_t> SentencePieceTokenizer::eos() const {
  const int id = impl_->sp.eos_id();
  return id >= 0 ? std::optional<int64_t>(id) : std::nullopt;
}

std::string SentencePieceTokenizer::describe() const {
  return "a SentencePiece tokenizer of " + std::to_string(size()) + " tokens";
}

TokenizerFiles SentencePieceTokenizer::files() const { return {"sentencepiece", {{"tokenizer.model", impl_->model}}}; }

std::shared_ptr<const TextTokenizer> tokenizer_from_file(const std::string& path, int64_t vocab_size) {
  // llama2.c's file starts with a small positive int32 (max_token_length); a SentencePiece model with the
  // protobuf tag of its first field (pieces: field 1, length-delimited, 0x0A); a tokenizer.json with '{' and
  // a key (llama2.c's file for max_token_length 123 starts "{\0").
  check_input_file(path, "tokenizer");
  const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
  const std::string config_path = not_a_file_reason(config.string()).empty() ? config.string() : "";
  if (fs::path(path).extension() == ".txt") return wordpiece_from_file(path, config_path, vocab_size);  // vocab.txt
  std::ifstream in(path, std::ios::binary);
  char first = 0, second = 0;
  in >> first >> second;  // past whitespace
  if (first == '{' && second == '"') {
    if (is_wordpiece_tokenizer_json_file(path)) return wordpiece_from_file(path, config_path, vocab_size);
    return std::make_shared<const BpeTokenizer>(BpeTokenizer::from_tokenizer_json_file(path, vocab_size, config_path));
  }
  in.clear();
  in.seekg(0);
  in.get(first);
  if (first == '\x0A') {  // (a llama2.c file whose longest token has 10 bytes starts so too)
    bool parses = false;
    try {
      parses = SentencePieceTokenizer::from_file(path) != nullptr;
    } catch (const Error&) {}
    if (parses) return SentencePieceTokenizer::from_file(path, vocab_size);
  }
  return Llama2cTokenizer::from_file(path, vocab_size);
}

std::shared_ptr<const TextTokenizer> tokenizer_from_files(const TokenizerFiles& f, const std::string& where,
                                                          int64_t vocab_size) {
  const auto file = [&](const char* name) -> const std::string& {
    const std::string* bytes = f.find(name);
    HL_CHECK(bytes != nullptr, where, name, " is missing (a ", f.type, " tokenizer's file)");
    return *bytes;
  };
  if (f.type == "bpe")
    return std::make_shared<const BpeTokenizer>(file("vocab.json"), file("merges.txt"), where + "vocab.json",
                                                where + "merges.txt", vocab_size);
  if (f.type == "tokenizer.json") {
    const std::string* config = f.find("tokenizer_config.json");
    return std::make_shared<const BpeTokenizer>(
        BpeTokenizer::from_tokenizer_json(file("tokenizer.json"), where + "tokenizer.json", vocab_size,
                                          config ? *config : std::string(), where + "tokenizer_config.json"));
  }
  if (f.type == "sentencepiece")
    return SentencePieceTokenizer::from_bytes(file("tokenizer.model"), where + "tokenizer.model", vocab_size);
  if (f.type == "ids")
    return std::make_shared<const IdTokenizer>(IdTokenizer::from_json(file("ids.json"), where + "ids.json"));
  if (f.type == "wordpiece") return wordpiece_from_files(f, where, vocab_size);  // vocab.txt or tokenizer.json
  HL_CHECK(f.type == "llama2c", where, ": tokenizer type '", f.type,
           "' is none headlab reads (bpe, tokenizer.json, sentencepiece, llama2c, ids, wordpiece)");
  return std::make_shared<const Llama2cTokenizer>(file("tokenizer.bin"), where + "tokenizer.bin", vocab_size);
}

}  // namespace headlab::tasks
