// safetensors files (Hugging Face's weight format): a reader that maps the file and hands out views
// of its tensors, converted to float32 Tensors on request; sharded checkpoints through their
// model.safetensors.index.json; and a writer of float32 tensors.
//
// The format: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data, the offsets counting from its start. Every claim of the header is checked against
// the file before anything is read through it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.h"

namespace headlab::io {

// One tensor's entry in a header: dtype as spelled in the file ("F32", "BF16", "I64", ...), shape,
// and where its bytes lie in the data section, [begin, end).
struct SafetensorsEntry {
  std::string dtype;
  Shape shape;
  size_t begin = 0;
  size_t end = 0;
};

// Bytes per element of a dtype name of the format, 0 when unknown.
size_t safetensors_dtype_size(const std::string& dtype);

// One .safetensors file, open read-only for the object's life and read at offsets (no mapping: a file cut
// short while it is read is an error naming it, not SIGBUS); the constructor checks the whole
// header (dtype known, shape's bytes == its offsets' span, spans in order, without gaps or overlap,
// covering the data exactly) and throws headlab::Error naming the file and the tensor otherwise.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // A missing name throws "<path>: no tensor 'name' (the file has N tensors)".
  const SafetensorsEntry& entry(const std::string& name) const;
  // The tensor's raw bytes, read from the file.
  std::vector<std::byte> bytes(const std::string& name) const;
  // The tensor as a new float32 CPU Tensor of its shape: F32 copied as is, F16 and BF16 converted
  // exactly; other dtypes throw.
  Tensor to_float(const std::string& name) const;

 private:
  void read_at(size_t offset, void* dst, size_t n, const std::string& what) const;
  std::string path_;
  int fd_ = -1;
  size_t size_ = 0;        // the file's bytes when it was opened
  size_t data_start_ = 0;  // 8 + header length
  std::map<std::string, std::string> metadata_;
  std::map<std::string, SafetensorsEntry> entries_;
};

// A model's weights in one file or several: open() takes a .safetensors file, a
// model.safetensors.index.json ({"weight_map": {name: shard file}}, shards beside it), or a folder
// holding either (model.safetensors first). Each shard is mapped once.
class SafetensorsModel {
 public:
  static SafetensorsModel open(const std::string& path);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The file that holds a tensor; a missing name throws naming the model's path.
  const SafetensorsFile& file_of(const std::string& name) const;
  Tensor to_float(const std::string& name) const { return file_of(name).to_float(name); }
  const std::vector<SafetensorsFile>& files() const { return files_; }

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

// Writes float32 tensors (any layout or device; written contiguous, dtype F32) and string metadata
// to path through a temporary file renamed onto it. Names must be unique, non-empty and not
// "__metadata__".
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace headlab::io
