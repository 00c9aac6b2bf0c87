// headlab train: every option of train::TrainOptions, with defaults that learn `reverse` to high
// exact-match accuracy in about two minutes on two cores.
#include <omp.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "train/trainer.h"

namespace headlab::cli {

void set_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

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
  app.add_option("--emb-dim", o->emb_dim, "embedding size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--n-heads", o->n_heads, "attention heads per layer")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--n-layers", o->n_layers, "transformer blocks")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--context-length", o->context_length, "tokens per sequence (0: what the task needs; chars: 64)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--drop-rate", o->drop_rate, "dropout probability")->check(CLI::Range(0.0, 0.99))->capture_default_str();
  app.add_flag("--qkv-bias", o->qkv_bias, "bias in the query/key/value projections");
  app.add_option("--steps", o->steps, "total optimizer steps (with --resume: continue up to this many)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", o->batch_size, "sequences per step")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o->lr, "peak learning rate")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--min-lr", o->min_lr, "final learning rate of the cosine schedule")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup", o->warmup, "linear warmup steps")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--schedule", o->schedule, "constant | cosine | step")
      ->check(CLI::IsMember({"constant", "cosine", "step"}))
      ->capture_default_str();
  app.add_option("--optimizer", o->optimizer, "adamw | adam | sgd")
      ->check(CLI::IsMember({"adamw", "adam", "sgd"}))
      ->capture_default_str();
  app.add_option("--weight-decay", o->weight_decay, "weight decay (default: the optimizer's PyTorch default)");
  app.add_option("--grad-clip", o->grad_clip, "clip gradients to this global norm (0: off)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--seed", o->seed, "seed for initialisation, dropout and data")->capture_default_str();
  app.add_option("--device", o->device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--out", o->out, "output folder for checkpoints and metrics.csv")->capture_default_str();
  app.add_flag("--resume", o->resume, "continue from <out>/checkpoint.h5 up to --steps");
  app.add_option("--eval-every", o->eval_every, "evaluate every N steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--eval-batches", o->eval_batches, "validation batches per evaluation")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--save-every", o->save_every, "checkpoint every N steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--keep-last", o->keep_last, "numbered checkpoints to keep")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--log-every", o->log_every, "log line every N steps (when not on a terminal)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", *threads, "CPU threads (0: all cores)")->check(CLI::NonNegativeNumber);
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
