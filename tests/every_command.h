// Every command of the headlab binary over one model, for the family suites (tests/test_neox.cpp,
// tests/test_families_cli.cpp): a trained checkpoint through eval, inspect, generate, heads, ablate with pruning,
// circuit, attention, export, train --init and --resume; a Hugging Face folder with its tokenizer through the text
// commands. A command that fails is reported naming it.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace headlab::testing {

// `headlab args...` run in dir's folder.
inline ProcessResult headlab_in(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), std::string(HEADLAB_BINARY_DIR) + "/headlab");
  ProcessResult r = run_process(args, dir.dir());
  EXPECT_EQ(r.code, 0) << args[1] << ": " << r.err;
  return r;
}

// A prompt-pair command (circuit, heads --task) over a model it refuses (post norms): the refusal, by name, exit 1.
inline void expect_pairs_refused(const TempDir& dir, const std::string& command, const std::string& model,
                                 std::vector<std::string> args) {
  args.insert(args.begin(), {std::string(HEADLAB_BINARY_DIR) + "/headlab", command, model});
  const ProcessResult r = run_process(args, dir.dir());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("path patching over post-norm models (circuit, heads --task) is not supported yet"),
            std::string::npos)
      << r.err;
}

// What a family refuses by name: path patching over prompt pairs (post norms), physical pruning (OLMo-2's q/k norms).
struct Refused {
  bool pairs = false, pruning = false;
};

// ck: a checkpoint of a run in dir/run trained on the task reverse; what the family refuses checked as refused.
inline void run_every_checkpoint_command(const TempDir& dir, const std::string& ck, Refused refused = {}) {
  const bool circuits = !refused.pairs;
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  run({"eval", ck, "--batches", "1"});
  run({"inspect", ck});
  run({"generate", ck, "--prompt", "1234"});
  run({"heads", ck, "--batches", "1", "--batch-size", "4", "--out", dir.path("heads")});
  const std::vector<std::string> pairs{"--task", "induction", "--rows", "4", "--out", dir.path("heads_pairs")};
  if (circuits) {
    std::vector<std::string> args{"heads", ck};
    args.insert(args.end(), pairs.begin(), pairs.end());
    run(args);
  } else {
    expect_pairs_refused(dir, "heads", ck, pairs);
  }
  if (refused.pruning) {  // the ablation without the pruned copy; --prune refused
    run({"ablate", ck, "--batches", "1", "--batch-size", "4", "--repeats", "1", "--out", dir.path("abl")});
    const ProcessResult r = run_process({std::string(HEADLAB_BINARY_DIR) + "/headlab", "ablate", ck, "--batches", "1",
                                         "--batch-size", "4", "--prune", "1", "--out", dir.path("abl_pruned")},
                                        dir.dir());
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("physical pruning is not supported"), std::string::npos) << r.err;
  } else {
    run({"ablate", ck, "--batches", "1", "--batch-size", "4", "--prune", "1", "--repeats", "1", "--out",
         dir.path("abl")});
  }
  const std::vector<std::string> circuit{"--task",        "induction", "--rows", "4",
                                         "--check-edges", "4",         "--out",  dir.path("circ")};
  if (circuits) {
    std::vector<std::string> args{"circuit", ck};
    args.insert(args.end(), circuit.begin(), circuit.end());
    run(args);
  } else {
    expect_pairs_refused(dir, "circuit", ck, circuit);
  }
  run({"attention", ck, "--prompt", "1234", "--out", dir.path("att")});
  run({"export", ck, "--out", dir.path("hf")});
  if (!refused.pruning) run({"export", dir.path("abl/pruned.h5"), "--out", dir.path("hf_pruned")});
  run({"train", "--init", ck, "--steps", "1", "--batch-size", "4", "--eval-every", "1", "--eval-batches", "1", "--out",
       dir.path("init")});
  run({"train", "--resume", "--steps", "4", "--out", dir.path("run")});
}

// A short story, repeated, at dir/story.txt: text for the folder commands.
inline std::string write_story(const TempDir& dir) {
  std::ofstream story(dir.path("story.txt"));
  for (int i = 0; i < 20; ++i)
    story << "Once upon a time there was a little dog. The dog liked to run in the park. One day the dog saw a "
             "cat, and the cat ran up a tree.\n";
  return dir.path("story.txt");
}

// hub: a folder with its tokenizer; story: text to score.
inline void run_every_folder_command(const TempDir& dir, const std::string& hub, const std::string& story,
                                     bool circuits = true) {
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  run({"inspect", hub});
  run({"tokenize", hub, "--prompt", "Once upon a time"});
  run({"eval", hub, "--text", story});
  run({"generate", hub, "--prompt", "Once upon a time", "--max-new-tokens", "4"});
  run({"attention", hub, "--prompt", "Once upon a time", "--out", dir.path("att")});
  if (!circuits) {
    expect_pairs_refused(dir, "heads", hub, {"--task", "induction", "--rows", "4", "--out", dir.path("heads")});
    return expect_pairs_refused(dir, "circuit", hub, {"--task", "induction", "--rows", "4", "--out", dir.path("circ")});
  }
  run({"heads", hub, "--task", "induction", "--rows", "4", "--out", dir.path("heads")});
  run({"circuit", hub, "--task", "induction", "--rows", "4", "--check-edges", "4", "--out", dir.path("circ")});
}

}  // namespace headlab::testing
