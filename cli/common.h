// What the `headlab` commands share: option validators, thread setting, loading a checkpoint with
// its model and task, output folders and files, and number formatting for the terminal tables.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "analysis/heads.h"
#include "analysis/table.h"
#include "io/checkpoint.h"
#include "io/folder_lock.h"
#include "tasks/task.h"
#include "train/config.h"

namespace headlab::cli {

// Number checks whose errors say what was expected in a few words (CLI11 2.1's PositiveNumber
// spells DBL_MAX out in 309 digits).
CLI::Validator positive_number();
CLI::Validator non_negative_number();
// Sets the thread count for OpenMP/OpenBLAS (0: leave the default, all cores).
// threads > 0: exactly that many; 0: OpenMP's default, or the cores shared out among `processes`
// headlab processes on this machine (data-parallel ranks).
void set_threads(int threads, int processes = 1);
int threads_in_use();

// A checkpoint with its model on `device` and its task (text: a chars task's text file instead).
struct Loaded {
  io::Checkpoint ckpt;
  train::RunConfig config;
  std::shared_ptr<nn::Model> model;
  std::unique_ptr<tasks::Task> task;
  // The model as a GPT, for what only the GPT has (clear error naming cmd for an encoder-decoder).
  nn::GPTModel& gpt(const char* cmd) const;
  // The model and task as an encoder-decoder's, or null for a GPT checkpoint.
  nn::EncoderDecoder* seq2seq() const { return dynamic_cast<nn::EncoderDecoder*>(model.get()); }
  const tasks::Seq2SeqTask* seq2seq_task() const { return dynamic_cast<const tasks::Seq2SeqTask*>(task.get()); }
};
Loaded load(const std::string& path, const std::string& device, const std::string& text = "");

// What the head analyses (ablate, heads) share: their options, and the checkpoint, model, task and
// evaluation batches those options name.
struct AnalysisArgs {
  std::string path, out, text, device = "cpu";
  int64_t batches = 0, batch_size = 0;
  int threads = 0;
};
// The checkpoint argument, --out (default <checkpoint folder>/<default_out>), --text, --batches,
// --batch-size, --device, --threads.
void add_analysis_options(CLI::App& app, AnalysisArgs& a, const std::string& default_out);
struct AnalysisInputs {
  Loaded in;
  train::RunConfig run;
  analysis::EvalSet data;  // --batches validation batches of --batch-size x context_length
  int64_t batches = 0, batch_size = 0;
  std::string out;      // created
  io::FolderLock lock;  // on out, for the command's lifetime
};
// Sets the threads, loads, refuses --text for a task checkpoint and a batch the machine cannot hold.
AnalysisInputs load_analysis(const AnalysisArgs& a, const char* cmd, const std::string& default_out);

void make_dir(const std::string& dir, const char* cmd);  // creates it (and parents) or throws naming cmd
// make_dir, then the folder's lock (io/folder_lock.h), to hold while cmd writes there.
io::FolderLock make_locked_dir(const std::string& dir, const char* cmd);
// Replaces the file atomically (io/atomic_file.h); errors start with cmd.
void write_text(const std::string& path, const std::string& text, const char* cmd);
std::string join_path(const std::string& dir, const std::string& name);

using analysis::fmt;  // fixed; "nan" for NaN (analysis/table.h, as the result tables show numbers)
using analysis::fmt_sci;
using analysis::fmt_signed;        // with a sign
std::string fmt_bytes(int64_t b);  // "1.5 MiB"
std::string pad(const std::string& s, size_t w, bool left = false);
// "layer 0: 1,2; layer 1: 0": the heads each layer keeps.
std::string kept_str(const std::vector<std::vector<int64_t>>& kept);
// The heads a model has, by original index: "layer 0: 0,2; layer 1: 1", or "enc.L0: 0,2; ..." for an encoder-decoder.
std::string kept_str(const nn::Model& model);

}  // namespace headlab::cli
