// The threads transport: data parallelism over the threads of one process. Each thread is a rank with
// its own model; a collective meets at a barrier, each thread sums its slice of the elements over
// every thread's buffer (in thread order, so every run sums alike) and writes the sum back into all of
// them; with an outer transport (MPI ranks), thread 0 then reduces across the processes and the others
// copy its result.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <vector>

#include "autograd/generator.h"
#include "train/collectives.h"

namespace headlab::train {

namespace {

// A spin-wait's pause: it leaves the core's shared resources to a sibling hardware thread (on a
// virtual machine, possibly another vCPU of this run) and costs little latency.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// What the threads of one run share: a reusable barrier that a failed thread breaks, and a slot per
// thread for the buffer it brings to the current collective.
class ThreadGroup {
 public:
  ThreadGroup(int threads, std::shared_ptr<Collectives> outer)
      : threads_(threads),
        outer_(std::move(outer)),
        slots_(static_cast<size_t>(threads), nullptr),
        spin_(outer_->local_size() * threads <= omp_get_num_procs() ? kSpin : std::chrono::microseconds{0}) {}

  int threads() const { return threads_; }
  Collectives& outer() const { return *outer_; }
  void*& slot(int thread) { return slots_[static_cast<size_t>(thread)]; }

  // Returns once every thread has arrived; throws ThreadGroupStopped once any thread has failed. A
  // waiter spins for up to kSpin before it sleeps: waking a sleeping thread costs tens of microseconds
  // on a virtual machine, and the threads' steps often end more than 100 us apart there (the demo's
  // model: 6 sleeps a step with 100 us of spinning, 2.7 with 2 ms). Only while every rank on this
  // machine has a core of its own: a spinning thread would otherwise take a core from a working one.
  void arrive_and_wait() {
    stop_if_failed();
    const uint64_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) {
      arrived_.store(0, std::memory_order_relaxed);  // (nobody arrives again before the generation moves)
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        generation_.store(generation + 1, std::memory_order_release);
      }
      woken_.notify_all();
      return;
    }
    const auto until = std::chrono::steady_clock::now() + spin_;
    for (int i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
      stop_if_failed();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    woken_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != generation || failed_.load(); });
    if (generation_.load(std::memory_order_acquire) == generation) stop_if_failed();
  }
  void fail() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      failed_.store(true);
    }
    woken_.notify_all();
  }

 private:
  static constexpr std::chrono::microseconds kSpin{2000};
  void stop_if_failed() const {
    if (failed_.load()) throw ThreadGroupStopped("data parallelism: another thread of this run failed");
  }
  const int threads_;
  const std::shared_ptr<Collectives> outer_;
  std::vector<void*> slots_;
  const std::chrono::microseconds spin_;
  std::mutex mutex_;
  std::condition_variable woken_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> failed_{false};
};

class ThreadRank final : public Collectives {
 public:
  ThreadRank(std::shared_ptr<ThreadGroup> group, int thread) : group_(std::move(group)), thread_(thread) {}
  int rank() const override { return group_->outer().rank() * group_->threads() + thread_; }
  int size() const override { return group_->outer().size() * group_->threads(); }
  int local_size() const override { return group_->outer().local_size() * group_->threads(); }
  int processes() const override { return group_->outer().processes(); }
  std::string name() const override {
    const std::string threads = std::to_string(group_->threads()) + " threads";
    return group_->outer().size() > 1 ? group_->outer().name() + " x " + threads : threads;
  }
  void allreduce_sum(float* data, int64_t n) override { allreduce(data, n); }
  void allreduce_sum(double* data, int64_t n) override { allreduce(data, n); }
  void broadcast(void* data, int64_t bytes, int root) override {
    ThreadGroup& g = *group_;
    const int root_process = root / g.threads(), root_thread = root % g.threads();
    const bool here = root_process == g.outer().rank();
    g.slot(thread_) = data;
    g.arrive_and_wait();
    if (here && thread_ == 0 && root_thread != 0) std::memcpy(data, g.slot(root_thread), static_cast<size_t>(bytes));
    g.arrive_and_wait();  // thread 0 holds the root's bytes
    if (thread_ == 0 && g.outer().size() > 1) g.outer().broadcast(data, bytes, root_process);
    g.arrive_and_wait();
    if (thread_ != 0) std::memcpy(data, g.slot(0), static_cast<size_t>(bytes));
    g.arrive_and_wait();  // nobody leaves while another still reads its buffer
  }
  void barrier() override {
    group_->arrive_and_wait();
    if (thread_ == 0 && group_->outer().size() > 1) group_->outer().barrier();
    group_->arrive_and_wait();
  }
  [[noreturn]] void abort(int code) override {
    group_->fail();
    group_->outer().abort(code);
    std::exit(code);  // (not reached)
  }

