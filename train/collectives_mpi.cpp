// The MPI transport (HEADLAB_MPI): MPI_Allreduce / MPI_Bcast on MPI_COMM_WORLD. Only this file
// includes mpi.h, so the rest of headlab builds the same with and without MPI.
#ifdef HEADLAB_HAVE_MPI
#include <mpi.h>

#include <cstdlib>
#include <limits>

#include "base/error.h"
#include "train/collectives.h"

namespace headlab::train {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  HL_FAIL("MPI: ", what, " failed: ", std::string(text, static_cast<size_t>(len)));
}

// MPI counts are int: large buffers go in pieces.
template <typename T>
void allreduce_in_pieces(T* data, int64_t n, MPI_Datatype type) {
  constexpr int64_t kPiece = std::numeric_limits<int>::max() / 2;
  for (int64_t first = 0; first < n; first += kPiece) {
    const int count = static_cast<int>(std::min(kPiece, n - first));
    check(MPI_Allreduce(MPI_IN_PLACE, data + first, count, type, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
}

class Mpi final : public Collectives {
 public:
  Mpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) check(MPI_Init(nullptr, nullptr), "MPI_Init");
    // Errors come back as codes (and become headlab::Error) instead of ending the job silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    library_ = std::string(version, static_cast<size_t>(len));
    library_ = library_.substr(0, library_.find(','));
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  std::string name() const override { return "MPI (" + library_ + ")"; }
  void allreduce_sum(float* data, int64_t n) override { allreduce_in_pieces(data, n, MPI_FLOAT); }
  void allreduce_sum(double* data, int64_t n) override { allreduce_in_pieces(data, n, MPI_DOUBLE); }
  void broadcast(void* data, int64_t bytes, int root) override {
    HL_CHECK(bytes <= std::numeric_limits<int>::max(), "MPI: broadcast of ", bytes, " bytes is too large");
    check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  int rank_ = 0, size_ = 1, local_size_ = 1;
  std::string library_;
};

}  // namespace

std::shared_ptr<Collectives> mpi_world() { return std::make_shared<Mpi>(); }

}  // namespace headlab::train
#endif
