// headlab train: every option of train::TrainOptions, with defaults that learn `reverse` to high
// exact-match accuracy in about two minutes on two cores.
#include <omp.h>

#include <cmath>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "train/trainer.h"

namespace headlab::cli {

void set_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

// CLI11 2.1's PositiveNumber / NonNegativeNumber are ranges up to DBL_MAX, and their error message
// spells DBL_MAX out in 309 digits ("--steps: Value abc not in range 0.000000 to 1797693..."). These
// say what was expected in a few words instead.
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

Action add_train(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  auto threads = std::make_shared<int>(0);
  app.add_option("--task", o->task, "reverse | copy | sort | add | chars")
      ->check(CLI::IsMember({"reverse", "copy", "sort", "add", "chars"}))
      ->capture_default_str();
  app.add_option("--text", o->text, "chars: the text to model (default: data/tiny.txt)");
  app.add_option("--min-len", o->min_len, "copy/reverse/sort: shortest digit string")->capture_default_str();
  app.add_option("--max-len", o->max_len, "copy/reverse/sort: longest digit string")->capture_default_str();
  app.add_option("--digits", o->n_digits, "add: digits per operand")->capture_default_str();
  app.add_option("--attention", o->attention, "fused (one W_query/W_key/W_value) | wrapper (one module per head)")
      ->check(CLI::IsMember({"fused", "wrapper"}))
      ->capture_default_str();
  app.add_option("--emb-dim", o->emb_dim, "embedding size")->check(positive_number())->capture_default_str();
  app.add_option("--n-heads", o->n_heads, "attention heads per layer")->check(positive_number())->capture_default_str();
  app.add_option("--n-layers", o->n_layers, "transformer blocks")->check(positive_number())->capture_default_str();
  app.add_option("--context-length", o->context_length, "tokens per sequence (0: what the task needs; chars: 64)")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--drop-rate", o->drop_rate, "dropout probability")->check(CLI::Range(0.0, 0.99))->capture_default_str();
  app.add_flag("--qkv-bias", o->qkv_bias, "bias in the query/key/value projections");
  app.add_option("--steps", o->steps, "total optimizer steps (with --resume: continue up to this many)")
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--batch-size", o->batch_size, "sequences per step")->check(positive_number())->capture_default_str();
  app.add_option("--lr", o->lr, "peak learning rate")->check(positive_number())->capture_default_str();
  app.add_option("--min-lr", o->min_lr, "final learning rate of the cosine schedule")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--warmup", o->warmup, "linear warmup steps")->check(non_negative_number())->capture_default_str();
  app.add_option("--schedule", o->schedule, "constant | cosine | step")
      ->check(CLI::IsMember({"constant", "cosine", "step"}))
      ->capture_default_str();
  app.add_option("--optimizer", o->optimizer, "adamw | adam | sgd")
      ->check(CLI::IsMember({"adamw", "adam", "sgd"}))
      ->capture_default_str();
  app.add_option("--weight-decay", o->weight_decay, "weight decay (default: the optimizer's PyTorch default)");
  app.add_option("--grad-clip", o->grad_clip, "clip gradients to this global norm (0: off)")
      ->check(non_negative_number())
      ->capture_default_str();
  app.add_option("--seed", o->seed, "seed for initialisation, dropout and data")->capture_default_str();
  app.add_option("--device", o->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--out", o->out, "output folder for checkpoints and metrics.csv")->capture_default_str();
  app.add_flag("--resume", o->resume, "continue from <out>/checkpoint.h5 up to --steps");
  app.add_option("--eval-every", o->eval_every, "evaluate every N steps")->check(positive_number())->capture_default_str();
  app.add_option("--eval-batches", o->eval_batches, "validation batches per evaluation")
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--save-every", o->save_every, "checkpoint every N steps")->check(positive_number())->capture_default_str();
  app.add_option("--keep-last", o->keep_last, "numbered checkpoints to keep")->check(non_negative_number())->capture_default_str();
  app.add_option("--log-every", o->log_every, "log line every N steps (when not on a terminal)")
      ->check(positive_number())
      ->capture_default_str();
  app.add_option("--threads", *threads, "CPU threads (0: all cores)")->check(non_negative_number());
  app.footer(tasks_help());
  return [o, threads] {
    set_threads(*threads);
    train::install_sigint_handler();
    train::Trainer trainer(*o);
    const train::TrainResult r = trainer.run();
    return r.interrupted ? 130 : 0;
  };
}

}  // namespace headlab::cli
