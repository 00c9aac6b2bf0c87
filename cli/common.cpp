// The commands' shared helpers (see common.h).
#include "cli/common.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "backends/backend.h"
#include "base/input_path.h"
#include "base/sizes.h"
#include "io/atomic_file.h"
#include "tasks/chars.h"
#include "train/config.h"
#include "train/memory.h"

namespace headlab::cli {

namespace fs = std::filesystem;

namespace {
constexpr const char* kRangeValidator = "RANGE";  // the name in_range's validators carry

// The range as --help and the options table show it: "[0, 8]", "(0, 1e+09]".
std::string range_text(double lo, double hi, bool lo_open) {
  std::ostringstream s;
  s << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
  return s.str();
}

CLI::Validator number_in(double lo, double hi, bool lo_open) {
  const std::string range = range_text(lo, hi, lo_open);
  CLI::Validator v(
      [=](std::string& s) -> std::string {
        // long double: 2^63 and 1e30 are numbers to compare, not conversion failures.
        char* end = nullptr;
        const long double x = s.empty() ? NAN : std::strtold(s.c_str(), &end);
        if (end != s.c_str() + s.size() || !std::isfinite(x))
          return "expected a number in " + range + ", got '" + s + "'";
        if ((lo_open ? x <= lo : x < lo) || x > hi) return "expected a number in " + range + ", got " + s;
        return "";
      },
      range);
  return v.name(kRangeValidator);
}
}  // namespace

CLI::Validator in_range(double lo, double hi) { return number_in(lo, hi, false); }
CLI::Validator positive_number(double hi) { return number_in(0.0, hi, true); }
CLI::Validator non_negative_number(double hi) { return number_in(0.0, hi, false); }

void add_threads_option(CLI::App& app, int& threads, const std::string& help) {
  const int cores = std::max(1, omp_get_num_procs());
  app.add_option(
         "--threads", threads,
         help + "; at most " + std::to_string(kMaxThreadsPerCore) + " x the " + std::to_string(cores) + " cores")
      ->check(non_negative_number(double(kMaxThreadsPerCore) * cores));
}

void add_seed_option(CLI::App& app, uint64_t& seed, const std::string& help) {
  app.add_option("--seed", seed, help)->check(in_range(0, 18446744073709551615.0))->capture_default_str();
}

namespace {
// CLI11's type of an option's value, without the validators' descriptions it appends after ':'.
std::string base_type(const CLI::Option& opt) {
  const std::string t = opt.get_type_name();
  return t.substr(0, t.find(':'));
}
bool is_number(const std::string& type) { return type == "INT" || type == "UINT" || type == "FLOAT"; }
const CLI::Validator* range_of(const CLI::Option& opt) {
  try {
    return const_cast<CLI::Option&>(opt).get_validator(kRangeValidator);
  } catch (const CLI::OptionNotFound&) {
    return nullptr;
  }
}
std::vector<const CLI::App*> commands(const CLI::App& app) {
  std::vector<const CLI::App*> subs;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) subs.push_back(sub);
  return subs;
}
}  // namespace

void finish_options(CLI::App& app) {
  const CLI::Validator non_empty([](std::string& s) { return s.empty() ? std::string("expected a path, got ''") : ""; },
                                 "");
  for (CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    for (CLI::Option* opt : sub->get_options()) {
      const std::string type = base_type(*opt);
      if (is_number(type))
        HL_CHECK(range_of(*opt) != nullptr, "headlab ", sub->get_name(), " ", opt->get_name(),
                 ": a number option without a declared range (cli/common.h: in_range)");
      if (type == kInputFile || type == kInputFolder || type == kOutputDir || type == kOutputFile)
        opt->check(non_empty);
    }
}

std::string options_table(const CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : commands(app))
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->get_name() == "--help") continue;
      const std::string type = base_type(*opt).empty() ? "FLAG" : base_type(*opt);  // flags take no value
      std::string range = "\t\t";
      if (const CLI::Validator* v = range_of(*opt)) {
        const std::string d = v->get_description();  // "[lo, hi]" or "(lo, hi]"
        const size_t comma = d.find(", ");
        const std::string lo = d.substr(1, comma - 1), hi = d.substr(comma + 2, d.size() - comma - 3);
        range = "\t" + (d[0] == '(' ? "(" + lo : lo) + "\t" + hi;
      }
      out += sub->get_name() + "\t" + opt->get_name() + "\t" + type + range + "\n";
    }
  return out;
}

