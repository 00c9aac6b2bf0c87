// Temporary files of atomic writes: <path>.tmp.<pid> beside <path>, renamed onto it when complete.
// A writer killed half-way leaves its temporary file behind; the pid in the name tells whether the
// writer is gone, so a later run can remove exactly those.
#pragma once
#include <string>
#include <vector>

namespace headlab::io {

// "<path>.tmp.<pid of this process>".
std::string temp_path_for(const std::string& path);

// Removes the files in `dir` named <name>.tmp.<pid> whose process no longer exists, and only those
// (a live writer's file, or one whose pid cannot be checked, stays). Returns the removed paths.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

}  // namespace headlab::io
