// Built against an installed headlab: a GPT through headlab::core, its hook points through
// headlab::headlab (analysis/hooked_run.h), checked against each other.
#include <iostream>

#include "analysis/hooked_run.h"
#include "nn/decoder_family.h"
#include "ops/ops.h"

using namespace headlab;

int main() {
  manual_seed(0);
  nn::DecoderConfig c;
  c.vocab_size = 11, c.context_length = 8, c.emb_dim = 16, c.n_heads = 2, c.n_layers = 2;
  nn::DecoderModel model(c);
  model.eval();
  const Tensor idx = tensor(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, {1, 6});
  const NoGradGuard no_grad;
  const analysis::HookedRun r = analysis::run_hooked(model, idx, {"blocks.1.attn.hook_pattern"});
  const double gap = sub(r.logits, model.forward(idx)).abs().max().item<double>();
  std::cout << "consumer: logits " << shape_str(r.logits.shape()) << ", pattern "
            << shape_str(r.cache.at("blocks.1.attn.hook_pattern").shape()) << ", hooked vs forward " << gap << "\n";
  return gap < 1e-5 ? 0 : 1;
}
