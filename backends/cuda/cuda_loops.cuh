// The elementwise loop engine of the CUDA backend: a grid-stride kernel over a Loop (up to 4
// operands, element strides, broadcast by stride 0), in three forms chosen on the host:
// contiguous (every operand stride 1 in one dim: offset = i), strided 1-D (offset = i * stride)
// and general (offsets from the linear index by dividing through the sizes).
// Functors own the typed loads and stores, so one kernel template serves every op and dtype.
#pragma once
#include "backends/cuda/cuda_internal.cuh"

namespace headlab::cuda {

enum class LoopMode : int { contiguous, strided1d, general };

template <LoopMode kMode, int kNops, typename F>
__global__ void loop_kernel(Loop l, int64_t n, F f) {
  void* p[kNops];
  int64_t s0[kNops];
#pragma unroll
  for (int k = 0; k < kNops; ++k) {
    p[k] = l.ptr[k];
    s0[k] = l.strides[k][0];
  }
  for (int64_t i = global_thread(); i < n; i += grid_threads()) {
    int64_t off[kNops];
    if constexpr (kMode == LoopMode::contiguous) {
#pragma unroll
      for (int k = 0; k < kNops; ++k) off[k] = i;
    } else if constexpr (kMode == LoopMode::strided1d) {
#pragma unroll
      for (int k = 0; k < kNops; ++k) off[k] = i * s0[k];
    } else {
#pragma unroll
      for (int k = 0; k < kNops; ++k) off[k] = 0;
      int64_t rem = i;
      for (int d = l.ndim - 1; d > 0; --d) {
        const int64_t size = l.sizes[d];
        const int64_t q = rem / size;
        const int64_t idx = rem - q * size;
        rem = q;
#pragma unroll
        for (int k = 0; k < kNops; ++k) off[k] += idx * l.strides[k][d];
      }
#pragma unroll
      for (int k = 0; k < kNops; ++k) off[k] += rem * s0[k];  // rem < sizes[0] here
    }
    f(p, off);
  }
}

// Drops size-1 dims and merges dims that are contiguous with each other in every operand, so
// a Loop that the op layer did not fully collapse still takes the fast paths.
inline Loop collapse_loop(const Loop& l, int nops) {
  Loop c = l;
  int nd = 0;
  for (int d = 0; d < l.ndim; ++d) {
    if (l.sizes[d] == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < nops && merge; ++k) merge = c.strides[k][nd - 1] == l.strides[k][d] * l.sizes[d];
    if (merge) {
      c.sizes[nd - 1] *= l.sizes[d];
      for (int k = 0; k < nops; ++k) c.strides[k][nd - 1] = l.strides[k][d];
    } else {
      c.sizes[nd] = l.sizes[d];
      for (int k = 0; k < nops; ++k) c.strides[k][nd] = l.strides[k][d];
      ++nd;
    }
  }
  for (int d = nd; d < kMaxDims; ++d) {
    c.sizes[d] = 1;
    for (int k = 0; k < 4; ++k) c.strides[k][d] = 0;
  }
  c.ndim = nd;
  return c;
}

template <int kNops, typename F>
void run_loop(CudaBackend& be, const char* what, const Loop& loop, F f) {
  HL_CHECK(loop.ndim >= 0 && loop.ndim <= kMaxDims, "cuda ", what, ": loop has ", loop.ndim, " dims (at most ",
           kMaxDims, ")");
  int64_t n = 1;
  for (int d = 0; d < loop.ndim; ++d) {
    HL_CHECK(loop.sizes[d] >= 0, "cuda ", what, ": negative loop size ", loop.sizes[d]);
    n *= loop.sizes[d];
  }
  if (n == 0) return;
  const Loop l = collapse_loop(loop, kNops);
  be.activate();
  const int grid = be.grid_for(n);
  bool unit = true;
  for (int k = 0; k < kNops && l.ndim == 1; ++k) unit = unit && l.strides[k][0] == 1;
  if (l.ndim == 0 || (l.ndim == 1 && unit))  // a scalar (ndim 0) has offset 0 = i for its one element
    loop_kernel<LoopMode::contiguous, kNops><<<grid, kThreads, 0, be.stream()>>>(l, n, f);
  else if (l.ndim == 1)
    loop_kernel<LoopMode::strided1d, kNops><<<grid, kThreads, 0, be.stream()>>>(l, n, f);
  else
    loop_kernel<LoopMode::general, kNops><<<grid, kThreads, 0, be.stream()>>>(l, n, f);
  HL_CUDA_LAUNCH_CHECK(what);
}

// ---- functors: out = fn(inputs...) with typed loads/stores ----
template <typename TO, typename TA, typename Fn>
struct Map1 {
  Fn fn;
  __device__ __forceinline__ void operator()(void* const* p, const int64_t* off) const {
    static_cast<TO*>(p[0])[off[0]] = fn(static_cast<const TA*>(p[1])[off[1]]);
  }
};

template <typename TO, typename TA, typename TB, typename Fn>
struct Map2 {
  Fn fn;
  __device__ __forceinline__ void operator()(void* const* p, const int64_t* off) const {
    static_cast<TO*>(p[0])[off[0]] = fn(static_cast<const TA*>(p[1])[off[1]], static_cast<const TB*>(p[2])[off[2]]);
  }
};

}  // namespace headlab::cuda
