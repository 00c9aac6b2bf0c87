// Learned head gates with an L0 penalty (Voita, Talbot, Moiseev, Sennrich & Titov 2019, "Analyzing
// Multi-Head Self-Attention"), on a frozen model: every head's context is multiplied by a
// hard-concrete gate z_h (Louizos, Welling & Kingma 2018) with a learned log_alpha_h,
//   u ~ U(0, 1), s = sigmoid((log u - log(1 - u) + log_alpha) / beta), z = clamp(s (zeta - gamma) + gamma, 0, 1),
// and the loss is the task's cross entropy plus penalty * sum_h P(z_h != 0), where
// P(z_h != 0) = sigmoid(log_alpha_h - beta log(-gamma / zeta)). At test time z_h =
// clamp(sigmoid(log_alpha_h) (zeta - gamma) + gamma, 0, 1): a head whose gate is 0 is closed.
// One run per penalty strength, from the same start; only log_alpha trains (Adam).
#pragma once
#include <cstdint>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

// The hard-concrete constants of both papers.
constexpr double kL0Beta = 2.0 / 3.0, kL0Gamma = -0.1, kL0Zeta = 1.1;

struct L0Options {
  // Per head, closing it pays off once the penalty exceeds what the head is worth in loss: from
  // ~1e-3 (a free head of a toy model at loss 1e-3) to ~0.3 (a head of a character model).
  std::vector<double> penalties = {0.001, 0.003, 0.01, 0.03, 0.1, 0.3};
  int64_t steps = 200;        // Adam steps per penalty
  int64_t batch_size = 64;    // rows of the task's training stream per step
  double lr = 0.1;            // Adam's, on log_alpha
  double init_log_alpha = 3;  // P(gate open) ~ 1 at the start
  uint64_t seed = 1;          // the gates' noise
};
struct L0Point {
  double penalty = 0;
  HeadMatrix log_alpha, gate;                       // learned; the test-time gate (0: closed)
  std::vector<std::pair<int64_t, int64_t>> closed;  // (layer, head) whose test-time gate is 0
  Scores scores;          // on the analysis data with the closed heads masked (the others open)
  double final_loss = 0;  // cross entropy of the last training step (with sampled gates)
};
struct L0Result {
  std::vector<L0Point> points;  // one per penalty, in the order given
  // Heads least needed first: by the smallest penalty that closes them (never: last), then by their
  // log_alpha summed over the penalties. Criterion::l0's order.
  HeadMatrix rank;  // position in that order, per head
};
L0Result l0_gates(nn::DecoderModel& model, const tasks::Task& task, const EvalSet& data, const L0Options& options = {});

// The test-time gate of a log_alpha (above).
double l0_test_gate(double log_alpha);

}  // namespace headlab::analysis
