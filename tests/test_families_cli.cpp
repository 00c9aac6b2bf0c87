// The newer decoder families through every command (the headlab binary): a model trained from scratch with
// --arch qwen3, gpt_neo (its local layers alternating), gemma, gemma2 (soft-capped), gemma3 (five local layers to one
// global) and olmo2,
// and a Hugging Face folder of each written with a tokenizer.json (a window on layer 1 where the family has
// windows), go through eval, inspect, tokenize, generate, attention, heads, ablate with pruning, circuit, convert,
// export, train --init and --resume, as tests/test_neox.cpp runs them for GPT-NeoX. circuit and heads --task
// (path patching) refuse the post-norm families (gemma2, gemma3, olmo2) by name.
#include <gtest/gtest.h>

#include "io/families.h"
#include "nn/decoder_family.h"
#include "tests/core_test_util.h"
#include "tests/every_command.h"
#include "tests/process_util.h"

using namespace headlab;
using headlab::testing::headlab_in;
using headlab::testing::TempDir;

class NewFamilies : public ::testing::TestWithParam<std::string> {};

namespace {

bool post_norms(const std::string& arch) { return arch == "gemma2" || arch == "gemma3" || arch == "olmo2"; }

headlab::testing::Refused refused(const std::string& arch) {
  return {.pairs = post_norms(arch), .pruning = arch == "olmo2"};
}

}  // namespace

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
  headlab::testing::run_every_checkpoint_command(dir, dir.path("run/checkpoint.h5"), refused(arch));
}

// A Hub-like folder with a tokenizer.json: the text commands read it as they read any folder.
TEST_P(NewFamilies, EveryCommandReadsAFolderWithItsTokenizerJson) {
  const std::string arch = GetParam();
  const TempDir dir(arch + "_hub");
  const auto run = [&](const std::vector<std::string>& args) { return headlab_in(dir, args); };
  nn::DecoderConfig c = dynamic_cast<const nn::DecoderFamily&>(io::family_named(arch, "test").model).config();
  c.vocab_size = 1472, c.context_length = 64, c.emb_dim = 32, c.n_heads = 4, c.n_layers = 2, c.hidden_dim = 48;
  if (arch != "gemma" && arch != "olmo2") c.sliding_window = 6, c.window_layers = {1};
  if (arch != "gpt_neo") c.n_kv_heads = 2, c.head_dim = 12;
  manual_seed(5);
  nn::DecoderModel m(c);
  io::TokenizerFiles files;
  files.type = "tokenizer.json";
  files.files.emplace_back("tokenizer.json", headlab::testing::slurp(std::string(HEADLAB_SOURCE_DIR) +
                                                                     "/tests/fixtures/tokenizer_json/qwen2.json"));
  const std::string hub = dir.path("hub");
  io::family_named(arch, "test").folder->write(hub, m, files);
  const std::string story = headlab::testing::write_story(dir);
  headlab::testing::run_every_folder_command(dir, hub, story, !post_norms(arch));
  run({"ablate", hub, "--text", story, "--tokens", "16", "--batches", "1", "--repeats", "1", "--out",
       dir.path("abl")});
  run({"convert", hub, "--out", dir.path("back.h5")});
  run({"eval", dir.path("back.h5"), "--text", story});
  run({"export", dir.path("back.h5"), "--out", dir.path("again")});
  run({"inspect", dir.path("again")});
}

INSTANTIATE_TEST_SUITE_P(Arch, NewFamilies,
                         ::testing::Values("qwen3", "gpt_neo", "gemma", "gemma2", "gemma3", "olmo2"));
