// Reductions of the CUDA backend: sum / max / min / argmax over the inner dims of a strided input
// for every outer index, plus the validation scans all_finite and indices_in_range.
// Semantics mirror the CPU: float sums accumulate in double; max/min/argmax let NaN win, as in
// PyTorch; argmax returns the first occurrence (smallest flattened inner index) on ties.
//
// Strategy (all deterministic, no atomics):
//   rows:    inner dims contiguous (stride 1) and long: a warp per output reads coalesced runs;
//   columns: otherwise (e.g. summing over the rows of a matrix): a thread per output, adjacent
//            threads reading adjacent outputs' elements;
// and when there are too few outputs to fill the GPU, the inner range is split into chunks whose
// partial results a second kernel combines in a fixed order.
#include <limits>
#include <memory>
#include <type_traits>

#include "backends/cuda/cuda_internal.cuh"

namespace headlab {
namespace cuda {
namespace {

struct ReduceGeom {
  int n_outer = 0, n_inner = 0;
  int64_t osz[kMaxDims] = {}, ost[kMaxDims] = {}, isz[kMaxDims] = {}, ist[kMaxDims] = {};
};

// Drops size-1 dims and merges contiguous neighbours (row-major flattening order is preserved,
// so flattened inner indices, which argmax returns, do not change).
int collapse_dims(int n, const int64_t* sz, const int64_t* st, int64_t* out_sz, int64_t* out_st) {
  int nd = 0;
  for (int d = 0; d < n; ++d) {
    if (sz[d] == 1) continue;
    if (nd > 0 && out_st[nd - 1] == st[d] * sz[d]) {
      out_sz[nd - 1] *= sz[d];
      out_st[nd - 1] = st[d];
    } else {
      out_sz[nd] = sz[d];
      out_st[nd] = st[d];
      ++nd;
    }
  }
  return nd;
}

__device__ __forceinline__ int64_t dims_offset(int64_t linear, int n, const int64_t* sz, const int64_t* st) {
  int64_t off = 0;
  for (int d = n - 1; d > 0; --d) {
    const int64_t q = linear / sz[d];
    off += (linear - q * sz[d]) * st[d];
    linear = q;
  }
  return n > 0 ? off + linear * st[0] : 0;
}

template <typename T>
__device__ __forceinline__ T lowest_value() {
  if constexpr (std::is_floating_point_v<T>)
    return -static_cast<T>(INFINITY);
  else
    return static_cast<T>(INT64_MIN);
}
template <typename T>
__device__ __forceinline__ T highest_value() {
  if constexpr (std::is_floating_point_v<T>)
    return static_cast<T>(INFINITY);
  else
    return static_cast<T>(INT64_MAX);
}

template <typename T>
struct ArgAcc {
  T v;
  int64_t i;
};

__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ double shfl_xor(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ int64_t shfl_xor(int64_t v, int o) {
  return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), o));
}
template <typename T>
__device__ __forceinline__ ArgAcc<T> shfl_xor(ArgAcc<T> a, int o) {
  return ArgAcc<T>{shfl_xor(a.v, o), shfl_xor(a.i, o)};
}

// One reducer per (element type, op): identity, take (element j), combine, store.
template <typename T, ReduceOp kOp>
struct Reducer;

template <typename T>
struct Reducer<T, ReduceOp::sum> {
  using A = Acc<T>;
  __device__ static A identity() { return A(0); }
  __device__ static A take(T v, int64_t) { return static_cast<A>(v); }
  __device__ static A combine(A a, A b) { return a + b; }
  __device__ static void store(void* out, int64_t o, A a) { static_cast<T*>(out)[o] = static_cast<T>(a); }
};

template <typename T>
struct Reducer<T, ReduceOp::max> {
  using A = T;
  __device__ static A identity() { return lowest_value<T>(); }
  __device__ static A take(T v, int64_t) { return v; }
  __device__ static A combine(A a, A b) { return (a != a) ? a : ((b != b || b > a) ? b : a); }
  __device__ static void store(void* out, int64_t o, A a) { static_cast<T*>(out)[o] = a; }
};

template <typename T>
struct Reducer<T, ReduceOp::min> {
  using A = T;
  __device__ static A identity() { return highest_value<T>(); }
  __device__ static A take(T v, int64_t) { return v; }
  __device__ static A combine(A a, A b) { return (a != a) ? a : ((b != b || b < a) ? b : a); }
  __device__ static void store(void* out, int64_t o, A a) { static_cast<T*>(out)[o] = a; }
};

// Order-independent: the larger value wins, NaN beats numbers, ties go to the smaller index.
template <typename T>
struct Reducer<T, ReduceOp::argmax> {
  using A = ArgAcc<T>;
  __device__ static A identity() { return A{lowest_value<T>(), INT64_MAX}; }
  __device__ static A take(T v, int64_t j) { return A{v, j}; }
  __device__ static A combine(A a, A b) {
    const bool a_nan = a.v != a.v, b_nan = b.v != b.v;
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.i <= b.i ? a : b;
      return a_nan ? a : b;
    }
    if (a.v > b.v) return a;
    if (b.v > a.v) return b;
    return a.i <= b.i ? a : b;
  }
  __device__ static void store(void* out, int64_t o, A a) {
    static_cast<int64_t*>(out)[o] = a.i == INT64_MAX ? 0 : a.i;  // empty reduction: 0
  }
};

