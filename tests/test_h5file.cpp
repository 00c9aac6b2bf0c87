// Tests for the HDF5 checkpoint file layer (io/h5file.h): round trips of every dtype and shape,
// attributes, listing, atomic overwrite, and one clear headlab::Error (never a crash) for missing,
// foreign, truncated and damaged files. Raw HDF5 calls here build files other tools could write and
// check the layout on disk.
#include "io/h5file.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>

#include "tests/core_test_util.h"
#include "tests/process_util.h"

namespace fs = std::filesystem;
using headlab::Error;
using headlab::testing::error_of;
using headlab::testing::TempDir;
using namespace headlab::io::h5;

namespace {

// This suite's EXPECT_ERROR takes several substrings, and fails the test when stmt throws nothing or
// something other than a headlab::Error.
#undef EXPECT_ERROR
#define EXPECT_ERROR(stmt, ...)                                                                        \
  do {                                                                                                 \
    std::string msg_ = error_of([&] { stmt; });                                                        \
    if (msg_ == "<no error>" || msg_.rfind("<not a headlab::Error>", 0) == 0)                          \
      ADD_FAILURE() << "expected headlab::Error, got: " << msg_;                                       \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})                             \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "message: " << msg_ << "\nmissing: " << part_; \
  } while (0)

template <typename T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<unsigned char>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

class H5FileTest : public ::testing::Test {
 protected:
  void TearDown() override {
    // Every HDF5 id the layer opened must be closed again, whatever path it took.
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
  }
  std::string path(const std::string& name) const { return tmp_.path(name); }
  std::vector<std::string> dir_entries() const { return tmp_.entries(); }
  TempDir tmp_{"h5file_test"};
};

// ---- round trips ---------------------------------------------------------------------------------

TEST_F(H5FileTest, RoundTripsEveryDtypeAndShape) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> f32(24);
  std::iota(f32.begin(), f32.end(), -3.25f);
  f32[0] = std::numeric_limits<float>::quiet_NaN();
  f32[1] = -inf;
  f32[2] = -0.0f;
  f32[3] = std::numeric_limits<float>::denorm_min();
  std::vector<double> f64 = {1.0 / 3.0, -2.5e300, 0.0, 1e-310, 42.0};
  std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), -1, 0, std::numeric_limits<int64_t>::max()};
  std::vector<uint8_t> u8(256);
  std::iota(u8.begin(), u8.end(), 0);
  float f32_scalar = 2.75f;
  double f64_scalar = -1e-3;
  int64_t i64_scalar = 123456789012345;
  uint8_t u8_scalar = 200;

  {
    Writer w(path("rt.h5"));
    w.write_f32("model/trf_blocks.0.att.W_query.weight", {2, 3, 4}, f32.data());
    w.write_f64("f64", {5}, f64.data());
    w.write_i64("optimizer/state/i64", {2, 2}, i64.data());
    w.write_u8("trainer/rng_state", {256}, u8.data());
    w.write_f32("scalars/f32", {}, &f32_scalar);
    w.write_f64("scalars/f64", {}, &f64_scalar);
    w.write_i64("scalars/i64", {}, &i64_scalar);
    w.write_u8("scalars/u8", {}, &u8_scalar);
    w.write_f32("empty/f32", {0}, nullptr);
    w.write_f64("empty/f64", {3, 0, 2}, nullptr);
    w.write("empty/i64", std::vector<int64_t>{0, 0}, std::vector<int64_t>{});
    w.write("one", std::vector<int64_t>{1}, std::vector<float>{7.5f});  // [1] must stay [1], not rank 0
    w.commit();
  }

  Reader r(path("rt.h5"));
  Array a = r.read("model/trf_blocks.0.att.W_query.weight", DType::f32, {2, 3, 4});
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(a.numel(), 24);
  EXPECT_EQ(a.bytes, bytes_of(f32));  // bitwise: NaN, -inf, -0 and denormals survive
  EXPECT_TRUE(std::isnan(a.as<float>()[0]));
  EXPECT_EQ(a.as<float>()[23], 19.75f);

  Array b = r.read("f64");
  EXPECT_EQ(b.dtype, DType::f64);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(b.as<double>(), f64);

  Array c = r.read("/optimizer/state/i64", DType::i64, {2, 2});  // a leading '/' names the same dataset
  EXPECT_EQ(c.as<int64_t>(), i64);

  Array d = r.read("trainer/rng_state", DType::u8, {256});
  EXPECT_EQ(d.as<uint8_t>(), u8);

  Array s1 = r.read("scalars/f32", DType::f32, {});
  EXPECT_TRUE(s1.shape.empty());
  EXPECT_EQ(s1.numel(), 1);
  EXPECT_EQ(s1.as<float>(), std::vector<float>{2.75f});
  EXPECT_EQ(r.read("scalars/f64", DType::f64, {}).as<double>(), std::vector<double>{-1e-3});
  EXPECT_EQ(r.read("scalars/i64", DType::i64, {}).as<int64_t>(), std::vector<int64_t>{123456789012345});
  EXPECT_EQ(r.read("scalars/u8", DType::u8, {}).as<uint8_t>(), std::vector<uint8_t>{200});

  Array e1 = r.read("empty/f32", DType::f32, {0});
  EXPECT_EQ(e1.numel(), 0);
  EXPECT_TRUE(e1.bytes.empty());
  EXPECT_EQ(r.read("empty/f64").shape, (std::vector<int64_t>{3, 0, 2}));
  EXPECT_EQ(r.read("empty/i64").dtype, DType::i64);
  EXPECT_EQ(r.read("empty/i64").shape, (std::vector<int64_t>{0, 0}));

  Array one = r.read("one");
  EXPECT_EQ(one.shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(one.as<float>(), std::vector<float>{7.5f});

  ArrayInfo info = r.info("model/trf_blocks.0.att.W_query.weight");
  EXPECT_EQ(info.dtype, DType::f32);
  EXPECT_EQ(info.shape, (std::vector<int64_t>{2, 3, 4}));

  EXPECT_ERROR(a.as<double>(), "float32", "float64");
}

