// Head types from attention patterns, as the interpretability tools score them (TransformerLens's
// head detectors; Olsson et al. 2022 for induction heads). Per head, each a mean attention weight:
//   previous_token: on key q-1, over queries q >= 1 of the data;
//   first_token:    on key 0 (an "attention sink"), over queries q >= 1;
//   separator:      on the row's separator ('>' or '='; an encoder's [SEP]), over the queries after it (an
//                   encoder's: every query, as Clark et al. measure BERT's heads) (NaN without one);
//   self_token:     on key q itself, over queries q >= 1 (a label, "self", in an encoder only);
//   next_token:     on key q+1, over queries 1 <= q < last (an encoder's: Clark et al. 2019; NaN in a causal model);
//   entropy:        -sum_k w log w in nats over queries q >= 1, and normalised by its maximum
//                   log(keys it may see: q + 1, an encoder's every key) (1: uniform over them; 0: one key);
//   induction:      on rows of n random tokens repeated twice, the weight of each query in the second
//                   half on the token after the earlier occurrence of its own token (key q-n+1);
//   duplicate_token: on the same rows, the weight on that earlier occurrence itself (key q-n).
// Algorithmic tasks' padding after the end token is left out of the queries.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/heads.h"

namespace headlab::analysis {

// A label is given when a score is clear: most of the attention on one kind of key (0.5), or for
// the two repeated-sequence scores 0.4 (TransformerLens's detectors use 0.4 as the induction
// threshold; a random head puts ~1/q of its weight there); "broad" when the normalised entropy
// is >= 0.8 (the head spreads its weight over nearly everything it can see).
constexpr double kPatternThreshold = 0.5, kRepeatThreshold = 0.4, kBroadThreshold = 0.8;

struct HeadTypeScores {
  int64_t layer = 0, head = 0, original_head = 0;
  double previous_token = 0, first_token = 0, separator = 0, self_token = 0, next_token = 0, entropy = 0,
         entropy_normalized = 0;
  double induction = 0, duplicate_token = 0;
  std::string label;  // "previous-token", "induction+duplicate-token", ...; "" when no score is clear
};
struct HeadTypes {
  std::vector<HeadTypeScores> heads;  // layer-major
  int64_t queries = 0;                // query positions of the data the pattern scores average over
  int64_t separator_queries = 0;      // of them, after a separator
  int64_t induction_rows = 0, induction_half = 0, induction_queries = 0;
};
struct HeadTypeOptions {
  int64_t separator_id = -1;  // -1: none (chars)
  int64_t induction_rows = 32;
  int64_t induction_half = 0;  // n; 0: half the data rows' length (at most context_length / 2)
  uint64_t seed = 1;
  int64_t rows_per_forward = 0;  // rows whose attention weights are kept at once; 0: as ~256 MB allow
};
HeadTypes head_types(nn::DecoderModel& model, const EvalSet& data, const HeadTypeOptions& options = {});
// What head_types checks of its inputs, for a caller to check before any other work: rows of T tokens.
void check_head_types(const nn::DecoderShape& shape, int64_t T, const HeadTypeOptions& options);

// Olsson et al.'s prefix-matching data: rows of `half` tokens drawn uniformly from the vocabulary, each
// written twice: (rows, 2 half) int64 on the CPU, the same for the same seed.
Tensor repeated_random_tokens(int64_t vocab_size, int64_t rows, int64_t half, uint64_t seed);
// The same rows as evaluation data: only the second copy's tokens that an induction head can predict are
// scored (query q in [half, 2 half - 2], whose next token follows the earlier copy of its own), the rest
// ignored, so its loss is what copying from the context is worth.
EvalSet repeated_tokens_set(int64_t vocab_size, int64_t rows, int64_t half, uint64_t seed);

}  // namespace headlab::analysis
