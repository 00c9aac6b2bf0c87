// The single-process transport, and world(): MPI when built in and launched by mpirun.
#include "train/collectives.h"

#include <cstdlib>
#include <sstream>
#include <vector>

#include "base/error.h"

namespace headlab::train {

namespace {

class SingleProcess final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void allreduce_sum(float*, int64_t) override {}
  void allreduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

}  // namespace

std::shared_ptr<Collectives> single_process() { return std::make_shared<SingleProcess>(); }

#ifdef HEADLAB_HAVE_MPI
std::shared_ptr<Collectives> mpi_world();  // collectives_mpi.cpp
bool built_with_mpi() { return true; }
#else
bool built_with_mpi() { return false; }
#endif

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

std::shared_ptr<Collectives> world() {
  static const std::shared_ptr<Collectives> w = [] {
    const bool launched = launched_by_mpi();
#ifdef HEADLAB_HAVE_MPI
    if (launched) return mpi_world();
#else
    HL_CHECK(!launched,
             "train: started by an MPI launcher, but this headlab was built without MPI "
             "(install libopenmpi-dev and configure with -DHEADLAB_MPI=ON)");
#endif
    return single_process();
  }();
  return w;
}

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void agree_across_ranks(Collectives& comm, const std::string& config, const std::string& command) {
  if (comm.size() == 1) return;
  std::vector<std::string> configs(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    std::string& c = configs[static_cast<size_t>(r)];
    int64_t bytes = r == comm.rank() ? static_cast<int64_t>(config.size()) : 0;
    comm.broadcast(&bytes, sizeof bytes, r);
    c = r == comm.rank() ? config : std::string(static_cast<size_t>(bytes), '\0');
    comm.broadcast(c.data(), bytes, r);
  }
  const std::vector<std::string> first = lines_of(configs[0]);
  for (int r = 1; r < comm.size(); ++r) {
    if (configs[static_cast<size_t>(r)] == configs[0]) continue;
    const std::vector<std::string> other = lines_of(configs[static_cast<size_t>(r)]);
    size_t i = 0;
    while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
    const auto at = [&](const std::vector<std::string>& v) { return i < v.size() ? "'" + v[i] + "'" : "nothing"; };
    throw RanksDisagree(command + ": the " + std::to_string(comm.size()) +
                        " ranks were started with different options: rank 0 has " + at(first) + ", rank " +
                        std::to_string(r) + " has " + at(other) +
                        "; every rank must run the same command (nothing was run)");
  }
}

}  // namespace headlab::train
