// One writer per output folder: every command that writes into a folder holds an advisory lock
// (flock) on <folder>/.headlab.lock for as long as it runs, and the file holds its pid, so a second
// run into the same folder is refused naming the first instead of both overwriting each other's files.
#pragma once
#include <string>
#include <vector>

namespace headlab::io {

class FolderLock {
 public:
  FolderLock() = default;  // holds nothing
  // Locks `dir` (which must exist) or throws "<who>: '<dir>' is in use by headlab process <pid>; wait
  // for it or choose another --out". The kernel drops a flock when its process ends, however it ends,
  // so the lock file a killed run leaves behind is simply taken over.
  FolderLock(const std::string& dir, const std::string& who);
  ~FolderLock();
  FolderLock(FolderLock&& o) noexcept;
  FolderLock& operator=(FolderLock&& o) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  bool held() const { return fd_ >= 0; }
  static const char* file_name() { return ".headlab.lock"; }

 private:
  void release();
  int fd_ = -1;
};

// What every command that writes into a folder does first: creates `dir` if needed, locks it, and
// removes the temporary files dead writers left in it (temp_files.h), returned in `removed`. Errors:
// "<who>: cannot create output folder '<dir>': <reason>" and FolderLock's.
FolderLock open_output_folder(const std::string& dir, const std::string& who,
                              std::vector<std::string>* removed = nullptr);

}  // namespace headlab::io
