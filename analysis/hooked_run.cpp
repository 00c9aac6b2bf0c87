#include "analysis/hooked_run.h"

#include <cmath>

#include "nn/attention.h"
#include "ops/ops.h"

namespace headlab::analysis {

namespace {

std::string block_prefix(int64_t layer) { return "blocks." + std::to_string(layer) + "."; }

// The model in eval mode for the run, as it was after.
struct EvalMode {
  nn::GPTModel& model;
  bool was_training;
  explicit EvalMode(nn::GPTModel& m) : model(m), was_training(m.is_training()) { model.eval(); }
  ~EvalMode() {
    if (was_training) model.train();
  }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;
};

}  // namespace

std::vector<std::string> hook_names(const nn::GPTModel& model) {
  std::vector<std::string> names{"hook_embed"};
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    const std::string p = block_prefix(l);
    names.push_back(p + "hook_resid_pre");
    if (model.attention(l).head_count() > 0)
      for (const char* h : {"hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z", "hook_result"})
        names.push_back(p + "attn." + h);
    names.push_back(p + "hook_attn_out");
    if (model.block(l)->ff) names.push_back(p + "hook_resid_mid"), names.push_back(p + "hook_mlp_out");
    names.push_back(p + "hook_resid_post");
  }
  names.push_back("ln_final.hook_normalized");
  return names;
}

HookedRun run_hooked(nn::GPTModel& model, const Tensor& tokens, const std::set<std::string>& cache,
                     const std::map<std::string, Hook>& hooks) {
  const std::vector<std::string> names = hook_names(model);
  const std::set<std::string> known(names.begin(), names.end());
  for (const std::string& n : cache)
    HL_CHECK(known.count(n), "run_with_cache: the model has no hook point '", n, "' (hook_names() lists them)");
  for (const auto& [n, h] : hooks) {
    HL_CHECK(known.count(n), "run_with_hooks: the model has no hook point '", n, "' (hook_names() lists them)");
    HL_CHECK(h != nullptr, "run_with_hooks: the hook at '", n, "' is empty");
  }
  HL_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::i64,
           "run_hooked: tokens must be a (B, T) int64 tensor, got ",
           tokens.defined() ? shape_str(tokens.shape()) + " " + dtype_name(tokens.dtype()) : std::string("none"));
  const NoGradGuard no_grad;
  const EvalMode eval(model);
  HookedRun r;
  // Each hook point: the hook's replacement (checked) or the activation, kept when asked for.
  const auto point = [&](const std::string& name, Tensor x) -> Tensor {
    if (const auto h = hooks.find(name); h != hooks.end()) {
      const Tensor y = h->second(name, x);
      if (y.defined()) {
        HL_CHECK(y.shape() == x.shape() && y.dtype() == x.dtype(), "run_with_hooks: the hook at '", name, "' returned ",
                 shape_str(y.shape()), " ", dtype_name(y.dtype()), "; the activation is ", shape_str(x.shape()), " ",
                 dtype_name(x.dtype()));
        x = y.to(x.device());
      }
    }
    if (cache.count(name)) r.cache[name] = x;
    return x;
  };
  const int64_t B = tokens.size(0), T = tokens.size(1);
  Tensor x = point("hook_embed", model.embed(tokens));  // (B, T, C)
  for (int64_t l = 0; l < model.n_layers(); ++l) {
    const std::string p = block_prefix(l);
    const std::shared_ptr<nn::TransformerBlock> block = model.block(l);
    x = point(p + "hook_resid_pre", x);
    nn::CausalMultiHead& att = model.attention(l);
    const int64_t H = att.head_count(), D = att.head_size();
    Tensor attn_out;
    if (H == 0) {
      attn_out = att.forward(block->norm1->forward(x));  // every head pruned: out_proj's bias alone
    } else {
      const std::shared_ptr<nn::CausalMultiHead> fused =
          att.form() == nn::AttentionForm::fused ? nullptr : nn::convert_attention(att, nn::AttentionForm::fused);
      auto& f = dynamic_cast<nn::CausalMultiHeadAttention&>(fused ? *fused : att);
      const Tensor n = block->norm1->forward(x);
      const auto per_head = [&](nn::Linear& proj, const char* hook) {  // (B, T, H, D)
        return point(p + "attn." + hook, proj.forward(n).reshape({B, T, H, D}));
      };
      const Tensor q = per_head(*f.W_query, "hook_q"), k = per_head(*f.W_key, "hook_k"),
                   v = per_head(*f.W_value, "hook_v");
      const Tensor pattern =  // (B, H, T, T)
          point(p + "attn.hook_pattern", causal_softmax(matmul(q.transpose(1, 2), k.permute({0, 2, 3, 1})),
                                                        1.0 / std::sqrt(static_cast<double>(D))));
      const Tensor z = point(p + "attn.hook_z", matmul(pattern, v.transpose(1, 2)).transpose(1, 2));  // (B, T, H, D)
      const std::string result = p + "attn.hook_result";
      if (cache.count(result) || hooks.count(result)) {  // each head's share of attn_out, only when asked
        const int64_t C = f.out_proj->weight.size(0);
        const Tensor W_O = f.out_proj->weight.reshape({C, H, D}).permute({1, 2, 0});  // (H, D, C)
        const Tensor per_head = matmul(z.permute({2, 0, 1, 3}).reshape({H, B * T, D}), W_O);
        const Tensor r = point(result, per_head.reshape({H, B, T, C}).permute({1, 2, 0, 3}));  // (B, T, H, C)
        attn_out = r.sum({2});
        if (f.out_proj->bias.defined()) attn_out = add(attn_out, f.out_proj->bias);
      } else {
        attn_out = f.out_proj->forward(z.reshape({B, T, H * D}));
      }
    }
    x = add(x, point(p + "hook_attn_out", attn_out));
    if (block->ff) {
      x = point(p + "hook_resid_mid", x);
      x = add(x, point(p + "hook_mlp_out", block->ff->forward(block->norm2->forward(x))));
    }
    x = point(p + "hook_resid_post", x);
  }
  r.logits = model.out_head->forward(point("ln_final.hook_normalized", model.final_norm->forward(x)));
  return r;
}

}  // namespace headlab::analysis
