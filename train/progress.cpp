// The progress bar, the log lines and metrics.csv.
#include "train/progress.h"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "io/atomic_file.h"

namespace headlab::train {

namespace {

std::string fixed(double v, int precision) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(precision) << v;
  return os.str();
}

std::string fmt_rate(double tokens_per_s) { return fixed(tokens_per_s / 1000.0, 1) + "k tok/s"; }

std::string fmt_duration(double s) {
  const int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 60)
    os << t / 60 << "m" << std::setw(2) << std::setfill('0') << t % 60 << "s";
  else
    os << t << "s";
  return os.str();
}

}  // namespace

std::string fmt_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

void write_metrics_csv(const std::string& path, const std::vector<io::MetricRow>& rows) {
  std::ostringstream os;
  os << "step,train_loss,val_loss,val_accuracy,val_exact_match,lr,grad_norm,tokens_per_s\n";
  os << std::setprecision(8);
  for (const io::MetricRow& m : rows)
    os << m.step << ',' << m.train_loss << ',' << m.val_loss << ',' << m.val_accuracy << ',' << m.val_exact_match << ','
       << m.lr << ',' << m.grad_norm << ',' << m.tokens_per_s << '\n';
  io::write_file_atomic(path, os.str(), "train");
}

void Progress::break_bar() {
  if (bar_open_) std::cout << "\n";
  bar_open_ = false;
}

void Progress::line(const std::string& text) {
  if (quiet_) return;
  break_bar();
  std::cout << text << std::endl;
}

void Progress::step(int64_t step, int64_t first_step, int64_t steps, double elapsed, double loss, double lr,
                    double grad_norm, double tokens_per_s) {
  if (quiet_) return;
  const double eta = elapsed / static_cast<double>(step - first_step) * static_cast<double>(steps - step);
  if (tty_) {
    const int width = 24, filled = static_cast<int>(width * step / steps);
    std::cout << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << step << "/"
              << steps << "  loss " << fixed(loss, 4) << "  lr " << std::scientific << std::setprecision(1) << lr
              << std::defaultfloat << "  " << fmt_rate(tokens_per_s) << "  ETA " << fmt_duration(eta) << "   "
              << std::flush;
    bar_open_ = true;
  } else if (step % log_every_ == 0 || step == 1) {
    std::ostringstream os;
    os << "step " << step << "/" << steps << "  loss " << fixed(loss, 4) << "  lr " << std::scientific
       << std::setprecision(2) << lr << std::defaultfloat << "  grad_norm " << fixed(grad_norm, 3) << "  "
       << fmt_rate(tokens_per_s) << "  ETA " << fmt_duration(eta);
    line(os.str());
  }
}

void Progress::finish() { break_bar(); }

}  // namespace headlab::train
