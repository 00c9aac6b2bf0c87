// The registry of model sources (io/sources.h): which source claims a headlab checkpoint, a model folder and a
// llama2.c file, and what source_of says of a path no source claims: missing, a folder without config.json, not
// a regular file, a pickle torch.save did not write, safetensors, text, empty (a GGUF file is claimed by its magic).
#include "io/sources.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::TempDir;

namespace {

namespace fs = std::filesystem;

std::string write_file(const TempDir& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir.path(name), std::ios::binary) << bytes;
  return dir.path(name);
}

// A legacy llama2.c header (dim 2, hidden 2, 1 layer, 1 head, 1 key/value head, 1 token shared, 1 position) and
// exactly the 38 floats of weights it claims.
std::string llama2c_bytes() {
  const int32_t header[7] = {2, 2, 1, 1, 1, 1, 1};
  std::string bytes(sizeof header, '\0');
  std::memcpy(bytes.data(), header, sizeof header);
  return bytes + std::string(38 * 4, '\0');
}

std::string claimed_by(const std::string& path) { return io::source_of(path, "test: checkpoint").name(); }

}  // namespace

TEST(Sources, TheRegistryListsEachFormatOnce) {
  std::vector<std::string> names;
  for (const io::ModelSource* s : io::sources()) names.push_back(s->name());
  EXPECT_EQ(names, (std::vector<std::string>{"headlab checkpoint", "Hugging Face folder", "llama2.c checkpoint",
                                             "PyTorch file", "GGUF file"}));
}

TEST(Sources, EachFormatIsClaimedByItsSource) {
  TempDir dir("sources");
  // HDF5's signature at byte 0, or after a 512-byte user block: the checkpoint's reader then says what is wrong.
  const std::string signature("\x89HDF\r\n\x1a\n", 8);
  EXPECT_EQ(claimed_by(write_file(dir, "a.h5", signature + "rest")), "headlab checkpoint");
  EXPECT_EQ(claimed_by(write_file(dir, "b.h5", std::string(512, '\0') + signature + "rest")), "headlab checkpoint");
  fs::create_directories(dir.path("hf"));
  write_file(dir, "hf/config.json", "{}");
  EXPECT_EQ(claimed_by(dir.path("hf")), "Hugging Face folder");
  EXPECT_EQ(io::source_of(dir.path("hf"), "test").tokenizer_option(), io::TokenizerOption::overrides);
  const std::string bin = write_file(dir, "model.bin", llama2c_bytes());
  EXPECT_EQ(claimed_by(bin), "llama2.c checkpoint");
  EXPECT_EQ(io::source_of(bin, "test").tokenizer_option(), io::TokenizerOption::required);
  // source_claiming: no checks and no errors, null where no source claims the path.
  EXPECT_EQ(io::source_claiming(dir.dir()), nullptr);
  EXPECT_EQ(io::source_claiming(dir.path("missing")), nullptr);
  EXPECT_NE(io::source_claiming(dir.path("hf")), nullptr);
}

TEST(Sources, APathNoSourceClaimsIsNamedWithWhatItIs) {
  TempDir dir("sources_unclaimed");
  const auto error = [](const std::string& path) {
    return headlab::testing::error_of([&] { io::source_of(path, "eval: checkpoint"); });
  };
  const auto expect = [&](const std::string& path, const std::vector<std::string>& parts) {
    const std::string e = error(path);
    EXPECT_NE(e.find("eval: checkpoint '" + path + "'"), std::string::npos) << e;
    for (const std::string& part : parts)
      EXPECT_NE(e.find(part), std::string::npos) << "missing: " << part << "\n" << e;
  };
  expect(dir.path("nope.h5"), {"': no such file or folder"});
  expect(dir.path("nope.h5/below"), {"': no such file or folder"});
  fs::create_directories(dir.path("plain"));
  expect(dir.path("plain"), {"' is a folder, not a file, and has no config.json"});
  ASSERT_EQ(::mkfifo(dir.path("fifo").c_str(), 0644), 0);
  expect(dir.path("fifo"), {"' is not a regular file (it is a FIFO)"});  // refused, never opened (it would block)
  // A zip is PyTorch's; its reader says what is wrong with it.
  const std::string zip = write_file(dir, "model.pt", std::string("PK\x03\x04", 4) + "archive/data.pkl");
  EXPECT_EQ(claimed_by(zip), "PyTorch file");
  EXPECT_ERROR(io::source_of(zip, "test").read(zip),
               "a PyTorch file is a zip archive as torch.save writes it, and this one cannot be read as one");
  expect(write_file(dir, "old.pth", std::string("\x80\x02\x8a\x0a", 4) + "pickled"),
         {"': is a pickle of protocol 2 but not a torch.save file"});
  EXPECT_EQ(claimed_by(write_file(dir, "model.gguf", std::string("GGUF\x03\0\0\0", 8))), "GGUF file");  // io/gguf.h
  expect(write_file(dir, "model.safetensors", std::string("\x02\0\0\0\0\0\0\0{}", 10)),
         {"': is a safetensors file, not a headlab checkpoint (.h5)"});
  expect(write_file(dir, "notes.h5", "not a checkpoint\n"),
         {"': is not an HDF5 file (a headlab checkpoint) or a llama2.c checkpoint",
          "it starts with the text \"not a checkpoint\""});
  expect(write_file(dir, "empty.h5", ""), {"': is not an HDF5 file", "the file is empty"});
  expect(write_file(dir, "bytes.bin", std::string("\x01\x02\x03\x04\x05\x06\x07\x08\xff", 9)),
         {"it starts with the bytes 01 02 03 04 05 06 07 08"});
  // A llama2.c file cut short: its header's sizes no longer give its length, so no source claims it.
  const std::string cut = llama2c_bytes();
  expect(write_file(dir, "cut.bin", cut.substr(0, cut.size() - 4)), {"': is not an HDF5 file", "the file's length"});
}
