// Input paths checked before anything opens them: a FIFO without a writer blocks open() forever,
// /dev/zero or a socket never ends, so an input is opened only once it is known to be a regular file.
// Every reader of a user's file (checkpoints, --text files, the commands' inputs) asks here first, and
// the files it passed are remembered as this process's inputs.
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

// True when anything is at `path`, even what cannot be read (a FIFO, a dangling link, a link loop): a
// reader that looks for a file by name takes it as given, and check_input_file then says what it is.
bool path_present(const std::string& path);

// Remembers a file a reader opened without check_input_file (it checked not_a_file_reason itself).
void remember_input(const std::string& path);

// True when `path` is a file this process passed through check_input_file (the same file by device and
// inode, under any name): the writers refuse to replace their own inputs (io/atomic_file.h).
bool is_an_input(const std::string& path);

// Throws "<who> '<path>' does not exist" or "... is not a folder (it is a FIFO)" unless `path` is a folder.
void check_input_folder(const std::string& path, const std::string& who);

}  // namespace headlab