std::string bash_completion(const CLI::App& app) {
  // (a stream, not "..." + std::string: GCC 12 warns falsely of an overlapping memcpy there, its bug 105329)
  std::ostringstream names, cases;
  for (const CLI::App* sub : commands(app)) {
    names << sub->get_name() << " ";
    cases << "    " << sub->get_name() << ") opts=\"--help";
    for (const CLI::Option* opt : sub->get_options())
      for (const std::string& n : opt->get_lnames()) cases << " --" << n;
    cases << "\" ;;\n";
  }
  std::ostringstream os;
  os << "# bash completion for headlab (zsh: autoload bashcompinit && bashcompinit first).\n"
        "# eval \"$(headlab --completion bash)\", or save it as ~/.local/share/bash-completion/completions/headlab\n"
        "_headlab() {\n"
        "  local cur=${COMP_WORDS[COMP_CWORD]} opts\n"
        "  if ((COMP_CWORD == 1)); then\n"
        "    COMPREPLY=($(compgen -W \""
     << names.str()
     << "--help --version\" -- \"$cur\"))\n"
        "    return\n"
        "  fi\n"
        "  case ${COMP_WORDS[1]} in\n"
     << cases.str()
     << "    *) opts=\"\" ;;\n"
        "  esac\n"
        "  if [[ $cur == -* ]]; then\n"
        "    COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n"
        "  else\n"
        "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
        "  fi\n"
        "}\n"
        "complete -o filenames -o bashdefault -F _headlab headlab\n";
  return os.str();
}

void set_threads(int threads, int processes) {
  if (threads > 0)
    omp_set_num_threads(threads);
  else if (processes > 1)
    omp_set_num_threads(std::max(1, omp_get_num_procs() / processes));
}

void add_model_argument(CLI::App& app, std::string& path, std::string& tokenizer) {
  app.add_option(
         "checkpoint", path,
         "headlab checkpoint (.h5), Hugging Face model folder (gpt2, llama, gpt_neox) or llama2.c checkpoint (.bin)")
      ->type_name(kInputFile)
      ->required();
  app.add_option("--tokenizer", tokenizer,
                 "the model's tokenizer: a SentencePiece model (tokenizer.model), llama2.c's tokenizer.bin or a "
                 "tokenizer.json (required for a llama2.c checkpoint; overrides a folder's)")
      ->type_name(kInputFile);
}

void add_analysis_options(CLI::App& app, AnalysisArgs& a, const std::string& default_out) {
  add_model_argument(app, a.path, a.tokenizer);
  app.add_option("--out", a.out, output_folder_help("output folder", default_out))
      ->type_name(kOutputDir);
  app.add_option("--text", a.text,
                 "chars and subword models: evaluate on the last 10% of this text (model folders, llama2.c files: required)")
      ->type_name(kInputFile);
  app.add_option("--tokens", a.tokens, "tokens per row of a text model's data (default: the model's context)")
      ->check(positive_number(1e9));
  app.add_option("--batches", a.batches, "validation batches (default: the run's --eval-batches)")
      ->check(positive_number(1e15));
  app.add_option("--batch-size", a.batch_size, "rows per batch (default: the run's --batch-size)")
      ->check(positive_number(1e15));
  app.add_option("--device", a.device, "cpu | cuda | cuda:N")->capture_default_str();
  add_threads_option(app, a.threads);
}

AnalysisInputs load_analysis(const AnalysisArgs& a, const char* cmd, const std::string& default_out) {
  set_threads(a.threads);
  AnalysisInputs r;
  r.in = load(cmd, a.path, a.device, a.text, a.tokenizer);
  const std::string task = r.in.task->name();
  const bool text_task = task == "chars" || task == "text";
  HL_CHECK(a.text.empty() || text_task, cmd, ": --text applies to chars and subword models; '", a.path, "' is a ", task,
           " checkpoint");
  HL_CHECK(!r.in.from_folder || !a.text.empty(), cmd, ": a pretrained model (a model folder or file) is analysed on a text: give --text FILE");
  HL_CHECK(a.tokens == 0 || text_task, cmd, ": --tokens applies to chars and subword models; a ", task,
           " task's rows are as long as its examples");
  r.run = r.in.config;
  r.batches = a.batches > 0 ? a.batches : r.run.run.eval_batches;
  r.batch_size = a.batch_size > 0 ? a.batch_size : r.run.run.batch_size;
  r.tokens = a.tokens > 0 ? a.tokens : r.run.batch_tokens();
  HL_CHECK(r.tokens <= r.run.batch_tokens(), cmd, ": --tokens ", r.tokens, " is longer than the model's context (",
           r.run.batch_tokens(), ")");
  if (text_task) r.in.task->check_context_length(r.tokens);
  train::check_evaluation_fits(r.run, r.in.model->device().is_cuda(), r.batches, r.batch_size, cmd,
                               "lower --batches (now " + std::to_string(r.batches) + ") or --batch-size (now " +
                                   std::to_string(r.batch_size) + ")",
                               r.tokens);
  r.out = output_folder(a.path, a.out, default_out);
  r.lock = make_locked_dir(r.out, cmd);
  r.data = analysis::make_eval_set(*r.in.task, r.batches, r.batch_size, r.tokens);
  return r;
}

