// The layering rule (ARCHITECTURE.md, "Layers"), checked on every #include of the library and the
// command: a folder includes itself and folders below it, never one above or beside it, and a
// folder's internal headers (backends/cpu, backends/cuda, *internal.h*, analysis/head_control.h)
// only from inside that folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// Rank of each folder: an include must go to a strictly lower rank (or to the same folder).
// Folders of equal rank are independent of each other.
const std::map<std::string, int> kRank = {
    {"base", 0}, {"backends", 1}, {"autograd", 2}, {"ops", 3},  {"nn", 4},       {"optim", 5}, {"tasks", 5},
    {"plot", 5}, {"io", 6},       {"train", 7},    {"loader", 8}, {"analysis", 9}, {"cli", 10},  {"python", 10},
};

// Headers that belong to their folder alone.
bool is_internal(const std::string& header) {
  return header.rfind("backends/cpu/", 0) == 0 || header.rfind("backends/cuda/", 0) == 0 ||
         header.find("internal.") != std::string::npos || header == "analysis/head_control.h";
}

struct Include {
  std::string file, header;
  int line;
};

std::vector<Include> includes_of(const fs::path& root) {
  std::vector<Include> out;
  const std::regex re(R"(^\s*#\s*include\s*"([^"]+)\")");
  for (const auto& [folder, rank] : kRank) {
    if (!fs::exists(root / folder)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh")) continue;
      std::ifstream f(e.path());
      std::string line;
      int n = 0;
      while (std::getline(f, line)) {
        ++n;
        std::smatch m;
        if (std::regex_search(line, m, re)) out.push_back({fs::relative(e.path(), root).string(), m[1], n});
      }
    }
  }
  return out;
}

std::string folder_of(const std::string& path) { return path.substr(0, path.find('/')); }

// One message per include that breaks the rule.
std::vector<std::string> rule_breaks(const std::vector<Include>& all) {
  std::vector<std::string> out;
  for (const Include& inc : all) {
    const std::string from = folder_of(inc.file), to = folder_of(inc.header);
    if (!kRank.count(to)) continue;  // a system or third-party header written with quotes
    const std::string where = inc.file + ":" + std::to_string(inc.line) + " includes \"" + inc.header + "\": ";
    if (from != to && kRank.at(to) >= kRank.at(from))
      out.push_back(where + from + " (rank " + std::to_string(kRank.at(from)) + ") may not include " + to + " (rank " +
                    std::to_string(kRank.at(to)) + ")");
    if (is_internal(inc.header) && from != to)
      out.push_back(where + "an internal header of " + fs::path(inc.header).parent_path().string() + "/");
  }
  return out;
}

}  // namespace

TEST(Layering, EveryIncludeGoesDown) {
  const std::vector<Include> all = includes_of(HEADLAB_SOURCE_DIR);
  ASSERT_GT(all.size(), 100u) << "too few includes found under " << HEADLAB_SOURCE_DIR;
  for (const std::string& b : rule_breaks(all)) ADD_FAILURE() << b;
}

// The rule must be able to fail: an include upward and one of another folder's internals are caught.
TEST(Layering, TheCheckCatchesABreak) {
  const fs::path root = fs::temp_directory_path() / ("headlab_layering_" + std::to_string(::getpid()));
  fs::create_directories(root / "ops");
  fs::create_directories(root / "nn");
  std::ofstream(root / "ops" / "bad.cpp") << "#include \"nn/module.h\"\n#include \"ops/internal.h\"\n";
  std::ofstream(root / "nn" / "bad.cpp") << "#include \"ops/internal.h\"\n#include \"ops/ops.h\"\n";
  const std::vector<Include> all = includes_of(root);
  const std::vector<std::string> breaks = rule_breaks(all);
  fs::remove_all(root);
  EXPECT_EQ(all.size(), 4u);
  ASSERT_EQ(breaks.size(), 2u);
  EXPECT_NE(breaks[0].find("nn/bad.cpp:1 includes \"ops/internal.h\": an internal header of ops/"), std::string::npos)
      << breaks[0];
  EXPECT_NE(breaks[1].find("ops/bad.cpp:1 includes \"nn/module.h\": ops (rank 3) may not include nn (rank 4)"),
            std::string::npos)
      << breaks[1];
}
