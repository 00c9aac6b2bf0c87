// The commands' shared helpers (see common.h).
#include "cli/common.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "backends/backend.h"
#include "base/input_path.h"
#include "io/atomic_file.h"
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

void set_threads(int threads, int processes) {
  if (threads > 0)
    omp_set_num_threads(threads);
  else if (processes > 1)
    omp_set_num_threads(std::max(1, omp_get_num_procs() / processes));
}

Loaded load(const std::string& path, const std::string& device, const std::string& text) {
  Loaded l;
  l.ckpt = io::load_checkpoint(path);
  l.config = train::RunConfig::from_json(l.ckpt.config);
  l.model = io::load_model(l.ckpt, path, Device::parse(device));
  l.task = l.config.make_task(text);
  return l;
}

nn::GPTModel& Loaded::gpt(const char* cmd) const {
  auto* g = dynamic_cast<nn::GPTModel*>(model.get());
  HL_CHECK(g, cmd, ": this command needs a GPT checkpoint; this one holds an encoder-decoder");
  return *g;
}

void add_analysis_options(CLI::App& app, AnalysisArgs& a, const std::string& default_out) {
  app.add_option("checkpoint", a.path, "checkpoint file (.h5)")->required();
  app.add_option("--out", a.out, "output folder (default: <checkpoint folder>/" + default_out + ")");
  app.add_option("--text", a.text, "chars checkpoints: evaluate on the last 10% of this text instead");
  app.add_option("--batches", a.batches, "validation batches (default: the run's --eval-batches)")
      ->check(positive_number());
  app.add_option("--batch-size", a.batch_size, "rows per batch (default: the run's --batch-size)")
      ->check(positive_number());
  app.add_option("--device", a.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: all cores)")->check(non_negative_number());
}

AnalysisInputs load_analysis(const AnalysisArgs& a, const char* cmd, const std::string& default_out) {
  set_threads(a.threads);
  AnalysisInputs r;
  check_input_file(a.path, std::string(cmd) + ": checkpoint", true);
  r.in = load(a.path, a.device, a.text);
  HL_CHECK(a.text.empty() || r.in.task->name() == "chars", cmd, ": --text applies to chars checkpoints; '", a.path,
           "' is a ", r.in.task->name(), " checkpoint");
  r.run = r.in.config;
  r.batches = a.batches > 0 ? a.batches : r.run.run.eval_batches;
  r.batch_size = a.batch_size > 0 ? a.batch_size : r.run.run.batch_size;
  train::check_evaluation_fits(r.run, r.in.model->device().is_cuda(), r.batches, r.batch_size, cmd,
                               "lower --batches (now " + std::to_string(r.batches) + ") or --batch-size (now " +
                                   std::to_string(r.batch_size) + ")");
  r.out = a.out.empty() ? join_path(std::filesystem::path(a.path).parent_path().string(), default_out) : a.out;
  r.lock = make_locked_dir(r.out, cmd);
  r.data = analysis::make_eval_set(*r.in.task, r.batches, r.batch_size, r.run.batch_tokens());
  return r;
}

std::string fmt_bytes(int64_t b) { return format_bytes(static_cast<double>(b)); }

std::string pad(const std::string& s, size_t w, bool left) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

void make_dir(const std::string& dir, const char* cmd) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HL_CHECK(!ec && fs::is_directory(dir), cmd, ": cannot create output folder '", dir,
           "': ", ec ? ec.message() : std::string("not a folder"));
}

io::FolderLock make_locked_dir(const std::string& dir, const char* cmd) {
  make_dir(dir, cmd);
  return io::FolderLock(dir, cmd);
}

void write_text(const std::string& path, const std::string& text, const char* cmd) {
  io::write_file_atomic(path, text, cmd);
}

std::string join_path(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

int threads_in_use() { return omp_get_max_threads(); }

std::string kept_str(const nn::Model& model) {
  const bool gpt = dynamic_cast<const nn::GPTModel*>(&model) != nullptr;
  std::string out;
  for (int64_t l = 0; l < model.attention_count(); ++l) {
    if (l) out += "; ";
    out += gpt ? "layer " + std::to_string(l) : model.attention_label(l);
    out += ": ";
    for (int64_t h = 0; h < model.heads_at(l); ++h) {
      if (h) out += ",";
      out += std::to_string(model.original_head(l, h));
    }
  }
  return out;
}

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