template <typename R>
__device__ __forceinline__ typename R::A warp_combine(typename R::A a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = R::combine(a, shfl_xor(a, o));
  return a;
}

// Pass 1, rows: a warp per task (output o, chunk s). blockDim = (32, kRowWarpsPerBlock).
// kFinal: store the result; else write the partial accumulator to partial[task].
template <typename T, ReduceOp kOp, bool kInner1D, bool kFinal>
__global__ void reduce_rows_kernel(void* out, const T* in, ReduceGeom g, int64_t n_out, int64_t n_red, int64_t splits,
                                   int64_t chunk) {
  using R = Reducer<T, kOp>;
  const int lane = threadIdx.x;
  const int64_t tasks = n_out * splits;
  for (int64_t task = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; task < tasks;
       task += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t o = task / splits, s = task - o * splits;
    const T* base = in + dims_offset(o, g.n_outer, g.osz, g.ost);
    const int64_t j1 = min(n_red, (s + 1) * chunk);
    typename R::A acc = R::identity();
    for (int64_t j = s * chunk + lane; j < j1; j += 32) {
      const int64_t off = kInner1D ? j * g.ist[0] : dims_offset(j, g.n_inner, g.isz, g.ist);
      acc = R::combine(acc, R::take(base[off], j));
    }
    acc = warp_combine<R>(acc);
    if (lane == 0) {
      if constexpr (kFinal)
        R::store(out, o, acc);
      else
        static_cast<typename R::A*>(out)[task] = acc;
    }
  }
}

// Pass 1, columns: a thread per task; x runs over outputs (coalesced when outputs are adjacent in
// memory), y over chunks.
template <typename T, ReduceOp kOp, bool kInner1D, bool kFinal>
__global__ void reduce_cols_kernel(void* out, const T* in, ReduceGeom g, int64_t n_out, int64_t n_red, int64_t splits,
                                   int64_t chunk) {
  using R = Reducer<T, kOp>;
  for (int64_t o = global_thread(); o < n_out; o += grid_threads()) {
    const T* base = in + dims_offset(o, g.n_outer, g.osz, g.ost);
    for (int64_t s = blockIdx.y; s < splits; s += gridDim.y) {
      const int64_t j1 = min(n_red, (s + 1) * chunk);
      typename R::A acc = R::identity();
      for (int64_t j = s * chunk; j < j1; ++j) {
        const int64_t off = kInner1D ? j * g.ist[0] : dims_offset(j, g.n_inner, g.isz, g.ist);
        acc = R::combine(acc, R::take(base[off], j));
      }
      if constexpr (kFinal)
        R::store(out, o, acc);
      else
        static_cast<typename R::A*>(out)[o * splits + s] = acc;
    }
  }
}

// Pass 2: a warp per output combines its `splits` partials.
template <typename T, ReduceOp kOp>
__global__ void reduce_partials_kernel(void* out, const typename Reducer<T, kOp>::A* partial, int64_t n_out,
                                       int64_t splits) {
  using R = Reducer<T, kOp>;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; o < n_out;
       o += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    typename R::A acc = R::identity();
    for (int64_t s = threadIdx.x; s < splits; s += 32) acc = R::combine(acc, partial[o * splits + s]);
    acc = warp_combine<R>(acc);
    if (threadIdx.x == 0) R::store(out, o, acc);
  }
}

