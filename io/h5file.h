// HDF5 file layer for checkpoints: named n-D arrays of raw data plus attributes, nothing about tensors.
// Writer writes a temporary file and renames it over the target in commit() (atomic, fsynced);
// Reader checks every name, dtype, shape and Fletcher32 checksum and turns any failure into headlab::Error.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace headlab::io {
class AtomicFile;
}

namespace headlab::io::h5 {

// What the files look like (h5py and h5dump >= HDF5 1.10 read them):
// - HDF5 1.10 file format, whose metadata (superblock, object headers, chunk indexes) is checksummed.
// - Every dataset with data is chunked (about 1 MiB a chunk) with the Fletcher32 filter.
//   A 0-element dataset is contiguous and unfiltered (there is nothing to checksum). A rank-0 array
//   is stored as shape [1] with the attribute headlab_scalar = 1 and read back as rank 0.
// - String attributes are fixed-length UTF-8 (h5py returns them as bytes); numbers are int64 / float64.
// - No timestamps: the same content gives byte-identical files.

// Stored little-endian as IEEE f32/f64, signed 64-bit and unsigned 8-bit; u8 also holds raw byte
// blobs (e.g. RNG state).
enum class DType { f32, f64, i64, u8 };

const char* dtype_name(DType d);  // "float32", "float64", "int64", "uint8": numpy's names
size_t dtype_size(DType d);

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::i64;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::u8;
  else
    static_assert(!sizeof(T), "h5: element type must be float, double, int64_t or uint8_t");
}

// "[64, 32]"; "[]" for rank 0.
std::string shape_str(const std::vector<int64_t>& shape);

// Product of the dims (1 for rank 0); throws on a negative dim or overflow.
int64_t shape_numel(const std::vector<int64_t>& shape);

struct Array {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;        // row-major, last dim contiguous; empty = rank 0 (one element)
  std::vector<unsigned char> bytes;  // numel() * dtype_size(dtype) bytes, native byte order

  int64_t numel() const { return shape_numel(shape); }

  // Copy of the elements as T; throws if T does not match dtype.
  template <typename T>
  std::vector<T> as() const {
    HL_CHECK(dtype_of<T>() == dtype, "h5::Array::as: array has dtype ", dtype_name(dtype), ", asked for ",
             dtype_name(dtype_of<T>()));
    std::vector<T> out(bytes.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
    return out;
  }
};

// Writes a temp file in the folder of <path> (io/atomic_file.h); commit() renames it onto <path>. Until commit()
// succeeds an existing <path> is untouched, and destroying an uncommitted Writer deletes the
// temporary file. Names may contain '/' (groups, created as needed); any other character, dots
// included, is part of the name: "model/trf_blocks.0.att.W_query.weight".
class Writer {
 public:
  // Errors if the folder of `path` does not exist (it is never created) or is not writable.
  explicit Writer(std::string path, std::string what = "checkpoint");
  ~Writer();  // never throws
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // data: numel(shape) elements of `dtype` in native byte order, row-major. The dataset must not exist.
  void write(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data);
  void write_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    write(name, DType::f32, shape, data);
  }
  void write_f64(const std::string& name, const std::vector<int64_t>& shape, const double* data) {
    write(name, DType::f64, shape, data);
  }
  void write_i64(const std::string& name, const std::vector<int64_t>& shape, const int64_t* data) {
    write(name, DType::i64, shape, data);
  }
  void write_u8(const std::string& name, const std::vector<int64_t>& shape, const uint8_t* data) {
    write(name, DType::u8, shape, data);
  }
  // values.size() must equal numel(shape).
  template <typename T>
  void write(const std::string& name, const std::vector<int64_t>& shape, const std::vector<T>& values) {
    HL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), what_, " '", path_, "': dataset ", name,
             " has shape ", shape_str(shape), " but ", values.size(), " values were given");
    write(name, dtype_of<T>(), shape, values.data());
  }
  void write(const std::string& name, const Array& a) { write(name, a.dtype, a.shape, a.bytes.data()); }

  // Creates a group (and its parents) if it does not exist, e.g. to hang attributes on it.
  void create_group(const std::string& name);

  // object: "/" or an existing group or dataset. Setting a key again replaces the value (and type).
  // Strings are fixed-length, so short values sit in the checksummed object header.
  void set_attr(const std::string& object, const std::string& key, const std::string& value);
  void set_attr(const std::string& object, const std::string& key, const char* value) {
    set_attr(object, key, std::string(value));
  }
  void set_attr(const std::string& object, const std::string& key, int64_t value);
  void set_attr(const std::string& object, const std::string& key, double value);

  // Closes the file, fsyncs it, renames it onto path() and fsyncs the folder. Nothing may be
  // written afterwards.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const;

 private:
  std::string ctx() const;  // "checkpoint '<path>': "
  void check_open(const std::string& op) const;

  std::string path_, what_;
  std::unique_ptr<AtomicFile> out_;  // the temp file, renamed onto path_ by commit()
  int64_t file_ = -1;                // hid_t; -1 once closed
};

struct ArrayInfo {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  int64_t numel() const { return shape_numel(shape); }
};

// Opens an HDF5 file read-only. Every error message starts "<what> '<path>': ".
class Reader {
 public:
  explicit Reader(std::string path, std::string what = "checkpoint");
  ~Reader();
  Reader(Reader&& other) noexcept;
  Reader& operator=(Reader&& other) noexcept;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  bool has(const std::string& name) const;  // a dataset or group of that name exists ("/" always does)
  // Names directly under `group` ("/" = root), sorted.
  std::vector<std::string> list(const std::string& group) const;
  // Every dataset below `group`, named relative to it ("sub/x"; from "/" the full names), sorted.
  std::vector<std::string> list_datasets_recursive(const std::string& group) const;

  ArrayInfo info(const std::string& name) const;  // dtype and shape without reading the data
  Array read(const std::string& name) const;      // verifies the Fletcher32 checksum where present
  Array read(const std::string& name, DType expected, const std::vector<int64_t>& expected_shape) const;

  bool has_attr(const std::string& object, const std::string& key) const;
  std::string attr_str(const std::string& object, const std::string& key) const;  // fixed or variable length
  int64_t attr_i64(const std::string& object, const std::string& key) const;      // any integer type
  double attr_f64(const std::string& object, const std::string& key) const;       // any float or integer type

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }

 private:
  std::string ctx() const;
  Array read_impl(const std::string& name, const DType* expected, const std::vector<int64_t>* expected_shape) const;

  std::string path_, what_;
  int64_t file_ = -1;       // hid_t
  uint64_t file_size_ = 0;  // bounds the size of arrays a damaged header may claim
};

}  // namespace headlab::io::h5
