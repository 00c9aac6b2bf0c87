// The registry of model sources, one line each, and what a path is when no source claims it: the formats
// headlab knows of but does not read (a pickle that is not torch.save's) are named,
// so the error says what to give instead.
#include "io/sources.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/error.h"
#include "base/input_path.h"
#include "io/gguf.h"
#include "io/hf_folder.h"
#include "io/llama2c.h"
#include "io/torch_layouts.h"

namespace headlab::io {

namespace {

namespace fs = std::filesystem;

// n bytes of a regular file from byte `at` (fewer where it is shorter; "" where it cannot be read).
std::string file_bytes(const std::string& path, uint64_t at, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(n, '\0');
  if (!in.seekg(static_cast<std::streamoff>(at))) return "";
  in.read(bytes.data(), static_cast<std::streamsize>(n));
  bytes.resize(static_cast<size_t>(in.gcount()));
  return bytes;
}

uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const uintmax_t n = fs::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

// HDF5's signature, at byte 0 or, after a user block, at 512, 1024, 2048, ... (where the HDF5 library looks).
bool is_hdf5_file(const std::string& path) {
  if (!not_a_file_reason(path).empty()) return false;  // a FIFO would block the open
  static const std::string kSignature("\x89HDF\r\n\x1a\n", 8);
  const uint64_t size = file_size_or_zero(path);
  for (uint64_t at = 0; at + kSignature.size() <= size; at = at == 0 ? 512 : at * 2)
    if (file_bytes(path, at, kSignature.size()) == kSignature) return true;
  return false;
}

// A safetensors file: an 8-byte little-endian header length, then the JSON header's '{'.
bool looks_like_safetensors(const std::string& head, uint64_t size) {
  if (head.size() < 9 || head[8] != '{') return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(head[i]);
  return n >= 2 && n <= size - 8;
}

std::string hex_bytes(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    if (!out.empty()) out += ' ';
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool is_text(const std::string& bytes) {
  for (const unsigned char c : bytes)
    if ((c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t') return false;
  return true;
}

// What a regular file no source claims is, to follow "<who> '<path>': ".
std::string unclaimed_file(const std::string& path) {
  const uint64_t size = file_size_or_zero(path);
  const std::string head = file_bytes(path, 0, 16);
  if (head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x80 && head[1] >= 2 && head[1] <= 5)
    return "is a pickle of protocol " + std::to_string(head[1]) +
           " but not a torch.save file (a zip archive with data.pkl, or the legacy format's magic number)";
  if (looks_like_safetensors(head, size))
    return "is a safetensors file, not a headlab checkpoint (.h5); give the model folder that holds it (with its "
           "config.json), or convert that folder with headlab convert";
  const std::string looks = head.empty()    ? "the file is empty"
                            : is_text(head) ? "it starts with the text " + nlohmann::json(head).dump()
                                            : "it starts with the bytes " + hex_bytes(head.substr(0, 8));
  return "is not an HDF5 file (a headlab checkpoint) or a llama2.c checkpoint (the magic \"ak42\", or a header "
         "whose sizes give the file's length exactly): " +
         looks + "; a Hugging Face model is given as its folder";
}

class CheckpointSource final : public ModelSource {
 public:
  std::string name() const override { return "headlab checkpoint"; }
  bool claims(const std::string& path) const override { return is_hdf5_file(path); }
  SourceModel read(const std::string& path) const override {
    SourceModel m;
    m.checkpoint = load_checkpoint(path);
    return m;
  }
  nlohmann::json read_config(const std::string& path) const override {
    return load_checkpoint(path).config.at("model");
  }
  TokenizerOption tokenizer_option() const override { return TokenizerOption::refused; }
};

class HfFolderSource final : public ModelSource {
 public:
  std::string name() const override { return "Hugging Face folder"; }
  bool claims(const std::string& path) const override { return is_hf_model_folder(path); }
  SourceModel read(const std::string& path) const override {
    const Family& family = family_of_folder(path);
    SourceModel m;
    m.pretrained = family.folder->read(path);
    m.notes = family.folder->describe(m.pretrained);
    m.tokenizer = tasks::folder_tokenizer(path, m.pretrained.vocab_path, m.pretrained.merges_path);
    return m;
  }
  nlohmann::json read_config(const std::string& path) const override {
    return family_of_folder(path).folder->read_config(path);
  }
  TokenizerOption tokenizer_option() const override { return TokenizerOption::overrides; }
};

class Llama2cSource final : public ModelSource {
 public:
  std::string name() const override { return "llama2.c checkpoint"; }
  bool claims(const std::string& path) const override { return is_llama2c_checkpoint(path); }
  SourceModel read(const std::string& path) const override {
    SourceModel m;
    m.pretrained = read_llama2c(path);
    return m;
  }
  nlohmann::json read_config(const std::string& path) const override { return read_llama2c(path).config; }
  TokenizerOption tokenizer_option() const override { return TokenizerOption::required; }
};

}  // namespace

const std::vector<const ModelSource*>& sources() {
  static const CheckpointSource checkpoint{};
  static const HfFolderSource hf_folder{};
  static const Llama2cSource llama2c{};
  static const std::vector<const ModelSource*> all = {
      &checkpoint,  // headlab's own HDF5 files (io/checkpoint.h), by HDF5's signature
      &hf_folder,   // a folder with config.json, of any family with a folder format (io/families.h)
      &llama2c,     // llama2.c's run.c files (io/llama2c.h), by their magic or header and length
      &torch_source(),  // torch.save's files (io/torch_layouts.h): zip archives, or the legacy format's magic
      &gguf_source(),   // llama.cpp's GGUF files (io/gguf.h), by their magic "GGUF"
  };
  return all;
}

const ModelSource* source_claiming(const std::string& path) {
  for (const ModelSource* s : sources())
    if (s->claims(path)) return s;
  return nullptr;
}

const ModelSource& source_of(const std::string& path, const std::string& who) {
  HL_CHECK(path_present(path), who, " '", path, "': no such file or folder");
  std::error_code ec;
  const bool folder = fs::is_directory(path, ec);
  if (!folder) check_input_file(path, who);  // a FIFO, a device, a dangling link: refused before a source opens it
  if (const ModelSource* s = source_claiming(path)) return *s;
  HL_CHECK(!folder, who, " '", path,
           "' is a folder, not a file, and has no config.json (a model folder holds config.json, "
           "model.safetensors or its shards, vocab.json and merges.txt)");
  HL_FAIL(who, " '", path, "': ", unclaimed_file(path));
}

}  // namespace headlab::io