template <typename T, ReduceOp kOp>
void reduce_typed(CudaBackend& be, void* out, const T* in, const ReduceGeom& g, int64_t n_out, int64_t n_red) {
  using R = Reducer<T, kOp>;
  const bool inner1d = g.n_inner <= 1;
  const bool rows = g.n_inner >= 1 && g.ist[g.n_inner - 1] == 1 && n_red >= 32;
  const int64_t sm = be.sm_count();
  int64_t splits = 1;
  if (rows) {
    const int64_t target_warps = sm * 64;
    if (n_out < target_warps) splits = std::min(ceil_div(target_warps, n_out), ceil_div(n_red, 1024));
  } else {
    const int64_t target_threads = sm * 2048;
    if (n_out < target_threads) splits = std::min(ceil_div(target_threads, n_out), ceil_div(n_red, 64));
  }
  splits = std::clamp<int64_t>(splits, 1, 4096);
  const int64_t chunk = std::max<int64_t>(ceil_div(n_red, splits), 1);
  splits = std::max<int64_t>(ceil_div(n_red, chunk), 1);  // no empty chunks

  std::unique_ptr<TempBuffer> partial;
  void* dst = out;
  if (splits > 1) {
    partial = std::make_unique<TempBuffer>(be, static_cast<size_t>(n_out * splits) * sizeof(typename R::A));
    dst = partial->as<void>();
  }
  const cudaStream_t st = be.stream();
  auto launch = [&](auto final_c, auto inner1d_c) {
    constexpr bool kFinal = decltype(final_c)::value, kInner1D = decltype(inner1d_c)::value;
    if (rows) {
      const int grid =
          static_cast<int>(std::min<int64_t>(ceil_div(n_out * splits, kRowWarpsPerBlock), be.max_blocks()));
      reduce_rows_kernel<T, kOp, kInner1D, kFinal>
          <<<grid, dim3(32, kRowWarpsPerBlock), 0, st>>>(dst, in, g, n_out, n_red, splits, chunk);
    } else {
      const dim3 grid(be.grid_for(n_out), static_cast<unsigned>(std::min<int64_t>(splits, 65535)));
      reduce_cols_kernel<T, kOp, kInner1D, kFinal><<<grid, kThreads, 0, st>>>(dst, in, g, n_out, n_red, splits, chunk);
    }
  };
  using True = std::true_type;
  using False = std::false_type;
  if (splits == 1)
    inner1d ? launch(True{}, True{}) : launch(True{}, False{});
  else
    inner1d ? launch(False{}, True{}) : launch(False{}, False{});
  HL_CUDA_LAUNCH_CHECK("reduce");
  if (splits > 1) {
    const int grid = static_cast<int>(std::min<int64_t>(ceil_div(n_out, kRowWarpsPerBlock), be.max_blocks()));
    reduce_partials_kernel<T, kOp>
        <<<grid, dim3(32, kRowWarpsPerBlock), 0, st>>>(out, partial->as<typename R::A>(), n_out, splits);
    HL_CUDA_LAUNCH_CHECK("reduce (combine partials)");
  }
}

template <typename T>
__global__ void all_finite_kernel(const T* p, int64_t n, int* bad) {
  bool ok = true;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) ok &= isfinite(p[i]);
  if (!ok) *bad = 1;  // every writer writes the same value
}

__global__ void indices_in_range_kernel(const int64_t* idx, int64_t n, int64_t lo, int64_t hi, int* bad) {
  bool ok = true;
  for (int64_t i = global_thread(); i < n; i += grid_threads()) ok &= idx[i] >= lo && idx[i] < hi;
  if (!ok) *bad = 1;
}

// slot = {failed, value}: the first writer records its bad index (mapped host memory; read after a wait).
__global__ void check_indices_kernel(const int64_t* idx, int64_t n, int64_t size, unsigned long long* slot) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    if ((idx[i] < 0 || idx[i] >= size) && atomicCAS(slot, 0ull, 1ull) == 0ull)
      slot[1] = static_cast<unsigned long long>(idx[i]);
}

