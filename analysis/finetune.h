// Fine-tuning after pruning (both Michel et al. 2019 and Voita et al. 2019 do it): a pruned
// checkpoint trained further on its own task, from its pruned weights, with a fresh optimizer.
#pragma once
#include <cstdint>
#include <string>

#include "analysis/heads.h"
#include "io/checkpoint.h"

namespace headlab::analysis {

struct FinetuneOptions {
  int64_t steps = 100;
  double lr = 0;    // peak learning rate; 0: the run's own
  std::string out;  // the run's folder: checkpoint.h5 (the fine-tuned model) and metrics.csv
  std::string device = "cpu";
  bool quiet = true;
};
struct FinetuneResult {
  Scores before, after;  // on the analysis data, before and after fine-tuning
  std::string checkpoint;
  double seconds = 0;
};
// Trains ck's model (a pruned one: config kept_heads) for options.steps steps of its run's task,
// optimizer kind, batch size and clipping; the schedule is the run's kind (cosine: warmup of a tenth
// of the steps) over the new length. The training stream starts at batch 0 again: the model sees the
// data it was trained on, as the papers' fine-tuning does.
FinetuneResult finetune(const io::Checkpoint& ck, const EvalSet& data, const FinetuneOptions& options);
// What finetune needs (its options; the training step and evaluation in the available memory), for a caller
// to check before its first result; errors name who. A pruned checkpoint needs no more than ck.
void check_finetune(const io::Checkpoint& ck, const FinetuneOptions& options, const std::string& who);

}  // namespace headlab::analysis