 private:
  template <typename T>
  void allreduce(T* data, int64_t n) {
    ThreadGroup& g = *group_;
    const int threads = g.threads();
    g.slot(thread_) = data;
    g.arrive_and_wait();
    const int64_t per = (n + threads - 1) / threads, first = std::min(n, thread_ * per),
                  last = std::min(n, first + per);
    // Block by block, so that the sums vectorise whatever the thread count.
    constexpr int64_t kBlock = 1024;
    T sum[kBlock];
    for (int64_t i0 = first; i0 < last; i0 += kBlock) {
      const int64_t n = std::min(kBlock, last - i0);
      std::fill_n(sum, n, T(0));
      for (int t = 0; t < threads; ++t) {
        const T* from = static_cast<const T*>(g.slot(t)) + i0;
        for (int64_t j = 0; j < n; ++j) sum[j] += from[j];
      }
      for (int t = 0; t < threads; ++t) std::copy_n(sum, n, static_cast<T*>(g.slot(t)) + i0);
    }
    g.arrive_and_wait();
    if (g.outer().size() == 1) return;  // (every buffer holds the sums; none is read again)
    if (thread_ == 0) g.outer().allreduce_sum(data, n);
    g.arrive_and_wait();
    if (thread_ != 0) std::copy(static_cast<T*>(g.slot(0)), static_cast<T*>(g.slot(0)) + n, data);
    g.arrive_and_wait();
  }

  std::shared_ptr<ThreadGroup> group_;
  int thread_;
};

}  // namespace

void run_on_threads(int threads, const std::shared_ptr<Collectives>& outer,
                    const std::function<void(const std::shared_ptr<Collectives>&)>& fn) {
  HL_CHECK(threads >= 1, "data parallelism: threads must be at least 1, got ", threads);
  HL_CHECK(outer != nullptr, "data parallelism: run_on_threads needs an outer transport (single_process())");
  const auto group = std::make_shared<ThreadGroup>(threads, outer);
  const Generator start = default_generator();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  int team = 0;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    team = omp_get_num_threads();  // (the single's barrier: every thread sees it below)
    try {
      // Too few threads (a caller already inside a parallel region, a thread limit): every thread of
      // the team sees it and none enters a collective that would wait forever.
      HL_CHECK(team == threads, "data parallelism: asked for ", threads, " threads, OpenMP started ", team,
               omp_in_parallel() && omp_get_level() > 1 ? " (called inside a parallel region)" : "");
      omp_set_num_threads(1);  // this thread's own kernels: nested regions run one thread
      std::optional<ThreadGenerator> own;
      if (t != 0) own.emplace(start);  // thread 0 keeps the caller's, which moves on as rank 0's does
      fn(std::make_shared<ThreadRank>(group, t));
    } catch (...) {
      errors[static_cast<size_t>(t)] = std::current_exception();
      group->fail();
    }
  }
  // The error that stopped the run, not another thread's ThreadGroupStopped; thread 0's first.
  std::exception_ptr stopped;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const ThreadGroupStopped&) {
      if (!stopped) stopped = e;
    } catch (...) {
      throw;
    }
  }
  if (stopped) std::rethrow_exception(stopped);
}

}  // namespace headlab::train