// Runs `launch(flag)` after zeroing a device flag, then reads the flag back (a host sync, after which the
// failed check_indices are raised).
template <typename F>
bool flag_clear(CudaBackend& be, const char* what, F&& launch) {
  TempBuffer flag(be, sizeof(int));
  HL_CUDA_CHECK(what, cudaMemsetAsync(flag.as<int>(), 0, sizeof(int), be.stream()));
  launch(flag.as<int>());
  HL_CUDA_LAUNCH_CHECK(what);
  int bad = 0;
  HL_CUDA_CHECK(what, cudaMemcpyAsync(&bad, flag.as<int>(), sizeof(int), cudaMemcpyDeviceToHost, be.stream()));
  HL_CUDA_CHECK(what, cudaStreamSynchronize(be.stream()));
  be.raise_failed_checks();
  return bad == 0;
}

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::reduce(ReduceOp op, DType dt, void* out, const void* in, int n_outer, const int64_t* outer_sizes,
                         const int64_t* outer_strides, int n_inner, const int64_t* inner_sizes,
                         const int64_t* inner_strides) {
  HL_CHECK(n_outer >= 0 && n_outer <= kMaxDims && n_inner >= 0 && n_inner <= kMaxDims, "cuda reduce: ", n_outer,
           " outer and ", n_inner, " inner dims (at most ", kMaxDims, " each)");
  if (dt == DType::b8) HL_FAIL("cuda reduce: bool tensors cannot be reduced; convert with to(int64) first");
  ReduceGeom g;
  int64_t n_out = 1, n_red = 1;
  for (int d = 0; d < n_outer; ++d) n_out *= outer_sizes[d];
  for (int d = 0; d < n_inner; ++d) n_red *= inner_sizes[d];
  if (n_out <= 0) return;
  g.n_outer = collapse_dims(n_outer, outer_sizes, outer_strides, g.osz, g.ost);
  g.n_inner = collapse_dims(n_inner, inner_sizes, inner_strides, g.isz, g.ist);
  activate();
  HLC_DISPATCH_ALL(dt, T, "reduce", {
    if constexpr (!std::is_same_v<T, uint8_t>) {
      const T* x = static_cast<const T*>(in);
      switch (op) {
        case ReduceOp::sum:
          reduce_typed<T, ReduceOp::sum>(*this, out, x, g, n_out, n_red);
          break;
        case ReduceOp::max:
          reduce_typed<T, ReduceOp::max>(*this, out, x, g, n_out, n_red);
          break;
        case ReduceOp::min:
          reduce_typed<T, ReduceOp::min>(*this, out, x, g, n_out, n_red);
          break;
        case ReduceOp::argmax:
          reduce_typed<T, ReduceOp::argmax>(*this, out, x, g, n_out, n_red);
          break;
        default:
          HL_FAIL("cuda reduce: unknown reduce op ", static_cast<int>(op));
      }
    }
  });
}

bool CudaBackend::all_finite(DType dt, const void* p, int64_t n) {
  bool ok = true;
  HLC_DISPATCH_FLOAT(dt, T, "all_finite", {
    if (n <= 0) return true;
    activate();
    ok = flag_clear(*this, "all_finite", [&](int* bad) {
      all_finite_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<const T*>(p), n, bad);
    });
  });
  return ok;
}

bool CudaBackend::indices_in_range(const int64_t* idx, int64_t n, int64_t lo, int64_t hi) {
  if (n <= 0) return true;
  activate();
  return flag_clear(*this, "indices_in_range", [&](int* bad) {
    indices_in_range_kernel<<<grid_for(n), kThreads, 0, stream_>>>(idx, n, lo, hi, bad);
  });
}

void CudaBackend::check_indices(const char* op, const int64_t* idx, int64_t n, int64_t size) {
  if (n <= 0) return;
  activate();
  unsigned long long* slot = nullptr;
  while (!slot) {  // a free slot taken under the lock; when none is left, a wait reads and frees them all
    {
      std::lock_guard<std::mutex> lock(checks_mu_);
      HL_CHECK(check_slots_ != nullptr, "cuda ", op, ": called while the process exits (the check slots are released)");
      if (pending_checks_.size() < kCheckSlots) {
        slot = check_slots_ + 2 * pending_checks_.size();
        pending_checks_.push_back({op, size});
      }
    }
    if (!slot) synchronize();  // or throws the failure it finds
  }
  check_indices_kernel<<<grid_for(n), kThreads, 0, stream_>>>(idx, n, size, slot);
  HL_CUDA_LAUNCH_CHECK("check_indices");
}

}  // namespace headlab