TEST_F(H5FileTest, LargeArraysAreChunkedWithFletcher32) {
  // 8 x 300 x 200 floats = 1.9 MB: more than one ~1 MiB chunk.
  std::vector<float> big(8 * 300 * 200);
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i) * 0.25f - 7.0f;
  {
    Writer w(path("big.h5"));
    w.write("model/big", {8, 300, 200}, big);
    w.commit();
  }
  EXPECT_EQ(Reader(path("big.h5")).read("model/big", DType::f32, {8, 300, 200}).as<float>(), big);

  // The hard requirement, checked on the file itself: chunked layout, Fletcher32 in the pipeline.
  hid_t f = H5Fopen(path("big.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t ds = H5Dopen2(f, "model/big", H5P_DEFAULT);
  hid_t dcpl = H5Dget_create_plist(ds);
  EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED);
  hsize_t chunk[3] = {};
  EXPECT_EQ(H5Pget_chunk(dcpl, 3, chunk), 3);
  EXPECT_LT(chunk[0], 8u);  // split into several chunks
  EXPECT_LE(chunk[0] * chunk[1] * chunk[2] * 4, 1u << 20);
  ASSERT_EQ(H5Pget_nfilters(dcpl), 1);
  unsigned flags = 0;
  size_t nelmts = 0;
  EXPECT_EQ(H5Pget_filter2(dcpl, 0, &flags, &nelmts, nullptr, 0, nullptr, nullptr), H5Z_FILTER_FLETCHER32);
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(f);
}

