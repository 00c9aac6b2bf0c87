// The house's rules that are not the include order (tests/test_layering.cpp holds that): no source file
// outside tests/ grows past 600 lines, and no floor above io/ includes a file format's own header (a format
// is a source in io/'s registry, io/sources.h). Each check is shown to fail on a tree made to break it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

constexpr int64_t kMaxLines = 600;

bool is_source(const fs::path& p) {
  static const std::vector<std::string> kinds = {".h", ".hpp", ".cpp", ".cu", ".cuh", ".py", ".sh", ".cmake"};
  const std::string ext = p.extension().string();
  return p.filename() == "CMakeLists.txt" || std::find(kinds.begin(), kinds.end(), ext) != kinds.end();
}

// Source files under root, except tests/, build trees, hidden folders and installed dependencies.
std::vector<fs::path> sources(const fs::path& root) {
  std::vector<fs::path> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && it.depth() == 0 &&
        (name == "tests" || name.rfind("build", 0) == 0 || name == "runs" || name == "node_modules")) {
      it.disable_recursion_pending();
    } else if (it->is_directory() && (name.front() == '.' || name == "__pycache__")) {
      it.disable_recursion_pending();
    } else if (it->is_regular_file() && is_source(it->path())) {
      out.push_back(it->path());
    }
  }
  return out;
}

std::vector<std::string> long_files(const fs::path& root) {
  std::vector<std::string> out;
  for (const fs::path& p : sources(root)) {
    std::ifstream f(p);
    int64_t lines = 0;
    for (std::string line; std::getline(f, line);) ++lines;
    if (lines > kMaxLines)
      out.push_back(fs::relative(p, root).string() + ": " + std::to_string(lines) + " lines (at most " +
                    std::to_string(kMaxLines) + ")");
  }
  return out;
}

// A format's own headers, which only io/ (its registry) includes.
bool format_header(const std::string& h) {
  return h.rfind("io/hf_", 0) == 0 || h.rfind("io/gguf", 0) == 0 || h == "io/llama2c.h" || h == "io/safetensors.h";
}

std::vector<std::string> format_includes(const fs::path& root) {
  std::vector<std::string> out;
  const std::regex re(R"(^\s*#\s*include\s*"([^"]+)\")");
  for (const char* floor : {"train", "loader", "analysis", "cli", "python"}) {
    if (!fs::exists(root / floor)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / floor)) {
      if (!e.is_regular_file()) continue;
      std::ifstream f(e.path());
      int n = 0;
      for (std::string line; std::getline(f, line);) {
        ++n;
        std::smatch m;
        if (std::regex_search(line, m, re) && format_header(m[1]))
          out.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(n) + " includes \"" + m[1].str() +
                        "\", a format's header (ask io/sources.h)");
      }
    }
  }
  return out;
}

// A scratch tree for the checks' own tests.
struct Scratch {
  fs::path root = fs::temp_directory_path() / ("headlab_house_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() { fs::remove_all(root); }
  void write(const std::string& path, const std::string& text) const {
    fs::create_directories((root / path).parent_path());
    std::ofstream(root / path) << text;
  }
};

}  // namespace

TEST(House, NoSourceFileOutsideTestsIsOver600Lines) {
  ASSERT_GT(sources(HEADLAB_SOURCE_DIR).size(), 100u) << "too few sources found under " << HEADLAB_SOURCE_DIR;
  for (const std::string& f : long_files(HEADLAB_SOURCE_DIR)) ADD_FAILURE() << f;
}

TEST(House, NoFloorAboveIoIncludesAFormatsHeader) {
  for (const std::string& f : format_includes(HEADLAB_SOURCE_DIR)) ADD_FAILURE() << f;
}

TEST(House, TheChecksCatchABreak) {
  const Scratch s;
  std::string long_text;
  for (int i = 0; i < 601; ++i) long_text += "// line\n";
  s.write("nn/long.cpp", long_text);
  s.write("nn/short.h", "// fine\n");
  s.write("tests/test_long.cpp", long_text);  // tests may be longer
  s.write("build/generated.cpp", long_text);  // and build trees are not sources
  s.write("cli/cmd_x.cpp", "#include \"io/hf_llama.h\"\n#include \"io/families.h\"\n");
  const std::vector<std::string> longs = long_files(s.root);
  ASSERT_EQ(longs.size(), 1u);
  EXPECT_EQ(longs[0], "nn/long.cpp: 601 lines (at most 600)");
  const std::vector<std::string> formats = format_includes(s.root);
  ASSERT_EQ(formats.size(), 1u);
  EXPECT_NE(formats[0].find("cli/cmd_x.cpp:1 includes \"io/hf_llama.h\""), std::string::npos) << formats[0];
}
