// The HDF5 reader: turns every HDF5 failure on a missing, foreign or damaged file into one
// headlab::Error sentence naming the file and the item.
#include "io/h5_internal.h"

#include "base/input_path.h"

namespace headlab::io::h5 {

using namespace detail;

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
  // A FIFO would block the open() below forever, a device never end: only a regular file is opened.
  const std::string not_file = not_a_file_reason(path_);
  HL_CHECK(not_file.empty(), ctx(), not_file);
  file_size_ = static_cast<uint64_t>(st.st_size);
  // Open with POSIX first: unlike HDF5, it says why it failed (errno).
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  int err = errno;
  HL_CHECK(fd >= 0, ctx(), "cannot open: ", errno_str(err));
  // A safetensors file (an 8-byte little-endian header length, then '{') given where a checkpoint is
  // expected: say so, rather than "not an HDF5 file".
  unsigned char head[9] = {};
  const bool safetensors =
      ::pread(fd, head, sizeof head, 0) == static_cast<ssize_t>(sizeof head) && head[8] == '{' && [&] {
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
        return n >= 2 && n <= file_size_ - 8;
      }();
  ::close(fd);
  HL_CHECK(!safetensors, ctx(),
           "is a safetensors file, not a headlab checkpoint (.h5); give the model folder that holds it (with its "
           "config.json), or convert that folder with headlab convert");

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
    : path_(std::move(o.path_)),
      what_(std::move(o.what_)),
      file_(std::exchange(o.file_, -1)),
      file_size_(o.file_size_) {}

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
    HL_CHECK(rank >= 0 && rank <= H5S_MAX_RANK, ctx, "dataset ", clean,
             " has an unreadable shape (the file is damaged)");
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
  HL_CHECK(object_exists(file, ctx, parts), ctx, "attribute ", key, ": ", *where,
           " is missing (no such group or dataset)");
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
    case H5T_STRING:
      return "a string";
    case H5T_INTEGER:
      return "an integer";
    case H5T_FLOAT:
      return "a float";
    default:
      return "a " + describe_type(type.get());
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
    HL_CHECK(
        mem.ok() && H5Tset_size(mem.get(), H5T_VARIABLE) >= 0 && H5Tset_cset(mem.get(), H5Tget_cset(type.get())) >= 0,
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

}  // namespace headlab::io::h5
