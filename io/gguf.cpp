// GGUF files (see gguf.h): the header read through a bounded cursor (every count and length checked against what
// is left of the file before anything is allocated), and tensors read at offsets and widened to float32. What
// the file means in headlab's terms (config, parameters, tokenizer, the source) is gguf_model.cpp's.
#include "io/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/input_path.h"
#include "io/gguf_quants.h"

namespace headlab::io {

static_assert(std::endian::native == std::endian::little, "GGUF data is little-endian, read in place");

namespace {

using nlohmann::json;
using T = GgufValueType;

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint64_t kMaxDims = 4;  // GGML_MAX_DIMS

std::string in_quotes(const std::string& s) { return "'" + s + "'"; }

// Bytes of a scalar value type; 0 for a string, an array or no type at all.
size_t scalar_bytes(uint32_t type) {
  switch (static_cast<T>(type)) {
    case T::uint8: case T::int8: case T::boolean: return 1;
    case T::uint16: case T::int16: return 2;
    case T::uint32: case T::int32: case T::float32: return 4;
    case T::uint64: case T::int64: case T::float64: return 8;
    case T::string: case T::array: return 0;
  }
  return 0;
}

// Reads exactly n bytes at `offset` (a file cut short since it was opened is an error naming it, as in
// io/safetensors.cpp).
void pread_exactly(int fd, const std::string& path, uint64_t offset, void* dst, size_t n, const std::string& what) {
  auto* out = static_cast<char*>(dst);
  for (size_t done = 0; done < n;) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    const int err = errno;
    if (got < 0 && err == EINTR) continue;
    HL_CHECK(got > 0, path, ": ", what, ": ",
             got < 0 ? std::string("cannot read: ") + std::strerror(err)
                     : "the file ends before its data (did it change while it was read?)");
    done += static_cast<size_t>(got);
  }
}

// The header, read front to back through a buffer; every read and every claimed size is checked against the
// file's length first.
class Cursor {
 public:
  Cursor(int fd, const std::string& path, uint64_t size) : fd_(fd), path_(path), size_(size) {}
  uint64_t at() const { return at_; }
  uint64_t left() const { return size_ - at_; }

  void read(void* dst, uint64_t n, const std::string& what) {
    HL_CHECK(n <= left(), path_, ": ", what, ": the file ends at byte ", size_, ", inside it (", n, " bytes at byte ",
             at_, ")");
    if (at_ < buf_at_ || at_ + n > buf_at_ + buf_.size()) {
      if (n > kBuffer) {  // a long string: straight into place
        pread_exactly(fd_, path_, at_, dst, static_cast<size_t>(n), what);
        at_ += n;
        return;
      }
      buf_.resize(static_cast<size_t>(std::min<uint64_t>(kBuffer, left())));
      pread_exactly(fd_, path_, at_, buf_.data(), buf_.size(), what);
      buf_at_ = at_;
    }
    std::memcpy(dst, buf_.data() + (at_ - buf_at_), static_cast<size_t>(n));
    at_ += n;
  }
  template <typename V>
  V get(const std::string& what) {
    V v;
    read(&v, sizeof(V), what);
    return v;
  }
  std::string string(const std::string& what) {
    const uint64_t n = get<uint64_t>(what + " (its length)");
    HL_CHECK(n <= left(), path_, ": ", what, ": a string of ", n, " bytes at byte ", at_,
             " runs past the file's end (", size_, " bytes)");
    std::string s(static_cast<size_t>(n), '\0');
    read(s.data(), n, what);
    return s;
  }
  // A count of items of at least `min_bytes` each: refused before anything is allocated where they cannot fit.
  uint64_t count(const std::string& what, uint64_t min_bytes) {
    const uint64_t n = get<uint64_t>(what);
    HL_CHECK(n <= left() / min_bytes, path_, ": ", what, " ", n, " needs at least ", min_bytes, " bytes each, but ",
             left(), " bytes of the file remain after byte ", at_);
    return n;
  }

