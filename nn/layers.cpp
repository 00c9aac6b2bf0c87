// Basic layers: forward passes are single fused ops (linear, embedding, layer_norm, dropout).
#include "nn/layers.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <typeinfo>

namespace headlab::nn {

std::string py_bool(bool b) { return b ? "True" : "False"; }

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Python's repr: the shortest digits that round-trip, fixed notation for 1e-4 <= |v| < 1e16
  // (always with a decimal point), scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string s(buf, res.ptr);  // "-d.ddde+XX"
  const size_t e = s.find('e');
  const int exp = std::stoi(s.substr(e + 1));
  std::string digits;
  for (char c : s.substr(0, e))
    if (c >= '0' && c <= '9') digits += c;
  std::string out = v < 0 || std::signbit(v) ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() < static_cast<size_t>(exp) + 1) digits.resize(static_cast<size_t>(exp) + 1, '0');
      const std::string frac = digits.substr(static_cast<size_t>(exp) + 1);
      out += digits.substr(0, static_cast<size_t>(exp) + 1);
      out += '.';
      out += frac.empty() ? std::string("0") : frac;
    } else {
      out += std::string("0.") + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += std::string(".") + digits.substr(1);
    const int a = std::abs(exp);
    out += std::string("e") + (exp < 0 ? "-" : "+") + (a < 10 ? "0" : "") + std::to_string(a);
  }
  return out;
}

Linear::Linear(int64_t in, int64_t out, bool has_bias) : in_features(in), out_features(out) {
  HL_CHECK(in > 0 && out > 0, "Linear: in_features and out_features must be positive, got ", in, " and ", out);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));  // kaiming_uniform(a=sqrt(5)) reduces to this
  weight = register_parameter("weight", initial_value({out, in}, [&] { return uniform({out, in}, -bound, bound); }));
  if (has_bias) bias = register_parameter("bias", initial_value({out}, [&] { return uniform({out}, -bound, bound); }));
}

void Linear::tie_weight(const Tensor& shared) {
  tie_parameter("weight", shared);
  weight = shared;
}

std::string Linear::extra_repr() const {
  std::ostringstream os;
  os << "in_features=" << in_features << ", out_features=" << out_features << ", bias=" << py_bool(bias.defined());
  return os.str();
}

Tensor Linear::forward(const Tensor& x) {
  HL_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_features, "Linear: expected input with last dim ",
           in_features, ", got shape ", x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  return linear(x, weight, bias);
}

namespace {
// The state_dict names of every Linear layer's weight below `m` (prefix: m's own name, with its dot).
void linear_weight_names(const Module& m, const std::string& prefix, std::vector<std::string>& names) {
  for (const auto& [name, child] : m.children()) {
    if (dynamic_cast<const Linear*>(child.get())) names.push_back(prefix + name + ".weight");
    linear_weight_names(*child, prefix + name + ".", names);
  }
}

// The state_dict names of model's Linear weights (itself one, or its children's).
std::vector<std::string> linear_weight_names(const Module& model) {
  std::vector<std::string> names;
  if (dynamic_cast<const Linear*>(&model)) names.push_back("weight");
  linear_weight_names(model, "", names);
  return names;
}
}  // namespace

int64_t to_bfloat16_weights(Module& model) {
  const std::vector<std::string> names = linear_weight_names(model);
  int64_t saved = 0;
  // named_parameters() lists a tied tensor under its first owner's name only: a head tied to an embedding is
  // not among them, and stays float32.
  model.to(DType::bf16, [&](const std::string& name, const Tensor& t) {
    const bool pick = t.dtype() == DType::f32 && std::find(names.begin(), names.end(), name) != names.end();
    if (pick) saved += t.numel() * 2;
    return pick;
  });
  for (auto& [name, t] : model.named_parameters())
    if (t.dtype() == DType::bf16) t.requires_grad_(false);
  return saved;
}

namespace {
// Every Linear layer's weight at or below m, as the tensors themselves (a tied one is also its other owner's).
void linear_weights(Module& m, std::vector<const TensorImpl*>& out) {
  if (auto* linear = dynamic_cast<Linear*>(&m); linear && linear->weight.defined()) out.push_back(linear->weight.impl());
  for (const auto& [name, child] : m.children()) linear_weights(*child, out);
}
}  // namespace

