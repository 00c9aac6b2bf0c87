// Basic layers with PyTorch's names, shapes and initialisation: Linear, Dropout, Embedding,
// LayerNorm (weight/bias, or the book's scale/shift), RMSNorm, no norm (IdentityNorm), GELU, ReLU, the book's
// FeedForward and LLaMA's gated one; the faces decoders and analyses see of a norm (Norm, FrozenNorm) and of an MLP
// (Mlp, with its hook points).
#pragma once
#include "nn/hooks.h"
#include "nn/module.h"

namespace headlab::nn {

// x: (..., in_features) -> (..., out_features). weight (out, in) and bias (out) are uniform in
// +-1/sqrt(in_features), as PyTorch initialises them.
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;
  // Weight tying: the weight becomes `shared` (an Embedding's (out, in) table, as GPT-2's head is wte).
  void tie_weight(const Tensor& shared);
  int64_t in_features, out_features;
  Tensor weight, bias;
};

// Stores every Linear layer's weight in bfloat16, in place, for inference: half their memory, and on the CPU
// about half the bytes a decoding step reads; inputs, biases, outputs and every other parameter stay float32
// (linear() widens each weight exactly as it reads it). A weight tied to another module's (GPT-2's head is its
// token embedding) stays float32. The weights stop requiring gradients; .to(float32) undoes the storage (not the
// rounding). Returns the bytes saved.
int64_t to_bfloat16_weights(Module& model);

// Stores every Linear layer's weight as ggml's blocks (block: q8_0, 34 bytes per 32 weights, or q4_k, 144 per
// 256), in place, for inference, as a quantized GGUF file holds them; linear() reads the blocks as they are
// (backends/quant_blocks.h). The rest stays float32, but a head tied to the token embedding is quantized with it
// (as llama.cpp's token_embd), the embedding widening the rows it looks up. With q4_k, a layer whose in_features
// is not a multiple of 256 takes q8_0 (llama.cpp's fallback); one whose in_features is not a multiple of 32 stays
// float32. The weights stop requiring gradients. Returns the bytes saved.
int64_t to_quantized_weights(Module& model, DType block);

// Inverted dropout: zeroes each element with probability p in training, scales the rest by 1/(1-p).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;
  double p;
};

// idx: (...) int64 -> (..., embedding_dim); weight ~ N(0, 1) as in PyTorch.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  std::string type_name() const override { return "Embedding"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& idx) override;
  int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

// A normalisation of the last dim: y = (x - mean(x) if it centres) / sqrt(mean of the squares + eps) *
// weight + bias. What decoders and analyses read of any norm a family uses (LayerNorm; RMSNorm, which
// does not centre and has no bias; IdentityNorm, no norm at all).
class Norm : public UnaryModule {
 public:
  Norm(int64_t dim, double eps) : dim(dim), eps(eps) {}
  virtual bool centres() const = 0;
  virtual bool identity() const { return false; }  // y = x: no weight, nothing to fold or freeze
  // What scales the normalised x: weight, or weight_offset + weight (Gemma's RMSNorm, 1 + weight).
  Tensor gain() const { return weight_offset != 0.0 ? add(weight, weight_offset) : weight; }
  int64_t dim;
  double eps;
  double weight_offset = 0.0;
  Tensor weight, bias;  // bias undefined where the norm has none; both undefined for the identity
};

// A norm at x as a linear map of the stream, its scale frozen at x's (per row): the real norm is not
// linear, but frozen at the x it saw, x's components c_i give y = sum_i share(c_i) + bias exactly, which
// is what direct logit attribution splits (TransformerLens's apply_ln_to_stack).
// No norm frozen is the identity: back(d) = d, apply(c) = c, no bias.
struct FrozenNorm {
  Tensor inv_scale;     // (..., 1): 1 / sqrt(variance or mean square of x + eps), per row; undefined: identity
  Tensor weight, bias;  // (C); bias undefined where the norm has none
  bool centred = true;
  bool identity() const { return !inv_scale.defined(); }
  // The direction d (..., C) as the stream sees it through the frozen norm: share(c) . d = c . back(d) for
  // every component c, i.e. back(d) = centre(weight * d) * inv_scale (without centring for RMSNorm).
  Tensor back(const Tensor& d) const;
  // Components c (K, ..., C) of the stream each as the frozen norm maps it, without the bias:
  // centre(c) * inv_scale * weight (TransformerLens's apply_ln_to_stack).
  Tensor apply(const Tensor& c) const;
  // bias . d (..., ): the part of y . d no component contributes (zeros without a bias).
  Tensor bias_along(const Tensor& d) const;
};
// x: (..., C), in the dtype and on the device the result is wanted in.
FrozenNorm freeze(const Norm& norm, const Tensor& x);

