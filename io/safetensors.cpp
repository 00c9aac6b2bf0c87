// safetensors reading and writing (see safetensors.h): the header's checks, reads at offsets (never a
// mapping), F16/BF16 -> F32, sharded index files, and the atomic writer.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/bfloat16.h"
#include "base/float16.h"
#include "base/input_path.h"
#include "base/json_fields.h"
#include "base/json_text.h"
#include "base/sizes.h"
#include "io/atomic_file.h"

namespace headlab::io {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian, read in place");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxHeaderBytes = 100u << 20;  // the format's own limit (100 MB)
constexpr int kMaxJsonDepth = 8;                // a header is 3 deep; deeper is a lie, refused before it costs

// JSON parsed with a depth limit, in linear time, nothing after it (base/json_text.h).
json parse_shallow_json(std::string_view text, const std::string& who) {
  return parse_json_text(text, who, {.max_depth = kMaxJsonDepth, .depth_expected = {}, .watch = {}});
}

std::string quoted(const std::string& name) { return "'" + name + "'"; }

// Size of the file at path, its descriptor open read-only.
struct ReadOnlyFile {
  int fd = -1;
  size_t size = 0;
  explicit ReadOnlyFile(const std::string& path) {
    check_input_file(path, "safetensors file");  // a FIFO would block open()
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const int err = errno;
    HL_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(err));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      HL_FAIL(path, ": not a regular file");
    }
    size = static_cast<size_t>(st.st_size);
  }
  ~ReadOnlyFile() {
    if (fd >= 0) ::close(fd);
  }
  int release() { return std::exchange(fd, -1); }
};

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}


// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  ReadOnlyFile file(path);
  HL_CHECK(file.size >= 8, path, ": ", file.size,
           " bytes, too short for a safetensors file (8-byte header length first)");
  fd_ = file.release();
  size_ = file.size;
  try {
    uint64_t n = 0;
    read_at(0, &n, 8, "the header length");
    HL_CHECK(n <= size_ - 8, path, ": the header claims ", n, " bytes, but only ", size_ - 8,
             " follow the length field");
    HL_CHECK(n <= kMaxHeaderBytes, path, ": the header claims ", n, " bytes, more than the format's 100 MB");
    data_start_ = 8 + static_cast<size_t>(n);
    const size_t data_size = size_ - data_start_;
    std::string text(static_cast<size_t>(n), '\0');
    read_at(8, text.data(), text.size(), "the header");
    const json header = parse_shallow_json(text, path + ": header");
    HL_CHECK(header.is_object(), path, ": the header must be a JSON object, got a ", header.type_name());

    std::vector<std::pair<const std::string*, const SafetensorsEntry*>> by_offset;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        HL_CHECK(value.is_object(), path, ": __metadata__ must be an object of strings, got a ", value.type_name());
        for (const auto& [key, v] : value.items()) {
          HL_CHECK(v.is_string(), path, ": __metadata__ key ", quoted(key), " must be a string, got ", json_text(v));
          metadata_.emplace(key, v.get<std::string>());
        }
        continue;
      }
      const std::string who = path + ": tensor " + quoted(name);
      HL_CHECK(value.is_object(), who, ": expected an object {dtype, shape, data_offsets}, got ", json_text(value));
      SafetensorsEntry e;
      HL_CHECK(value.contains("dtype") && value["dtype"].is_string(), who, ": expected a string dtype");
      e.dtype = value["dtype"].get<std::string>();
      const size_t elem = safetensors_dtype_size(e.dtype);
      HL_CHECK(elem != 0, who, ": unknown dtype ", json_text(e.dtype));
      HL_CHECK(value.contains("shape") && value["shape"].is_array(), who, ": expected a shape (a list of sizes)");
      size_t bytes = elem;
      for (const json& d : value["shape"]) {
        int64_t size = -1;
        HL_CHECK(json_to_integer(d, size) && size >= 0, who, ": shape ", json_text(value["shape"]), " holds ",
                 json_text(d), ", expected sizes >= 0");
        e.shape.push_back(size);
        HL_CHECK(!__builtin_mul_overflow(bytes, static_cast<size_t>(size), &bytes), who, ": shape ",
                 json_text(value["shape"]), " is too large");
      }
      const json* off = value.contains("data_offsets") ? &value["data_offsets"] : nullptr;
      HL_CHECK(off && off->is_array() && off->size() == 2 && json_to_integer((*off)[0], e.begin) &&
                   json_to_integer((*off)[1], e.end),
               who, ": expected data_offsets [begin, end], got ", off ? json_text(*off) : std::string("none"));
      HL_CHECK(e.begin <= e.end, who, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin");
      HL_CHECK(e.end <= data_size, who, ": data_offsets [", e.begin, ", ", e.end, "] reach past the data's ", data_size,
               " bytes");
      HL_CHECK(e.end - e.begin == bytes, who, ": shape ", shape_str(e.shape), " of ", e.dtype, " is ", bytes,
               " bytes, but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
      const auto [it, fresh] = entries_.emplace(name, std::move(e));
      HL_CHECK(fresh, who, ": appears twice in the header");
      by_offset.emplace_back(&it->first, &it->second);
    }
    // The data must be the tensors back to back, in some order: no gap, no overlap, nothing after.
    std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
      return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
    });
    size_t at = 0;
    for (const auto& [name, e] : by_offset) {
      HL_CHECK(e->begin >= at, path, ": tensor ", quoted(*name), ": data_offsets [", e->begin, ", ", e->end,
               "] overlap the tensor before it, which ends at ", at);
      HL_CHECK(e->begin == at, path, ": tensor ", quoted(*name), ": data_offsets [", e->begin, ", ", e->end,
               "] leave a gap after byte ", at, " of the data");
      at = e->end;
    }
    HL_CHECK(at == data_size, path, ": the tensors end at byte ", at, " of the data, but the file holds ", data_size,
             " bytes of data");
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

