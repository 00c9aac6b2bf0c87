// The `headlab` command's subcommands. Each add_* registers its options on the parent app and
// returns the action to run once parsing succeeded (so usage errors and run errors stay apart).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace headlab::cli {

using Action = std::function<int()>;

Action add_train(CLI::App& app);
Action add_eval(CLI::App& app);
Action add_generate(CLI::App& app);
Action add_inspect(CLI::App& app);
Action add_compare(CLI::App& app);
Action add_ablate(CLI::App& app);
Action add_attention(CLI::App& app);
Action add_heads(CLI::App& app);
Action add_circuit(CLI::App& app);
Action add_tokenize(CLI::App& app);
Action add_export(CLI::App& app);
Action add_convert(CLI::App& app);
Action add_sae(CLI::App& app);

}  // namespace headlab::cli
