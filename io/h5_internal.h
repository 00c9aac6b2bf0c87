// Internals shared by io/h5file.cpp (writing) and io/h5_reader.cpp (reading): RAII handles over the
// HDF5 C API, HDF5's silenced error stack, name checks, type mapping and chunking.
#pragma once
#include "io/h5file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <utility>

namespace headlab::io::h5 {

static_assert(std::is_same_v<hid_t, int64_t>, "h5file.h stores hid_t as int64_t");

namespace detail {

#if H5_VERSION_GE(1, 12, 0)
using LinkInfo = H5L_info2_t;
#else
using LinkInfo = H5L_info_t;
#endif

// Chunks of about 1 MiB: Fletcher32 is kept per chunk, and a chunk this size reads fast.
inline constexpr uint64_t kChunkTargetBytes = 1u << 20;
// Rank-0 arrays cannot be chunked (and so cannot carry Fletcher32): they are stored as shape [1]
// with this attribute on the dataset, and read back as rank 0.
inline constexpr const char* kScalarAttr = "headlab_scalar";
// A damaged header may claim any size. Data is stored uncompressed, and even files from other tools
// rarely compress weights better than this, so a larger claim means damage, not data.
inline constexpr uint64_t kSizeFactor = 64;
inline constexpr uint64_t kSizeSlack = uint64_t(64) << 20;

// HDF5 prints its error stack to stderr by default; the library must never print. Error stacks
// are per thread in thread-safe builds, so silence each thread once.
inline void silence_hdf5() {
  // No HDF5 clean-up at exit: after a write failed half-way (a full disk, a file size limit) HDF5
  // 1.10 keeps the file it could not close and crashes closing it again in its atexit handler. Every
  // file here is closed explicitly. Must come before any other HDF5 call.
  static const bool no_atexit = H5dont_atexit() >= 0;
  (void)no_atexit;
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

// Owns one HDF5 id; closes it on every path. Close is the matching H5?close function.
template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, -1);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  void reset() {
    if (id_ >= 0) Close(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
};
using Object = Handle<H5Oclose>;  // whatever H5Oopen opened: a group or a dataset
using Dataset = Handle<H5Dclose>;
using Group = Handle<H5Gclose>;
using Space = Handle<H5Sclose>;
using Type = Handle<H5Tclose>;
using Plist = Handle<H5Pclose>;
using Attr = Handle<H5Aclose>;

// The innermost message on the current HDF5 error stack ("" if none), for errors that are not
// about damage (disk full, permissions): it is the only place HDF5 says why.
inline std::string hdf5_reason() {
  std::string reason;
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    try {
      if (n == 0 && e && e->desc) *static_cast<std::string*>(data) = e->desc;
    } catch (...) {}
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &reason);
  std::replace(reason.begin(), reason.end(), '\n', ' ');  // errors are one line
  return reason;
}

inline std::string with_reason(const std::string& msg) {
  std::string r = hdf5_reason();
  return r.empty() ? msg : msg + " (HDF5: " + r + ")";
}

inline std::string errno_str(int err) { return std::strerror(err); }

inline std::string folder_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Names are '/'-separated paths from the root. A leading or trailing '/' is ignored; "" and "/"
// are the root. Empty components ("a//b") and "." / ".." are refused: HDF5 would read them as
// something other than a name.
inline std::vector<std::string> split_name(const std::string& ctx, const std::string& name) {
  std::vector<std::string> parts;
  size_t b = 0, e = name.size();
  while (b < e && name[b] == '/') ++b;
  while (e > b && name[e - 1] == '/') --e;
  if (b == e) return parts;
  size_t start = b;
  for (size_t i = b; i <= e; ++i) {
    if (i == e || name[i] == '/') {
      std::string part = name.substr(start, i - start);
      HL_CHECK(!part.empty() && part != "." && part != "..", ctx, "invalid name '", name,
               "' (empty, '.' or '..' component)");
      parts.push_back(std::move(part));
      start = i + 1;
    }
  }
  return parts;
}

inline std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < parts.size(); ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out;
}

inline std::string shown(const std::string& clean) { return clean.empty() ? "/" : clean; }
inline const char* h5_name(const std::string& clean) { return clean.empty() ? "/" : clean.c_str(); }

inline hid_t file_type_of(DType d) {
  switch (d) {
    case DType::f32:
      return H5T_IEEE_F32LE;
    case DType::f64:
      return H5T_IEEE_F64LE;
    case DType::i64:
      return H5T_STD_I64LE;
    case DType::u8:
      return H5T_STD_U8LE;
  }
  return -1;
}

inline hid_t mem_type_of(DType d) {
  switch (d) {
    case DType::f32:
      return H5T_NATIVE_FLOAT;
    case DType::f64:
      return H5T_NATIVE_DOUBLE;
    case DType::i64:
      return H5T_NATIVE_INT64;
    case DType::u8:
      return H5T_NATIVE_UINT8;
  }
  return -1;
}

// Maps a stored type onto a DType (either byte order); false if it is none of them.
inline bool dtype_from_h5(hid_t type, DType* out) {
  const std::pair<DType, hid_t> known[] = {{DType::f32, H5T_IEEE_F32LE}, {DType::f32, H5T_IEEE_F32BE},
                                           {DType::f64, H5T_IEEE_F64LE}, {DType::f64, H5T_IEEE_F64BE},
                                           {DType::i64, H5T_STD_I64LE},  {DType::i64, H5T_STD_I64BE},
                                           {DType::u8, H5T_STD_U8LE},    {DType::u8, H5T_STD_U8BE}};
  for (auto [d, t] : known) {
    if (H5Tequal(type, t) > 0) {
      *out = d;
      return true;
    }
  }
  return false;
}

// A short numpy-like name of a type we do not read, for the error message.
inline std::string describe_type(hid_t type) {
  size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(size * 8);
    case H5T_FLOAT:
      return "float" + std::to_string(size * 8) + (size == 4 || size == 8 ? " (non-IEEE)" : "");
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "variable-length";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    default:
      return "unknown";
  }
}

