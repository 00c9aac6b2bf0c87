// Basic layers with PyTorch's names, shapes and initialisation: Linear, Dropout, Embedding,
// LayerNorm (weight/bias, or the book's scale/shift), GELU, ReLU, and the book's FeedForward.
#pragma once
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

// Normalises the last dim with biased variance, eps 1e-5. Names: weight/bias (torch.nn.LayerNorm),
// or scale/shift with style Book (the LayerNorm of "Build a LLM from Scratch", used by GPTModel).
class LayerNorm : public UnaryModule {
 public:
  enum class Style { Torch, Book };
  explicit LayerNorm(int64_t dim, double eps = 1e-5, Style style = Style::Torch);
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;
  Tensor forward(const Tensor& x) override;
  int64_t dim;
  double eps;
  Style style;
  Tensor weight, bias;  // registered as scale/shift in the Book style
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

// The book's FeedForward: layers = Sequential(Linear(d, 4d), GELU, Linear(4d, d)).
class FeedForward : public UnaryModule {
 public:
  explicit FeedForward(int64_t emb_dim);
  std::string type_name() const override { return "FeedForward"; }
  Tensor forward(const Tensor& x) override { return layers->forward(x); }
  std::shared_ptr<Sequential> layers;
};

std::string py_bool(bool b);     // "True" / "False", for reprs
std::string py_float(double v);  // as Python's repr(float): "0.0", "0.5", "1e-05"

}  // namespace headlab::nn
