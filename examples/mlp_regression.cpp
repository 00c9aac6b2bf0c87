// Fits y = sin(x) on [-3, 3] with a 1 -> 32 -> 1 tanh MLP and plain SGD, using only the core:
// tensors, ops and autograd (the loop itself lives in examples/mlp_regression.h, which the test
// suite runs too). Prints the loss every few hundred steps and exits non-zero unless it fell
// more than 10x.
//   usage: mlp_regression [steps=3000] [lr=0.05]
#include <algorithm>
#include <exception>
#include <iostream>
#include <string>

#include "examples/mlp_regression.h"

int main(int argc, char** argv) {
  try {
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : 3000;
    const double lr = argc > 2 ? std::stod(argv[2]) : 0.05;
    const headlab::examples::FitResult r =
        headlab::examples::fit_sine(steps, lr, std::max<int64_t>(steps / 10, 1), &std::cout);
    const double ratio = r.initial_loss / r.final_loss;
    std::cout << "initial loss " << r.initial_loss << ", final loss " << r.final_loss << ", ratio " << ratio << "x\n";
    if (!(ratio > 10)) {
      std::cerr << "mlp_regression: the loss fell only " << ratio << "x (expected more than 10x)\n";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "mlp_regression: " << e.what() << "\n";
    return 2;
  }
}
