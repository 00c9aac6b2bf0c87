// run_with_cache and run_with_hooks by name over the model's forward.
#include "analysis/hooked_run.h"

#include <optional>

#include "analysis/head_control.h"

namespace headlab::analysis {

std::vector<std::string> hook_names(const nn::DecoderModel& model) {
  std::vector<std::string> names;
  for (const nn::HookKey& key : model.hook_points()) names.push_back(nn::hook_name(key));
  return names;
}

HookedRun run_hooked(nn::DecoderModel& model, const Tensor& tokens, const std::set<std::string>& cache,
                     const std::map<std::string, Hook>& hooks, bool tape, const Tensor& valid_lens) {
  const std::vector<nn::HookKey> points = model.hook_points(true);
  const std::set<nn::HookKey> known(points.begin(), points.end());
  // The key a name means on this model, or an error naming the call.
  const auto key_of = [&](const std::string& name, const char* call) {
    const std::optional<nn::HookKey> key = nn::parse_hook_name(name);
    HL_CHECK(key && known.count(*key), call, ": the model has no hook point '", name, "' (hook_names() lists them)");
    return *key;
  };
  std::set<nn::HookKey> keep;
  for (const std::string& n : cache) keep.insert(key_of(n, "run_with_cache"));
  std::map<nn::HookKey, nn::ActivationCache::Callback> call;
  for (const auto& [n, h] : hooks) {
    HL_CHECK(h != nullptr, "run_with_hooks: the hook at '", n, "' is empty");
    // The hook's replacement, checked, or the activation (perhaps edited in place).
    call[key_of(n, "run_with_hooks")] = [name = n, hook = h](nn::HookKey, const Tensor& x) {
      const Tensor y = hook(name, x);
      if (!y.defined()) return x;
      HL_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype(), "run_with_hooks: the hook at '", name, "' returned ",
               shape_str(y.shape()), " ", dtype_name(y.dtype()), "; the activation is ", shape_str(x.shape()), " ",
               dtype_name(x.dtype()));
      return y.to(x.device());
    };
  }
  HL_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::i64,
           "run_hooked: tokens must be a (B, T) int64 tensor, got ",
           tokens.defined() ? shape_str(tokens.shape()) + " " + dtype_name(tokens.dtype()) : std::string("none"));
  std::optional<NoGradGuard> no_grad;
  if (!tape) no_grad.emplace();
  const detail::EvalMode eval(model);
  nn::ActivationCache acts(std::move(keep), std::move(call));
  HookedRun r;
  r.logits = model.forward(tokens, &acts, valid_lens);
  for (auto& [key, x] : acts.cache()) r.cache[nn::hook_name(key)] = std::move(x);
  return r;
}

}  // namespace headlab::analysis
