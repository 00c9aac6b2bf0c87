// headlab: train, evaluate, generate with, inspect and analyse the heads of GPTs and encoder-decoders.
// Library errors become one line on stderr and exit code 1; usage errors exit with code 2.
#include <algorithm>
#include <csignal>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "base/error.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "train/collectives.h"

namespace {

// What a command will run with: every option's value, defaults included, and the positional arguments,
// one "name=value" a line (what the ranks of an MPI job compare).
std::string effective_config(const CLI::App& command) {
  std::string text = command.get_name() + "\n" + command.config_to_str(true, false);
  for (const CLI::Option* o : command.get_options())
    if (o->get_positional()) {
      text += o->get_name() + "=";
      for (const std::string& r : o->results()) text += r + " ";
      text += "\n";
    }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // Under a file size limit (ulimit -f) a write past it fails with EFBIG, which the writers report,
  // instead of SIGXFSZ ending the process half-way through a save.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{
      "headlab: a small, fast C++ deep-learning toolkit for studying attention heads.\n"
      "Train a GPT or d2l's encoder-decoder Transformer on toy tasks or text, compare the wrapper and\n"
      "fused forms of multi-head attention, and find which heads matter and what they do."};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       std::string("headlab 0.1.0 (CUDA backend: ") + (headlab::cuda_built() ? "built" : "not built") +
                           ", MPI data parallel: " + (headlab::train::built_with_mpi() ? "built" : "not built") +
                           ", CPU GEMMs: " + headlab::cpu_gemm_kernels() + ")");
  std::map<CLI::App*, headlab::cli::Action> actions;
  // Each command's --help ends with examples a user can run from the repository after ./scripts/demo.sh.
  auto add = [&](const char* name, const char* help, headlab::cli::Action (*fn)(CLI::App&), const char* examples) {
    CLI::App* sub = app.add_subcommand(name, help);
    actions[sub] = fn(*sub);
    sub->footer(std::string("\nExamples (S=../shared/models/stories260K):\n").append(examples));
  };
  add("train", "train a GPT or an encoder-decoder (--arch) on a task: reverse, copy, sort, add, chars, numbers",
      headlab::cli::add_train,
      "  headlab train --task reverse --out runs/r\n"
      "  headlab train --task sort --n-layers 1 --n-heads 2 --steps 500 --track-heads 50 --out runs/sort\n"
      "  headlab train --arch encoder-decoder --task numbers --steps 1000 --out runs/numbers\n");
  add("eval", "loss and accuracy of a checkpoint on validation data", headlab::cli::add_eval,
      "  headlab eval runs/demo/checkpoint.h5\n"
      "  headlab eval $S/stories260K.bin --tokenizer $S/tok512.model --text README.md\n");
  add("generate", "continue a prompt (or answer a task input) with a checkpoint", headlab::cli::add_generate,
      "  headlab generate runs/demo/checkpoint.h5 --prompt 31415\n"
      "  headlab generate $S/stories260K.bin --tokenizer $S/tok512.model --prompt \"Once upon a time\"\n");
  add("inspect", "show a checkpoint's config, parameters and training state", headlab::cli::add_inspect,
      "  headlab inspect runs/demo/checkpoint.h5\n"
      "  headlab inspect $S/stories260K.bin\n");
  add("compare", "time and compare the wrapper and fused attention (multi-head, grouped-query, multi-query)",
      headlab::cli::add_compare,
      "  headlab compare --out runs/compare\n"
      "  headlab compare --no-sweep --no-peer-grid --config gqa,8,256,512,512,8,2 --out runs/gqa\n");
  add("ablate", "which heads matter: ablation, importance, pruning (GPT and encoder-decoder)",
      headlab::cli::add_ablate,
      "  headlab ablate runs/demo/checkpoint.h5 --prune 2 --finetune 100\n"
      "  headlab ablate $S/stories260K.bin --tokenizer $S/tok512.model --text README.md --out runs/s-ablate\n");
  add("attention", "dump and draw every head's attention weights for one input", headlab::cli::add_attention,
      "  headlab attention runs/demo/checkpoint.h5 --prompt 31415\n"
      "  headlab attention $S/stories260K.bin --tokenizer $S/tok512.model --prompt \"Tim and Lily\" --out runs/att\n");
  add("heads", "what each attention head does: ablation, logit attribution, patching, head types",
      headlab::cli::add_heads,
      "  headlab heads runs/demo/checkpoint.h5\n"
      "  headlab heads $S/stories260K.bin --tokenizer $S/tok512.model --task induction --out runs/s-heads\n"
      "  headlab heads runs/watch   (a folder of one run's checkpoints: every head over training)\n");
  add("circuit", "which heads pass what to whom on prompt pairs: edge attribution, path patching, circuit discovery",
      headlab::cli::add_circuit,
      "  headlab circuit $S/stories260K.bin --tokenizer $S/tok512.model --task induction --out runs/s-circuit\n"
      "  headlab circuit gpt2/ --task ioi --rows 32\n");
  add("tokenize", "a model's subword tokenizer (a folder's, a checkpoint's or --tokenizer): text -> ids",
      headlab::cli::add_tokenize,
      "  headlab tokenize $S/stories260K.bin --tokenizer $S/tok512.model --prompt \"Once upon a time\"\n");
  add("export", "write a decoder checkpoint as a Hugging Face folder of its family (config.json, model.safetensors)",
      headlab::cli::add_export, "  headlab export runs/demo/checkpoint.h5 --out runs/demo/hf\n");
  add("convert",
      "write a Hugging Face folder or a llama2.c checkpoint as a headlab checkpoint (.h5, its tokenizer inside)",
      headlab::cli::add_convert,
      "  headlab convert $S/stories260K.bin --tokenizer $S/tok512.model --out runs/stories260K.h5\n");
  add("sae", "sparse autoencoders on a model's hook points: train them (SAELens's folders), evaluate them (its evals)",
      headlab::cli::add_sae,
      "  headlab sae train $S/stories260K.bin --tokenizer $S/tok512.model --text README.md \\\n"
      "      --hook blocks.2.hook_resid_post --arch topk --k 16 --expansion 8 --training-tokens 200000 \\\n"
      "      --batch-size 1024 --lr 1e-3 --out runs/sae\n"
      "  headlab sae eval $S/stories260K.bin --tokenizer $S/tok512.model --text README.md \\\n"
      "      runs/sae/blocks.2.hook_resid_post\n");
  try {
    headlab::cli::finish_options(app);
  } catch (const headlab::Error& e) {
    std::cerr << "headlab: internal error: " << e.what() << std::endl;
    return 1;
  }
  // Every command's options with their kinds and ranges, for the CLI property test (not in --help).
  if (argc == 2 && std::string(argv[1]) == "--options-table") {
    std::cout << headlab::cli::options_table(app);
    return 0;
  }
  // Shell completion of every command and option (README: "Shell completion").
  if (argc >= 2 && std::string(argv[1]) == "--completion") {
    if (argc == 3 && std::string(argv[2]) == "bash") {
      std::cout << headlab::cli::bash_completion(app);
      return 0;
    }
    std::cerr << "headlab --completion: give the shell: headlab --completion bash (zsh: with bashcompinit)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A mistyped command name is left over as an extra argument while CLI11 reports only that a
    // subcommand is required; name it instead.
    const bool no_command =
        std::none_of(actions.begin(), actions.end(), [](const auto& a) { return a.first->parsed(); });
    const std::vector<std::string> rest = app.remaining();
    if (no_command && !rest.empty() && !rest.front().empty() && rest.front()[0] != '-') {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      std::cerr << "unknown command '" << rest.front() << "' (commands: " << names
                << ")\nRun with --help for more information.\n";
      return 2;
    }
    app.exit(e);  // prints the message and the hint to use --help
    return 2;
  }
  // The CPU threading policy may re-execute the program; parsing first (it has no side effects)
  // spares --help, --version and usage errors that second start.
  headlab::prepare_process(argv);
  const auto chosen = std::find_if(actions.begin(), actions.end(), [](const auto& a) { return a.first->parsed(); });
  if (chosen == actions.end()) return 0;
  CLI::App& command = *chosen->first;
  // Under mpirun every rank must run the same command, and a rank that fails ends them all: the others
  // may be waiting for it in a collective.
  std::shared_ptr<headlab::train::Collectives> ranks;
  if (headlab::train::built_with_mpi() && headlab::train::launched_by_mpi()) {
    try {
      ranks = headlab::train::world();
      headlab::train::agree_across_ranks(*ranks, effective_config(command), command.get_name());
    } catch (const headlab::train::RanksDisagree& e) {
      if (ranks->rank() == 0) std::cerr << "headlab: " << e.what() << std::endl;
      return 2;
    } catch (const headlab::Error& e) {
      std::cerr << "headlab: " << e.what() << std::endl;
      return 1;
    }
  }
  const auto fail = [&](const std::string& message) {
    const bool parallel = ranks && ranks->size() > 1;
    // One write: under mpirun the launcher's own abort message may otherwise land inside this one.
    const std::string line =
        "headlab: " +
        (parallel ? "rank " + std::to_string(ranks->rank()) + " of " + std::to_string(ranks->size()) + ": " : "") +
        message + (parallel ? "\nheadlab: stopping every rank\n" : "\n");
    std::cerr << line << std::flush;
    if (parallel) ranks->abort(1);
    return 1;
  };
  try {
    return chosen->second();
  } catch (const headlab::Error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(std::string("internal error: ") + e.what());
  }
}
