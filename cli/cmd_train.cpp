// headlab train: every option of train::TrainOptions, with the defaults of nn::ModelOptions and
// train::RunConfig::defaults().
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>

#include "analysis/heads_over_time.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "train/trainer.h"

namespace headlab::cli {

namespace {

// train --init: the run's model and task from a checkpoint, a model folder or a llama2.c checkpoint (with its
// tokenizer), its parameters the start.
void start_from(const std::string& path, train::TrainOptions& o, const std::string& text,
                const std::string& tokenizer) {
  HL_CHECK(!o.resume, "train: --init starts a new run and --resume continues one; give one of them");
  const auto told = [&](const char* name) { return std::find(o.told.begin(), o.told.end(), name) != o.told.end(); };
  for (const char* fixed : {"--arch", "--attention", "--emb-dim", "--n-heads", "--n-kv-heads", "--n-layers",
                            "--context-length", "--qkv-bias", "--attn-only", "--ffn-hiddens"})
    HL_CHECK(!told(fixed), "train: ", fixed, " is fixed by --init '", path, "' (its model's)");
  Loaded l = load("train: --init", path, "cpu", text, tokenizer);
  train::RunConfig& c = o.config;
  const nn::ModelFamily& family = l.config.family().model;
  o.init_model = told("--drop-rate") ? family.with_dropout(l.config.model, o.model.drop_rate) : l.config.model;
  if (l.subword()) {
    HL_CHECK(!text.empty(), "train: a pretrained model trains on a text: give --text FILE with --init '", path, "'");
    HL_CHECK(!told("--task") || c.task.name == "text", "train: --init '", path,
             "' is a pretrained model: it trains on --text FILE (task text, its own tokenizer), not task ",
             c.task.name);
  } else {
    HL_CHECK(!told("--task") || c.task.name == l.config.task.name, "train: --init '", path, "' was trained on task ",
             l.config.task.name, ", not ", c.task.name);
  }
  const tasks::TaskOptions given = c.task.options;
  c.task = l.config.task;  // its tokenizer (resolve() gives it the run's seed)
  if (!text.empty()) c.task.options.text_path = text;
  if (told("--repeat-prob")) c.task.options.repeat_prob = given.repeat_prob;
  if (told("--repeat-span")) c.task.options.repeat_span = given.repeat_span;
  o.init = std::move(l.ckpt.model);
}

// What is chosen by name and resolved after parsing (an optimizer's defaults depend on its kind).
struct Choices {
  std::string attention = "fused", parallel = "auto", optimizer = "adamw", schedule = "cosine", text, init, tokenizer;
  double weight_decay = -1;  // < 0: the optimizer's PyTorch default
  int threads = 0;
  int64_t track_heads = 0;
  bool deterministic = false;
};

// The model's family and its task.
void add_task_options(CLI::App& app, train::TrainOptions& o, Choices& ch) {
  train::RunConfig& c = o.config;
  tasks::TaskOptions& t = c.task.options;
  nn::ModelOptions& m = o.model;
  app.add_option("--arch", m.arch, io::families_help())
      ->check(CLI::IsMember(io::family_names()))
      ->capture_default_str();
  app.add_option("--task", c.task.name, "reverse | copy | sort | add | chars (gpt) | numbers (encoder-decoder)")
      ->check(CLI::IsMember({"reverse", "copy", "sort", "add", "chars", "numbers"}))
      ->capture_default_str();
  app.add_option("--max-number", t.max_number, "numbers: the largest number spelled out")
      ->check(non_negative_number(999999))
      ->capture_default_str();
  app.add_option("--text", ch.text, "chars: the text to model (default: data/tiny.txt)")->type_name(kInputFile);
  app.add_option("--repeat-prob", t.repeat_prob,
                 "chars/text: data with more repetition: each segment of the text written twice with this "
                 "probability (induction heads form on text that repeats within a context)")
      ->check(in_range(0, 1))
      ->capture_default_str();
  app.add_option("--repeat-span", t.repeat_span,
                 "chars/text with --repeat-prob: segments of --repeat-span/6 .. --repeat-span tokens (keep it "
                 "under the context length, so that both copies fit in one)")
      ->check(in_range(2, 1e6))
      ->capture_default_str();
  app.add_option("--min-len", t.min_len, "copy/reverse/sort: shortest digit string")
      ->check(positive_number(1e4))
      ->capture_default_str();
  app.add_option("--max-len", t.max_len, "copy/reverse/sort: longest digit string")
      ->check(positive_number(1e4))
      ->capture_default_str();
  app.add_option("--digits", t.n_digits, "add: digits per operand")->check(in_range(1, 18))->capture_default_str();
}

// The model's sizes (nn::ModelOptions), whatever its family.
void add_model_options(CLI::App& app, nn::ModelOptions& m, Choices& ch) {
  app.add_option("--attention", ch.attention, nn::attention_forms_help())
      ->check(CLI::IsMember(enum_names<nn::AttentionForm>()))
      ->capture_default_str();
  app.add_option("--emb-dim", m.emb_dim, "embedding size (encoder-decoder: num_hiddens)")
      ->check(positive_number(1e9))
      ->capture_default_str();
  app.add_option("--ffn-hiddens", m.ffn_hiddens,
                 "encoder-decoder: ffn_num_hiddens (0: 2 x --emb-dim); llama: the SwiGLU's width (0: 8/3 x --emb-dim, "
                 "rounded up to a multiple of 8)")
      ->check(non_negative_number(1e9));
  app.add_option("--n-heads", m.n_heads, "attention heads per layer")
      ->check(positive_number(1e6))
      ->capture_default_str();
  app.add_option("--n-kv-heads", m.n_kv_heads,
                 "llama: key/value heads, dividing --n-heads (grouped-query attention; 1: multi-query; 0: --n-heads)")
      ->check(non_negative_number(1e6));
  app.add_option("--n-layers", m.n_layers, "transformer blocks")->check(positive_number(1e6))->capture_default_str();
  app.add_option("--context-length", m.context_length, "tokens per sequence (0: what the task needs; chars: 64)")
      ->check(non_negative_number(1e9))
      ->capture_default_str();
  app.add_option("--drop-rate", m.drop_rate, "dropout probability")->check(in_range(0, 0.99))->capture_default_str();
  app.add_flag("--qkv-bias", m.qkv_bias, "bias in the query/key/value projections");
  app.add_flag("--attn-only", m.attn_only,
               "gpt: attention-only blocks (no MLP, no norm2), as the attn-only models of Elhage et al. 2021");
}

// The run: optimizer, schedule, cadences, files, threads.
void add_run_options(CLI::App& app, train::TrainOptions& o, Choices& ch) {
  train::RunConfig& c = o.config;
  app.add_option("--steps", c.run.steps, "total optimizer steps (with --resume: continue up to this many)")
      ->check(positive_number(1e12))
      ->capture_default_str();
  app.add_option("--batch-size", c.run.batch_size, "sequences per step")
      ->check(positive_number(1e15))
      ->capture_default_str();
  app.add_option("--lr", c.optimizer.lr, "peak learning rate")->check(positive_number(1e3))->capture_default_str();
  app.add_option("--min-lr", c.schedule.min_lr, "final learning rate of the cosine schedule")
      ->check(non_negative_number(1e3))
      ->capture_default_str();
  app.add_option("--warmup", c.schedule.warmup, "linear warmup steps")
      ->check(non_negative_number(1e12))
      ->capture_default_str();
  app.add_option("--schedule", ch.schedule, "constant | cosine | step")
      ->check(CLI::IsMember(enum_names<optim::ScheduleKind>()))
      ->capture_default_str();
  app.add_option("--optimizer", ch.optimizer, "adamw | adam | sgd")
      ->check(CLI::IsMember(enum_names<optim::OptimizerKind>()))
      ->capture_default_str();
  app.add_option("--weight-decay", ch.weight_decay, "weight decay (default: the optimizer's PyTorch default)")
      ->check(non_negative_number(1e3));
  app.add_option("--grad-clip", c.run.grad_clip, "clip gradients to this global norm (0: off)")
      ->check(non_negative_number(1e12))
      ->capture_default_str();
  app.add_flag("--skip-nonfinite", c.run.skip_nonfinite,
               "skip a step whose loss or gradient norm is NaN or inf (no optimizer step) instead of stopping");
  app.add_option("--max-skipped-steps", c.run.max_skipped_steps,
                 "with --skip-nonfinite: stop after this many skipped steps in a row")
      ->check(positive_number(1e12))
      ->capture_default_str();
  add_seed_option(app, c.run.seed, "seed for initialisation, dropout and data");
  app.add_option("--device", c.run.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_flag("--deterministic", ch.deterministic,
               "the same bits on every run on a GPU too: attention's backward without atomics (slower; the CPU's "
               "kernels are deterministic either way)");
  app.add_option("--out", o.out, "output folder for checkpoints and metrics.csv")
      ->type_name(kOutputDir)
      ->capture_default_str();
  app.add_option("--init", ch.init,
                 "start from this model instead of random weights: a checkpoint (.h5), a Hugging Face folder or a "
                 "llama2.c checkpoint, which fixes the architecture and tokenizer; a pretrained model trains on --text "
                 "(task text, its tokenizer), a checkpoint of a task on its own task")
      ->type_name(kInputFile);
  app.add_option("--tokenizer", ch.tokenizer,
                 "--init's tokenizer: a SentencePiece model, llama2.c's tokenizer.bin or a tokenizer.json (required "
                 "for a llama2.c checkpoint; overrides a folder's)")
      ->type_name(kInputFile);
  app.add_option("--track-heads", ch.track_heads,
                 "decoders: every N steps (and before the first, after the last) score every head (previous-token, "
                 "induction, duplicate-token) and the in-context-learning score (a task: its answers' loss and "
                 "accuracy): <out>/heads_over_time.csv and .png; the phase change in heads_over_time.md")
      ->check(non_negative_number(1e12));
  app.add_flag("--resume", o.resume,
               "continue from <out>/checkpoint.h5 up to --steps; options given that fix the model, task or data must "
               "match it; the learning rate and schedule, --grad-clip and the eval/save cadences may change");
  app.add_flag("--overwrite", o.overwrite,
               "a new run into an --out holding another run: remove that run's checkpoints, metrics.csv and "
               "heads_over_time files first (without it, train refuses)");
  app.add_option("--eval-every", c.run.eval_every, "evaluate every N steps")
      ->check(positive_number(1e12))
      ->capture_default_str();
  app.add_option("--eval-batches", c.run.eval_batches, "validation batches per evaluation")
      ->check(positive_number(1e15))
      ->capture_default_str();
  app.add_option("--save-every", c.run.save_every, "checkpoint every N steps")
      ->check(positive_number(1e12))
      ->capture_default_str();
  app.add_option("--keep-last", c.run.keep_last, "numbered checkpoints to keep")
      ->check(non_negative_number(1e6))
      ->capture_default_str();
  app.add_option("--log-every", o.log_every, "log line every N steps (when not on a terminal)")
      ->check(positive_number(1e12))
      ->capture_default_str();
  add_threads_option(app, ch.threads, "CPU threads (0: all cores, shared out among the MPI ranks on this machine)");
  app.add_option("--parallel", ch.parallel,
                 "how a CPU step uses the threads: 'data' (each thread its rows of the batch, gradients summed), "
                 "'ops' (every op split over them), 'auto' (data when the batch splits into shares of a "
                 "multiple of 4 rows and the model's extra copies take at most 1 GiB)")
      ->capture_default_str();
}

// The run the options describe, after parsing.
int run_training(train::TrainOptions& o, const Choices& ch) {
  o.comm = train::world();  // under mpirun: data parallel over its ranks
  set_threads(ch.threads, o.comm->local_size());
  set_deterministic_attention(ch.deterministic);
  train::RunConfig& c = o.config;
  o.model.attention = parse_enum<nn::AttentionForm>(ch.attention, "train: --attention");
  o.thread_use = parse_enum<train::ThreadUse>(ch.parallel, "train: --parallel");
  const double lr = c.optimizer.lr;
  c.optimizer = optim::OptimizerOptions::defaults(parse_enum<optim::OptimizerKind>(ch.optimizer, "train: --optimizer"));
  c.optimizer.lr = lr;
  if (ch.weight_decay >= 0) c.optimizer.weight_decay = ch.weight_decay;
  c.schedule.kind = parse_enum<optim::ScheduleKind>(ch.schedule, "train: --schedule");
  if (!ch.text.empty()) c.task.options.text_path = ch.text;
  HL_CHECK(ch.tokenizer.empty() || !ch.init.empty(), "train: --tokenizer is --init's model's tokenizer; give --init");
  if (!ch.init.empty()) start_from(ch.init, o, ch.text, ch.tokenizer);
  const auto tracker = std::make_shared<analysis::HeadsOverTime>();
  if (ch.track_heads > 0) o.observer = analysis::track_heads(tracker, o.out, ch.track_heads);
  train::install_sigint_handler();
  try {
    const train::TrainResult r = train::Trainer(o).run();
    std::cout << analysis::finish_tracking(*tracker, o.out) << std::flush;
    return r.interrupted ? 130 : 0;
  } catch (const train::ResumeMismatch& e) {  // a usage error: every rank finds the same
    if (o.comm->rank() == 0) std::cerr << "headlab: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    if (o.comm->size() == 1) throw;
    // An error on one rank ends every rank: the others would wait for it in the next allreduce.
    std::cerr << "headlab: rank " << o.comm->rank() << " of " << o.comm->size() << ": " << e.what() << std::endl;
    o.comm->abort(1);
    throw;  // (not reached: abort ends the process)
  }
}

}  // namespace

// The options bind straight to the run's options (train/trainer.h); --optimizer, --weight-decay and
// --lr are combined after parsing, since an optimizer's defaults depend on its kind.
Action add_train(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  auto ch = std::make_shared<Choices>();
  add_task_options(app, *o, *ch);
  add_model_options(app, o->model, *ch);
  add_run_options(app, *o, *ch);
  app.footer(tasks::tasks_help());
  CLI::App* self = &app;
  return [o, ch, self] {
    for (const CLI::Option* opt : self->get_options())  // what the user gave, for --resume to compare
      if (opt->count() > 0) o->told.push_back(opt->get_name());
    HL_CHECK(!(o->resume && o->overwrite),
             "train: --resume continues the run in --out and --overwrite replaces it; "
             "give one of them");
    return run_training(*o, *ch);
  };
}

}  // namespace headlab::cli