 private:
  static constexpr uint64_t kBuffer = uint64_t{1} << 20;
  int fd_;
  const std::string& path_;
  uint64_t size_, at_ = 0, buf_at_ = 0;
  std::vector<char> buf_;
};

// One scalar of a value type as JSON.
json scalar(Cursor& in, uint32_t type, const std::string& what) {
  switch (static_cast<T>(type)) {
    case T::uint8: return in.get<uint8_t>(what);
    case T::int8: return in.get<int8_t>(what);
    case T::uint16: return in.get<uint16_t>(what);
    case T::int16: return in.get<int16_t>(what);
    case T::uint32: return in.get<uint32_t>(what);
    case T::int32: return in.get<int32_t>(what);
    case T::uint64: return in.get<uint64_t>(what);
    case T::int64: return in.get<int64_t>(what);
    case T::float32: return static_cast<double>(in.get<float>(what));
    case T::float64: return in.get<double>(what);
    case T::boolean: {
      const uint8_t b = in.get<uint8_t>(what);
      HL_CHECK(b <= 1, what, ": a BOOL of value ", int(b), " (expected 0 or 1)");
      return b == 1;
    }
    case T::string: return in.string(what);
    case T::array: break;
  }
  HL_FAIL(what, ": value type ", type, " is not one of GGUF's (0..12)");
}

GgufValue value(Cursor& in, uint32_t type, const std::string& path, const std::string& key) {
  const std::string what = path + ": metadata " + in_quotes(key);
  GgufValue v;
  v.type = type;
  if (type != static_cast<uint32_t>(T::array)) {
    v.value = scalar(in, type, what);
    return v;
  }
  v.element_type = in.get<uint32_t>(what + " (its element type)");
  HL_CHECK(v.element_type != static_cast<uint32_t>(T::array), what, ": an array of arrays, which headlab does not read");
  HL_CHECK(v.element_type <= static_cast<uint32_t>(T::float64), what, ": element type ", v.element_type,
           " is not one of GGUF's (0..12)");
  const size_t each = scalar_bytes(v.element_type);
  const uint64_t n = in.count(what + ": the array's count", each ? each : 8);  // a string: its length at least
  v.value = json::array();
  v.value.get_ref<json::array_t&>().reserve(static_cast<size_t>(n));
  for (uint64_t i = 0; i < n; ++i) v.value.push_back(scalar(in, v.element_type, what));
  return v;
}

}  // namespace

