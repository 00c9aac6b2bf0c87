// --resume's table of options: how each is read from a config, and whether it may change.
#include "train/resume.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <sstream>

namespace headlab::train {

namespace {

namespace fs = std::filesystem;

// What --resume compares: a command-line option and its value in a config and the model options it
// answers to (the command line's, or its family's reading of the checkpoint's model section).
struct ResumeSetting {
  const char* option;
  std::string (*value)(const RunConfig& c, const nn::ModelOptions& m);
  void (*apply)(RunConfig& to, const RunConfig& from);  // null: fixed by the checkpoint
};

template <typename T>
std::string str(T v) {
  std::ostringstream os;
  os << std::setprecision(8) << v;
  return os.str();
}

std::string text_file(const RunConfig& c, const nn::ModelOptions&) {
  return fs::absolute(c.task.options.text_path).lexically_normal().string();
}

const std::vector<ResumeSetting>& resume_settings() {
  using M = nn::ModelOptions;
  static const std::vector<ResumeSetting> settings = {
      // the model
      {"--arch", [](const RunConfig&, const M& m) { return m.arch; }, nullptr},
      {"--attention", [](const RunConfig&, const M& m) { return std::string(enum_name(m.attention)); }, nullptr},
      {"--emb-dim", [](const RunConfig&, const M& m) { return str(m.emb_dim); }, nullptr},
      {"--ffn-hiddens", [](const RunConfig&, const M& m) { return str(m.ffn_hiddens); }, nullptr},
      {"--n-heads", [](const RunConfig&, const M& m) { return str(m.n_heads); }, nullptr},
      {"--n-kv-heads", [](const RunConfig&, const M& m) { return str(m.n_kv_heads); }, nullptr},
      {"--n-layers", [](const RunConfig&, const M& m) { return str(m.n_layers); }, nullptr},
      {"--context-length", [](const RunConfig&, const M& m) { return str(m.context_length); }, nullptr},
      {"--drop-rate", [](const RunConfig&, const M& m) { return str(m.drop_rate); }, nullptr},
      {"--qkv-bias", [](const RunConfig&, const M& m) { return str(m.qkv_bias); }, nullptr},
      {"--attn-only", [](const RunConfig&, const M& m) { return str(m.attn_only); }, nullptr},
      // the task and the data
      {"--task", [](const RunConfig& c, const M&) { return c.task.name; }, nullptr},
      {"--max-number", [](const RunConfig& c, const M&) { return str(c.task.options.max_number); }, nullptr},
      {"--text", text_file, nullptr},
      {"--min-len", [](const RunConfig& c, const M&) { return str(c.task.options.min_len); }, nullptr},
      {"--max-len", [](const RunConfig& c, const M&) { return str(c.task.options.max_len); }, nullptr},
      {"--digits", [](const RunConfig& c, const M&) { return str(c.task.options.n_digits); }, nullptr},
      {"--seed", [](const RunConfig& c, const M&) { return str(c.run.seed); }, nullptr},
      {"--batch-size", [](const RunConfig& c, const M&) { return str(c.run.batch_size); }, nullptr},
      {"--optimizer", [](const RunConfig& c, const M&) { return std::string(enum_name(c.optimizer.kind)); }, nullptr},
      // what may change
      {"--lr", [](const RunConfig& c, const M&) { return str(c.optimizer.lr); },
       [](RunConfig& to, const RunConfig& from) { to.optimizer.lr = to.schedule.lr = from.optimizer.lr; }},
      {"--min-lr", [](const RunConfig& c, const M&) { return str(c.schedule.min_lr); },
       [](RunConfig& to, const RunConfig& from) { to.schedule.min_lr = from.schedule.min_lr; }},
      {"--warmup", [](const RunConfig& c, const M&) { return str(c.schedule.warmup); },
       [](RunConfig& to, const RunConfig& from) { to.schedule.warmup = from.schedule.warmup; }},
      {"--schedule", [](const RunConfig& c, const M&) { return std::string(enum_name(c.schedule.kind)); },
       [](RunConfig& to, const RunConfig& from) { to.schedule.kind = from.schedule.kind; }},
      {"--weight-decay", [](const RunConfig& c, const M&) { return str(c.optimizer.weight_decay); },
       [](RunConfig& to, const RunConfig& from) { to.optimizer.weight_decay = from.optimizer.weight_decay; }},
      {"--grad-clip", [](const RunConfig& c, const M&) { return str(c.run.grad_clip); },
       [](RunConfig& to, const RunConfig& from) { to.run.grad_clip = from.run.grad_clip; }},
      {"--eval-every", [](const RunConfig& c, const M&) { return str(c.run.eval_every); },
       [](RunConfig& to, const RunConfig& from) { to.run.eval_every = from.run.eval_every; }},
      {"--eval-batches", [](const RunConfig& c, const M&) { return str(c.run.eval_batches); },
       [](RunConfig& to, const RunConfig& from) { to.run.eval_batches = from.run.eval_batches; }},
      {"--save-every", [](const RunConfig& c, const M&) { return str(c.run.save_every); },
       [](RunConfig& to, const RunConfig& from) { to.run.save_every = from.run.save_every; }},
      {"--keep-last", [](const RunConfig& c, const M&) { return str(c.run.keep_last); },
       [](RunConfig& to, const RunConfig& from) { to.run.keep_last = from.run.keep_last; }},
      // always this process's, given or not
      {"--steps", [](const RunConfig& c, const M&) { return str(c.run.steps); },
       [](RunConfig& to, const RunConfig& from) { to.run.steps = to.schedule.total = from.run.steps; }},
      {"--device", [](const RunConfig& c, const M&) { return c.run.device; },
       [](RunConfig& to, const RunConfig& from) { to.run.device = from.run.device; }},
      {"--skip-nonfinite", [](const RunConfig& c, const M&) { return str(c.run.skip_nonfinite); },
       [](RunConfig& to, const RunConfig& from) { to.run.skip_nonfinite = from.run.skip_nonfinite; }},
      {"--max-skipped-steps", [](const RunConfig& c, const M&) { return str(c.run.max_skipped_steps); },
       [](RunConfig& to, const RunConfig& from) { to.run.max_skipped_steps = from.run.max_skipped_steps; }},
  };
  return settings;
}

bool always_applied(const std::string& option) {
  return option == "--steps" || option == "--device" || option == "--skip-nonfinite" || option == "--max-skipped-steps";
}

}  // namespace

RunConfig resume_config(RunConfig checkpoint, const std::string& path, const RunConfig& ours,
                        const nn::ModelOptions& model, const std::vector<std::string>& told, std::string& changes) {
  const nn::ModelOptions theirs_model = checkpoint.family().model.options(checkpoint.model);
  const auto was_told = [&](const std::string& option) {
    return std::find(told.begin(), told.end(), option) != told.end();
  };
  std::string differences;
  for (const ResumeSetting& r : resume_settings()) {
    if (!was_told(r.option) && !always_applied(r.option)) continue;
    if (std::string(r.option) == "--context-length" && model.context_length == 0) continue;  // (the task's need)
    const std::string mine = r.value(ours, model), theirs = r.value(checkpoint, theirs_model);
    if (mine == theirs) continue;
    if (!r.apply) {
      differences += std::string(differences.empty() ? "" : "; ") + r.option + " " + mine +
                     " differs from the checkpoint's " + theirs;
      continue;
    }
    r.apply(checkpoint, ours);
    if (!always_applied(r.option) || was_told(r.option))
      changes += std::string(changes.empty() ? "" : ", ") + r.option + " " + mine + " (was " + theirs + ")";
  }
  if (!differences.empty())
    throw ResumeMismatch("train --resume: " + differences + ". These are fixed by '" + path +
                         "'; leave them out to continue it, or train a new run into another --out");
  checkpoint.run.validate();
  return checkpoint;
}

}  // namespace headlab::train
