// Input paths checked before anything opens them: a FIFO without a writer blocks open() forever,
// /dev/zero or a socket never ends, so an input is opened only once it is known to be a regular file.
// Every reader of a user's file (checkpoints, --text files, the commands' inputs) asks here first.
#pragma once
#include <string>

namespace headlab {

// "" when `path` is a regular file (symlinks followed); otherwise why not, to follow the quoted path:
// "does not exist", "is a folder, not a file", "is not a regular file (it is a FIFO)".
std::string not_a_file_reason(const std::string& path);

// Throws "<who> '<path>' <reason>" unless `path` is a regular file; who names the reader and the
// input ("eval: checkpoint"). missing_ok: a path that does not exist passes, for a reader that says so
// in its own words.
void check_input_file(const std::string& path, const std::string& who, bool missing_ok = false);

// Throws "<who> '<path>' does not exist" or "... is not a folder (it is a FIFO)" unless `path` is a folder.
void check_input_folder(const std::string& path, const std::string& who);

}  // namespace headlab