// Reads exactly n bytes at `offset`: a file cut short since it was opened (another program rewriting it) is
// an error naming it, where a mapping would have raised SIGBUS.
void SafetensorsFile::read_at(size_t offset, void* dst, size_t n, const std::string& what) const {
  auto* out = static_cast<char*>(dst);
  for (size_t done = 0; done < n;) {
    const ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    const int err = errno;
    if (got < 0 && err == EINTR) continue;
    HL_CHECK(got > 0, path_, ": ", what, ": ",
             got < 0 ? std::string("cannot read: ") + std::strerror(err)
                     : "the file ends before its data (did it change while it was read?)");
    done += static_cast<size_t>(got);
  }
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      size_(o.size_),
      data_start_(o.data_start_),
      metadata_(std::move(o.metadata_)),
      entries_(std::move(o.entries_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    data_start_ = o.data_start_;
    metadata_ = std::move(o.metadata_);
    entries_ = std::move(o.entries_);
  }
  return *this;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  HL_CHECK(it != entries_.end(), path_, ": no tensor ", quoted(name), " (the file has ", entries_.size(), " tensors)");
  return it->second;
}

std::vector<std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  std::vector<std::byte> out(e.end - e.begin);
  read_at(data_start_ + e.begin, out.data(), out.size(), "tensor " + quoted(name));
  return out;
}

