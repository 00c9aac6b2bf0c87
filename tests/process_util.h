// Files and programs for the suites that use them: TempDir, a fresh folder under /tmp for one test;
// run_process, which runs a program as a user would (through /bin/sh, stdin from /dev/null, both
// output streams captured in files) and gives back its exit code and the text of stdout and stderr.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace headlab::testing {

// A unique folder <parent>/<prefix>.XXXXXX (parent /tmp by default), made by the constructor and removed with all its content by the
// destructor. As a fixture member it exists from before SetUp to after TearDown.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "headlab_test", const std::string& parent = "/tmp") {
    std::string tmpl = parent + "/" + prefix + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    dir_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The names of what the folder holds, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::string dir_;
};

struct ProcessResult {
  int code = -1;  // the exit status, or 128 + the signal that ended the program
  std::string out, err;
};

// The whole content of a file ("" when it cannot be read).
inline std::string slurp(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// s as one single-quoted shell word.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs argv (every word quoted) with the environment assignments `env` in front of it
// ("OMP_NUM_THREADS=1 ...", or ""); the streams go through files in scratch_dir, removed afterwards.
inline ProcessResult run_process(const std::vector<std::string>& argv, const std::string& scratch_dir,
                                 const std::string& env = "") {
  static int counter = 0;
  const std::string base = scratch_dir + "/run" + std::to_string(counter++);
  std::ostringstream cmd;
  cmd << env;
  for (const std::string& a : argv) cmd << ' ' << quote(a);
  cmd << " >" << quote(base + ".out") << " 2>" << quote(base + ".err") << " </dev/null";
  const int status = std::system(cmd.str().c_str());
  ProcessResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

}  // namespace headlab::testing
