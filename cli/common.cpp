// The commands' shared helpers (see common.h).
#include "cli/common.h"

#include <omp.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "backends/backend.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {
CLI::Validator number_at_least(double lowest, bool inclusive, const std::string& what) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(s, v) || !std::isfinite(v)) return "expected " + what + ", got '" + s + "'";
        if (inclusive ? v < lowest : v <= lowest) return "expected " + what + ", got " + s;
        return "";
      },
      inclusive ? "NONNEGATIVE" : "POSITIVE");
}
}  // namespace

CLI::Validator positive_number() { return number_at_least(0.0, false, "a positive number"); }
CLI::Validator non_negative_number() { return number_at_least(0.0, true, "a number >= 0"); }

void set_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

Loaded load(const std::string& path, const std::string& device, const std::string& text) {
  Loaded l;
  l.ckpt = io::load_checkpoint(path);
  l.model = io::model_from_checkpoint(l.ckpt, path, Device::parse(device));
  l.task = train::RunConfig::from_json(l.ckpt.config).make_task(text);
  return l;
}

std::string fmt(double v, int precision) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_signed(double v, int precision) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  os << std::showpos << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_sci(double v, int precision) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_bytes(int64_t b) { return format_bytes(static_cast<double>(b)); }

std::string pad(const std::string& s, size_t w, bool left) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

void make_dir(const std::string& dir, const char* cmd) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HL_CHECK(!ec && fs::is_directory(dir), cmd, ": cannot create output folder '", dir, "': ",
           ec ? ec.message() : std::string("not a folder"));
}

void write_text(const std::string& path, const std::string& text, const char* cmd) {
  std::ofstream f(path, std::ios::trunc);
  HL_CHECK(f.good(), cmd, ": cannot write '", path, "'");
  f << text;
  f.close();
  HL_CHECK(f.good(), cmd, ": writing '", path, "' failed (disk full?)");
}

std::string join_path(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

int threads_in_use() { return omp_get_max_threads(); }


std::string kept_str(const std::vector<std::vector<int64_t>>& kept) {
  std::string out;
  for (size_t l = 0; l < kept.size(); ++l) {
    if (l) out += "; ";
    out += "layer " + std::to_string(l) + ": ";
    for (size_t i = 0; i < kept[l].size(); ++i) {
      if (i) out += ",";
      out += std::to_string(kept[l][i]);
    }
  }
  return out;
}

}  // namespace headlab::cli
