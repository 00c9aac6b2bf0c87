// Temporary files of atomic writes: ".headlab-tmp-<pid>.<name>" beside <name>, renamed onto it when
// complete. The fixed hidden marker says the file is headlab's own; the extension stays last, so a
// writer that picks its format by extension (PLplot) writes the temp file as it would the real one.
// A writer killed half-way leaves its temp file behind; the pid in the name tells whether it is gone.
#pragma once
#include <string>
#include <vector>

namespace headlab::io {

// "<folder>/.headlab-tmp-<pid of this process>.<file name>".
std::string temp_path_for(const std::string& path);

// Removes the files (and AtomicFolder's folders) in `dir` named .headlab-tmp-<pid>.<name> whose process
// no longer exists, and only those: a live writer's file, one whose pid cannot be checked, and a user's own
// "x.tmp.<pid>" stay. Returns the removed paths.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

}  // namespace headlab::io
