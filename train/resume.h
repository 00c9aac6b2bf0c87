// --resume: which command-line options fix a run (the model, the task, the data: a told one must agree
// with the checkpoint), which may change (the learning rate and schedule, gradient clipping, the
// cadences: a told one replaces the checkpoint's), and which are always this process's (--steps,
// --device, the --skip-nonfinite settings).
#pragma once
#include <string>
#include <vector>

#include "base/error.h"
#include "nn/family.h"
#include "train/config.h"

namespace headlab::train {

// A --resume whose options contradict the checkpoint's model, task or data; the message names every
// difference. (headlab train exits 2 on it: a usage error, nothing was run.)
class ResumeMismatch : public Error {
 public:
  using Error::Error;
};

// The checkpoint's config (`checkpoint`, read from `path`) with what this process was told: `ours` and
// `model` hold the command line's values, `told` the options given ("--lr"). Throws ResumeMismatch for
// every told option that fixes the run and differs; `changes` receives the replaced ones for the log
// ("--lr 0.001 (was 0.003)").
RunConfig resume_config(RunConfig checkpoint, const std::string& path, const RunConfig& ours,
                        const nn::ModelOptions& model, const std::vector<std::string>& told, std::string& changes);

}  // namespace headlab::train
