// The real models of ../shared/models that several suites test against (each folder's README says what, where
// from and what to reproduce); a test skips with a message where the folder is absent.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "loader/load.h"
#include "nn/generate.h"
#include "ops/ops.h"
#include "tests/process_util.h"

namespace headlab::testing {

inline const std::string kStories260KDir = std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/stories260K";

// stories260K's published story: the fenced block of its folder's README ("" where absent).
inline std::string published_story() {
  const std::string readme = slurp(kStories260KDir + "/README.md");
  const size_t open = readme.find("```\n");
  const size_t close = readme.find("\n```", open + 4);
  return open == std::string::npos || close == std::string::npos ? "" : readme.substr(open + 4, close - open - 4);
}

// stories260K (llama2.c's file) before and after `store` changes how its weights are held (bfloat16, blocks): the
// logits over its own 256-token greedy story both ways, and the story it writes after, as text.
struct StoredWeightsRun {
  int64_t saved = 0;  // what `store` returned: the bytes saved
  std::vector<int64_t> story_before, story_after;  // the greedy tokens after the prompt
  Tensor logits_before, logits_after;              // (1, T, vocab) over the prompt and story_before
  std::string text_after;
};
inline StoredWeightsRun stories260k_with_stored_weights(const std::function<int64_t(nn::DecoderModel&)>& store) {
  const loader::Loaded l = loader::load("test", kStories260KDir + "/stories260K.bin", "cpu", "",
                                        kStories260KDir + "/tok512.bin");
  nn::DecoderModel& model = l.decoder("test");
  const tasks::Prompt p = l.task->encode_prompt("");
  nn::GenerateOptions o;
  o.max_new_tokens = 256;
  o.end_id = l.task->end_id();
  StoredWeightsRun r;
  r.story_before = nn::generate(model, p.ids, o);
  std::vector<int64_t> ids = p.ids;
  ids.insert(ids.end(), r.story_before.begin(), r.story_before.end());
  const NoGradGuard no_grad;
  const Tensor tokens = tensor(ids, {1, static_cast<int64_t>(ids.size())});
  r.logits_before = model.forward(tokens);
  r.saved = store(model);
  r.logits_after = model.forward(tokens);
  r.story_after = nn::generate(model, p.ids, o);
  r.text_after = l.task->format_continuation(p, r.story_after);
  return r;
}

}  // namespace headlab::testing
