// Available memory, sizes in words, and the caps on files read whole (sizes.h), checked by size before a
// byte is read.
#include "base/sizes.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <sstream>

#include "base/error.h"
#include "base/input_path.h"

namespace headlab {

namespace {

const char* kind_name(WholeFile kind) {
  switch (kind) {
    case WholeFile::config:
      return "a config file";
    case WholeFile::tokenizer:
      return "a tokenizer file";
    case WholeFile::text:
      return "a text (1/64 of the memory available: tokenizing costs up to ~58 bytes a byte)";
  }
  return "";
}

}  // namespace

std::string format_bytes(double b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 6) b /= 1024, ++u;
  std::ostringstream os;
  if (u == 0)
    os << static_cast<int64_t>(b) << " B";
  else if (std::isfinite(b))
    os << std::fixed << std::setprecision(1) << b << ' ' << units[u];
  else
    os << "more than 1024 EiB";
  return os.str();
}

double available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

int64_t whole_file_cap(WholeFile kind) {
  switch (kind) {
    case WholeFile::config:
      return int64_t{16} << 20;
    case WholeFile::tokenizer:
      return int64_t{512} << 20;
    case WholeFile::text:
      return std::max<int64_t>(int64_t{64} << 20, static_cast<int64_t>(available_memory() / 64));
  }
  return 0;
}

std::string whole_file_reason(const std::string& path, WholeFile kind) {
  std::string why = not_a_file_reason(path);
  if (!why.empty()) return why;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "cannot be examined";
  const int64_t cap = whole_file_cap(kind);
  if (st.st_size <= cap) return "";
  return "is " + format_bytes(static_cast<double>(st.st_size)) + " (" + std::to_string(st.st_size) +
         " bytes), more than the " + format_bytes(static_cast<double>(cap)) + " headlab reads whole of " +
         kind_name(kind);
}

std::string read_whole_file(const std::string& path, WholeFile kind, const std::string& who) {
  const std::string why = whole_file_reason(path, kind);
  HL_CHECK(why.empty(), who, " '", path, "' ", why);
  std::ifstream in(path, std::ios::binary);
  HL_CHECK(in, who, " '", path, "' cannot be opened for reading");
  remember_input(path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  HL_CHECK(!in.bad(), who, " '", path, "' could not be read");
  return bytes;
}

}  // namespace headlab
