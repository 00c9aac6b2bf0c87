// What a training run tells its user while it runs: on a terminal a bar redrawn every step, otherwise a
// line every --log-every steps; the evaluations and notices as lines; the closing summary; metrics.csv.
// Rank 0 speaks for a data-parallel run (the others are quiet).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace headlab::train {

// A value that may be huge or not finite: "nan", "inf", "1.94457e+15", "2.6972".
std::string fmt_value(double v);

// metrics.csv: step,train_loss,val_loss,val_accuracy,val_exact_match,lr,grad_norm,tokens_per_s
void write_metrics_csv(const std::string& path, const std::vector<io::MetricRow>& rows);

class Progress {
 public:
  Progress(bool quiet, bool tty, int64_t log_every) : quiet_(quiet), tty_(tty && !quiet), log_every_(log_every) {}
  // A line of its own (the bar, if drawn, ends first).
  void line(const std::string& text);
  // After step `step` of `steps`, started from `first_step` `elapsed` seconds ago: the bar, or a line
  // every log_every steps (and after the first). loss: the mean since the last evaluation.
  void step(int64_t step, int64_t first_step, int64_t steps, double elapsed, double loss, double lr, double grad_norm,
            double tokens_per_s);
  // The bar's end, before the closing summary.
  void finish();

 private:
  void break_bar();
  bool quiet_, tty_;
  int64_t log_every_;
  bool bar_open_ = false;
};

}  // namespace headlab::train
