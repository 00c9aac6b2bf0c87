// headlab circuit: which heads pass what to whom on a prompt-pair task: option parsing, then
// analysis::run_circuit (analysis/circuit_report.h: edge attribution checked against patching, path
// patching, activation patching, discovery) and its files.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "analysis/circuit_report.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "train/collectives.h"

namespace headlab::cli {

namespace {

struct CircuitArgs {
  std::string path, tokenizer, out;
  PromptPairArgs pairs;
  analysis::CircuitRunOptions run;
  int threads = 0;
};

}  // namespace

Action add_circuit(CLI::App& app) {
  auto a = std::make_shared<CircuitArgs>();
  add_model_argument(app, a->path, a->tokenizer);
  add_prompt_pair_options(app, a->pairs);
  app.add_option("--out", a->out, output_folder_help("output folder", "circuit"))->type_name(kOutputDir);
  app.add_option("--tau", a->run.tau, "discovery: an edge goes when the normalised metric falls by less than this")
      ->check(in_range(0, 10))
      ->capture_default_str();
  app.add_option("--ig-steps", a->run.ig_steps,
                 "edge attribution with integrated gradients over this many steps (EAP-IG; 0: EAP)")
      ->check(in_range(0, 1000))
      ->capture_default_str();
  app.add_flag("--by-position", a->run.by_position,
               "noising and denoising also at each position alone (activation_patching_by_position.csv; copies "
               "per node and position)");
  app.add_flag("--plain-acdc", a->run.plain_acdc,
               "discovery one edge a forward in ACDC's order (for comparison; slow)");
  app.add_option("--senders", a->run.senders,
                 "path patching: sender nodes (embed, L<l>H<h>, MLP<l>; default: every head)")
      ->delimiter(',');
  app.add_option("--receivers", a->run.receivers,
                 "path patching: receivers (logits, L<l>H<h> = its q, k and v, L<l>H<h>.q/.k/.v, MLP<l>)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--chunk-rows", a->run.engine.chunk_rows,
                 "prompt rows a forward (0: as a memory budget allows: the model's size, 256 MB to 1 GiB)")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--check-edges", a->run.check_edges, "edges whose attribution is checked against real patching")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  add_seed_option(app, a->run.seed, "the generated prompt pairs and the edges checked");
  add_threads_option(app, a->threads);
  return [a] {
    // Under mpirun the ranks share the prompt rows (CircuitOptions::collectives); rank 0 prints and writes.
    const std::shared_ptr<train::Collectives> comm = train::world();
    set_threads(a->threads, comm->local_size());
    const bool writer = comm->rank() == 0;
    const Loaded in = load("circuit", a->path, "cpu", "", a->tokenizer);
    nn::DecoderModel& model = in.decoder("circuit");
    const MadePairs made = make_prompt_pairs(a->pairs, in, a->run.seed, "circuit");
    const std::string out = output_folder(a->path, a->out, "circuit");
    std::optional<io::FolderLock> lock;
    if (writer) lock.emplace(make_locked_dir(out, "circuit"));
    analysis::CircuitRunOptions o = a->run;
    o.engine.collectives = comm, o.engine.stored_rows = a->pairs.stored_rows;
    o.checkpoint = a->path, o.source = made.source;
    const analysis::CircuitReport r = analysis::run_circuit(model, made.pairs, o, writer ? say : analysis::Say());
    if (!writer) return 0;
    std::cout << "\nwrote " << wrote_line(out, analysis::write_circuit_files(out, made.pairs, o, r)) << "\n";
    return 0;
  };
}

}  // namespace headlab::cli
