// Temp-file names of headlab's atomic writers and the removal of dead writers' leftovers (temp_files.h).
#include "io/temp_files.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <regex>

namespace headlab::io {

namespace fs = std::filesystem;

namespace {
constexpr const char* kMarker = ".headlab-tmp-";
}  // namespace

std::string temp_path_for(const std::string& path) {
  const fs::path p(path);
  return (p.parent_path() / (kMarker + std::to_string(::getpid()) + "." + p.filename().string())).string();
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  static const std::regex pattern(R"(\.headlab-tmp-([0-9]{1,10})\..+)");
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    // (a regular file of an AtomicFile, or the folder of an AtomicFolder; never a symlink)
    if (!std::regex_match(name, m, pattern) || it->is_symlink(ec) || !(it->is_regular_file(ec) || it->is_directory(ec)))
      continue;
    const long long pid = std::stoll(m[1].str());
    // kill(pid, 0) fails with ESRCH only when no such process exists (EPERM: it exists, not ours).
    const bool gone =
        pid > 0 && pid != ::getpid() && pid <= 0x7fffffff && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    std::error_code rm;
    if (gone && fs::remove_all(it->path(), rm) > 0 && !rm) removed.push_back(it->path().string());
  }
  return removed;
}

}  // namespace headlab::io
