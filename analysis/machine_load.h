// How busy the rest of the machine was while a measurement ran: the CPU time every process used
// (/proc/stat) minus this process's own and its waited-for children's (/proc/self/stat: a PyTorch peer
// run as a child counts as ours), over the wall time, in cores. A timing made while other work shares the
// CPU can be off by several times, so the commands that time things say so (compare; bench/).
#pragma once
#include <chrono>
#include <string>

namespace headlab::analysis {

class OtherLoad {
 public:
  OtherLoad();  // starts counting
  // The other processes' mean use since construction, in busy cores; NaN where /proc cannot be read.
  double cores() const;
  // "" when quiet (under kBusyCores), else a sentence saying how busy and what it means for the timings.
  std::string warning() const;
  static constexpr double kBusyCores = 0.5;

 private:
  double all_start_ = 0, own_start_ = 0;  // seconds of CPU time
  std::chrono::steady_clock::time_point wall_start_;
};

}  // namespace headlab::analysis
