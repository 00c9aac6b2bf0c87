// The README's API tour: autograd, an attention module with head gates, functional grad, views.
#include <iostream>

#include "nn/attention.h"  // pulls in ops/ops.h (every op) and autograd (Tensor, grad, NoGradGuard)
using namespace headlab;

int main() {
  manual_seed(0);
  Tensor x = randn({2, 6, 16});  // (B, T, C)
  nn::CausalMultiHeadAttention mha(16, 16, /*context_length=*/8, /*dropout=*/0.0, /*num_heads=*/4);
  Tensor gates = ones({4}).requires_grad_();          // one gate per head
  Tensor loss = mha.forward(x, gates).pow(2).mean();  // (2, 6, 16) -> scalar
  loss.backward();                                    // fills .grad of parameters and gates
  std::cout << "dL/dgates " << gates.grad() << "\n";  // head-importance scores
  std::cout << mha.repr() << "\n";                    // the module tree, as PyTorch prints it

  Tensor w = randn({3, 3}).requires_grad_();
  Tensor dw = grad({matmul(w, w.mT()).sum()}, {w})[0];  // functional: w.grad() stays undefined
  std::cout << "dw " << dw << " w.grad defined: " << w.grad().defined() << "\n";
  NoGradGuard no_grad;            // nothing below is recorded
  Tensor wt = w.transpose(0, 1);  // a view: no copy
  std::cout << "shares storage: " << wt.shares_storage(w) << "\n";
  auto wrapper = nn::fused_to_wrapper(mha);  // same maths, one module per head
  std::cout << "wrapper vs fused: " << (wrapper->forward(x) - mha.forward(x)).abs().max() << "\n";
}
