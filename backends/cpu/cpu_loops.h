// Loop drivers for the CPU backend. A Loop (already collapsed by ops/) is split into rows along its
// last dim; each kernel supplies a row function whose unit-stride and broadcast (stride 0) cases
// are plain indexed loops the compiler vectorises. OpenMP splits rows, or one long row, across threads.
#pragma once
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backends/backend.h"

namespace headlab::cpu {

constexpr int64_t kParallelGrain = 32768;  // below this many elements threads cost more than they save

// Whether `parallel` work goes to a team of threads: only when there is more than one to go to. Entering
// an OpenMP region costs libgomp a futex call even for a team of one (1.3 us; 2.6 us inside the threads
// of data-parallel training, where every op's kernels run one thread and the calls contend), so a loop
// that would run on one thread does not enter one: a step of the demo's model runs ~600 such loops.
inline bool use_team(bool parallel) { return parallel && omp_get_max_threads() > 1; }

// body(i) for i in [lo, hi): the one place body is called, so that it inlines into a loop the compiler
// vectorises whichever way parallel_for runs it. A function of its own (as an OpenMP region's body is):
// inlined into a kernel that dispatches over many ops, it would exhaust GCC's inlining budget there and
// leave exp and tanh as calls.
template <typename Body>
[[gnu::noinline]] void serial_for(int64_t lo, int64_t hi, Body& body) {
  for (int64_t i = lo; i < hi; ++i) body(i);
}

// body(i) for i in [0, n): in equal contiguous parts over the threads when `parallel`, else inline.
template <typename Body>
inline void parallel_for(int64_t n, bool parallel, Body&& body) {
  if (!use_team(parallel && n > 1)) return serial_for(0, n, body);
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    serial_for(n * t / nt, n * (t + 1) / nt, body);
  }
}

// body(i) for i in [0, n), each thread of the team taking the next i when it finishes one (a dynamic schedule:
// for parts whose cost the other tenants of the memory bus decide, as decoding's GEMV bands), else inline.
template <typename Body>
inline void parallel_for_dynamic(int64_t n, bool parallel, Body&& body) {
  if (!use_team(parallel && n > 1)) return serial_for(0, n, body);
  std::atomic<int64_t> next{0};
#pragma omp parallel
  for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) body(i);
}

// body(thread, threads) on each thread of a team of up to `threads` when more than one, else body(0, 1)
// inline. body splits its work by (thread, threads) itself: an `omp for` in it would bind to an enclosing
// team (data-parallel training's) when it runs inline.
template <typename Body>
inline void parallel_team(int threads, Body&& body) {
  if (use_team(threads > 1)) {
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num(), omp_get_num_threads());
  } else {
    body(0, 1);
  }
}

// row(base_offsets[NOPS], n, inner_strides[NOPS]) is called for every row of the loop.
template <int NOPS, typename RowFn>
void for_each_row(const Loop& l, RowFn&& row) {
  int64_t inner_strides[NOPS];
  if (l.ndim == 0) {
    int64_t base[NOPS] = {};
    for (int k = 0; k < NOPS; ++k) inner_strides[k] = 0;
    row(base, int64_t{1}, inner_strides);
    return;
  }
  const int nd = l.ndim;
  for (int k = 0; k < NOPS; ++k) inner_strides[k] = l.strides[k][nd - 1];
  const int64_t inner = l.sizes[nd - 1];
  int64_t outer = 1;
  for (int d = 0; d < nd - 1; ++d) outer *= l.sizes[d];
  if (outer == 1) {  // one long row: split it into chunks
    const int64_t chunks = inner > kParallelGrain ? std::min<int64_t>(omp_get_max_threads() * 4, inner / 4096) : 1;
    parallel_for(chunks, chunks > 1, [&](int64_t c) {
      const int64_t lo = inner * c / chunks, hi = inner * (c + 1) / chunks;
      int64_t base[NOPS];
      for (int k = 0; k < NOPS; ++k) base[k] = lo * inner_strides[k];
      row(base, hi - lo, inner_strides);
    });
    return;
  }
  parallel_for(outer, outer * inner > kParallelGrain, [&](int64_t o) {
    int64_t base[NOPS] = {};
    int64_t rem = o;
    for (int d = nd - 2; d >= 0; --d) {
      const int64_t idx = rem % l.sizes[d];
      rem /= l.sizes[d];
      for (int k = 0; k < NOPS; ++k) base[k] += idx * l.strides[k][d];
    }
    row(base, inner, inner_strides);
  });
}

// o[i*so] = f(a[i*sa]) with unit-stride and broadcast fast paths.
template <typename TO, typename TA, typename F>
inline void map1(TO* __restrict o, int64_t so, const TA* __restrict a, int64_t sa, int64_t n, F f) {
  if (so == 1 && sa == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i]);
  } else if (so == 1 && sa == 0) {
    const TO v = f(a[0]);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) o[i * so] = f(a[i * sa]);
  }
}

// o[i*so] = f(a[i*sa], b[i*sb]) with unit-stride and broadcast fast paths.
template <typename TO, typename TA, typename TB, typename F>
inline void map2(TO* __restrict o, int64_t so, const TA* __restrict a, int64_t sa, const TB* __restrict b, int64_t sb,
                 int64_t n, F f) {
  if (so == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
  } else if (so == 1 && sa == 1 && sb == 0) {
    const TB bv = b[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], bv);
  } else if (so == 1 && sa == 0 && sb == 1) {
    const TA av = a[0];
    for (int64_t i = 0; i < n; ++i) o[i] = f(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) o[i * so] = f(a[i * sa], b[i * sb]);
  }
}

}  // namespace headlab::cpu
