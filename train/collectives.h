// Collectives: what data-parallel training needs from the processes it runs on, behind one small
// interface, as the CUDA backend sits behind backends/backend.h. A transport implements it: a single
// process (nothing to do), MPI (train/collectives_mpi.cpp, built with HEADLAB_MPI), the threads of one
// process (train/collectives_threads.cpp), which composes with MPI. NCCL would be another: the same calls on device
// buffers with ncclAllReduce / ncclBroadcast on one stream, the communicator made from an ncclUniqueId that rank 0
// broadcasts over MPI (docs/data-parallel.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/error.h"

namespace headlab::train {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_size() const = 0;               // ranks on this machine (they share its cores)
  virtual int processes() const { return size(); }  // the processes the ranks run in
  virtual std::string name() const = 0;             // "single process", "MPI (Open MPI 4.1.4)"
  // Element-wise sum over every rank, in place, host memory. Every rank receives the same values.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  virtual void allreduce_sum(double* data, int64_t n) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank now (an error on one rank must not leave the others waiting in a collective).
  [[noreturn]] virtual void abort(int code) = 0;
};

std::shared_ptr<Collectives> single_process();
// True when an MPI launcher started this process (mpirun / mpiexec set OMPI_COMM_WORLD_SIZE, PMI_SIZE or
// PMIX_RANK).
bool launched_by_mpi();
// The processes this one was started among: MPI when headlab was built with it and started by an
// MPI launcher (mpirun / mpiexec set OMPI_COMM_WORLD_SIZE or PMI_SIZE), else a single process.
// Initialises MPI on first use; finalised at exit.
std::shared_ptr<Collectives> world();
bool built_with_mpi();

// Ranks that were started with different commands must not begin: one rank's different --steps or --rows
// sends it into a collective the others never enter (a hang, MPI_ERR_TRUNCATE, a crash). `config` is
// this rank's whole effective configuration, a "name=value" a line; every rank receives every rank's,
// and on any difference every rank throws RanksDisagree with the same message, naming the first rank
// and line that differ from rank 0's. Costs one broadcast per rank.
void agree_across_ranks(Collectives& comm, const std::string& config, const std::string& command);

class RanksDisagree : public Error {
 public:
  using Error::Error;
};

// Data parallelism over threads: runs fn on `threads` threads of one OpenMP team (the calling thread is
// thread 0), each with its own Collectives: rank outer.rank() x threads + thread of outer.size() x
// threads. Inside, each thread's kernels are single-threaded (a nested OpenMP region and OpenBLAS run
// one thread) and its default_generator() is its own, a copy of the calling thread's. An error on one
// thread wakes the others out of their collectives (a ThreadGroupStopped error) and is rethrown here
// once every thread has returned.
void run_on_threads(int threads, const std::shared_ptr<Collectives>& outer,
                    const std::function<void(const std::shared_ptr<Collectives>&)>& fn);

// What a thread of run_on_threads gets from a collective when another thread of its group failed.
class ThreadGroupStopped : public Error {
 public:
  using Error::Error;
};

}  // namespace headlab::train