TEST_F(H5FileTest, AttributesRoundTrip) {
  std::string long_text(100000, ' ');
  for (size_t i = 0; i < long_text.size(); ++i) long_text[i] = char('a' + i % 26);
  {
    Writer w(path("attrs.h5"));
    std::vector<float> v = {1, 2};
    w.write("model/w", {2}, v);
    w.create_group("trainer");
    w.set_attr("/", "format", "headlab-checkpoint");
    w.set_attr("/", "format_version", int64_t(1));
    w.set_attr("/", "empty", "");
    w.set_attr("/", "utf8", "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93\nline 2");
    w.set_attr("/", "config", long_text);  // larger than an object header message (64 KiB)
    w.set_attr("model", "lr", 3e-4);
    w.set_attr("model/w", "min", std::numeric_limits<int64_t>::min());
    w.set_attr("model/w", "max", std::numeric_limits<int64_t>::max());
    w.set_attr("trainer", "neg_zero", -0.0);
    w.set_attr("trainer", "inf", std::numeric_limits<double>::infinity());
    w.set_attr("trainer", "replaced", int64_t(5));
    w.set_attr("trainer", "replaced", "now text");  // setting a key again replaces value and type
    w.commit();
  }
  Reader r(path("attrs.h5"));
  EXPECT_EQ(r.attr_str("/", "format"), "headlab-checkpoint");
  EXPECT_EQ(r.attr_i64("/", "format_version"), 1);
  EXPECT_EQ(r.attr_f64("/", "format_version"), 1.0);  // integers read as numbers too
  EXPECT_EQ(r.attr_str("/", "empty"), "");
  EXPECT_EQ(r.attr_str("/", "utf8"), "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93\nline 2");
  EXPECT_EQ(r.attr_str("/", "config"), long_text);
  EXPECT_EQ(r.attr_f64("model", "lr"), 3e-4);
  EXPECT_EQ(r.attr_i64("model/w", "min"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(r.attr_i64("model/w", "max"), std::numeric_limits<int64_t>::max());
  double nz = r.attr_f64("trainer", "neg_zero");
  EXPECT_TRUE(nz == 0.0 && std::signbit(nz));
  EXPECT_EQ(r.attr_f64("trainer", "inf"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.attr_str("trainer", "replaced"), "now text");
  EXPECT_TRUE(r.has_attr("/", "format"));
  EXPECT_TRUE(r.has_attr("model/w", "min"));
  EXPECT_FALSE(r.has_attr("/", "nope"));
  EXPECT_FALSE(r.has_attr("model", "min"));

  const std::string p = path("attrs.h5");
  EXPECT_ERROR(r.attr_str("/", "nope"), p, "attribute nope on / is missing");
  EXPECT_ERROR(r.attr_i64("/", "format"), p, "attribute format on / is a string, not an integer");
  EXPECT_ERROR(r.attr_str("/", "format_version"), p, "attribute format_version on / is an integer, not a string");
  EXPECT_ERROR(r.attr_f64("/", "format"), p, "not a number");
  EXPECT_ERROR(r.attr_str("optimizer", "x"), p, "optimizer is missing");
  EXPECT_ERROR(r.has_attr("optimizer", "x"), p, "optimizer is missing");
}

TEST_F(H5FileTest, ListsGroupsAndDatasets) {
  {
    Writer w(path("list.h5"));
    std::vector<float> v = {1};
    w.write("model/b.bias", {1}, v);
    w.write("model/a.weight", {1}, v);
    w.write("model/sub/c", {1}, v);
    w.write("optimizer/step", std::vector<int64_t>{}, std::vector<int64_t>{3});
    w.write("top", {1}, v);
    w.create_group("empty_group");
    w.create_group("model/sub");  // existing: no-op
    w.commit();
  }
  Reader r(path("list.h5"));
  using V = std::vector<std::string>;
  EXPECT_EQ(r.list("/"), (V{"empty_group", "model", "optimizer", "top"}));
  EXPECT_EQ(r.list(""), r.list("/"));
  EXPECT_EQ(r.list("model"), (V{"a.weight", "b.bias", "sub"}));
  EXPECT_EQ(r.list("model/sub/"), (V{"c"}));
  EXPECT_EQ(r.list("empty_group"), V{});
  EXPECT_EQ(r.list_datasets_recursive("/"),
            (V{"model/a.weight", "model/b.bias", "model/sub/c", "optimizer/step", "top"}));
  EXPECT_EQ(r.list_datasets_recursive("model"), (V{"a.weight", "b.bias", "sub/c"}));
  EXPECT_EQ(r.list_datasets_recursive("empty_group"), V{});

  EXPECT_TRUE(r.has("/"));
  EXPECT_TRUE(r.has("model"));
  EXPECT_TRUE(r.has("model/sub/c"));
  EXPECT_TRUE(r.has("/model/a.weight"));
  EXPECT_TRUE(r.has("empty_group"));
  EXPECT_FALSE(r.has("model/a"));  // dots are part of the name, not a separator
  EXPECT_FALSE(r.has("model/zzz"));
  EXPECT_FALSE(r.has("nope/deeper/still"));
  EXPECT_FALSE(r.has("top/below_a_dataset"));

  const std::string p = path("list.h5");
  EXPECT_ERROR(r.list("nope"), p, "group nope is missing");
  EXPECT_ERROR(r.list("top"), p, "top is a dataset, not a group");
  EXPECT_ERROR(r.list_datasets_recursive("model/zzz"), p, "group model/zzz is missing");

  Reader moved = std::move(r);  // readers can be moved into whatever holds them
  EXPECT_EQ(moved.read("optimizer/step").as<int64_t>(), std::vector<int64_t>{3});
  EXPECT_EQ(moved.path(), p);
}

TEST_F(H5FileTest, SameContentGivesTheSameBytes) {
  auto write = [&](const std::string& p) {
    Writer w(p);
    w.write("model/w", {2, 2}, std::vector<float>{1, 2, 3, 4});
    w.write("step", std::vector<int64_t>{}, std::vector<int64_t>{7});
    w.set_attr("/", "format", "headlab-checkpoint");
    w.set_attr("model", "lr", 0.5);
    w.commit();
  };
  write(path("a.h5"));
  // Let the clock tick over a second, so that any timestamp in the file would differ.
  for (time_t t0 = ::time(nullptr); ::time(nullptr) == t0;) ::usleep(10000);
  write(path("b.h5"));
  EXPECT_EQ(read_file(path("a.h5")), read_file(path("b.h5")));
}

// ---- atomic write --------------------------------------------------------------------------------

TEST_F(H5FileTest, OverwriteIsAtomic) {
  const std::string p = path("checkpoint.h5");
  auto value_in_file = [&] { return Reader(p).read("v", DType::f32, {3}).as<float>(); };
  {
    Writer w(p);
    w.write("v", {3}, std::vector<float>{1, 2, 3});
    w.commit();
  }
  ASSERT_EQ(value_in_file(), (std::vector<float>{1, 2, 3}));

  {  // destroyed without commit: old content intact, temp file gone
    Writer w(p);
    EXPECT_EQ(w.temp_path(), path(".headlab-tmp-" + std::to_string(::getpid()) + ".checkpoint.h5"));
    w.write("v", {3}, std::vector<float>{9, 9, 9});
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_EQ(value_in_file(), (std::vector<float>{1, 2, 3}));  // the real name is untouched while writing
  }
  EXPECT_EQ(value_in_file(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"checkpoint.h5"});

  {  // an exception half way through behaves the same
    Writer w(p);
    w.write("v", {3}, std::vector<float>{8, 8, 8});
    EXPECT_ERROR(w.write("v", {3}, std::vector<float>{7, 7, 7}), p, "dataset v", "already exists");
  }
  EXPECT_EQ(value_in_file(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"checkpoint.h5"});

  {  // a Reader holding the old file open does not stop the replacement, and keeps seeing the old data
    Reader old(p);
    Writer w(p);
    w.write("v", {3}, std::vector<float>{4, 5, 6});
    w.commit();
    EXPECT_FALSE(fs::exists(w.temp_path()));
    EXPECT_EQ(old.read("v").as<float>(), (std::vector<float>{1, 2, 3}));
  }
  EXPECT_EQ(value_in_file(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(dir_entries(), std::vector<std::string>{"checkpoint.h5"});
}

TEST_F(H5FileTest, WriterErrors) {
  const std::string missing_dir = path("no_such_dir");
  const std::string in_missing = missing_dir + "/checkpoint.h5";
  EXPECT_ERROR(Writer w(in_missing), "checkpoint: cannot write '" + in_missing + "': ", "No such file or directory",
               "folder '" + missing_dir + "' does not exist");
  EXPECT_ERROR(Writer w(tmp_.dir()), tmp_.dir(), "is a folder");
  EXPECT_FALSE(fs::exists(missing_dir));  // never created
  {
    Writer first(path("dup.h5"));
    EXPECT_ERROR(Writer second(path("dup.h5")), path("dup.h5"), "another Writer in this process is already writing it");
  }
  Writer again(path("dup.h5"));  // the name is free once the first Writer is gone

  const std::string p = path("w.h5");
  Writer w(p, "snapshot");
  std::vector<float> v = {1, 2};
  w.write("a", {2}, v);
  EXPECT_ERROR(w.write("a/b", {2}, v), "snapshot '" + p + "'", "a is a dataset, not a group");
  EXPECT_ERROR(w.write("", {2}, v), p, "needs a name");
  EXPECT_ERROR(w.write("x//y", {2}, v), p, "invalid name 'x//y'");
  EXPECT_ERROR(w.write("x/./y", {2}, v), p, "invalid name");
  EXPECT_ERROR(w.write("neg", DType::f32, {2, -1}, v.data()), p, "dataset neg has shape [2, -1]", "negative");
  EXPECT_ERROR(w.write("null", DType::f32, {2}, nullptr), p, "dataset null", "no data");
  EXPECT_ERROR(w.write("count", {3}, v), p, "dataset count has shape [3] but 2 values were given");
  EXPECT_ERROR(w.set_attr("nope", "k", int64_t(1)), p, "cannot set attribute k on nope: no such group or dataset");
  EXPECT_ERROR(w.create_group("a"), p, "a is a dataset, not a group");
  w.commit();
  EXPECT_ERROR(w.write("b", {2}, v), p, "already committed");
  EXPECT_ERROR(w.set_attr("/", "k", 1.0), p, "already committed");
  EXPECT_ERROR(w.commit(), p, "already committed");
  EXPECT_EQ(Reader(p).list("/"), std::vector<std::string>{"a"});
}

// ---- reader errors -------------------------------------------------------------------------------

TEST_F(H5FileTest, ReaderErrorsOnMissingForeignAndTruncatedFiles) {
  const std::string missing = path("x.h5");
  EXPECT_ERROR(Reader r(missing), "checkpoint '" + missing + "': no such file");
  EXPECT_ERROR(Reader r(path("no_dir/x.h5"), "fixture"), "fixture '" + path("no_dir/x.h5") + "': no such file");
  EXPECT_ERROR(Reader r(tmp_.dir()), tmp_.dir(), "is a folder, not a file");

  const std::string text = path("notes.h5");
  std::ofstream(text) << "this is a text file, not HDF5\n";
  EXPECT_ERROR(Reader r(text), "checkpoint '" + text + "': is not an HDF5 file (or is truncated)");
  const std::string empty = path("empty.h5");
  write_file(empty, {});
  EXPECT_ERROR(Reader r(empty), empty, "is not an HDF5 file");

  const std::string good = path("good.h5");
  {
    Writer w(good);
    std::vector<float> v(5000, 1.5f);
    w.write("model/tok_emb.weight", {50, 100}, v);
    w.set_attr("/", "format", "headlab-checkpoint");
    w.commit();
  }
  auto bytes = read_file(good);
  ASSERT_GT(bytes.size(), 4096u);
  for (size_t keep : {bytes.size() / 2, size_t(1024)}) {
    const std::string cut = path("cut" + std::to_string(keep) + ".h5");
    write_file(cut, std::vector<unsigned char>(bytes.begin(), bytes.begin() + long(keep)));
    EXPECT_ERROR(Reader r(cut), "checkpoint '" + cut + "': ", "truncated");
  }
}

TEST_F(H5FileTest, ReaderErrorsOnWrongNamesDtypesAndShapes) {
  const std::string p = path("x.h5");
  {
    Writer w(p);
    w.write("model/tok_emb.weight", {64, 32}, std::vector<float>(64 * 32, 0.5f));
    w.write("model/a", {2}, std::vector<int64_t>{1, 2});
    w.commit();
  }
  Reader r(p);
  const std::string c = "checkpoint '" + p + "': ";
  EXPECT_ERROR(r.read("model/out_head.weight"), c + "dataset model/out_head.weight is missing");
  EXPECT_ERROR(r.read("nope/deeper/x"), c + "dataset nope/deeper/x is missing");
  EXPECT_ERROR(r.read("model/a/below"), c + "dataset model/a/below is missing");
  EXPECT_ERROR(r.info("model/zzz"), c + "dataset model/zzz is missing");
  EXPECT_ERROR(r.read("model"), c + "model is a group, not a dataset");
  EXPECT_ERROR(r.read("model/tok_emb.weight", DType::f32, {64, 64}),
               c + "dataset model/tok_emb.weight has shape [64, 32], expected [64, 64]");
  EXPECT_ERROR(r.read("model/tok_emb.weight", DType::f32, {}),
               c + "dataset model/tok_emb.weight has shape [64, 32], expected []");
  EXPECT_ERROR(r.read("model/a", DType::f32, {2}), c + "dataset model/a has dtype int64, expected float32");
  EXPECT_EQ(r.read("model/a", DType::i64, {2}).as<int64_t>(), (std::vector<int64_t>{1, 2}));
}

// ---- damaged files ---------------------------------------------------------------------------------

TEST_F(H5FileTest, FlippedDataByteFailsTheChecksum) {
  const std::string p = path("x.h5");
  std::vector<float> head(20000);
  for (size_t i = 0; i < head.size(); ++i) head[i] = 1000.25f + float(i);
  std::vector<float> emb(64 * 32, -2.0f);
  {
    Writer w(p);
    w.write("model/out_head.weight", {100, 200}, head);
    w.write("model/tok_emb.weight", {64, 32}, emb);
    w.commit();
  }
  auto bytes = read_file(p);
  auto pattern = bytes_of(std::vector<float>(head.begin(), head.begin() + 4));
  auto at = std::search(bytes.begin(), bytes.end(), pattern.begin(), pattern.end());
  ASSERT_NE(at, bytes.end()) << "data of model/out_head.weight not found in the file";
  size_t data_start = size_t(at - bytes.begin());
  ASSERT_LE(data_start + head.size() * 4, bytes.size());

  for (size_t offset : {size_t(0), size_t(4 * 12345 + 1), size_t(4 * 19999 + 3)}) {
    auto damaged = bytes;
    damaged[data_start + offset] ^= 0x01;  // one bit
    const std::string d = path("damaged" + std::to_string(offset) + ".h5");
    write_file(d, damaged);
    Reader r(d);
    EXPECT_EQ(r.info("model/out_head.weight").shape, (std::vector<int64_t>{100, 200}));  // metadata is fine
    EXPECT_ERROR(r.read("model/out_head.weight", DType::f32, {100, 200}),
                 "checkpoint '" + d + "': dataset model/out_head.weight failed its checksum (the file is damaged)");
    EXPECT_EQ(r.read("model/tok_emb.weight").as<float>(), emb);  // other datasets still read
  }
}

// Everything a checkpoint loader would read, as one comparable value.
struct Snapshot {
  std::map<std::string, Array> arrays;
  std::string format, config;
  int64_t version = 0;
  double lr = 0;
  bool operator==(const Snapshot& o) const {
    if (format != o.format || config != o.config || version != o.version || lr != o.lr) return false;
    if (arrays.size() != o.arrays.size()) return false;
    for (const auto& [name, a] : arrays) {
      auto it = o.arrays.find(name);
      if (it == o.arrays.end() || it->second.dtype != a.dtype || it->second.shape != a.shape ||
          it->second.bytes != a.bytes)
        return false;
    }
    return true;
  }
};

Snapshot read_everything(const std::string& p) {
  Reader r(p);
  Snapshot s;
  for (const auto& name : r.list_datasets_recursive("/")) s.arrays[name] = r.read(name);
  for (const auto& group : r.list("/")) (void)r.has(group);
  s.format = r.attr_str("/", "format");
  s.config = r.attr_str("/", "config");
  s.version = r.attr_i64("/", "format_version");
  s.lr = r.attr_f64("optimizer", "lr");
  return s;
}

// Reads a damaged file in a child process, so that a crash or hang is reported as a failure at that
// byte instead of killing the test binary. It also keeps out of the leak report the few hundred
// bytes HDF5 1.10 itself leaks on some damaged object headers. Returns the waitpid status.
enum Outcome { kIntact = 0, kError = 1, kErrorWithoutPath = 2, kSilentlyDifferent = 3, kOtherException = 4 };
int read_in_child(const std::string& p, const Snapshot& original) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);  // a hang ends as SIGALRM
    int code = kOtherException;
    try {
      code = read_everything(p) == original ? kIntact : kSilentlyDifferent;
    } catch (const Error& e) {
      code = std::string(e.what()).find("'" + p + "'") != std::string::npos ? kError : kErrorWithoutPath;
    } catch (...) {}
    ::_exit(code);  // no atexit handlers: gtest and the leak checker belong to the parent
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) ADD_FAILURE() << "fork/waitpid failed";
  return status;
}

TEST_F(H5FileTest, FlippedByteAnywhereGivesAnErrorOrTheOriginalData) {
  const std::string p = path("x.h5");
  {
    Writer w(p);
    std::vector<float> head(20000);
    for (size_t i = 0; i < head.size(); ++i) head[i] = std::sin(float(i));
    w.write("model/out_head.weight", {100, 200}, head);
    w.write("model/trf_blocks.0.norm1.scale", {64}, std::vector<float>(64, 1.0f));
    w.write("model/empty", {0, 4}, std::vector<double>{});
    w.write("optimizer/step", std::vector<int64_t>{}, std::vector<int64_t>{1234});
    w.write("trainer/rng", {2500}, std::vector<uint8_t>(2500, 0xA5));
    w.set_attr("/", "format", "headlab-checkpoint");
    w.set_attr("/", "format_version", int64_t(1));
    w.set_attr("/", "config", std::string(R"({"vocab_size": 50, "emb_dim": 64, "n_heads": 4})"));
    w.set_attr("optimizer", "lr", 1e-3);
    w.commit();
  }
  const Snapshot original = read_everything(p);
  ASSERT_EQ(original.arrays.size(), 5u);
  const auto bytes = read_file(p);
  // HEADLAB_H5_FUZZ_OFFSETS=<n> runs a denser sweep by hand.
  const char* env = std::getenv("HEADLAB_H5_FUZZ_OFFSETS");
  const size_t n_offsets = env ? std::min<size_t>(std::stoul(env), bytes.size()) : 200;
  const std::string d = path("damaged.h5");
  size_t detected = 0;
  for (size_t i = 0; i < n_offsets; ++i) {
    size_t offset = i * bytes.size() / n_offsets;
    auto damaged = bytes;
    damaged[offset] ^= 0xFF;
    write_file(d, damaged);
    int status = read_in_child(d, original);
    if (WIFSIGNALED(status)) {
      ADD_FAILURE() << "byte " << offset << ": reading crashed or hung (signal " << WTERMSIG(status) << ")";
      continue;
    }
    switch (WEXITSTATUS(status)) {
      case kIntact:
        break;  // the byte was unused
      case kError:
        ++detected;
        break;
      case kErrorWithoutPath:
        ADD_FAILURE() << "byte " << offset << ": error message does not name the file";
        break;
      case kSilentlyDifferent:
        ADD_FAILURE() << "byte " << offset << ": content changed without an error";
        break;
      default:
        ADD_FAILURE() << "byte " << offset << ": threw something other than headlab::Error";
        break;
    }
  }
  // Nearly all of the file is checksummed data or checksummed (1.10 format) metadata.
  EXPECT_GT(detected, n_offsets * 3 / 4);
}

// ---- files written by other tools --------------------------------------------------------------------

// Builds a small file with the raw C API the way h5py or another tool might: no checksums, a
// scalar dataspace, big-endian data, unsupported dtypes, variable-length strings, a dataset that
// claims far more data than the file holds.
void write_foreign_file(const std::string& p) {
  hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  auto put = [&](const char* name, hid_t ftype, hid_t mtype, hid_t space, const void* data, hid_t dcpl) {
    hid_t ds = H5Dcreate2(f, name, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(ds, 0);
    if (data) {
      ASSERT_GE(H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    }
    H5Dclose(ds);
  };
  hsize_t three = 3;
  hid_t s3 = H5Screate_simple(1, &three, nullptr);
  hid_t scalar = H5Screate(H5S_SCALAR);
  float plain[3] = {1.5f, -2.5f, 3.5f};
  put("plain_f32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, s3, plain, H5P_DEFAULT);
  double be[3] = {0.125, -1e10, 7.0};
  put("big_endian_f64", H5T_IEEE_F64BE, H5T_NATIVE_DOUBLE, s3, be, H5P_DEFAULT);
  int64_t step = 77;
  put("scalar_i64", H5T_STD_I64LE, H5T_NATIVE_INT64, scalar, &step, H5P_DEFAULT);
  int32_t i32[3] = {1, 2, 3};
  put("int32", H5T_STD_I32LE, H5T_NATIVE_INT32, s3, i32, H5P_DEFAULT);

  // 2^36 floats = 256 GiB, chunked and never written: a tiny file whose header claims a huge array.
  hsize_t huge = hsize_t(1) << 36, chunk = 1024;
  hid_t shuge = H5Screate_simple(1, &huge, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, &chunk);
  put("huge", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, shuge, nullptr, dcpl);
  H5Pclose(dcpl);
  H5Sclose(shuge);

  hid_t vstr = H5Tcopy(H5T_C_S1);
  H5Tset_size(vstr, H5T_VARIABLE);
  H5Tset_cset(vstr, H5T_CSET_UTF8);
  const char* text = "variable length";
  hid_t a = H5Acreate2(f, "vstr", vstr, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, vstr, &text);
  H5Aclose(a);
  H5Tclose(vstr);
  hid_t s2 = H5Screate_simple(1, &three, nullptr);
  int64_t many[3] = {1, 2, 3};
  a = H5Acreate2(f, "three_ints", H5T_STD_I64LE, s2, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT64, many);
  H5Aclose(a);
  int32_t small = -5;
  a = H5Acreate2(f, "int32_attr", H5T_STD_I32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_INT32, &small);
  H5Aclose(a);
  H5Sclose(s2);
  H5Sclose(s3);
  H5Sclose(scalar);
  H5Fclose(f);
}

TEST_F(H5FileTest, ReadsFilesFromOtherToolsAndRefusesWhatItCannot) {
  const std::string p = path("foreign.h5");
  write_foreign_file(p);
  Reader r(p, "fixture");
  EXPECT_EQ(r.read("plain_f32", DType::f32, {3}).as<float>(), (std::vector<float>{1.5f, -2.5f, 3.5f}));
  EXPECT_EQ(r.read("big_endian_f64", DType::f64, {3}).as<double>(), (std::vector<double>{0.125, -1e10, 7.0}));
  Array s = r.read("scalar_i64");
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.as<int64_t>(), std::vector<int64_t>{77});
  EXPECT_EQ(r.attr_str("/", "vstr"), "variable length");
  EXPECT_EQ(r.attr_i64("/", "int32_attr"), -5);

  const std::string c = "fixture '" + p + "': ";
  EXPECT_ERROR(r.read("int32"), c + "dataset int32 has dtype int32, which is not supported");
  EXPECT_EQ(r.info("huge").shape, (std::vector<int64_t>{int64_t(1) << 36}));
  EXPECT_ERROR(r.read("huge"), c + "dataset huge claims shape [68719476736] (274877906944 bytes), more than a file of",
               "(the file is damaged)");
  EXPECT_ERROR(r.attr_i64("/", "three_ints"), c + "attribute three_ints on / holds 3 values, expected one");
}

}  // namespace
