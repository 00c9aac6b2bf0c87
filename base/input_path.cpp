// Input path checks (see input_path.h): one stat(), never an open().
#include "base/input_path.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "base/error.h"

namespace headlab {

namespace {

constexpr const char* kMissing = "does not exist";

// What kind of thing a stat() found, as a noun phrase for the messages.
const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "neither a file nor a folder";
}

// "" when stat() worked (st filled in), else why the path cannot be used.
std::string stat_reason(const std::string& path, struct stat& st) {
  if (::stat(path.c_str(), &st) == 0) return "";
  const int err = errno;
  struct stat link {};
  if (err == ENOENT && ::lstat(path.c_str(), &link) == 0)
    return "is a symbolic link to nothing (its target does not exist)";
  if (err == ENOENT || err == ENOTDIR) return kMissing;
  if (err == ELOOP) return "is a loop of symbolic links (or too long a chain of them)";
  return std::string("cannot be examined: ") + std::strerror(err);
}

// The files check_input_file passed, by (device, inode).
std::mutex g_inputs_mutex;
std::set<std::pair<dev_t, ino_t>> g_inputs;

}  // namespace

bool path_present(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void remember_input(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  const std::lock_guard<std::mutex> lock(g_inputs_mutex);
  g_inputs.emplace(st.st_dev, st.st_ino);
}

bool is_an_input(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  const std::lock_guard<std::mutex> lock(g_inputs_mutex);
  return g_inputs.count({st.st_dev, st.st_ino}) > 0;
}

std::string not_a_file_reason(const std::string& path) {
  struct stat st {};
  std::string why = stat_reason(path, st);
  if (!why.empty() || S_ISREG(st.st_mode)) return why;
  if (S_ISDIR(st.st_mode)) return "is a folder, not a file";
  return std::string("is not a regular file (it is ") + kind_of(st.st_mode) + ")";
}

void check_input_file(const std::string& path, const std::string& who, bool missing_ok) {
  const std::string why = not_a_file_reason(path);
  HL_CHECK(why.empty() || (missing_ok && why == kMissing), who, " '", path, "' ", why);
  if (why.empty()) remember_input(path);
}

void check_input_folder(const std::string& path, const std::string& who) {
  struct stat st {};
  const std::string why = stat_reason(path, st);
  HL_CHECK(why.empty(), who, " '", path, "' ", why);
  HL_CHECK(S_ISDIR(st.st_mode), who, " '", path, "' is not a folder (it is ",
           S_ISREG(st.st_mode) ? "a file" : kind_of(st.st_mode), ")");
}

}  // namespace headlab
