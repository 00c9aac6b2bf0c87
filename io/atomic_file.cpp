// AtomicFile (atomic_file.h): temp file, write, fsync, rename, fsync the folder; the temp file is
// removed on every failure.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "base/input_path.h"
#include "io/folder_lock.h"
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

// Makes a rename in `folder` durable; some file systems cannot fsync a folder (EINVAL), and the
// rename is then as durable as they allow.
void sync_folder(const std::string& folder, const std::string& who) {
  const int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  HL_CHECK(dfd >= 0, who, ": cannot open folder '", folder, "' to sync it: ", std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  HL_CHECK(rc == 0 || err == EINVAL, who, ": cannot sync folder '", folder, "' to disk: ", std::strerror(err));
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string who)
    : path_(std::move(path)), who_(std::move(who)), tmp_path_(temp_path_for(path_)) {
  HL_CHECK(!path_.empty(), who_, ": empty file name");
  HL_CHECK(!is_an_input(path_), who_, ": will not replace '", path_,
           "': it is an input of this command (write the output somewhere else)");
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
  discard();                            // forget the temp name (the file is now path_)
  sync_folder(folder_of(path_), who_);  // the rename itself is durable only once the folder is synced
}

// ---- AtomicFolder ----

namespace fs = std::filesystem;

struct AtomicFolder::Locks {
  FolderLock old_folder, new_folder;
};

namespace {

// The names of the manifest's files, one a line ("" when there is no manifest).
std::set<std::string> manifest_files(const std::string& folder) {
  std::set<std::string> names;
  std::ifstream in(fs::path(folder) / AtomicFolder::manifest_name());
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') names.insert(line);
  return names;
}

}  // namespace

AtomicFolder::AtomicFolder(std::string path, std::string who)
    : path_(std::move(path)), who_(std::move(who)), locks_(std::make_unique<Locks>()) {
  HL_CHECK(!path_.empty(), who_, ": empty folder name");
  while (path_.size() > 1 && path_.back() == '/') path_.pop_back();  // "out/" names the folder "out"
  std::error_code ec;
  fs::create_directories(path_, ec);
  HL_CHECK(!ec && fs::is_directory(path_), who_, ": cannot create output folder '", path_,
           "': ", ec ? ec.message() : std::string("not a folder"));
  // A link to a folder: the swap replaces the folder it names (renaming the link would leave the old one).
  if (fs::is_symlink(path_)) path_ = fs::canonical(path_).string();
  locks_->old_folder = FolderLock(path_, who_);
  remove_stale_temp_files(path_);
  const std::string parent = folder_of(path_);
  remove_stale_temp_files(parent);
  // What the swap would remove: everything but the lock and what a manifest lists.
  const std::set<std::string> listed = manifest_files(path_);
  std::string foreign;
  int n_foreign = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(path_, ec)) {
    const std::string name = e.path().filename().string();
    if (name == FolderLock::file_name() || name == manifest_name() || listed.count(name)) continue;
    if (++n_foreign <= 5) foreign += (foreign.empty() ? "" : ", ") + name;
  }
  HL_CHECK(!ec, who_, ": cannot list '", path_, "': ", ec.message());
  HL_CHECK(n_foreign == 0, who_, ": '", path_, "' holds files headlab did not write there (", foreign,
           n_foreign > 5 ? ", and " + std::to_string(n_foreign - 5) + " more" : std::string(), "); ", who_,
           " replaces a folder only whole and only one it wrote: choose a new or empty --out");
  tmp_path_ = temp_path_for(path_);
  fs::remove_all(tmp_path_, ec);  // (a leftover of this pid's earlier try)
  HL_CHECK(fs::create_directory(tmp_path_, ec) && !ec, who_, ": cannot create '", tmp_path_, "': ", ec.message());
  locks_->new_folder = FolderLock(tmp_path_, who_);
}

AtomicFolder::~AtomicFolder() {
  if (committed_ || tmp_path_.empty()) return;
  std::error_code ec;
  fs::remove_all(tmp_path_, ec);
}

void AtomicFolder::commit() {
  HL_CHECK(!committed_, who_, ": '", path_, "' was already committed");
  std::ostringstream manifest;
  manifest << "# written whole by headlab " << who_ << "; a later " << who_
           << " replaces this folder only while it holds these files alone\n";
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(tmp_path_, ec)) {
    const std::string name = e.path().filename().string();
    if (name != FolderLock::file_name()) manifest << name << "\n";
  }
  HL_CHECK(!ec, who_, ": cannot list '", tmp_path_, "': ", ec.message());
  write_file_atomic((fs::path(tmp_path_) / manifest_name()).string(), manifest.str(), who_);
  sync_folder(tmp_path_, who_);
  if (::renameat2(AT_FDCWD, tmp_path_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    HL_FAIL(who_, ": cannot swap '", tmp_path_, "' in for '", path_, "': ", std::strerror(err),
            " (the file system must support renameat2's RENAME_EXCHANGE); '", path_, "' is unchanged");
  }
  committed_ = true;
  sync_folder(folder_of(path_), who_);
  fs::remove_all(tmp_path_, ec);  // the old contents, now under the temp name
  HL_CHECK(!ec, who_, ": wrote '", path_, "' but cannot remove the old contents at '", tmp_path_, "': ", ec.message());
}

void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& who) {
  AtomicFile f(path, who);
  f.write(bytes);
  f.commit();
}

void copy_file_atomic(const std::string& from, const std::string& path, const std::string& who) {
  std::ifstream in(from, std::ios::binary);
  HL_CHECK(in.is_open(), who, ": cannot read '", from, "': ", std::strerror(errno));
  AtomicFile f(path, who);
  std::vector<char> buf(size_t{1} << 20);  // a checkpoint need not fit in memory twice
  while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0)
    f.write(std::string_view(buf.data(), static_cast<size_t>(in.gcount())));
  HL_CHECK(in.eof(), who, ": cannot read '", from, "': ", std::strerror(errno));
  f.commit();
}

}  // namespace headlab::io
