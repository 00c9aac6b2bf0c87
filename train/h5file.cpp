// HDF5 file layer for checkpoints (see h5file.h): RAII handles over the HDF5 C API, the atomic
// write path (temp file, flush, fsync, rename, fsync folder) and a reader that turns every HDF5
// failure on a missing, foreign or damaged file into one headlab::Error sentence.
#include "train/h5file.h"

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

namespace headlab::h5 {

static_assert(std::is_same_v<hid_t, int64_t>, "h5file.h stores hid_t as int64_t");

namespace {

// Chunks of about 1 MiB: Fletcher32 is kept per chunk, and a chunk this size reads fast.
constexpr uint64_t kChunkTargetBytes = 1u << 20;
// Rank-0 arrays cannot be chunked (and so cannot carry Fletcher32): they are stored as shape [1]
// with this attribute on the dataset, and read back as rank 0.
constexpr const char* kScalarAttr = "headlab_scalar";
// A damaged header may claim any size. Data is stored uncompressed, and even files from other tools
// rarely compress weights better than this, so a larger claim means damage, not data.
constexpr uint64_t kSizeFactor = 64;
constexpr uint64_t kSizeSlack = uint64_t(64) << 20;

// HDF5 prints its error stack to stderr by default; the library must never print. Error stacks
// are per thread in thread-safe builds, so silence each thread once.
void silence_hdf5() {
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
std::string hdf5_reason() {
  std::string reason;
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    try {
      if (n == 0 && e && e->desc) *static_cast<std::string*>(data) = e->desc;
    } catch (...) {
    }
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &reason);
  return reason;
}

std::string with_reason(const std::string& msg) {
  std::string r = hdf5_reason();
  return r.empty() ? msg : msg + " (HDF5: " + r + ")";
}

std::string errno_str(int err) { return std::strerror(err); }

std::string folder_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Names are '/'-separated paths from the root. A leading or trailing '/' is ignored; "" and "/"
// are the root. Empty components ("a//b") and "." / ".." are refused: HDF5 would read them as
// something other than a name.
std::vector<std::string> split_name(const std::string& ctx, const std::string& name) {
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

std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < parts.size(); ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out;
}

std::string shown(const std::string& clean) { return clean.empty() ? "/" : clean; }
const char* h5_name(const std::string& clean) { return clean.empty() ? "/" : clean.c_str(); }

hid_t file_type_of(DType d) {
  switch (d) {
    case DType::f32: return H5T_IEEE_F32LE;
    case DType::f64: return H5T_IEEE_F64LE;
    case DType::i64: return H5T_STD_I64LE;
    case DType::u8: return H5T_STD_U8LE;
  }
  return -1;
}

hid_t mem_type_of(DType d) {
  switch (d) {
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::f64: return H5T_NATIVE_DOUBLE;
    case DType::i64: return H5T_NATIVE_INT64;
    case DType::u8: return H5T_NATIVE_UINT8;
  }
  return -1;
}

// Maps a stored type onto a DType (either byte order); false if it is none of them.
bool dtype_from_h5(hid_t type, DType* out) {
  const std::pair<DType, hid_t> known[] = {
      {DType::f32, H5T_IEEE_F32LE}, {DType::f32, H5T_IEEE_F32BE}, {DType::f64, H5T_IEEE_F64LE},
      {DType::f64, H5T_IEEE_F64BE}, {DType::i64, H5T_STD_I64LE},  {DType::i64, H5T_STD_I64BE},
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
std::string describe_type(hid_t type) {
  size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(size * 8);
    case H5T_FLOAT: return "float" + std::to_string(size * 8) + (size == 4 || size == 8 ? " (non-IEEE)" : "");
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    default: return "unknown";
  }
}

// Chunk shape of about kChunkTargetBytes: whole inner rows, splitting the outermost dims first so
// that a chunk is one contiguous run of the row-major array.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims, size_t elem) {
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

Plist make_fapl(const std::string& ctx, bool strong_close) {
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

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void fsync_path(const std::string& ctx, const std::string& path, bool dir) {
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
Object open_object(hid_t file, const std::string& ctx, const std::string& clean) {
  Object obj(H5Oopen(file, h5_name(clean), H5P_DEFAULT));
  HL_CHECK(obj.ok(), ctx, shown(clean), " cannot be opened (the file is damaged)");
  return obj;
}

// Whether `parts` names an existing group or dataset: every prefix must be a group (HDF5's own
// H5Lexists fails, rather than answering false, when a middle component is missing).
bool object_exists(hid_t file, const std::string& ctx, const std::vector<std::string>& parts) {
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

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    HL_CHECK(d >= 0, "h5: shape ", shape_str(shape), " has a negative dimension");
    HL_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / d, "h5: shape ", shape_str(shape),
             " has too many elements");
    n *= d;
  }
  return n;
}

// ------------------------------------------------------------------------------------------------
// Writer

namespace {

// Temp files being written by this process. The name has only the pid in it (a crashed run's
// leftover is simply overwritten), so two Writers on one path in one process would share it.
std::mutex g_temp_mutex;
std::set<std::string> g_temp_paths;

}  // namespace

Writer::Writer(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  silence_hdf5();
  HL_CHECK(!path_.empty(), what_, ": empty file name");
  HL_CHECK(!is_dir(path_), ctx(), "is a folder, not a file");
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  {
    std::lock_guard<std::mutex> lock(g_temp_mutex);
    HL_CHECK(g_temp_paths.insert(tmp_path_).second, ctx(), "another Writer in this process is already writing it");
  }
  try {
    create_temp();
  } catch (...) {
    std::lock_guard<std::mutex> lock(g_temp_mutex);
    g_temp_paths.erase(tmp_path_);
    throw;
  }
}

void Writer::create_temp() {
  // Create the file with POSIX first: unlike HDF5, it says why it failed (errno).
  int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    std::string folder = folder_of(path_);
    std::string hint = err == ENOENT && !is_dir(folder) ? " (folder '" + folder + "' does not exist)" : "";
    HL_FAIL(ctx(), "cannot create '", tmp_path_, "': ", errno_str(err), hint);
  }
  ::close(fd);

  try {
    Plist fcpl(H5Pcreate(H5P_FILE_CREATE));
    // No timestamps on the root group (nor, below, on other objects): same content, same bytes.
    HL_CHECK(fcpl.ok() && H5Pset_obj_track_times(fcpl.get(), 0) >= 0, ctx(), "cannot create an HDF5 property list");
    Plist fapl = make_fapl(ctx(), true);
    // The 1.10 format checksums all metadata (superblock, object headers, chunk indexes), so damage
    // outside the data is detected too. h5py and h5dump built on HDF5 >= 1.10 read it.
    HL_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0, ctx(),
             "cannot set the HDF5 format version");
    file_ = H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
    HL_CHECK(file_ >= 0, with_reason(ctx() + "cannot create '" + tmp_path_ + "' as an HDF5 file"));
  } catch (...) {
    ::unlink(tmp_path_.c_str());
    throw;
  }
}

Writer::~Writer() {
  try {
    if (file_ >= 0) H5Fclose(file_);
    file_ = -1;
    if (!committed_) ::unlink(tmp_path_.c_str());
    std::lock_guard<std::mutex> lock(g_temp_mutex);
    g_temp_paths.erase(tmp_path_);
  } catch (...) {
  }
}

std::string Writer::ctx() const { return what_ + " '" + path_ + "': "; }

void Writer::check_open(const std::string& op) const {
  HL_CHECK(file_ >= 0, ctx(), "cannot ", op, ": the file was already committed (or failed to)");
}

namespace {

#if H5_VERSION_GE(1, 12, 0)
using LinkInfo = H5L_info2_t;
#else
using LinkInfo = H5L_info_t;
#endif

// Opens group parts[0..n) from the root, creating the missing ones.
Object open_or_create_groups(hid_t file, const std::string& ctx, const std::vector<std::string>& parts, size_t n,
                             const std::string& for_name) {
  Plist gcpl(H5Pcreate(H5P_GROUP_CREATE));
  // Links stay compact (inside the group's checksummed object header) instead of moving to a
  // fractal heap past 8 links: HDF5 1.10 does not verify that heap, and a damaged one can crash it.
  HL_CHECK(gcpl.ok() && H5Pset_obj_track_times(gcpl.get(), 0) >= 0 &&
               H5Pset_link_phase_change(gcpl.get(), 65535, 65535) >= 0,
           ctx, "cannot set HDF5 group properties");

  Object cur(H5Oopen(file, "/", H5P_DEFAULT));
  HL_CHECK(cur.ok(), with_reason(ctx + "cannot open the root group"));
  for (size_t i = 0; i < n; ++i) {
    std::string prefix = join(parts, i + 1);
    htri_t exists = H5Lexists(cur.get(), parts[i].c_str(), H5P_DEFAULT);
    HL_CHECK(exists >= 0, with_reason(ctx + "cannot look up group " + prefix));
    if (exists == 0) {
      Group g(H5Gcreate2(cur.get(), parts[i].c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT));
      HL_CHECK(g.ok(), with_reason(ctx + "cannot create group " + prefix));
    }
    Object next(H5Oopen(cur.get(), parts[i].c_str(), H5P_DEFAULT));
    HL_CHECK(next.ok(), with_reason(ctx + "cannot open group " + prefix));
    HL_CHECK(H5Iget_type(next.get()) == H5I_GROUP, ctx, "cannot create ", for_name, ": ", prefix,
             " is a dataset, not a group");
    cur = std::move(next);
  }
  return cur;
}

// Creates (or replaces) a scalar attribute on an open object.
void put_attr(hid_t owner, const std::string& ctx, const std::string& where, const std::string& key,
              hid_t file_type, hid_t mem_type, const void* value) {
  HL_CHECK(!key.empty(), ctx, "attribute on ", where, " needs a non-empty name");
  htri_t exists = H5Aexists(owner, key.c_str());
  HL_CHECK(exists >= 0, with_reason(ctx + "cannot look up attribute " + key + " on " + where));
  if (exists > 0)
    HL_CHECK(H5Adelete(owner, key.c_str()) >= 0, with_reason(ctx + "cannot replace attribute " + key + " on " + where));
  Space space(H5Screate(H5S_SCALAR));
  HL_CHECK(space.ok(), ctx, "cannot create an HDF5 dataspace");
  Attr attr(H5Acreate2(owner, key.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  HL_CHECK(attr.ok(), with_reason(ctx + "cannot create attribute " + key + " on " + where));
  HL_CHECK(H5Awrite(attr.get(), mem_type, value) >= 0, with_reason(ctx + "cannot write attribute " + key + " on " + where));
}

}  // namespace

void Writer::write(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  check_open("write dataset " + name);
  auto parts = split_name(ctx(), name);
  HL_CHECK(!parts.empty(), ctx(), "a dataset needs a name, got '", name, "'");
  std::string clean = join(parts, parts.size());
  HL_CHECK(shape.size() <= H5S_MAX_RANK, ctx(), "dataset ", clean, " has rank ", shape.size(), ", HDF5 allows at most ",
           H5S_MAX_RANK);
  int64_t numel = 1;
  const size_t elem = dtype_size(dtype);
  for (int64_t d : shape) {
    HL_CHECK(d >= 0, ctx(), "dataset ", clean, " has shape ", shape_str(shape), " with a negative dimension");
    HL_CHECK(d == 0 || numel <= std::numeric_limits<int64_t>::max() / int64_t(elem) / d, ctx(), "dataset ", clean,
             " of shape ", shape_str(shape), " is too large");
    numel *= d;
  }
  HL_CHECK(numel == 0 || data != nullptr, ctx(), "dataset ", clean, ": no data given for shape ", shape_str(shape));

  Object parent = open_or_create_groups(file_, ctx(), parts, parts.size() - 1, clean);
  const std::string& leaf = parts.back();
  htri_t exists = H5Lexists(parent.get(), leaf.c_str(), H5P_DEFAULT);
  HL_CHECK(exists >= 0, with_reason(ctx() + "cannot look up " + clean));
  HL_CHECK(exists == 0, ctx(), "cannot write dataset ", clean, ": a dataset or group of that name already exists");

  // Rank 0 is stored as [1] (see kScalarAttr) so that it can be chunked and checksummed.
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims.push_back(1);
  Space space(H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  HL_CHECK(space.ok(), with_reason(ctx() + "cannot create the dataspace of " + clean));
  Plist dcpl(H5Pcreate(H5P_DATASET_CREATE));
  HL_CHECK(dcpl.ok(), ctx(), "cannot create an HDF5 property list");
  HL_CHECK(H5Pset_obj_track_times(dcpl.get(), 0) >= 0, ctx(), "cannot set HDF5 dataset properties");
  // A 0-element array is stored contiguous and unfiltered: it has no bytes to checksum, and HDF5
  // cannot chunk a fixed dimension of size 0.
  if (numel > 0) {
    auto chunk = chunk_dims(dims, elem);
    HL_CHECK(H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data()) >= 0 && H5Pset_fletcher32(dcpl.get()) >= 0,
             with_reason(ctx() + "cannot set chunking and checksum for " + clean));
  }
  Dataset ds(H5Dcreate2(parent.get(), leaf.c_str(), file_type_of(dtype), space.get(), H5P_DEFAULT, dcpl.get(),
                        H5P_DEFAULT));
  HL_CHECK(ds.ok(), with_reason(ctx() + "cannot create dataset " + clean));
  if (numel > 0)
    HL_CHECK(H5Dwrite(ds.get(), mem_type_of(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
             with_reason(ctx() + "cannot write dataset " + clean));
  if (shape.empty()) {
    int64_t one = 1;
    put_attr(ds.get(), ctx(), clean, kScalarAttr, H5T_STD_I64LE, H5T_NATIVE_INT64, &one);
  }
}

void Writer::create_group(const std::string& name) {
  check_open("create group " + name);
  auto parts = split_name(ctx(), name);
  open_or_create_groups(file_, ctx(), parts, parts.size(), join(parts, parts.size()));
}

namespace {

Object attr_owner_for_write(hid_t file, const std::string& ctx, const std::string& object, const std::string& key,
                            std::string* where) {
  auto parts = split_name(ctx, object);
  *where = shown(join(parts, parts.size()));
  HL_CHECK(object_exists(file, ctx, parts), ctx, "cannot set attribute ", key, " on ", *where,
           ": no such group or dataset");
  return open_object(file, ctx, join(parts, parts.size()));
}

}  // namespace

void Writer::set_attr(const std::string& object, const std::string& key, const std::string& value) {
  check_open("set attribute " + key);
  std::string where;
  Object owner = attr_owner_for_write(file_, ctx(), object, key, &where);
  // Fixed length (not variable length): the bytes then live in the attribute message, which the
  // 1.10 format checksums, instead of the global heap, which it does not.
  Type type(H5Tcopy(H5T_C_S1));
  HL_CHECK(type.ok() && H5Tset_size(type.get(), std::max<size_t>(1, value.size())) >= 0 &&
               H5Tset_strpad(type.get(), H5T_STR_NULLPAD) >= 0 && H5Tset_cset(type.get(), H5T_CSET_UTF8) >= 0,
           ctx(), "cannot make the string type of attribute ", key);
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  put_attr(owner.get(), ctx(), where, key, type.get(), type.get(), padded.data());
}

void Writer::set_attr(const std::string& object, const std::string& key, int64_t value) {
  check_open("set attribute " + key);
  std::string where;
  Object owner = attr_owner_for_write(file_, ctx(), object, key, &where);
  put_attr(owner.get(), ctx(), where, key, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void Writer::set_attr(const std::string& object, const std::string& key, double value) {
  check_open("set attribute " + key);
  std::string where;
  Object owner = attr_owner_for_write(file_, ctx(), object, key, &where);
  put_attr(owner.get(), ctx(), where, key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void Writer::commit() {
  check_open("commit");
  herr_t flushed = H5Fflush(file_, H5F_SCOPE_GLOBAL);
  std::string reason = flushed < 0 ? hdf5_reason() : "";
  herr_t closed = H5Fclose(file_);
  if (closed < 0 && reason.empty()) reason = hdf5_reason();
  file_ = -1;  // closed or not, it is not used again; the destructor removes the temp file
  HL_CHECK(flushed >= 0 && closed >= 0, ctx(), "cannot finish writing '", tmp_path_, "'",
           reason.empty() ? "" : " (HDF5: " + reason + ")");
  fsync_path(ctx(), tmp_path_, false);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    HL_FAIL(ctx(), "cannot rename '", tmp_path_, "' onto it: ", errno_str(err));
  }
  committed_ = true;
  // The rename itself is durable only once the folder is synced.
  fsync_path(ctx(), folder_of(path_), true);
}

// ------------------------------------------------------------------------------------------------
// Reader

Reader::Reader(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  silence_hdf5();
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    int err = errno;
    HL_CHECK(err != ENOENT && err != ENOTDIR, ctx(), "no such file");
    HL_FAIL(ctx(), "cannot open: ", errno_str(err));
  }
  HL_CHECK(!S_ISDIR(st.st_mode), ctx(), "is a folder, not a file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  // Open with POSIX first: unlike HDF5, it says why it failed (errno).
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  int err = errno;
  HL_CHECK(fd >= 0, ctx(), "cannot open: ", errno_str(err));
  ::close(fd);

  Plist fapl = make_fapl(ctx(), false);
#if H5_VERSION_GE(1, 12, 0)
  htri_t is_h5 = H5Fis_accessible(path_.c_str(), fapl.get());
#else
  htri_t is_h5 = H5Fis_hdf5(path_.c_str());
#endif
  HL_CHECK(is_h5 > 0, ctx(), "is not an HDF5 file (or is truncated)");
  file_ = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get());
  HL_CHECK(file_ >= 0, ctx(), "is truncated or damaged (HDF5 cannot open it)");
}

Reader::~Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

Reader::Reader(Reader&& o) noexcept
    : path_(std::move(o.path_)), what_(std::move(o.what_)), file_(std::exchange(o.file_, -1)), file_size_(o.file_size_) {}

Reader& Reader::operator=(Reader&& o) noexcept {
  if (this != &o) {
    if (file_ >= 0) H5Fclose(file_);
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    file_ = std::exchange(o.file_, -1);
    file_size_ = o.file_size_;
  }
  return *this;
}

std::string Reader::ctx() const { return what_ + " '" + path_ + "': "; }

bool Reader::has(const std::string& name) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  return object_exists(file_, ctx(), split_name(ctx(), name));
}

namespace {

// Opens an existing group for listing.
Object open_group(hid_t file, const std::string& ctx, const std::string& group, std::string* clean_out) {
  auto parts = split_name(ctx, group);
  std::string clean = join(parts, parts.size());
  HL_CHECK(object_exists(file, ctx, parts), ctx, "group ", shown(clean), " is missing");
  Object g = open_object(file, ctx, clean);
  HL_CHECK(H5Iget_type(g.get()) == H5I_GROUP, ctx, shown(clean), " is a dataset, not a group");
  *clean_out = clean;
  return g;
}

// Link-iteration callbacks run inside HDF5's C code: they must not throw.
herr_t collect_link(hid_t, const char* name, const LinkInfo*, void* out) noexcept {
  try {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

herr_t collect_hard_link(hid_t, const char* name, const LinkInfo* info, void* out) noexcept {
  if (info->type != H5L_TYPE_HARD) return 0;  // soft and external links are not part of the file
  return collect_link(0, name, info, out);
}

}  // namespace

std::vector<std::string> Reader::list(const std::string& group) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string clean;
  Object g = open_group(file_, ctx(), group, &clean);
  std::vector<std::string> names;
  HL_CHECK(H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_link, &names) >= 0, ctx(),
           "cannot list group ", shown(clean), " (the file is damaged)");
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> Reader::list_datasets_recursive(const std::string& group) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string clean;
  Object g = open_group(file_, ctx(), group, &clean);
  // H5Lvisit enters each group once, so hard-link cycles in a damaged file cannot loop.
  std::vector<std::string> links;
  HL_CHECK(H5Lvisit(g.get(), H5_INDEX_NAME, H5_ITER_NATIVE, collect_hard_link, &links) >= 0, ctx(),
           "cannot list group ", shown(clean), " (the file is damaged)");
  std::vector<std::string> datasets;
  for (const auto& link : links) {
    Object o(H5Oopen(g.get(), link.c_str(), H5P_DEFAULT));
    HL_CHECK(o.ok(), ctx(), clean.empty() ? link : clean + "/" + link, " cannot be opened (the file is damaged)");
    if (H5Iget_type(o.get()) == H5I_DATASET) datasets.push_back(link);
  }
  std::sort(datasets.begin(), datasets.end());
  return datasets;
}

namespace {

// Dtype and true shape of an open dataset, checked for sanity.
ArrayInfo inspect(hid_t ds, const std::string& ctx, const std::string& clean) {
  ArrayInfo info;
  Type type(H5Dget_type(ds));
  HL_CHECK(type.ok(), ctx, "dataset ", clean, " has an unreadable type (the file is damaged)");
  HL_CHECK(dtype_from_h5(type.get(), &info.dtype), ctx, "dataset ", clean, " has dtype ", describe_type(type.get()),
           ", which is not supported (float32, float64, int64 or uint8)");
  Space space(H5Dget_space(ds));
  HL_CHECK(space.ok(), ctx, "dataset ", clean, " has an unreadable shape (the file is damaged)");
  H5S_class_t cls = H5Sget_simple_extent_type(space.get());
  if (cls == H5S_SIMPLE) {
    int rank = H5Sget_simple_extent_ndims(space.get());
    HL_CHECK(rank >= 0 && rank <= H5S_MAX_RANK, ctx, "dataset ", clean, " has an unreadable shape (the file is damaged)");
    std::vector<hsize_t> dims(size_t(rank) + 1);
    HL_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) == rank, ctx, "dataset ", clean,
             " has an unreadable shape (the file is damaged)");
    for (int i = 0; i < rank; ++i) {
      HL_CHECK(dims[i] <= hsize_t(std::numeric_limits<int64_t>::max()), ctx, "dataset ", clean,
               " has an absurd dimension ", dims[i], " (the file is damaged)");
      info.shape.push_back(int64_t(dims[i]));
    }
  } else {
    HL_CHECK(cls == H5S_SCALAR, ctx, "dataset ", clean, " has no shape (a null dataspace), which is not supported");
  }
  if (info.shape.size() == 1 && info.shape[0] == 1) {
    htri_t scalar = H5Aexists(ds, kScalarAttr);
    HL_CHECK(scalar >= 0, ctx, "dataset ", clean, " has unreadable attributes (the file is damaged)");
    if (scalar > 0) info.shape.clear();
  }
  int64_t n = 1;
  for (int64_t d : info.shape) {
    HL_CHECK(d == 0 || n <= std::numeric_limits<int64_t>::max() / 8 / d, ctx, "dataset ", clean, " has shape ",
             shape_str(info.shape), ", too large (the file is damaged)");
    n *= d;
  }
  return info;
}

Object open_dataset(hid_t file, const std::string& ctx, const std::string& name, std::string* clean_out) {
  auto parts = split_name(ctx, name);
  HL_CHECK(!parts.empty(), ctx, "a dataset needs a name, got '", name, "'");
  std::string clean = join(parts, parts.size());
  HL_CHECK(object_exists(file, ctx, parts), ctx, "dataset ", clean, " is missing");
  Object ds = open_object(file, ctx, clean);
  HL_CHECK(H5Iget_type(ds.get()) == H5I_DATASET, ctx, clean, " is a group, not a dataset");
  *clean_out = clean;
  return ds;
}

}  // namespace

ArrayInfo Reader::info(const std::string& name) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string clean;
  Object ds = open_dataset(file_, ctx(), name, &clean);
  return inspect(ds.get(), ctx(), clean);
}

Array Reader::read(const std::string& name) const { return read_impl(name, nullptr, nullptr); }

Array Reader::read(const std::string& name, DType expected, const std::vector<int64_t>& expected_shape) const {
  return read_impl(name, &expected, &expected_shape);
}

Array Reader::read_impl(const std::string& name, const DType* expected,
                        const std::vector<int64_t>* expected_shape) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string clean;
  Object ds = open_dataset(file_, ctx(), name, &clean);
  ArrayInfo info = inspect(ds.get(), ctx(), clean);
  if (expected)
    HL_CHECK(info.dtype == *expected, ctx(), "dataset ", clean, " has dtype ", dtype_name(info.dtype), ", expected ",
             dtype_name(*expected));
  if (expected_shape)
    HL_CHECK(info.shape == *expected_shape, ctx(), "dataset ", clean, " has shape ", shape_str(info.shape),
             ", expected ", shape_str(*expected_shape));

  uint64_t nbytes = uint64_t(info.numel()) * dtype_size(info.dtype);
  uint64_t limit = file_size_ * kSizeFactor + kSizeSlack;
  HL_CHECK(nbytes <= limit, ctx(), "dataset ", clean, " claims shape ", shape_str(info.shape), " (", nbytes,
           " bytes), more than a file of ", file_size_, " bytes can hold (the file is damaged)");

  Array a;
  a.dtype = info.dtype;
  a.shape = std::move(info.shape);
  a.bytes.resize(nbytes);
  if (nbytes == 0) return a;
  Plist dxpl(H5Pcreate(H5P_DATASET_XFER));
  HL_CHECK(dxpl.ok() && H5Pset_edc_check(dxpl.get(), H5Z_ENABLE_EDC) >= 0, ctx(),
           "cannot create an HDF5 property list");
  if (H5Dread(ds.get(), mem_type_of(a.dtype), H5S_ALL, H5S_ALL, dxpl.get(), a.bytes.data()) < 0) {
    // Tell a checksum failure from other damage: the same read without checksum checks succeeds.
    bool bad_checksum = H5Pset_edc_check(dxpl.get(), H5Z_DISABLE_EDC) >= 0 &&
                        H5Dread(ds.get(), mem_type_of(a.dtype), H5S_ALL, H5S_ALL, dxpl.get(), a.bytes.data()) >= 0;
    HL_CHECK(!bad_checksum, ctx(), "dataset ", clean, " failed its checksum (the file is damaged)");
    HL_FAIL(ctx(), "dataset ", clean, " cannot be read (the file is damaged)");
  }
  return a;
}

namespace {

// Opens attribute `key` of an existing object; it must hold exactly one value.
Attr open_attr(hid_t file, const std::string& ctx, const std::string& object, const std::string& key,
               std::string* where) {
  auto parts = split_name(ctx, object);
  *where = shown(join(parts, parts.size()));
  HL_CHECK(object_exists(file, ctx, parts), ctx, "attribute ", key, ": ", *where, " is missing (no such group or dataset)");
  Object owner = open_object(file, ctx, join(parts, parts.size()));
  htri_t exists = H5Aexists(owner.get(), key.c_str());
  HL_CHECK(exists >= 0, ctx, "attribute ", key, " on ", *where, " cannot be looked up (the file is damaged)");
  HL_CHECK(exists > 0, ctx, "attribute ", key, " on ", *where, " is missing");
  Attr attr(H5Aopen(owner.get(), key.c_str(), H5P_DEFAULT));
  HL_CHECK(attr.ok(), ctx, "attribute ", key, " on ", *where, " cannot be opened (the file is damaged)");
  Space space(H5Aget_space(attr.get()));
  HL_CHECK(space.ok(), ctx, "attribute ", key, " on ", *where, " cannot be read (the file is damaged)");
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  HL_CHECK(n == 1, ctx, "attribute ", key, " on ", *where, " holds ", n, " values, expected one");
  return attr;
}

std::string attr_kind(hid_t attr) {
  Type type(H5Aget_type(attr));
  if (!type.ok()) return "unknown";
  switch (H5Tget_class(type.get())) {
    case H5T_STRING: return "a string";
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    default: return "a " + describe_type(type.get());
  }
}

}  // namespace

bool Reader::has_attr(const std::string& object, const std::string& key) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  auto parts = split_name(ctx(), object);
  std::string where = shown(join(parts, parts.size()));
  HL_CHECK(object_exists(file_, ctx(), parts), ctx(), "attribute ", key, ": ", where,
           " is missing (no such group or dataset)");
  Object owner = open_object(file_, ctx(), join(parts, parts.size()));
  htri_t exists = H5Aexists(owner.get(), key.c_str());
  HL_CHECK(exists >= 0, ctx(), "attribute ", key, " on ", where, " cannot be looked up (the file is damaged)");
  return exists > 0;
}

std::string Reader::attr_str(const std::string& object, const std::string& key) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string where;
  Attr attr = open_attr(file_, ctx(), object, key, &where);
  Type type(H5Aget_type(attr.get()));
  HL_CHECK(type.ok(), ctx(), "attribute ", key, " on ", where, " cannot be read (the file is damaged)");
  HL_CHECK(H5Tget_class(type.get()) == H5T_STRING, ctx(), "attribute ", key, " on ", where, " is ",
           attr_kind(attr.get()), ", not a string");
  htri_t variable = H5Tis_variable_str(type.get());
  HL_CHECK(variable >= 0, ctx(), "attribute ", key, " on ", where, " cannot be read (the file is damaged)");
  if (variable > 0) {
    Type mem(H5Tcopy(H5T_C_S1));
    HL_CHECK(mem.ok() && H5Tset_size(mem.get(), H5T_VARIABLE) >= 0 &&
                 H5Tset_cset(mem.get(), H5Tget_cset(type.get())) >= 0,
             ctx(), "cannot make an HDF5 string type");
    char* p = nullptr;
    HL_CHECK(H5Aread(attr.get(), mem.get(), &p) >= 0, ctx(), "attribute ", key, " on ", where,
             " cannot be read (the file is damaged)");
    std::string out;
    try {
      if (p) out = p;
    } catch (...) {
      H5free_memory(p);
      throw;
    }
    H5free_memory(p);
    return out;
  }
  size_t size = H5Tget_size(type.get());
  HL_CHECK(size > 0 && size <= file_size_, ctx(), "attribute ", key, " on ", where, " claims ", size,
           " bytes, more than the file holds (the file is damaged)");
  std::string out(size, '\0');
  HL_CHECK(H5Aread(attr.get(), type.get(), out.data()) >= 0, ctx(), "attribute ", key, " on ", where,
           " cannot be read (the file is damaged)");
  if (H5Tget_strpad(type.get()) == H5T_STR_NULLTERM) {
    out.resize(std::strlen(out.c_str()));
  } else {
    char pad = H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD ? ' ' : '\0';
    while (!out.empty() && out.back() == pad) out.pop_back();
  }
  return out;
}

