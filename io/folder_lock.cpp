// FolderLock (see folder_lock.h): flock(LOCK_EX | LOCK_NB) on an open file description of the
// lock file; the pid written into it is only for the message of the run that is refused.
#include "io/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/error.h"
#include "io/temp_files.h"

namespace headlab::io {

FolderLock::FolderLock(const std::string& dir, const std::string& who) {
  const std::string path = (std::filesystem::path(dir) / file_name()).string();
  // O_CLOEXEC: a child process (a browser, a shell) must not inherit, and so keep, the lock.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  const int open_err = errno;
  HL_CHECK(fd >= 0, who, ": cannot create the lock file '", path, "': ", std::strerror(open_err));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    HL_CHECK(err == EWOULDBLOCK, who, ": cannot lock '", path, "': ", std::strerror(err));
    const std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    // (an empty file: the other process has the lock but has not written its pid yet)
    HL_FAIL(who, ": '", dir, "' is in use by ",
            pid.empty() ? std::string("another headlab process") : "headlab process " + pid,
            "; wait for it or choose another --out");
  }
  const std::string mine = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    const int err = errno;
    ::close(fd);
    HL_FAIL(who, ": cannot write the lock file '", path, "': ", std::strerror(err));
  }
  fd_ = fd;
}

void FolderLock::release() {
  if (fd_ < 0) return;
  // The file stays (removing it would let a third process lock a new file while a second still
  // waits on the old one); emptied, it names nobody.
  if (::ftruncate(fd_, 0) != 0) {
    // nothing to do: the lock itself goes with the close below, and a stale pid only names a dead process
  }
  ::close(fd_);  // (closing the last descriptor of the open file description drops the flock)
  fd_ = -1;
}

FolderLock::~FolderLock() { release(); }

FolderLock::FolderLock(FolderLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

FolderLock& FolderLock::operator=(FolderLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

FolderLock open_output_folder(const std::string& dir, const std::string& who, std::vector<std::string>* removed) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  HL_CHECK(!ec && std::filesystem::is_directory(dir), who, ": cannot create output folder '", dir,
           "': ", ec ? ec.message() : std::string("not a folder"));
  FolderLock lock(dir, who);  // before anything in it is touched, the stale temp files included
  std::vector<std::string> gone = remove_stale_temp_files(dir);
  if (removed) *removed = std::move(gone);
  return lock;
}

}  // namespace headlab::io
