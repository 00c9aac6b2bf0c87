// HDF5 file layer for checkpoints (see h5file.h): the write path (HDF5 into an AtomicFile's temp
// file, committed by it) and the small helpers of the public header. Reading is in h5_reader.cpp.
#include "io/atomic_file.h"
#include "io/h5_internal.h"

namespace headlab::io::h5 {

using namespace detail;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::i64:
      return "int64";
    case DType::u8:
      return "uint8";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
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

Writer::Writer(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  silence_hdf5();
  HL_CHECK(!path_.empty(), what_, ": empty file name");
  HL_CHECK(!is_dir(path_), ctx(), "is a folder, not a file");
  // The temp file is created by AtomicFile first: unlike HDF5, it says why it failed (errno).
  out_ = std::make_unique<AtomicFile>(path_, what_);
  Plist fcpl(H5Pcreate(H5P_FILE_CREATE));
  // No timestamps on the root group (nor, below, on other objects): same content, same bytes.
  HL_CHECK(fcpl.ok() && H5Pset_obj_track_times(fcpl.get(), 0) >= 0, ctx(), "cannot create an HDF5 property list");
  Plist fapl = make_fapl(ctx(), true);
  // The 1.10 format checksums all metadata (superblock, object headers, chunk indexes), so damage
  // outside the data is detected too. h5py and h5dump built on HDF5 >= 1.10 read it.
  HL_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V110, H5F_LIBVER_V110) >= 0, ctx(),
           "cannot set the HDF5 format version");
  file_ = H5Fcreate(temp_path().c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  HL_CHECK(file_ >= 0, with_reason(ctx() + "cannot create '" + temp_path() + "' as an HDF5 file"));
}

Writer::~Writer() {
  try {
    if (file_ >= 0) H5Fclose(file_);
    file_ = -1;
  } catch (...) {}
  out_.reset();  // removes the temp file unless committed
}

const std::string& Writer::temp_path() const { return out_->temp_path(); }

std::string Writer::ctx() const { return what_ + " '" + path_ + "': "; }

void Writer::check_open(const std::string& op) const {
  HL_CHECK(file_ >= 0, ctx(), "cannot ", op, ": the file was already committed (or failed to)");
}

namespace {

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
void put_attr(hid_t owner, const std::string& ctx, const std::string& where, const std::string& key, hid_t file_type,
              hid_t mem_type, const void* value) {
  HL_CHECK(!key.empty(), ctx, "attribute on ", where, " needs a non-empty name");
  htri_t exists = H5Aexists(owner, key.c_str());
  HL_CHECK(exists >= 0, with_reason(ctx + "cannot look up attribute " + key + " on " + where));
  if (exists > 0)
    HL_CHECK(H5Adelete(owner, key.c_str()) >= 0, with_reason(ctx + "cannot replace attribute " + key + " on " + where));
  Space space(H5Screate(H5S_SCALAR));
  HL_CHECK(space.ok(), ctx, "cannot create an HDF5 dataspace");
  Attr attr(H5Acreate2(owner, key.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  HL_CHECK(attr.ok(), with_reason(ctx + "cannot create attribute " + key + " on " + where));
  HL_CHECK(H5Awrite(attr.get(), mem_type, value) >= 0,
           with_reason(ctx + "cannot write attribute " + key + " on " + where));
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
  Dataset ds(
      H5Dcreate2(parent.get(), leaf.c_str(), file_type_of(dtype), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
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
  errno = 0;
  herr_t flushed = H5Fflush(file_, H5F_SCOPE_GLOBAL);
  int err = errno;
  std::string reason = flushed < 0 ? hdf5_reason() : "";
  herr_t closed = H5Fclose(file_);
  if (closed < 0 && reason.empty()) reason = hdf5_reason(), err = errno;
  file_ = -1;  // closed or not, it is not used again; the destructor removes the temp file
  // The OS's reason first (no space, file too large); HDF5's account after it.
  HL_CHECK(flushed >= 0 && closed >= 0, ctx(), "cannot finish writing '", temp_path(), "'",
           err != 0 ? ": " + errno_str(err) : "", reason.empty() ? "" : " (HDF5: " + reason + ")");
  out_->commit();
}

}  // namespace headlab::io::h5
