// Nanda et al. 2023's grokking analysis on the paper's own checkpoint (examples/grokking.h; docs/grokking.md):
// accuracy and the losses over the paper's split beside the stored ones, the stored loss curves, the embedding's
// Fourier spectrum and key frequencies, the neurons' frequencies, and the restricted and excluded losses.
//   usage: grokking [--model PATH] [--out DIR] [--check]     (run from the repository root)
// --check exits 1 unless the numbers agree with the paper's claims (failures() in examples/grokking.h).
#include <exception>
#include <iostream>
#include <string>

#include "examples/grokking.h"

int main(int argc, char** argv) {
  namespace g = headlab::examples::grokking;
  g::Options o;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--check") {
      check = true;
    } else if ((a == "--model" || a == "--out") && i + 1 < argc) {
      (a == "--model" ? o.model : o.out) = argv[++i];
    } else {
      std::cerr << "usage: grokking [--model PATH] [--out DIR] [--check]\n  --model  default " << o.model
                << "\n  --out    default " << o.out << "\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    const g::Report r = g::run(o, std::cout);
    if (!check) return 0;
    const auto failed = g::failures(r);
    for (const auto& f : failed) std::cerr << "grokking --check: " << f << "\n";
    if (failed.empty()) std::cout << "check passed\n";
    return failed.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "grokking: " << e.what() << "\n";
    return 2;
  }
}
