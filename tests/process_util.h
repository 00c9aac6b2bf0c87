// Files and programs for the suites that use them: TempDir, a fresh folder under /tmp for one test;
// run_process, which runs a program as a user would (through /bin/sh, stdin from /dev/null, both
// output streams captured in files) and gives back its exit code and the text of stdout and stderr;
// run_in_child, which runs a function in a forked child and reports its Error, crash or hang.
#pragma once
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/error.h"

namespace headlab::testing {

// A unique folder <parent>/<prefix>.XXXXXX (parent /tmp by default), made by the constructor and removed with all its
// content by the destructor. As a fixture member it exists from before SetUp to after TearDown.
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

// Runs f in a child process (a crash or a hang fails the test instead of ending it). Returns the
// message of the headlab::Error it threw, or "" when it succeeded.
struct ChildOutcome {
  bool ok = false;       // f returned normally
  bool error = false;    // f threw headlab::Error
  std::string message;   // its message
  std::string abnormal;  // crash, hang or another exception
};

inline ChildOutcome run_in_child(const std::function<void()>& f) {
  int fds[2];
  if (::pipe(fds) != 0) return {false, false, "", "pipe failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(30);  // a hang ends as SIGALRM
    omp_set_num_threads(1);
    int code = 3;
    std::string msg;
    try {
      f();
      code = 0;
    } catch (const Error& e) {
      msg = e.what();
      code = 1;
    } catch (const std::exception& e) {
      msg = e.what();
      code = 2;
    } catch (...) {}
    size_t done = 0;
    while (done < msg.size()) {
      const ssize_t n = ::write(fds[1], msg.data() + done, msg.size() - done);
      if (n <= 0) break;
      done += size_t(n);
    }
    ::_exit(code);  // no atexit handlers: gtest and the leak checker belong to the parent
  }
  ::close(fds[1]);
  ChildOutcome out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.message.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return {false, false, "", "fork/waitpid failed"};
  if (WIFSIGNALED(status)) {
    out.abnormal =
        "killed by signal " + std::to_string(WTERMSIG(status)) + (WTERMSIG(status) == SIGALRM ? " (hang)" : " (crash)");
  } else if (WEXITSTATUS(status) == 0) {
    out.ok = true;
  } else if (WEXITSTATUS(status) == 1) {
    out.error = true;
  } else {
    out.abnormal = "exit code " + std::to_string(WEXITSTATUS(status)) + ": " + out.message;
  }
  return out;
}

}  // namespace headlab::testing
