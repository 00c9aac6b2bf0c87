// Timing statistics (medians of interleaved runs) and Spearman rank correlation.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.h"

namespace headlab::analysis {

// ------------------------------------------------------------------------------------------------
// Timing: `warmup` untimed calls, then `repeats` timed ones (device synchronised around each).
struct TimeStats {
  double median = 0, p25 = 0, p75 = 0, min = 0, max = 0;  // seconds
  int64_t repeats = 0;
};
TimeStats time_call(const std::function<void()>& fn, Device device, int64_t warmup, int64_t repeats);
// Several calls timed in turn within each repeat, so that a busy machine slows them alike.
std::vector<TimeStats> time_interleaved(const std::vector<std::function<void()>>& fns, Device device, int64_t warmup,
                                        int64_t repeats);

// Pearson correlation; NaN pairs are skipped; NaN when fewer than 2 pairs remain or one side is constant.
double pearson_correlation(const std::vector<double>& x, const std::vector<double>& y);
// Spearman rank correlation (ties get their mean rank): Pearson's of the ranks; NaN pairs are skipped.
double rank_correlation(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace headlab::analysis