int64_t to_quantized_weights(Module& model, DType block) {
  HL_CHECK(block == DType::q8_0 || block == DType::q4_k, "to_quantized_weights: the blocks are q8_0 or q4_k, not ",
           dtype_name(block));
  std::vector<const TensorImpl*> weights;
  linear_weights(model, weights);
  int64_t saved = 0;
  model.convert_parameters([&](const std::string&, const Tensor& t) {
    if (t.dtype() != DType::f32 || t.dim() != 2 || std::find(weights.begin(), weights.end(), t.impl()) == weights.end())
      return Tensor();
    const DType use = t.size(1) % dtype_block(block) == 0 ? block : DType::q8_0;
    if (t.size(1) % dtype_block(use) != 0) return Tensor();
    Tensor q = quantize(t, use);
    saved += t.numel() * 4 - q.numel() * static_cast<int64_t>(dtype_size(use));
    return q;
  });
  for (auto& [name, t] : model.named_parameters())
    if (is_block_quantized(t.dtype())) t.requires_grad_(false);
  return saved;
}

Dropout::Dropout(double p_) : p(p_) { HL_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p); }

std::string Dropout::extra_repr() const {
  std::ostringstream os;
  os << "p=" << py_float(p) << ", inplace=False";
  return os.str();
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }

Embedding::Embedding(int64_t n, int64_t d) : num_embeddings(n), embedding_dim(d) {
  HL_CHECK(n > 0 && d > 0, "Embedding: sizes must be positive, got ", n, " and ", d);
  weight = register_parameter("weight", initial_value({n, d}, [&] { return randn({n, d}); }));
}

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
}

Tensor Embedding::forward(const Tensor& idx) { return embedding(weight, idx); }

LayerNorm::LayerNorm(int64_t d, double e, Style s) : Norm(d, e), style(s) {
  HL_CHECK(d > 0, "LayerNorm: dim must be positive, got ", d);
  weight = register_parameter(style == Style::Book ? "scale" : "weight", ones({d}));
  bias = register_parameter(style == Style::Book ? "shift" : "bias", zeros({d}));
}

std::string LayerNorm::extra_repr() const {
  if (style == Style::Book) return "";  // the book's LayerNorm is a plain nn.Module: "LayerNorm()"
  std::ostringstream os;
  os << "(" << dim << ",), eps=" << py_float(eps) << ", elementwise_affine=True";
  if (weight_offset != 0.0) os << ", weight_offset=" << py_float(weight_offset);
  return os.str();
}

Tensor LayerNorm::forward(const Tensor& x) {
  HL_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim, "LayerNorm: expected input with last dim ", dim,
           ", got shape ", x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  return layer_norm(x, weight, bias, eps);
}

RMSNorm::RMSNorm(int64_t d, double e, double offset) : Norm(d, e) {
  HL_CHECK(d > 0, "RMSNorm: dim must be positive, got ", d);
  HL_CHECK(e >= 0 && std::isfinite(e), "RMSNorm: eps must be finite and >= 0, got ", e);
  HL_CHECK(std::isfinite(offset), "RMSNorm: weight_offset must be finite, got ", offset);
  weight_offset = offset;
  weight = register_parameter("weight", offset != 0.0 ? full({d}, 1.0 - offset) : ones({d}));  // a gain of 1
}

std::string RMSNorm::extra_repr() const {
  std::ostringstream os;
  os << "(" << dim << ",), eps=" << py_float(eps) << ", elementwise_affine=True";
  if (weight_offset != 0.0) os << ", weight_offset=" << py_float(weight_offset);
  return os.str();
}

Tensor RMSNorm::forward(const Tensor& x) {
  HL_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim, "RMSNorm: expected input with last dim ", dim,
           ", got shape ", x.defined() ? shape_str(x.shape()) : std::string("(undefined)"));
  return rms_norm(x, gain(), eps);
}

