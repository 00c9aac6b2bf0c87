// The training loop of examples/mlp_regression.cpp, shared with its test (tests/test_autograd.cpp):
// a 1 -> 32 -> 1 tanh MLP fitted to y = sin(x) on [-3, 3] by full-batch SGD, with nothing but the
// core API. Parameters are leaf tensors; the update runs under NoGradGuard with in-place copy_.
// N = points, H = hidden units. The learning rate stays below 2 / (largest Hessian eigenvalue),
// about 0.1 here: at 0.2 the loss diverges within a few steps.
#pragma once
#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include "ops/ops.h"

namespace headlab::examples {

struct FitResult {
  double initial_loss = 0;
  double final_loss = 0;
};

inline FitResult fit_sine(int64_t steps, double lr = 0.05, int64_t log_every = 0, std::ostream* log = nullptr,
                          uint64_t seed = 0) {
  constexpr int64_t N = 64, H = 32;
  // x: (N, 1) evenly spaced on [-3, 3]; y = sin(x): (N, 1)
  const Tensor x = add(mul(arange(0, N, 1, DType::f32), 6.0 / (N - 1)), -3.0).view({N, 1});
  std::vector<float> ys;  // headlab has no sin op: the targets are made on the host
  for (float v : x.to_vector<float>()) ys.push_back(std::sin(v));
  const Tensor target = tensor(ys, {N, 1});

  // PyTorch's nn.Linear initialisation: uniform in +-1/sqrt(in_features) for weight and bias.
  Generator gen(seed);
  Tensor w1 = uniform({H, 1}, -1.0, 1.0, gen), b1 = uniform({H}, -1.0, 1.0, gen);
  const double bound2 = 1.0 / std::sqrt(static_cast<double>(H));
  Tensor w2 = uniform({1, H}, -bound2, bound2, gen), b2 = uniform({1}, -bound2, bound2, gen);
  std::vector<Tensor*> params = {&w1, &b1, &w2, &b2};
  for (Tensor* p : params) p->requires_grad_();

  auto forward = [&] { return mse_loss(linear(tanh(linear(x, w1, b1)), w2, b2), target); };
  FitResult r;
  for (int64_t step = 0; step < steps; ++step) {
    const Tensor loss = forward();
    const double value = loss.item<double>();
    if (step == 0) r.initial_loss = value;
    if (log && log_every > 0 && step % log_every == 0) *log << "step " << step << "  loss " << value << "\n";
    loss.backward();
    NoGradGuard no_grad;  // the update is not part of any graph
    for (Tensor* p : params) {
      p->copy_(sub(*p, mul(p->grad(), lr)));
      p->zero_grad();
    }
  }
  NoGradGuard no_grad;
  r.final_loss = forward().item<double>();
  if (steps == 0) r.initial_loss = r.final_loss;
  return r;
}

}  // namespace headlab::examples
