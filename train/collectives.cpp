// The single-process transport, and world(): MPI when built in and launched by mpirun.
#include "train/collectives.h"

#include <cstdlib>

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

std::shared_ptr<Collectives> world() {
  static const std::shared_ptr<Collectives> w = [] {
    const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
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

}  // namespace headlab::train