FrozenNorm freeze(const Norm& norm, const Tensor& x) {
  NoGradGuard no_grad;
  FrozenNorm f;
  if (norm.identity()) {  // inv_scale undefined: the identity
    f.centred = false;
    return f;
  }
  const Tensor xc = norm.centres() ? sub(x, x.mean({-1}, true)) : x;
  f.inv_scale = rsqrt(add(mul(xc, xc).mean({-1}, true), norm.eps));
  f.weight = norm.gain().detach();
  if (norm.bias.defined()) f.bias = norm.bias.detach();
  f.centred = norm.centres();
  return f;
}

Tensor FrozenNorm::back(const Tensor& d) const {
  if (identity()) return d;
  const Tensor g = mul(d, weight.to(d.device()).to(d.dtype()));
  return mul(centred ? sub(g, g.mean({-1}, true)) : g, inv_scale.to(d.device()).to(d.dtype()));
}

Tensor FrozenNorm::apply(const Tensor& c) const {
  if (identity()) return c;
  const Tensor x = centred ? sub(c, c.mean({-1}, true)) : c;
  return mul(mul(x, inv_scale.to(c.device()).to(c.dtype())), weight.to(c.device()).to(c.dtype()));
}

Tensor FrozenNorm::bias_along(const Tensor& d) const {
  if (!bias.defined()) return zeros(Shape(d.shape().begin(), d.shape().end() - 1), d.dtype(), d.device());
  return mul(d, bias.to(d.device()).to(d.dtype())).sum({-1});
}

FeedForward::FeedForward(int64_t emb_dim, int64_t hidden_dim, bool tanh_gelu)
    : FeedForward(emb_dim, hidden_dim, std::make_shared<GELU>(tanh_gelu)) {}

FeedForward::FeedForward(int64_t emb_dim, int64_t hidden_dim, std::shared_ptr<UnaryModule> activation) {
  const int64_t F = hidden_dim > 0 ? hidden_dim : 4 * emb_dim;
  layers = register_module("layers", std::make_shared<Sequential>());
  layers->push_back(std::make_shared<Linear>(emb_dim, F));
  layers->push_back(std::move(activation));
  layers->push_back(std::make_shared<Linear>(F, emb_dim));
}

Tensor FeedForward::forward(const Tensor& x, const HookSite& site) {
  // The up-projection and its GELU in one pass (linear_gelu) where the layers are these exact classes (a
  // subclass keeps its own forward) and no hook reads or replaces the pre-activation between them.
  const std::shared_ptr<UnaryModule> first = layers->at(0), second = layers->at(1);
  const UnaryModule &m0 = *first, &m1 = *second;
  if (typeid(m0) == typeid(Linear) && typeid(m1) == typeid(GELU) && !site.wants(HookPoint::mlp_pre)) {
    const auto& up = static_cast<const Linear&>(m0);
    const bool tanh_form = static_cast<const GELU&>(m1).tanh_approximation;
    const Tensor post = linear_gelu(x, up.weight, up.bias, tanh_form).post;  // (..., 4C)
    return layers->at(2)->forward(site(HookPoint::mlp_post, post));
  }
  const Tensor pre = site(HookPoint::mlp_pre, layers->at(0)->forward(x));  // (..., 4C)
  return layers->at(2)->forward(site(HookPoint::mlp_post, layers->at(1)->forward(pre)));
}

GatedFeedForward::GatedFeedForward(int64_t emb_dim, int64_t hidden_dim, bool gelu_gate) : gelu_gate(gelu_gate) {
  fc1 = register_module("fc1", std::make_shared<Linear>(emb_dim, hidden_dim, false));
  fc2 = register_module("fc2", std::make_shared<Linear>(emb_dim, hidden_dim, false));
  fc3 = register_module("fc3", std::make_shared<Linear>(hidden_dim, emb_dim, false));
}

Tensor GatedFeedForward::forward(const Tensor& x, const HookSite& site) {
  const Tensor gate = site(HookPoint::mlp_pre, fc1->forward(x));  // (..., F)
  const Tensor post = site(HookPoint::mlp_post, mul(gelu_gate ? gelu(gate, true) : silu(gate), fc2->forward(x)));
  return fc3->forward(post);
}

}  // namespace headlab::nn
