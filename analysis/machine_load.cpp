#include "analysis/machine_load.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "analysis/table.h"

namespace headlab::analysis {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double ticks_per_second() { return static_cast<double>(sysconf(_SC_CLK_TCK)); }

// Busy CPU seconds of the whole machine: /proc/stat's "cpu" line, user + nice + system + irq + softirq + steal.
double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return kNaN;
  return (user + nice + system + irq + softirq + steal) / ticks_per_second();
}

// This process's CPU seconds and its waited-for children's: /proc/self/stat fields 14-17.
double own_busy_seconds() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  if (!std::getline(f, line)) return kNaN;
  const size_t close = line.rfind(')');  // the command name may hold spaces; the fields follow its ')'
  if (close == std::string::npos) return kNaN;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double sum = 0;
  for (int i = 3; i <= 17 && rest >> field; ++i)
    if (i >= 14) sum += std::strtod(field.c_str(), nullptr);
  return sum / ticks_per_second();
}

}  // namespace

OtherLoad::OtherLoad()
    : all_start_(machine_busy_seconds()), own_start_(own_busy_seconds()), wall_start_(std::chrono::steady_clock::now()) {}

double OtherLoad::cores() const {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
  const double others = (machine_busy_seconds() - all_start_) - (own_busy_seconds() - own_start_);
  if (!(wall > 0) || std::isnan(others)) return kNaN;
  return std::max(0.0, others / wall);
}

std::string OtherLoad::warning() const {
  const double c = cores();
  if (!(c >= kBusyCores)) return "";
  std::ostringstream os;
  os << "other processes kept " << fmt(c, 1) << " cores busy while this ran: the timings shared the CPU with them "
     << "and their ratios can be off by several times; rerun when the machine is quiet";
  return os.str();
}

}  // namespace headlab::analysis