Tensor SafetensorsFile::to_float(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  HL_CHECK(e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16", path_, ": tensor ", quoted(name), " has dtype ",
           e.dtype, "; only F32, F16 and BF16 convert to float32");
  Tensor t = Tensor::empty(e.shape);  // (shape...) float32, CPU
  float* dst = t.data<float>();
  const size_t n = static_cast<size_t>(t.numel());
  const std::string what = "tensor " + quoted(name);
  // Read straight into the tensor (F32), or through a small buffer (F16, BF16): the kernel copies from the
  // page cache, and no mapping of the file joins the resident set (nor faults it in page by page: in a VM
  // 475 MB loaded in 1.5 s this way against 2.3 s through a mapping).
  if (e.dtype == "F32") {
    read_at(data_start_ + e.begin, dst, n * sizeof(float), what);
    return t;
  }
  const bool half = e.dtype == "F16";
  constexpr size_t kChunk = size_t{1} << 19;  // elements per read (1 MiB)
  std::vector<uint16_t> bits(std::min(n, kChunk));
  for (size_t at = 0; at < n; at += kChunk) {
    const size_t m = std::min(kChunk, n - at);
    read_at(data_start_ + e.begin + 2 * at, bits.data(), 2 * m, what);
    for (size_t i = 0; i < m; ++i) dst[at + i] = half ? float_from_f16(bits[i]) : float_from_bf16(bits[i]);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsModel

SafetensorsModel SafetensorsModel::open(const std::string& path) {
  SafetensorsModel model;
  model.path_ = path;
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    const fs::path single = fs::path(path) / "model.safetensors",
                   index = fs::path(path) / "model.safetensors.index.json";
    HL_CHECK(fs::exists(single, ec) || fs::exists(index, ec), path,
             ": holds neither model.safetensors nor model.safetensors.index.json");
    file = (fs::exists(single, ec) ? single : index).string();
  }
  if (!file.ends_with(".index.json")) {
    model.files_.emplace_back(file);
    for (const auto& [name, e] : model.files_.back().entries()) model.where_.emplace(name, 0);
    return model;
  }
  // A sharded model: the index names each tensor's shard, a file beside it.
  const std::string text = read_whole_file(file, WholeFile::config, "safetensors index");
  const json index = parse_shallow_json(text, file);
  HL_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), file,
           ": expected an object with a \"weight_map\" object of tensor name -> shard file");
  const fs::path folder = fs::path(file).parent_path();
  std::map<std::string, size_t> shard_index;  // shard file name -> index in files_
  for (const auto& [name, shard] : index["weight_map"].items()) {
    HL_CHECK(shard.is_string(), file, ": weight_map's tensor ", quoted(name), " names ", json_text(shard),
             ", expected a shard file name");
    const std::string shard_name = shard.get<std::string>();
    HL_CHECK(
        !shard_name.empty() && shard_name.find('/') == std::string::npos && shard_name != "." && shard_name != "..",
        file, ": weight_map's tensor ", quoted(name), " names ", json_text(shard),
        ", expected a file name in the index's folder");
    auto it = shard_index.find(shard_name);
    if (it == shard_index.end()) {
      model.files_.emplace_back((folder / shard_name).string());
      it = shard_index.emplace(shard_name, model.files_.size() - 1).first;
    }
    const SafetensorsFile& f = model.files_[it->second];
    HL_CHECK(f.contains(name), file, ": weight_map puts tensor ", quoted(name), " in ", shard_name,
             ", which has no such tensor");
    model.where_.emplace(name, it->second);
  }
  return model;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsModel::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  HL_CHECK(it != where_.end(), path_, ": no tensor ", quoted(name), " (the model has ", where_.size(), " tensors)");
  return files_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string who = "write_safetensors '" + path + "'";
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::vector<float>> data;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    HL_CHECK(!name.empty() && name != "__metadata__", who, ": expected a tensor name, got ", quoted(name));
    HL_CHECK(!header.contains(name), who, ": tensor ", quoted(name), " is given twice");
    HL_CHECK(t.defined() && t.dtype() == DType::f32, who, ": tensor ", quoted(name), " must be float32");
    data.push_back(t.to_vector<float>());
    const size_t bytes = data.back().size() * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned (readers may map it)
  const uint64_t n = text.size();

  AtomicFile file(path, who);
  file.write(std::string_view(reinterpret_cast<const char*>(&n), 8));
  file.write(text);
  for (const std::vector<float>& d : data)
    file.write(std::string_view(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(float)));
  file.commit();
}

}  // namespace headlab::io
