// The newer decoder families through every command (the headlab binary): a model trained from scratch with
// --arch qwen3 and --arch gpt_neo (its local layers alternating), and a Hugging Face folder of each written with a
// tokenizer.json (a window on layer 1), go through eval, inspect, tokenize, generate, attention, heads, ablate with
// pruning, circuit, convert, export, train --init and --resume, as tests/test_neox.cpp runs them for GPT-NeoX.
#include <gtest/gtest.h>

#include <fstream>

#include "io/families.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::TempDir;

namespace {

headlab::testing::ProcessResult headlab_in(const TempDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), std::string(HEADLAB_BINARY_DIR) + "/headlab");
  headlab::testing::ProcessResult r = headlab::testing::run_process(args, dir.dir());
  EXPECT_EQ(r.code, 0) << args[1] << ": " << r.err;
  return r;
}

}  // namespace

class NewFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(NewFamilies, EveryCommandRunsOnAModelTrainedFromScratch) {
  const std::string arch = GetParam();
  const TempDir dir(arch + "_cli");
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  const auto train = run({"train",
                          "--task",
                          "reverse",
                          "--arch",
                          arch,
                          "--steps",
                          "3",
                          "--emb-dim",
                          "32",
                          "--n-heads",
                          "4",
                          "--n-layers",
                          "2",
                          "--batch-size",
                          "4",
                          "--eval-every",
                          "3",
                          "--eval-batches",
                          "1",
                          "--out",
                          dir.path("run")});
  EXPECT_NE(train.out.find(arch + ", 2 layers x 4 heads"), std::string::npos) << train.out;
  const std::string ck = dir.path("run/checkpoint.h5");
  run({"eval", ck, "--batches", "1"});
  run({"inspect", ck});
  run({"generate", ck, "--prompt", "1234"});
  run({"heads", ck, "--batches", "1", "--batch-size", "4", "--out", dir.path("heads")});
  run({"heads", ck, "--task", "induction", "--rows", "4", "--out", dir.path("heads_pairs")});
  run({"ablate", ck, "--batches", "1", "--batch-size", "4", "--prune", "1", "--repeats", "1", "--out",
       dir.path("abl")});
  run({"circuit", ck, "--task", "induction", "--rows", "4", "--check-edges", "4", "--out", dir.path("circ")});
  run({"attention", ck, "--prompt", "1234", "--out", dir.path("att")});
  run({"export", ck, "--out", dir.path("hf")});
  run({"export", dir.path("abl/pruned.h5"), "--out", dir.path("hf_pruned")});
  run({"train", "--init", ck, "--steps", "1", "--batch-size", "4", "--eval-every", "1", "--eval-batches", "1", "--out",
       dir.path("init")});
  run({"train", "--resume", "--steps", "4", "--out", dir.path("run")});
}

// A Hub-like folder with a tokenizer.json: the text commands read it as they read any folder.
TEST_P(NewFamilies, EveryCommandReadsAFolderWithItsTokenizerJson) {
  const std::string arch = GetParam();
  const TempDir dir(arch + "_hub");
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  nn::DecoderConfig c = (arch == "qwen3" ? nn::qwen3_family() : nn::gpt_neo_family()).config();
  c.vocab_size = 1472, c.context_length = 64, c.emb_dim = 32, c.n_heads = 4, c.n_layers = 2, c.hidden_dim = 48;
  c.sliding_window = 6, c.window_layers = {1};
  if (arch == "qwen3") c.n_kv_heads = 2, c.head_dim = 12;
  manual_seed(5);
  nn::DecoderModel m(c);
  io::TokenizerFiles files;
  files.type = "tokenizer.json";
  files.files.emplace_back("tokenizer.json", headlab::testing::slurp(std::string(HEADLAB_SOURCE_DIR) +
                                                                     "/tests/fixtures/tokenizer_json/qwen2.json"));
  const std::string hub = dir.path("hub");
  io::family_named(arch, "test").folder->write(hub, m, files);
  {
    std::ofstream story(dir.path("story.txt"));
    for (int i = 0; i < 20; ++i)
      story << "Once upon a time there was a little dog. The dog liked to run in the park. One day the dog saw a "
               "cat, and the cat ran up a tree.\n";
  }
  run({"inspect", hub});
  run({"tokenize", hub, "--prompt", "Once upon a time"});
  run({"eval", hub, "--text", dir.path("story.txt")});
  run({"generate", hub, "--prompt", "Once upon a time", "--max-new-tokens", "4"});
  run({"attention", hub, "--prompt", "Once upon a time", "--out", dir.path("att")});
  run({"heads", hub, "--task", "induction", "--rows", "4", "--out", dir.path("heads")});
  run({"circuit", hub, "--task", "induction", "--rows", "4", "--check-edges", "4", "--out", dir.path("circ")});
  run({"ablate", hub, "--text", dir.path("story.txt"), "--tokens", "16", "--batches", "1", "--repeats", "1", "--out",
       dir.path("abl")});
  run({"convert", hub, "--out", dir.path("back.h5")});
  run({"eval", dir.path("back.h5"), "--text", dir.path("story.txt")});
  run({"export", dir.path("back.h5"), "--out", dir.path("again")});
  run({"inspect", dir.path("again")});
}

INSTANTIATE_TEST_SUITE_P(Arch, NewFamilies, ::testing::Values("qwen3", "gpt_neo"));
