// What the `headlab` commands share: option validators, thread setting, loading a checkpoint with
// its model and task, output folders and files, and number formatting for the terminal tables.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "analysis/heads.h"
#include "analysis/prompt_pairs.h"
#include "analysis/table.h"
#include "io/checkpoint.h"
#include "io/folder_lock.h"
#include "loader/load.h"
#include "tasks/bpe_tokenizer.h"
#include "tasks/task.h"
#include "train/config.h"

namespace headlab::cli {

// Every number option of every command declares its allowed range with one of these (finish_options
// refuses a command whose number option has none): NaN, inf, an empty value, a non-number and anything
// outside the range are refused while parsing (exit 2), naming the option and the range. The range
// shows in --help and in the options table (options_table) that the CLI property test reads.
CLI::Validator in_range(double lo, double hi);  // [lo, hi]
CLI::Validator positive_number(double hi);      // (0, hi]
CLI::Validator non_negative_number(double hi);  // [0, hi]
// Options naming paths say what they are through CLI11's type name, for --help and the options table:
inline constexpr const char* kInputFile = "FILE";      // read: checked as a regular file before it is opened
inline constexpr const char* kInputFolder = "FOLDER";  // read: a folder of files (a model's)
inline constexpr const char* kOutputDir = "DIR";       // written: created, then locked (io/folder_lock.h)
inline constexpr const char* kOutputFile = "OUTFILE";  // written: replaced atomically (check_output_file first)
// --threads, declared once: 0 (all cores) up to kMaxThreadsPerCore x the machine's cores.
inline constexpr int kMaxThreadsPerCore = 4;
void add_threads_option(CLI::App& app, int& threads, const std::string& help = "CPU threads (0: all cores)");
// --seed (0 .. 2^64 - 1), declared once.
void add_seed_option(CLI::App& app, uint64_t& seed, const std::string& help);
// Once every command is declared: throws (a programming error) when a number option of any command
// lacks a range, and gives every path option (kInputFile, kInputFolder, kOutputDir) the check that
// refuses an empty value while parsing (an empty --out would otherwise mean "the default").
void finish_options(CLI::App& app);
// One line per option of every command: "command<TAB>option<TAB>type<TAB>lo<TAB>hi" (type: INT, UINT,
// FLOAT, FILE, FOLDER, DIR, OUTFILE, TEXT or FLAG; lo and hi for numbers, the lower bound open when prefixed by '(').
std::string options_table(const CLI::App& app);
// `headlab --completion bash`: a bash completion script of every command and its options.
std::string bash_completion(const CLI::App& app);
// Sets the thread count for OpenMP/OpenBLAS (0: leave the default, all cores).
// threads > 0: exactly that many; 0: OpenMP's default, or the cores shared out among `processes`
// headlab processes on this machine (data-parallel ranks).
void set_threads(int threads, int processes = 1);
int threads_in_use();

// A model with its task (loader/load.h), as every command loads it.
using headlab::loader::load;
using headlab::loader::Loaded;

// What the head analyses (ablate, heads) share: their options, and the checkpoint, model, task and
// evaluation batches those options name.
struct AnalysisArgs {
  std::string path, tokenizer, out, text, device = "cpu";
  int64_t batches = 0, batch_size = 0;
  int64_t tokens = 0;  // per row; 0: the model's context (a task's rows are as long as the task needs)
  int threads = 0;
};
// The model argument of every command that reads one: a headlab checkpoint (.h5), a Hugging Face model folder
// or a llama2.c checkpoint; and --tokenizer (a llama2.c checkpoint's tokenizer file).
void add_model_argument(CLI::App& app, std::string& path, std::string& tokenizer);
// The checkpoint argument, --out (default: output_folder), --text, --batches,
// --batch-size, --tokens, --device, --threads.
void add_analysis_options(CLI::App& app, AnalysisArgs& a, const std::string& default_out);
struct AnalysisInputs {
  Loaded in;
  train::RunConfig run;
  analysis::EvalSet data;  // --batches validation batches of --batch-size x tokens
  int64_t batches = 0, batch_size = 0, tokens = 0;
  std::string out;      // created
  io::FolderLock lock;  // on out, for the command's lifetime
};
// Sets the threads, loads, refuses --text for a task checkpoint and a batch the machine cannot hold.
AnalysisInputs load_analysis(const AnalysisArgs& a, const char* cmd, const std::string& default_out);

// The prompt pairs of the circuit analyses (heads --task/--pairs, circuit): --task induction | ioi |
// greater-than with --rows, --span, --template, or --pairs FILE.
struct PromptPairArgs {
  std::string task, file;
  int64_t rows = 64, span = 0, templ = 0;
  int64_t stored_rows = 0;  // analysis::CircuitOptions::stored_rows
  const CLI::Option *task_option = nullptr, *file_option = nullptr;
  std::vector<const CLI::Option*> pair_only;  // the options that mean something only with prompt pairs
  bool given() const { return task_option->count() > 0 || file_option->count() > 0; }  // even when empty
  // Throws naming an option of the pairs given without them (it would be ignored).
  void refuse_without_pairs(const char* cmd) const;
};
void add_prompt_pair_options(CLI::App& app, PromptPairArgs& a);
struct MadePairs {
  analysis::PromptPairs pairs;
  std::string source;  // where they came from, in words
};
// The pairs for the model `in` loaded (seed: the generated rows); clear errors naming cmd.
MadePairs make_prompt_pairs(const PromptPairArgs& a, const Loaded& in, uint64_t seed, const char* cmd);

// Throws "<who> '<path>' ..." unless a file can be written at path: its folder exists, and the path is
// not a folder nor anything but a regular file.
void check_output_file(const std::string& path, const std::string& who);
// io::open_output_folder: created, locked (to hold while cmd writes there), dead writers' temp files removed.
io::FolderLock make_locked_dir(const std::string& dir, const char* cmd);
// The whole of a user's input file, checked as a regular file first; errors start with who.
std::string read_input_file(const std::string& path, const char* who);
// Replaces the file atomically (io/atomic_file.h); errors start with cmd.
void write_text(const std::string& path, const std::string& text, const char* cmd);
std::string join_path(const std::string& dir, const std::string& name);
// Where a command writes when --out is not given, the one rule of every command that reads a model:
// beside the model (a file's folder/<name>), or inside a model folder (<folder>/<name>). `out` when given.
std::string output_folder(const std::string& model_path, const std::string& out, const std::string& name);
// The --out help of such a command: "output folder (default: <name> beside the model file, or inside a model folder)".
std::string output_folder_help(const std::string& what, const std::string& name);

using analysis::fmt;  // fixed; "nan" for NaN (analysis/table.h, as the result tables show numbers)
using analysis::fmt_sci;
using analysis::fmt_signed;        // with a sign
using analysis::count_of;  // "1 validation batch"
std::string fmt_bytes(int64_t b);  // "1.5 MiB"
std::string pad(const std::string& s, size_t w, bool left = false);
// An analysis's text on the terminal, as it comes (analysis::Say).
void say(const std::string& text);
// "<out>/{heads.csv, report.md}": what a command wrote, for its closing line.
std::string wrote_line(const std::string& out, const std::vector<std::string>& names);

}  // namespace headlab::cli