std::string gguf_type_name(uint32_t type) {
  static const char* kNames[] = {"UINT8",  "INT8", "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                 "BOOL",   "STRING", "ARRAY", "UINT64", "INT64",  "FLOAT64"};
  return type < std::size(kNames) ? kNames[type] : "type " + std::to_string(type);
}

// ---------------------------------------------------------------------------------------------
// GgufFile

GgufFile::GgufFile(const std::string& path) : path_(path) {
  check_input_file(path, "GGUF file");  // a FIFO would block open(); remembered as an input (never overwritten)
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const int err = errno;
  HL_CHECK(fd_ >= 0, path, ": cannot open: ", std::strerror(err));
  try {
    struct stat st {};
    HL_CHECK(::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode), path, ": not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
    Cursor in(fd_, path_, size_);
    char magic[4];
    in.read(magic, 4, "the magic \"GGUF\"");
    HL_CHECK(std::memcmp(magic, "GGUF", 4) == 0, path, ": does not start with the magic \"GGUF\"");
    version_ = in.get<uint32_t>("the version");
    HL_CHECK(version_ != 1, path, ": GGUF version 1 (32-bit counts, before August 2023), which headlab does not read "
             "(it reads versions 2 and 3; llama.cpp's convert scripts rewrite old files)");
    const uint32_t swapped = __builtin_bswap32(version_);
    HL_CHECK(swapped != 2 && swapped != 3, path, ": a big-endian GGUF file (version ", swapped,
             "), which headlab does not read (it reads little-endian files, as llama.cpp writes them by default)");
    HL_CHECK(version_ == 2 || version_ == 3, path, ": GGUF version ", version_, " (headlab reads versions 2 and 3)");
    // The least a tensor info takes: a name's length, n_dims, type, offset; a metadata pair: key length, type, a byte.
    const uint64_t n_tensors = in.count("the tensor count", 24);
    const uint64_t n_kv = in.count("the metadata count", 13);

    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = in.string("metadata key " + std::to_string(i));
      const uint32_t type = in.get<uint32_t>(path + ": metadata " + in_quotes(key) + " (its value type)");
      GgufValue v = value(in, type, path, key);
      HL_CHECK(metadata_.emplace(key, std::move(v)).second, path, ": metadata ", in_quotes(key), " appears twice");
    }

    uint64_t alignment = kDefaultAlignment;
    if (const GgufValue* a = find("general.alignment")) {
      HL_CHECK(a->type == static_cast<uint32_t>(T::uint32), path, ": metadata 'general.alignment' is a ",
               gguf_type_name(a->type), " (expected a UINT32)");
      alignment = a->value.get<uint64_t>();
      HL_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, path, ": metadata 'general.alignment' = ",
               alignment, " (expected a power of two)");
    }

    tensors_.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo t;
      t.name = in.string("tensor " + std::to_string(i) + "'s name");
      const std::string who = path + ": tensor " + in_quotes(t.name);
      const uint32_t n_dims = in.get<uint32_t>(who + ": n_dims");
      HL_CHECK(n_dims >= 1 && n_dims <= kMaxDims, who, ": n_dims ", n_dims, " (expected 1 to ", kMaxDims, ")");
      uint64_t numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        t.ne.push_back(in.get<uint64_t>(who + ": ne[" + std::to_string(d) + "]"));
        constexpr uint64_t kMost = uint64_t{1} << 62;  // more than any file holds; an int64 shape
        HL_CHECK(t.ne.back() <= kMost && !__builtin_mul_overflow(numel, t.ne.back(), &numel) && numel <= kMost, who,
                 ": ne ", json(t.ne).dump(), " has too many elements for any file");
      }
      t.type = in.get<uint32_t>(who + ": its type");
      t.offset = in.get<uint64_t>(who + ": its offset");
      const GgmlBlock block = ggml_block(t.type);
      HL_CHECK(block.elements > 0, who, ": ggml type ", ggml_type_name(t.type),
               ", which headlab does not read (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)");
      HL_CHECK(t.ne[0] % static_cast<uint64_t>(block.elements) == 0, who, ": rows of ", t.ne[0],
               " elements are not whole ", ggml_type_name(t.type), " blocks of ", block.elements);
      t.bytes = numel / static_cast<uint64_t>(block.elements) * static_cast<uint64_t>(block.bytes);  // numel < 2^62
      HL_CHECK(t.offset % alignment == 0, who, ": offset ", t.offset, " is not a multiple of the alignment ",
               alignment);
      HL_CHECK(by_name_.emplace(t.name, tensors_.size()).second, who, ": appears twice");
      tensors_.push_back(std::move(t));
    }
    const uint64_t header_end = in.at();
    data_start_ = header_end + (alignment - header_end % alignment) % alignment;
    // A file of metadata alone may end with its header, unpadded.
    HL_CHECK(data_start_ <= size_ || tensors_.empty(), path, ": the header ends at byte ", header_end,
             ", its padding to ", alignment, " at byte ", data_start_, ", past the file's end (", size_, " bytes)");
    const uint64_t data_size = data_start_ <= size_ ? size_ - data_start_ : 0;
    for (const GgufTensorInfo& t : tensors_)
      HL_CHECK(t.offset <= data_size && t.bytes <= data_size - t.offset, path, ": tensor ", in_quotes(t.name),
               ": offset ", t.offset, " + ", t.bytes, " bytes runs past the data's end (", data_size,
               " bytes of data from byte ", data_start_, "; file ", size_, " bytes)");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

