// Sparse rows (backend.h): each row of a (rows, k) pair of values and indices names k rows of a table, as a TopK
// sparse autoencoder's codes name k of its features. What a dense product would spend on the zeros is not spent: a
// decoder reads k of d_sae rows per token, and the gradients touch only those rows.
#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_internal.h"

namespace headlab::cpu {

namespace {

// One row's k largest as (value, index), largest first, ties to the lower index. A min-heap of the best k so far:
// most entries of a long row lose one comparison against its root and are never moved.
template <typename T>
void topk_row(T* values, int64_t* idx, const T* x, int64_t cols, int64_t k, std::vector<std::pair<T, int64_t>>& heap) {
  // "a before b" in the heap's order: a is the worse of the two (smaller, or equal with the higher index)
  const auto worse = [](const std::pair<T, int64_t>& a, const std::pair<T, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  heap.clear();
  for (int64_t c = 0; c < k; ++c) heap.emplace_back(x[c], c);
  std::make_heap(heap.begin(), heap.end(), worse);
  for (int64_t c = k; c < cols; ++c) {
    if (!(x[c] > heap.front().first)) continue;  // equal values keep the earlier (lower) index
    std::pop_heap(heap.begin(), heap.end(), worse);
    heap.back() = {x[c], c};
    std::push_heap(heap.begin(), heap.end(), worse);
  }
  std::sort_heap(heap.begin(), heap.end(), worse);  // ascending in `worse` order: the best first
  for (int64_t j = 0; j < k; ++j) {
    values[j] = heap[j].first;
    idx[j] = heap[j].second;
  }
}

}  // namespace

void CpuBackend::topk_rows(DType dt, void* values, int64_t* idx, const void* x, int64_t rows, int64_t cols, int64_t k) {
  dispatch_float(dt, "topk", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* v = static_cast<T*>(values);
    const T* a = static_cast<const T*>(x);
    const int64_t threads = use_team(rows > 1 && rows * cols > kParallelGrain) ? omp_get_max_threads() : 1;
    std::vector<std::vector<std::pair<T, int64_t>>> heaps(static_cast<size_t>(threads));
    parallel_for(rows, threads > 1, [&](int64_t r) {
      auto& heap = heaps[static_cast<size_t>(omp_get_thread_num() % threads)];
      topk_row(v + r * k, idx + r * k, a + r * cols, cols, k, heap);
    });
  });
}

void CpuBackend::sparse_rows_gather(DType dt, void* out, const void* values, const int64_t* idx, const void* table,
                                    int64_t rows, int64_t k, int64_t n) {
  dispatch_float(dt, "sparse_matmul", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    const T *v = static_cast<const T*>(values), *w = static_cast<const T*>(table);
    parallel_for(rows, rows * k * n > kParallelGrain, [&](int64_t r) {
      T* orow = o + r * n;
      std::fill(orow, orow + n, T(0));
      for (int64_t j = 0; j < k; ++j) {
        const T s = v[r * k + j];
        const T* wrow = w + idx[r * k + j] * n;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) orow[c] += s * wrow[c];
      }
    });
  });
}

void CpuBackend::sparse_rows_dot(DType dt, void* dots, const void* a, const int64_t* idx, const void* table,
                                 int64_t rows, int64_t k, int64_t n) {
  dispatch_float(dt, "sparse_matmul", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* d = static_cast<T*>(dots);
    const T *x = static_cast<const T*>(a), *w = static_cast<const T*>(table);
    parallel_for(rows, rows * k * n > kParallelGrain, [&](int64_t r) {
      const T* xrow = x + r * n;
      for (int64_t j = 0; j < k; ++j) {
        const T* wrow = w + idx[r * k + j] * n;
        d[r * k + j] = static_cast<T>(lane_sum<T>(n, [=](int64_t c) { return xrow[c] * wrow[c]; }));
      }
    });
  });
}

void CpuBackend::sparse_rows_scatter(DType dt, void* out, const void* values, const int64_t* idx, const void* src,
                                     int64_t rows, int64_t k, int64_t n, int64_t entries) {
  // The pairs sorted by entry (a counting sort, stable: each entry's pairs in row order), then each entry's row
  // summed by one thread: no two threads write one row, and the sums' order does not depend on the thread count.
  std::vector<int64_t> start(static_cast<size_t>(entries) + 1, 0), order(static_cast<size_t>(rows * k));
  for (int64_t p = 0; p < rows * k; ++p) ++start[static_cast<size_t>(idx[p]) + 1];
  for (int64_t e = 0; e < entries; ++e) start[e + 1] += start[e];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t p = 0; p < rows * k; ++p) order[static_cast<size_t>(next[static_cast<size_t>(idx[p])]++)] = p;
  }
  dispatch_float(dt, "sparse_outer", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    const T *v = static_cast<const T*>(values), *s = static_cast<const T*>(src);
    parallel_for(entries, entries * n + rows * k * n > kParallelGrain, [&](int64_t e) {
      T* orow = o + e * n;
      std::fill(orow, orow + n, T(0));
      for (int64_t q = start[e]; q < start[e + 1]; ++q) {
        const int64_t p = order[q];
        const T scale = v[p];
        const T* srow = s + (p / k) * n;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) orow[c] += scale * srow[c];
      }
    });
  });
}

}  // namespace headlab::cpu
