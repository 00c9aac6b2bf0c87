// Sizes: what the machine has available, sizes in words, and the files headlab reads whole with the
// most it reads of each kind: one table, so that a file padded to
// gigabytes (a vocab.json, a config.json, a text) is refused by its size before it is read, naming the
// file, its size and the limit. docs/limits.md repeats the table.
//
//   kind        files                                                        at most
//   config      config.json, tokenizer_config.json, a shard index            16 MiB
//   tokenizer   vocab.json, merges.txt, tokenizer.json, tokenizer.model,     512 MiB
//               tokenizer.bin
//   text        --text files, prompt files                                   1/64 of the available memory,
//                                                                            at least 64 MiB
//
// A text costs up to ~58 bytes of memory a byte while it is tokenized (the strings of its pieces, their
// ids, the windows): 1/64 of what the machine has available leaves the rest to the model.
#pragma once
#include <cstdint>
#include <string>

namespace headlab {

enum class WholeFile { config, tokenizer, text };

// The most headlab reads of a file of that kind, in bytes (text: from the memory available now).
int64_t whole_file_cap(WholeFile kind);

// "" when `path` is a regular file no larger than its kind's cap; else why not, to follow the quoted
// path ("is 2.1 GB, more than the 512 MiB headlab reads of a tokenizer file").
std::string whole_file_reason(const std::string& path, WholeFile kind);

// The whole of `path`: throws "<who> '<path>' <reason>" (check_input_file's reasons, the cap, a read
// error). The file is remembered as an input (base/input_path.h).
std::string read_whole_file(const std::string& path, WholeFile kind, const std::string& who);

// MemAvailable of /proc/meminfo, in bytes; 0 when it cannot be read.
double available_memory();

// "512 B", "1.5 KiB", "3.0 GiB": sizes in allocation errors, memory estimates and these limits.
std::string format_bytes(double bytes);

}  // namespace headlab
