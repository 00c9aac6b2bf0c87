// The one way headlab writes a file: a temp file beside it (temp_files.h), written, fsynced, renamed
// onto the name and the folder fsynced, so a reader sees the old file or the new one, never half of
// one, and a crash or a full disk leaves the old file intact and no temp file behind.
#pragma once
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

// Replaces `path` with `bytes` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view bytes, const std::string& who);

}  // namespace headlab::io
