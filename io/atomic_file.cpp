// AtomicFile (atomic_file.h): temp file, write, fsync, rename, fsync the folder; the temp file is
// removed on every failure.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "base/error.h"
#include "io/temp_files.h"

namespace headlab::io {

namespace {

// Temp files being written by this process. The name holds only the pid, so two writers of one
// path in one process would share it: the second is refused.
std::mutex g_mutex;
std::set<std::string> g_temp_paths;

std::string folder_of(const std::string& path) {
  const std::string f = std::filesystem::path(path).parent_path().string();
  return f.empty() ? "." : f;
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string who)
    : path_(std::move(path)), who_(std::move(who)), tmp_path_(temp_path_for(path_)) {
  HL_CHECK(!path_.empty(), who_, ": empty file name");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    HL_CHECK(g_temp_paths.insert(tmp_path_).second, who_, ": cannot write '", path_,
             "': another Writer in this process is already writing it");
  }
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);  // less the umask, as any new file
  if (fd_ < 0) {
    const int err = errno;
    const std::string folder = folder_of(path_);
    std::error_code ec;
    fail(err, err == ENOENT && !std::filesystem::is_directory(folder, ec) ? " (folder '" + folder + "' does not exist)"
                                                                          : "");
  }
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_) ::unlink(tmp_path_.c_str());
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_temp_paths.erase(tmp_path_);
  } catch (...) {}
}

void AtomicFile::fail(int err, const std::string& hint) {
  discard();
  HL_FAIL(who_, ": cannot write '", path_, "': ", std::strerror(err), hint);
}

void AtomicFile::write(std::string_view bytes) {
  HL_CHECK(fd_ >= 0, who_, ": cannot write '", path_, "': the file was already committed (or failed to)");
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(n < 0 ? errno : ENOSPC);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

void AtomicFile::commit() {
  HL_CHECK(fd_ >= 0, who_, ": cannot write '", path_, "': the file was already committed (or failed to)");
  // A writer that wrote temp_path() by name truncated and filled the same file: fsync on this
  // descriptor syncs its bytes too.
  if (::fsync(fd_) != 0) fail(errno);
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail(errno);
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    HL_FAIL(who_, ": cannot rename '", tmp_path_, "' onto '", path_, "': ", std::strerror(err));
  }
  committed_ = true;
  discard();  // forget the temp name (the file is now path_)
  // The rename itself is durable only once the folder is synced; some file systems cannot fsync a
  // folder (EINVAL), and the rename is then as durable as they allow.
  const std::string folder = folder_of(path_);
  const int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  HL_CHECK(dfd >= 0, who_, ": cannot open folder '", folder, "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  HL_CHECK(rc == 0 || err == EINVAL, who_, ": cannot sync folder '", folder, "' to disk: ", std::strerror(err));
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& who) {
  AtomicFile f(path, who);
  f.write(bytes);
  f.commit();
}

}  // namespace headlab::io
