// GGUF files (llama.cpp's format, versions 2 and 3; ggml's docs/gguf.md) as a model source:
//   "GGUF", uint32 version, uint64 tensor count, uint64 metadata count; the metadata (key: uint64 length + bytes;
//   uint32 value type; the value: a little-endian scalar, a string, or an array: uint32 element type, uint64 count,
//   the elements); per tensor its name, uint32 n_dims, uint64 ne[n_dims] (innermost first: PyTorch's shape is ne
//   reversed), uint32 ggml type and uint64 offset from the data's start; zeros to general.alignment (32 by
//   default); the data.
// Every count, length, offset and size is checked against the file's length before anything of that size is
// allocated or read, and the file is read at offsets, never mapped (a file cut short is an error, not SIGBUS).
// Tensors are widened to float32 as they are read (io/gguf_quants.h: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
// The source maps general.architecture llama, qwen2 (the llama family), gpt2 (gpt) and gptneox (neox) onto
// headlab's families, llama.cpp's tensor names onto headlab's, and tokenizer.ggml.* (model "llama": llama2.c's
// tokenizer; "gpt2": byte-level BPE) onto a tokenizer. gguf.cpp reads the file; gguf_model.cpp maps it.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/tensor.h"
#include "io/sources.h"

namespace headlab::io {

// GGUF's value types.
enum class GgufValueType : uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6, boolean = 7, string = 8,
  array = 9, uint64 = 10, int64 = 11, float64 = 12
};
std::string gguf_type_name(uint32_t type);  // "UINT32", "ARRAY", or "type N"

// One metadata value: numbers as JSON numbers (a float32 as the double it equals), a string, or an array of them.
struct GgufValue {
  uint32_t type = 0;
  uint32_t element_type = 0;  // an array's
  nlohmann::json value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // innermost first, as stored
  uint32_t type = 0;         // ggml's
  uint64_t offset = 0;       // from the data's start
  uint64_t bytes = 0;        // its data's length
  Shape shape() const { return Shape(ne.rbegin(), ne.rend()); }  // PyTorch's: (ne[n-1], ..., ne[0])
};

// A GGUF file, open read-only for the object's life; the constructor reads and checks the whole header (errors
// name the file and the field or tensor).
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* find(const std::string& key) const;  // null: absent
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* tensor(const std::string& name) const;  // null: absent
  // The tensor as a new float32 CPU Tensor of its PyTorch shape; a type headlab does not read throws naming it.
  Tensor to_float(const std::string& name) const;
  // A 2-D Q8_0 or Q4_K tensor as it is stored: (rows, blocks) of DType::q8_0 or q4_k, one read, no widening
  // (the linear layers read the blocks); undefined for any other type or shape.
  Tensor to_blocks(const std::string& name) const;
  // n bytes of a tensor's data as stored, from its byte `at` (a quantized tensor's blocks: io/gguf_quants.h).
  void read_bytes(const GgufTensorInfo& t, uint64_t at, void* dst, size_t n) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;        // the file's bytes when it was opened
  uint64_t data_start_ = 0;  // the header's end, aligned
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

// A regular file that starts with "GGUF".
bool is_gguf_file(const std::string& path);
// The model in headlab's terms: the family's section, its parameters, the tokenizer it holds (or a note why none).
SourceModel read_gguf(const std::string& path);
// The source registered in io/sources.cpp ("GGUF file").
const ModelSource& gguf_source();

}  // namespace headlab::io
