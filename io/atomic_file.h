// The one way headlab writes a file: a temp file beside it (temp_files.h), written, fsynced, renamed
// onto the name and the folder fsynced, so a reader sees the old file or the new one, never half of
// one, and a crash or a full disk leaves the old file intact and no temp file behind.
#pragma once
#include <memory>
#include <string>
#include <string_view>

namespace headlab::io {

// A file being replaced. Writers that stream bytes call write(); writers that open the file by name
// themselves (HDF5, PLplot) write temp_path(). Nothing is visible under path() until commit().
// Errors name the file and the OS's reason: "<who>: cannot write 'out/heads.csv': No space left on device".
class AtomicFile {
 public:
  // Creates the temp file; the folder of `path` must exist (it is never created).
  AtomicFile(std::string path, std::string who);
  ~AtomicFile();  // removes the temp file unless committed; never throws
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::string_view bytes);
  // Closes and fsyncs the temp file, renames it onto path() and fsyncs the folder. On failure the
  // temp file is removed and path() is untouched.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_path_; }

 private:
  [[noreturn]] void fail(int err, const std::string& hint = "");
  void discard() noexcept;

  std::string path_, who_, tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// A folder written whole or not at all: its files go into a fresh folder beside it
// (".headlab-tmp-<pid>.<name>", see temp_files.h), and commit() swaps that folder in with one rename
// (renameat2's RENAME_EXCHANGE) and removes the old contents, so a reader sees the old folder or the new
// one, never new weights beside an old config. Only a folder that is absent, empty, or was written whole
// by an AtomicFolder earlier (its manifest, ".headlab-folder", lists every file in it) is replaced; any
// other file in it is named in the constructor's refusal, as is a folder another process holds
// (both folders are locked with FolderLock until the end).
class AtomicFolder {
 public:
  AtomicFolder(std::string path, std::string who);
  ~AtomicFolder();  // removes the new folder unless committed; never throws
  AtomicFolder(const AtomicFolder&) = delete;
  AtomicFolder& operator=(const AtomicFolder&) = delete;

  // Where the files are written until commit().
  const std::string& temp_path() const { return tmp_path_; }
  // Writes the manifest (every file in temp_path()), swaps the folders, removes the old one.
  void commit();

  static const char* manifest_name() { return ".headlab-folder"; }

 private:
  struct Locks;
  std::string path_, who_, tmp_path_;
  std::unique_ptr<Locks> locks_;
  bool committed_ = false;
};

// Replaces `path` with `bytes` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& who);
// Replaces `path` with a copy of the file `from` through an AtomicFile, a MiB at a time.
void copy_file_atomic(const std::string& from, const std::string& path, const std::string& who);

}  // namespace headlab::io