void add_prompt_pair_options(CLI::App& app, PromptPairArgs& a) {
  a.task_option = app.add_option(
      "--task", a.task,
      "built-in prompt pairs: induction (repeated random tokens) | ioi | greater-than (both GPT-2's BPE)");
  a.file_option =
      app.add_option(
             "--pairs", a.file,
             "prompt pairs, a JSONL file of {\"clean\", \"corrupt\", \"answer\", \"wrong\"} (instead of --task)")
          ->type_name(kInputFile);
  a.pair_only.push_back(app.add_option("--rows", a.rows, "prompt pairs generated for --task")
                            ->check(positive_number(1e6))
                            ->capture_default_str());
  a.pair_only.push_back(
      app.add_option("--span", a.span, "induction: random tokens repeated (default: min(10, half the context))")
          ->check(in_range(2, 1e6)));
  a.pair_only.push_back(app.add_option("--template", a.templ, "ioi: which of Wang et al.'s 15 templates (0-based)")
                            ->check(in_range(0, analysis::kIoiTemplates - 1))
                            ->capture_default_str());
  a.pair_only.push_back(app.add_option("--stored-rows", a.stored_rows,
                                       "prompt rows whose clean and corrupted runs stay in memory between passes; the "
                                       "others are run again in each (0: as many as 2 GiB hold, or a quarter of the "
                                       "available memory where that is less)")
                            ->check(non_negative_number(1e9))
                            ->capture_default_str());
}

void PromptPairArgs::refuse_without_pairs(const char* cmd) const {
  for (const CLI::Option* o : pair_only)
    HL_CHECK(o->count() == 0, cmd, ": ", o->get_name(),
             " is an option of prompt pairs; give --task or --pairs with it");
}

MadePairs make_prompt_pairs(const PromptPairArgs& a, const Loaded& in, uint64_t seed, const char* cmd) {
  MadePairs m;
  m.pairs = analysis::make_prompt_pairs({a.task, a.file, a.rows, a.span, a.templ, seed}, *in.task,
                                        in.decoder(cmd).shape(), cmd, &m.source);
  return m;
}

std::string fmt_bytes(int64_t b) { return format_bytes(static_cast<double>(b)); }

std::string pad(const std::string& s, size_t w, bool left) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

void check_output_file(const std::string& path, const std::string& who) {
  std::error_code ec;
  const fs::path p(path);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  HL_CHECK(fs::is_directory(parent, ec), who, " '", path, "': its folder '", parent.string(), "' does not exist");
  const fs::file_status st = fs::status(p, ec);
  HL_CHECK(!fs::exists(st) || fs::is_regular_file(st), who, " '", path, "' ",
           fs::is_directory(st) ? "is a folder, not a file" : "is not a regular file");
}

io::FolderLock make_locked_dir(const std::string& dir, const char* cmd) { return io::open_output_folder(dir, cmd); }

std::string read_input_file(const std::string& path, const char* who) {
  return read_whole_file(path, WholeFile::text, who);
}

void write_text(const std::string& path, const std::string& text, const char* cmd) {
  io::write_file_atomic(path, text, cmd);
}

std::string join_path(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

int threads_in_use() { return omp_get_max_threads(); }

void say(const std::string& text) { std::cout << text << std::flush; }

std::string wrote_line(const std::string& out, const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return out + "/{" + list + "}";
}

std::string output_folder(const std::string& model_path, const std::string& out, const std::string& name) {
  if (!out.empty()) return out;
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) return join_path(model_path, name);
  const std::string parent = std::filesystem::path(model_path).parent_path().string();
  return join_path(parent.empty() ? "." : parent, name);
}

std::string output_folder_help(const std::string& what, const std::string& name) {
  return what + " (default: " + name + "/ beside the model file, or inside a model folder)";
}

}  // namespace headlab::cli