GgufFile::~GgufFile() {
  if (fd_ >= 0) ::close(fd_);
}

const GgufValue* GgufFile::find(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Tensor GgufFile::to_float(const std::string& name) const {
  const GgufTensorInfo* t = tensor(name);
  HL_CHECK(t, path_, ": no tensor ", in_quotes(name), " (the file has ", tensors_.size(), " tensors)");
  Tensor out = Tensor::empty(t->shape());  // float32, CPU
  float* dst = out.data<float>();
  const std::string what = "tensor " + in_quotes(name);
  if (t->type == static_cast<uint32_t>(GgmlType::f32)) {
    pread_exactly(fd_, path_, data_start_ + t->offset, dst, static_cast<size_t>(t->bytes), what);
    return out;
  }
  // Through a buffer of whole blocks (about 1 MiB), each widened into place.
  const GgmlBlock block = ggml_block(t->type);
  const uint64_t blocks = t->bytes / static_cast<uint64_t>(block.bytes);
  const uint64_t per_read = std::max<uint64_t>(1, (uint64_t{1} << 20) / static_cast<uint64_t>(block.bytes));
  std::vector<std::byte> buf(static_cast<size_t>(std::min(blocks, per_read) * static_cast<uint64_t>(block.bytes)));
  for (uint64_t b = 0; b < blocks; b += per_read) {
    const uint64_t m = std::min(per_read, blocks - b);
    pread_exactly(fd_, path_, data_start_ + t->offset + b * static_cast<uint64_t>(block.bytes), buf.data(),
                  static_cast<size_t>(m * static_cast<uint64_t>(block.bytes)), what);
    dequantize(t->type, buf.data(), dst + b * static_cast<uint64_t>(block.elements), static_cast<int64_t>(m));
  }
  return out;
}

Tensor GgufFile::to_blocks(const std::string& name) const {
  const GgufTensorInfo* t = tensor(name);
  HL_CHECK(t, path_, ": no tensor ", in_quotes(name), " (the file has ", tensors_.size(), " tensors)");
  const DType block = t->type == static_cast<uint32_t>(GgmlType::q8_0)   ? DType::q8_0
                      : t->type == static_cast<uint32_t>(GgmlType::q4_k) ? DType::q4_k
                                                                          : DType::f32;
  const Shape shape = t->shape();
  if (block == DType::f32 || shape.size() != 2 || shape[1] % dtype_block(block) != 0) return Tensor();
  Tensor out = Tensor::empty({shape[0], shape[1] / dtype_block(block)}, block);  // CPU
  HL_CHECK(static_cast<uint64_t>(out.numel()) * dtype_size(block) == t->bytes, path_, ": tensor ", in_quotes(name),
           " holds ", t->bytes, " bytes, not its blocks' ", out.numel() * static_cast<int64_t>(dtype_size(block)));
  pread_exactly(fd_, path_, data_start_ + t->offset, out.raw_data(), static_cast<size_t>(t->bytes),
                "tensor " + in_quotes(name));
  return out;
}

void GgufFile::read_bytes(const GgufTensorInfo& t, uint64_t at, void* dst, size_t n) const {
  HL_CHECK(at <= t.bytes && n <= t.bytes - at, path_, ": tensor ", in_quotes(t.name), ": bytes ", at, " + ", n,
           " are past its ", t.bytes);
  pread_exactly(fd_, path_, data_start_ + t.offset + at, dst, n, "tensor " + in_quotes(t.name));
}

bool is_gguf_file(const std::string& path) {
  if (!not_a_file_reason(path).empty()) return false;  // a FIFO would block the open
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const bool gguf = ::pread(fd, magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0;
  ::close(fd);
  return gguf;
}

}  // namespace headlab::io