int64_t Reader::attr_i64(const std::string& object, const std::string& key) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string where;
  Attr attr = open_attr(file_, ctx(), object, key, &where);
  Type type(H5Aget_type(attr.get()));
  HL_CHECK(type.ok() && H5Tget_class(type.get()) == H5T_INTEGER, ctx(), "attribute ", key, " on ", where, " is ",
           attr_kind(attr.get()), ", not an integer");
  int64_t v = 0;
  HL_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v) >= 0, ctx(), "attribute ", key, " on ", where,
           " cannot be read (the file is damaged)");
  return v;
}

double Reader::attr_f64(const std::string& object, const std::string& key) const {
  HL_CHECK(file_ >= 0, ctx(), "reader was moved from");
  std::string where;
  Attr attr = open_attr(file_, ctx(), object, key, &where);
  Type type(H5Aget_type(attr.get()));
  H5T_class_t cls = type.ok() ? H5Tget_class(type.get()) : H5T_NO_CLASS;
  HL_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER, ctx(), "attribute ", key, " on ", where, " is ",
           attr_kind(attr.get()), ", not a number");
  double v = 0;
  HL_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v) >= 0, ctx(), "attribute ", key, " on ", where,
           " cannot be read (the file is damaged)");
  return v;
}

}  // namespace headlab::h5
