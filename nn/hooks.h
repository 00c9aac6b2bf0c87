// Hook points: the named places in a decoder's forward where an analysis reads or replaces an
// activation, with TransformerLens's names and shapes. The forward asks a Hooks object at each point;
// with none attached (a null pointer, what training and plain inference pass) a point costs one branch.
// B = batch rows, T = tokens, C = d_model, H = heads (of queries; of keys and values for k, v),
// D = head size, F = the MLP's hidden width.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.h"

namespace headlab::nn {

// In the order a forward reaches them. The per-block points carry their layer; the others layer -1.
enum class HookPoint : uint8_t {
  embed,      // hook_embed                   (B, T, C)  the token embeddings
  pos_embed,  // hook_pos_embed               (B, T, C)  the learned position embeddings (families that have them)
  // embed.ln.hook_normalized (B, T, C): the summed embeddings normed (an encoder's: BERT)
  embed_normalized,
  resid_pre,       // blocks.L.hook_resid_pre      (B, T, C)  the stream entering block L
  q_input,         // blocks.L.hook_q_input        (B, T, H, C)  the stream per head, each head's own (split inputs)
  k_input,         // blocks.L.hook_k_input        (B, T, Hkv, C)  a key/value head's own (grouped-query: fewer)
  v_input,         // blocks.L.hook_v_input        (B, T, Hkv, C)
  ln1_normalized,  // blocks.L.ln1.hook_normalized (B, T, C)
  q,               // blocks.L.attn.hook_q         (B, T, H, D)
  k,               // blocks.L.attn.hook_k         (B, T, Hkv, D)  Hkv = H but in grouped-query attention
  v,               // blocks.L.attn.hook_v         (B, T, Hkv, D)
  rot_q,           // blocks.L.attn.hook_rot_q     (B, T, H, D)  after the rotary embedding (families that rotate)
  rot_k,           // blocks.L.attn.hook_rot_k     (B, T, Hkv, D)
  pattern,         // blocks.L.attn.hook_pattern   (B, H, T, T)  softmax weights, query x key
  z,               // blocks.L.attn.hook_z         (B, T, H, D)  each head's weighted values (after its head control)
  result,          // blocks.L.attn.hook_result    (B, T, H, C)  each head's share of attn_out, out_proj's bias excluded
  // blocks.L.ln1_post.hook_normalized (B, T, C): the attention's output normed (post norms)
  ln1_post_normalized,
  attn_out,        // blocks.L.hook_attn_out       (B, T, C)
  resid_mid,       // blocks.L.hook_resid_mid      (B, T, C)  blocks with an MLP after the attention
  mlp_in,          // blocks.L.hook_mlp_in         (B, T, C)  what the MLP's norm reads
  ln2_normalized,  // blocks.L.ln2.hook_normalized (B, T, C)
  mlp_pre,         // blocks.L.mlp.hook_pre        (B, T, F)  before the activation
  mlp_post,        // blocks.L.mlp.hook_post       (B, T, F)  after it
  // blocks.L.ln2_post.hook_normalized (B, T, C): the MLP's output normed (post norms)
  ln2_post_normalized,
  mlp_out,              // blocks.L.hook_mlp_out        (B, T, C)
  resid_post,           // blocks.L.hook_resid_post     (B, T, C)
  ln_final_normalized,  // ln_final.hook_normalized (B, T, C)
  // mlm_head.ln.hook_normalized (B, T, C): the masked-LM head's transform, normed (BERT)
  mlm_normalized,
};

// A hook point of one layer (-1 for the points outside the blocks).
struct HookKey {
  HookPoint point = HookPoint::embed;
  int64_t layer = -1;
  auto operator<=>(const HookKey&) const = default;
};

bool is_block_point(HookPoint p);
// TransformerLens's name: "hook_embed", "blocks.3.attn.hook_q", "ln_final.hook_normalized".
std::string hook_name(HookKey key);
// The key a name means, or nothing for a name that is no hook point's.
std::optional<HookKey> parse_hook_name(const std::string& name);

// What a forward does at its hook points.
class Hooks {
 public:
  virtual ~Hooks() = default;
  // Whether the forward stops at `key`: asked before the optional work some points need (per-head
  // results, the attention pattern, per-head inputs), so that a point nobody wants costs nothing.
  virtual bool wants(HookKey key) const = 0;
  // Called with the activation at a wanted point; returns the tensor to go on with (the same shape and
  // dtype; `x` itself to go on unchanged, or after editing it in place).
  virtual Tensor at(HookKey key, const Tensor& x) = 0;
};

// One block's view of the hooks: what its modules call at each point. Empty (no hooks) in training and
// plain inference.
struct HookSite {
  Hooks* hooks = nullptr;
  int64_t layer = -1;
  bool wants(HookPoint p) const { return hooks != nullptr && hooks->wants({p, layer}); }
  bool wants_any(std::initializer_list<HookPoint> points) const;
  // The activation to go on with at point p.
  Tensor operator()(HookPoint p, const Tensor& x) const { return wants(p) ? hooks->at({p, layer}, x) : x; }
};

// Hooks that keep the activations at a set of points (as the forward went on with them), optionally
// after a callback that may replace them.
class ActivationCache : public Hooks {
 public:
  using Callback = std::function<Tensor(HookKey key, const Tensor& x)>;
  explicit ActivationCache(std::set<HookKey> keep = {}, std::map<HookKey, Callback> call = {})
      : keep_(std::move(keep)), call_(std::move(call)) {}
  bool wants(HookKey key) const override { return keep_.count(key) > 0 || call_.count(key) > 0; }
  Tensor at(HookKey key, const Tensor& x) override;
  const std::map<HookKey, Tensor>& cache() const { return cache_; }
  std::map<HookKey, Tensor>& cache() { return cache_; }

 private:
  std::set<HookKey> keep_;
  std::map<HookKey, Callback> call_;
  std::map<HookKey, Tensor> cache_;
};

}  // namespace headlab::nn
