// Timing statistics and rank correlation.
#include "analysis/stats.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "backends/backend.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double percentile(std::vector<double> v, double q) {  // linear interpolation, as numpy's default
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

// ---- timing and comparisons ----
namespace {
TimeStats summarize(const std::vector<double>& t) {
  TimeStats s;
  s.repeats = static_cast<int64_t>(t.size());
  s.median = percentile(t, 0.5);
  s.p25 = percentile(t, 0.25);
  s.p75 = percentile(t, 0.75);
  s.min = *std::min_element(t.begin(), t.end());
  s.max = *std::max_element(t.begin(), t.end());
  return s;
}
}  // namespace

std::vector<TimeStats> time_interleaved(const std::vector<std::function<void()>>& fns, Device device, int64_t warmup,
                                        int64_t repeats) {
  HL_CHECK(repeats > 0, "time_interleaved: repeats must be positive, got ", repeats);
  Backend& be = backend_for(device);
  for (int64_t i = 0; i < warmup; ++i)
    for (const auto& fn : fns) fn();
  be.synchronize();
  std::vector<std::vector<double>> t(fns.size());
  for (int64_t i = 0; i < repeats; ++i)
    for (size_t k = 0; k < fns.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[k]();
      be.synchronize();
      t[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<TimeStats> out;
  for (const auto& v : t) out.push_back(summarize(v));
  return out;
}

TimeStats time_call(const std::function<void()>& fn, Device device, int64_t warmup, int64_t repeats) {
  return time_interleaved({fn}, device, warmup, repeats).front();
}

namespace {

// The pairs where neither value is NaN.
std::pair<std::vector<double>, std::vector<double>> finite_pairs(const char* who, const std::vector<double>& x_in,
                                                                 const std::vector<double>& y_in) {
  HL_CHECK(x_in.size() == y_in.size(), who, ": ", x_in.size(), " and ", y_in.size(), " values");
  std::vector<double> x, y;
  for (size_t i = 0; i < x_in.size(); ++i)
    if (!std::isnan(x_in[i]) && !std::isnan(y_in[i])) x.push_back(x_in[i]), y.push_back(y_in[i]);
  return {x, y};
}

double pearson_of(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() < 2) return kNaN;
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n, my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : kNaN;
}

}  // namespace

double pearson_correlation(const std::vector<double>& x_in, const std::vector<double>& y_in) {
  const auto [x, y] = finite_pairs("pearson_correlation", x_in, y_in);
  return pearson_of(x, y);
}

double rank_correlation(const std::vector<double>& x_in, const std::vector<double>& y_in) {
  const auto [x, y] = finite_pairs("rank_correlation", x_in, y_in);
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * static_cast<double>(i + j);
      i = j + 1;
    }
    return r;
  };
  return pearson_of(ranks(x), ranks(y));
}

}  // namespace headlab::analysis