// Chunk shape of about kChunkTargetBytes: whole inner rows, splitting the outermost dims first so
// that a chunk is one contiguous run of the row-major array.
inline std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, size_t elem) {
  std::vector<hsize_t> chunk = dims;
  uint64_t inner = elem;  // bytes of one slice below dim i
  for (size_t i = dims.size(); i-- > 0;) inner *= dims[i] ? dims[i] : 1;
  for (size_t i = 0; i < chunk.size(); ++i) {
    inner /= dims[i] ? dims[i] : 1;
    if (inner * chunk[i] <= kChunkTargetBytes) break;
    chunk[i] = std::max<uint64_t>(1, kChunkTargetBytes / inner);
  }
  return chunk;
}

inline Plist make_fapl(const std::string& ctx, bool strong_close) {
  Plist fapl(H5Pcreate(H5P_FILE_ACCESS));
  HL_CHECK(fapl.ok(), ctx, "cannot create an HDF5 property list");
  // Strong close for the writer: H5Fclose really closes the file, so the fsync and rename that
  // follow see all of it. Not for readers: HDF5 refuses to open one file twice with different
  // close degrees, and other code in the process may have it open with the default.
  if (strong_close)
    HL_CHECK(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) >= 0, ctx, "cannot set HDF5 close degree");
#if (H5_VERSION_GE(1, 10, 7) && !H5_VERSION_GE(1, 12, 0)) || H5_VERSION_GE(1, 12, 1)
  // Lock where the file system supports it; do not fail where it does not (some network mounts).
  HL_CHECK(H5Pset_file_locking(fapl.get(), 1, 1) >= 0, ctx, "cannot set HDF5 file locking");
#endif
  return fapl;
}

inline bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

inline void fsync_path(const std::string& ctx, const std::string& path, bool dir) {
  int fd = ::open(path.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  int open_err = errno;
  HL_CHECK(fd >= 0, ctx, "cannot open '", path, "' to sync it: ", errno_str(open_err));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems cannot fsync a folder (EINVAL); the rename is then as durable as they allow.
  HL_CHECK(rc == 0 || (dir && err == EINVAL), ctx, "cannot sync '", path, "' to disk: ", errno_str(err));
}

// Opens the object at `clean`, which object_exists() has found.
inline Object open_object(hid_t file, const std::string& ctx, const std::string& clean) {
  Object obj(H5Oopen(file, h5_name(clean), H5P_DEFAULT));
  HL_CHECK(obj.ok(), ctx, shown(clean), " cannot be opened (the file is damaged)");
  return obj;
}

// Whether `parts` names an existing group or dataset: every prefix must be a group (HDF5's own
// H5Lexists fails, rather than answering false, when a middle component is missing).
inline bool object_exists(hid_t file, const std::string& ctx, const std::vector<std::string>& parts) {
  for (size_t i = 1; i <= parts.size(); ++i) {
    std::string prefix = join(parts, i);
    htri_t link = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    HL_CHECK(link >= 0, ctx, "cannot look up ", prefix, " (the file is damaged)");
    if (link == 0) return false;
    htri_t obj = H5Oexists_by_name(file, prefix.c_str(), H5P_DEFAULT);
    HL_CHECK(obj >= 0, ctx, "cannot look up ", prefix, " (the file is damaged)");
    if (obj == 0) return false;  // a dangling soft link
    if (i < parts.size()) {
      Object o = open_object(file, ctx, prefix);
      if (H5Iget_type(o.get()) != H5I_GROUP) return false;
    }
  }
  return true;
}

}  // namespace detail

}  // namespace headlab::io::h5
