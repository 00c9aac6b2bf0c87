// The trainer's files in the run's folder (train/trainer.h): the files that make a run and its checkpoint
// history, the checkpoints it writes (checkpoint-<step>.h5 and checkpoint.h5, the history pruned to
// --keep-last), and a fresh run's refusal or removal (--overwrite) of another run in its folder.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <regex>

#include "io/atomic_file.h"
#include "train/trainer.h"
#include "train/trainer_internal.h"

namespace headlab::train {

namespace fs = std::filesystem;

namespace {

// Removes checkpoint-<step>.h5 files beyond the newest `keep`.
void prune_history(const std::string& dir, int64_t keep) {
  const std::vector<std::pair<int64_t, std::string>> found = checkpoint_history(dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 0)) < found.size(); ++i) {
    std::error_code ec;
    fs::remove(found[i].second, ec);
  }
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> checkpoint_history(const std::string& dir) {
  static const std::regex pattern(R"(checkpoint-(\d{1,18})\.h5)");  // 18 digits: the step fits an int64
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, m, pattern)) found.emplace_back(std::stoll(m[1].str()), it->path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<std::string> run_files(const std::string& dir) {
  static const std::regex pattern(R"(checkpoint(-\d+)?\.h5|metrics\.csv|heads_over_time\.(csv|png|md))");
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, pattern)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Writes checkpoint-<step>.h5 and checkpoint.h5 and drops numbered ones beyond keep_last.
std::string Trainer::save(Session& s) const {
  check_parameters(s);
  io::Checkpoint ck;
  ck.config = s.config.to_json();
  ck.tokenizer = s.config.tokenizer_files();
  ck.model = io::snapshot_parameters(*s.model);
  ck.has_optimizer = true;
  ck.optimizer = s.opt->options();
  for (auto& [name, t] : s.opt->state()) ck.optimizer_state.emplace_back(name, t.detach().to(kCPU));
  ck.optimizer_steps = s.opt->steps();
  ck.has_trainer = true;
  ck.trainer = s.state;
  ck.trainer.rng_seed = default_generator().seed();
  ck.trainer.rng_offset = default_generator().offset();
  const std::string numbered = (fs::path(opts_.out) / ("checkpoint-" + std::to_string(s.state.step) + ".h5")).string();
  io::save_checkpoint(numbered, ck);
  io::copy_file_atomic(numbered, latest_, "checkpoint");  // the same bytes: serialized once
  s.good_checkpoint_step = s.state.step;
  s.wrote_checkpoint = true;
  prune_history(opts_.out, s.config.run.keep_last);
  return numbered;
}

namespace {

// The first files of a run, for messages: "checkpoint.h5, metrics.csv, ..., and 3 more".
std::string some_names(const std::vector<std::string>& files) {
  std::string names;
  for (size_t i = 0; i < files.size() && i < 4; ++i) names += (i ? ", " : "") + files[i];
  if (files.size() > 4) names += ", and " + std::to_string(files.size() - 4) + " more";
  return names;
}

}  // namespace

void Trainer::refuse_another_run() const {
  const std::vector<std::string> old = run_files(opts_.out);
  HL_CHECK(old.empty() || opts_.overwrite, "train: '", opts_.out, "' holds another run (", some_names(old),
           "); continue it with --resume, replace it with --overwrite, or choose another --out");
}

void Trainer::remove_another_run() const {
  const std::vector<std::string> old = run_files(opts_.out);
  if (old.empty()) return;
  refuse_another_run();
  const std::string names = some_names(old);
  for (const std::string& name : old) {
    std::error_code ec;
    fs::remove(fs::path(opts_.out) / name, ec);
    HL_CHECK(!ec, "train: --overwrite: cannot remove '", (fs::path(opts_.out) / name).string(), "': ", ec.message());
  }
  if (!opts_.quiet) std::cout << "removed the earlier run in " << opts_.out << " (--overwrite): " << names << "\n";
}

}  // namespace headlab::train
