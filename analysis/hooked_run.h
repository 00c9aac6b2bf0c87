// A decoder's forward by hook-point name, as TransformerLens's run_with_cache and run_with_hooks take
// them: read any activation (run_with_cache keeps only the names asked for, the memory complaint of
// TransformerLens users) or replace it. The forward is the model's own (nn/decoder.h, with the hook points
// and shapes listed in nn/hooks.h), in eval mode, without a tape, the model as it stands (its head
// controls included, as train::evaluate runs it).
#pragma once
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "nn/decoder.h"

namespace headlab::analysis {

// Every hook point of the model, in the order the forward reaches them (nn::DecoderModel::hook_points).
// The per-head inputs (blocks.L.hook_q_input, _k_input, _v_input) and blocks.L.hook_mlp_in are not
// listed but may be named: hooking one makes that input per head (a copy of the stream per head).
std::vector<std::string> hook_names(const nn::DecoderModel& model);

// Called with the hook's name and the activation; returns the activation to go on with (the same
// shape and dtype), or an undefined Tensor to go on with the argument (which the hook may have edited in
// place: it is the forward's own tensor).
using Hook = std::function<Tensor(const std::string& name, const Tensor& activation)>;

struct HookedRun {
  Tensor logits;                        // (B, T, vocab_size)
  std::map<std::string, Tensor> cache;  // the names asked for, as the forward went on with them
};

// tokens: (B, T) int64. cache: names to keep; hooks: names to call. Unknown names are refused, naming
// the name and where the list is (hook_names). tape: the forward recorded for a backward (its logits and
// activations keep their history; analysis/residual.h's gradients), else without one. valid_lens: (B,) int64, each
// row's tokens before its padding, which an encoder's attention hides (nn::DecoderModel::forward's).
HookedRun run_hooked(nn::DecoderModel& model, const Tensor& tokens, const std::set<std::string>& cache = {},
                     const std::map<std::string, Hook>& hooks = {}, bool tape = false, const Tensor& valid_lens = {});

}  // namespace headlab::analysis
