// The trainer's data parallelism (train/trainer.h): the one allreduce of every gradient per step, its
// time on the session, the check that every rank holds the same parameters, and whether a CPU run
// splits its batches over threads (ThreadUse).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/hash.h"
#include "train/trainer.h"
#include "train/trainer_internal.h"

namespace headlab::train {

double allreduce_gradients(Collectives& comm, const std::vector<Tensor>& params, std::vector<float>& extra) {
  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  // A fresh buffer each step, and the sums handed back as views of it: no copy back, and no gradient
  // aliases another tensor (a gradient from backward may be shared with another parameter's).
  const Tensor flat = Tensor::empty({total + static_cast<int64_t>(extra.size())}, DType::f32, kCPU);
  float* data = flat.data<float>();
  int64_t at = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    const int64_t n = p.numel();
    if (g.defined()) {
      HL_CHECK(g.dtype() == DType::f32, "train: data parallelism reduces float32 gradients, got ",
               dtype_name(g.dtype()));
      flat.narrow(0, at, n).view(p.shape()).copy_(g);
    } else {
      std::fill(data + at, data + at + n, 0.0f);
    }
    at += n;
  }
  std::copy(extra.begin(), extra.end(), data + at);
  comm.allreduce_sum(data, flat.numel());
  double squares = 0;  // the norm here, summed in double as grad_norm sums: not several ops per parameter
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < total; ++i) squares += static_cast<double>(data[i]) * data[i];
  at = 0;
  for (const Tensor& p : params) {
    const Tensor sum = flat.narrow(0, at, p.numel()).view(p.shape());
    p.set_grad(p.device() == flat.device() ? sum : sum.to(p.device()));
    at += p.numel();
  }
  std::copy(data + at, data + flat.numel(), extra.begin());
  return std::sqrt(squares);
}

double Trainer::all_reduce_gradients(Session& s, std::vector<float>& extra) const {
  const auto start = std::chrono::steady_clock::now();
  const double norm = allreduce_gradients(*opts_.comm, s.params, extra);
  s.allreduce_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return norm;
}

// Every rank steps its own copy of the model with the same summed gradients, so the copies stay
// bitwise equal unless something is not deterministic (a rank on another CPU, another OpenBLAS).
// Checked at the start and at every evaluation: a 64-bit FNV-1a hash of the parameters, compared
// with rank 0's.
void Trainer::check_ranks_agree(const Session& s) const {
  Collectives& comm = *opts_.comm;
  if (comm.size() == 1) return;
  uint64_t hash = kFnv1aStart;
  for (const Tensor& p : s.params) {
    const Tensor host = p.detach().to(kCPU).contiguous();
    hash = fnv1a64(host.raw_data(), static_cast<size_t>(host.numel()) * dtype_size(host.dtype()), hash);
  }
  uint64_t root = hash;
  comm.broadcast(&root, sizeof root, 0);
  double differing = root == hash ? 0.0 : 1.0;
  comm.allreduce_sum(&differing, 1);
  HL_CHECK(differing == 0, "train: data parallelism: at step ", s.state.step, " the parameters of ",
           static_cast<int64_t>(differing), " of ", comm.size(), " ranks differ from rank 0's (", comm.name(),
           "); the ranks must run the same headlab build on the same kind of CPU");
}

int Trainer::data_parallel_threads(const Session& s) const {
  const int threads = omp_get_max_threads();
  if (opts_.thread_use == ThreadUse::ops || threads == 1) return 1;
  const RunSettings& run = s.config.run;
  const int64_t ranks = static_cast<int64_t>(opts_.comm->size()) * threads;
  const bool cpu = !s.model->device().is_cuda();
  if (opts_.thread_use == ThreadUse::data) {
    HL_CHECK(cpu, "train: --parallel data splits a batch over CPU threads; this run is on ", s.model->device().str());
    HL_CHECK(run.batch_size % ranks == 0, "train: --parallel data: --batch-size ", run.batch_size,
             " does not split evenly over ", ranks, " threads", opts_.comm->size() > 1 ? " (all ranks)" : "",
             "; use a multiple of ", ranks);
    return threads;
  }
  const int slots = s.config.optimizer.kind == optim::OptimizerKind::sgd ? 1 : 2;
  const double replicas = static_cast<double>(threads - 1) * static_cast<double>(s.model->num_parameters()) *
                          static_cast<double>(sizeof(float) * (2 + slots));
  const bool pays =
      cpu && run.batch_size % ranks == 0 && (run.batch_size / ranks) % 4 == 0 && replicas <= kMaxReplicaBytes;
  return pays ? threads : 1;
}

}  // namespace headlab::train