// Normalises the last dim with biased variance, eps 1e-5. Names: weight/bias (torch.nn.LayerNorm),
// or scale/shift with style Book (the LayerNorm of "Build a LLM from Scratch", used by GPTModel).
class LayerNorm : public Norm {
 public:
  enum class Style { Torch, Book };
  explicit LayerNorm(int64_t dim, double eps = 1e-5, Style style = Style::Torch);
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;
  bool centres() const override { return true; }
  Style style;
};

// torch.nn.RMSNorm (LLaMA's norm): x / sqrt(mean(x^2) + eps) * weight; weight starts at ones, no bias.
// weight_offset 1: Gemma's, x / sqrt(mean(x^2) + eps) * (1 + weight), weight starting at zeros.
class RMSNorm : public Norm {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, double weight_offset = 0.0);
  std::string type_name() const override { return "RMSNorm"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;
  bool centres() const override { return false; }
};

// No normalisation: y = x, no parameters (TransformerLens's normalization_type None, an nn.Identity).
class IdentityNorm : public Norm {
 public:
  explicit IdentityNorm(int64_t dim) : Norm(dim, 0.0) {}
  std::string type_name() const override { return "Identity"; }
  Tensor forward(const Tensor& x) override { return x; }
  bool centres() const override { return false; }
  bool identity() const override { return true; }
};

class GELU : public UnaryModule {
 public:
  explicit GELU(bool tanh_approximation = true) : tanh_approximation(tanh_approximation) {}
  std::string type_name() const override { return "GELU"; }
  std::string extra_repr() const override { return tanh_approximation ? "approximate='tanh'" : "approximate='none'"; }
  Tensor forward(const Tensor& x) override { return gelu(x, tanh_approximation); }
  bool tanh_approximation;
};

class ReLU : public UnaryModule {
 public:
  std::string type_name() const override { return "ReLU"; }
  Tensor forward(const Tensor& x) override { return relu(x); }
};

// A block's MLP, with its hook points: mlp.hook_pre (before the activation) and mlp.hook_post (after).
class Mlp : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override { return forward(x, HookSite{}); }
  virtual Tensor forward(const Tensor& x, const HookSite& site) = 0;  // x (..., C) -> (..., C)
};

// The book's FeedForward: layers = Sequential(Linear(d, 4d), GELU, Linear(4d, d)); GPT-NeoX's MLP is the same
// with its own width (intermediate_size) and the exact GELU; TransformerLens's ReLU MLP with a ReLU.
class FeedForward : public Mlp {
 public:
  explicit FeedForward(int64_t emb_dim, int64_t hidden_dim = 0 /* 4 * emb_dim */, bool tanh_gelu = true);
  // activation: layers.1 (GELU, ReLU), between the two Linear layers.
  FeedForward(int64_t emb_dim, int64_t hidden_dim, std::shared_ptr<UnaryModule> activation);
  std::string type_name() const override { return "FeedForward"; }
  using Mlp::forward;
  Tensor forward(const Tensor& x, const HookSite& site) override;
  std::shared_ptr<Sequential> layers;
};

// LLaMA's gated MLP: down(silu(gate x) * up x) as fc3(silu(fc1 x) * fc2 x), no biases (the names of the
// book's Llama conversion); gelu_gate: Gemma's GeGLU, the gate through the tanh GELU instead of SiLU.
// mlp.hook_pre: fc1 x; mlp.hook_post: the product fc3 reads.
class GatedFeedForward : public Mlp {
 public:
  GatedFeedForward(int64_t emb_dim, int64_t hidden_dim, bool gelu_gate = false);
  std::string type_name() const override { return "FeedForward"; }
  using Mlp::forward;
  Tensor forward(const Tensor& x, const HookSite& site) override;
  std::shared_ptr<Linear> fc1, fc2, fc3;
  bool gelu_gate;
};

std::string py_bool(bool b);     // "True" / "False", for reprs
std::string py_float(double v);  // as Python's repr(float): "0.0", "0.5", "1e-05"

}  // namespace headlab::nn
