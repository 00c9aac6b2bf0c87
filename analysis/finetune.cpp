// Fine-tuning a pruned checkpoint through the Trainer (checkpoints, metrics, divergence stops included).
#include "analysis/finetune.h"

#include <chrono>

#include "train/trainer.h"

namespace headlab::analysis {

namespace {

// The fine-tune's run: ck's, for o.steps steps.
train::RunConfig finetune_config(const io::Checkpoint& ck, const FinetuneOptions& o) {
  HL_CHECK(o.steps > 0, "finetune: the number of steps must be positive, got ", o.steps);
  HL_CHECK(o.lr >= 0, "finetune: the learning rate must be >= 0 (0: the run's own), got ", o.lr);
  train::RunConfig config = train::config_of(ck, "finetune");
  config.run.steps = o.steps;
  config.run.eval_every = config.run.save_every = o.steps;
  config.run.device = o.device;
  if (o.lr > 0) config.optimizer.lr = o.lr;
  config.schedule.warmup = std::min(config.schedule.warmup, std::max<int64_t>(1, o.steps / 10));
  return config;
}

}  // namespace

void check_finetune(const io::Checkpoint& ck, const FinetuneOptions& o, const std::string& who) {
  train::check_training_fits(finetune_config(ck, o), who);
}

FinetuneResult finetune(const io::Checkpoint& ck, const EvalSet& data, const FinetuneOptions& o) {
  HL_CHECK(!o.out.empty(), "finetune: no output folder given");
  const train::RunConfig config = finetune_config(ck, o);
  const Device device = Device::parse(o.device);
  FinetuneResult r;
  r.before = evaluate_heads(*io::load_model(ck, "finetune", device), data);
  train::TrainOptions to;
  to.config = config;
  to.out = o.out;
  to.overwrite = true;  // the fine-tune's folder is the analysis's own output: a rerun replaces it, as its tables
  to.quiet = o.quiet;
  to.init = ck.model;
  to.init_model = config.model;
  const auto start = std::chrono::steady_clock::now();
  const train::TrainResult t = train::Trainer(to).run();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  HL_CHECK(!t.interrupted, "finetune: interrupted at step ", t.steps_done, " of ", o.steps);
  r.checkpoint = t.checkpoint;
  r.after = evaluate_heads(*io::load_model(io::load_checkpoint(r.checkpoint), r.checkpoint, device), data);
  return r;
}

}  // namespace headlab::analysis
