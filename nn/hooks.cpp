// Hook point names (TransformerLens's) and the caching hooks.
#include "nn/hooks.h"

#include <array>

#include "base/error.h"

namespace headlab::nn {

namespace {

struct PointName {
  HookPoint point;
  const char* name;  // after "blocks.L." for block points
};

constexpr std::array<PointName, 28> kNames = {{
    {HookPoint::embed, "hook_embed"},
    {HookPoint::pos_embed, "hook_pos_embed"},
    {HookPoint::embed_normalized, "embed.ln.hook_normalized"},
    {HookPoint::resid_pre, "hook_resid_pre"},
    {HookPoint::q_input, "hook_q_input"},
    {HookPoint::k_input, "hook_k_input"},
    {HookPoint::v_input, "hook_v_input"},
    {HookPoint::ln1_normalized, "ln1.hook_normalized"},
    {HookPoint::q, "attn.hook_q"},
    {HookPoint::k, "attn.hook_k"},
    {HookPoint::v, "attn.hook_v"},
    {HookPoint::rot_q, "attn.hook_rot_q"},
    {HookPoint::rot_k, "attn.hook_rot_k"},
    {HookPoint::pattern, "attn.hook_pattern"},
    {HookPoint::z, "attn.hook_z"},
    {HookPoint::result, "attn.hook_result"},
    {HookPoint::ln1_post_normalized, "ln1_post.hook_normalized"},
    {HookPoint::attn_out, "hook_attn_out"},
    {HookPoint::resid_mid, "hook_resid_mid"},
    {HookPoint::mlp_in, "hook_mlp_in"},
    {HookPoint::ln2_normalized, "ln2.hook_normalized"},
    {HookPoint::mlp_pre, "mlp.hook_pre"},
    {HookPoint::mlp_post, "mlp.hook_post"},
    {HookPoint::ln2_post_normalized, "ln2_post.hook_normalized"},
    {HookPoint::mlp_out, "hook_mlp_out"},
    {HookPoint::resid_post, "hook_resid_post"},
    {HookPoint::ln_final_normalized, "ln_final.hook_normalized"},
    {HookPoint::mlm_normalized, "mlm_head.ln.hook_normalized"},
}};

const char* point_name(HookPoint p) {
  for (const PointName& n : kNames)
    if (n.point == p) return n.name;
  HL_FAIL("hooks: hook point ", static_cast<int>(p), " has no name");
}

}  // namespace

bool is_block_point(HookPoint p) {
  return p != HookPoint::embed && p != HookPoint::pos_embed && p != HookPoint::embed_normalized &&
         p != HookPoint::ln_final_normalized && p != HookPoint::mlm_normalized;
}

std::string hook_name(HookKey key) {
  if (!is_block_point(key.point)) return point_name(key.point);
  return "blocks." + std::to_string(key.layer) + "." + point_name(key.point);
}

std::optional<HookKey> parse_hook_name(const std::string& name) {
  std::string rest = name;
  int64_t layer = -1;
  if (name.rfind("blocks.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    const std::string digits = name.substr(7, dot == std::string::npos ? std::string::npos : dot - 7);
    if (dot == std::string::npos || digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos || (digits.size() > 1 && digits[0] == '0'))
      return std::nullopt;
    layer = std::stoll(digits);
    rest = name.substr(dot + 1);
  }
  for (const PointName& n : kNames)
    if (rest == n.name && is_block_point(n.point) == (layer >= 0)) return HookKey{n.point, layer};
  return std::nullopt;
}

bool HookSite::wants_any(std::initializer_list<HookPoint> points) const {
  if (hooks == nullptr) return false;
  for (HookPoint p : points)
    if (hooks->wants({p, layer})) return true;
  return false;
}

Tensor ActivationCache::at(HookKey key, const Tensor& x) {
  Tensor y = x;
  if (const auto c = call_.find(key); c != call_.end()) {
    const Tensor r = c->second(key, x);
    if (r.defined()) y = r;
  }
  if (keep_.count(key)) cache_[key] = y;
  return y;
}

}  // namespace headlab::nn
