// Elementwise kernels of the CUDA backend: fill, arange, copy (casting between all dtypes),
// unary ops and their derivatives, where. The formulas are the CPU's (backends/scalar_math.h), so
// CPU and CUDA agree to rounding.
#include <type_traits>

#include "backends/cuda/cuda_loops.cuh"

namespace headlab {
namespace cuda {
namespace {

template <typename T>
struct FillOp {
  T v;
  __device__ __forceinline__ void operator()(void* const* p, const int64_t* off) const {
    static_cast<T*>(p[0])[off[0]] = v;
  }
};

// bool is one byte 0/1: anything non-zero becomes 1.
template <typename TD, typename TS>
struct CastFn {
  __device__ __forceinline__ TD operator()(TS x) const {
    if constexpr (std::is_same_v<TD, uint8_t> && !std::is_same_v<TS, uint8_t>)
      return TD(x != TS(0));
    else
      return static_cast<TD>(x);
  }
};

template <typename T>
struct WhereOp {
  __device__ __forceinline__ void operator()(void* const* p, const int64_t* off) const {
    static_cast<T*>(p[0])[off[0]] = static_cast<const uint8_t*>(p[1])[off[1]] ? static_cast<const T*>(p[2])[off[2]]
                                                                              : static_cast<const T*>(p[3])[off[3]];
  }
};

template <UnaryOp kOp, typename T>
struct UnaryFn {
  T alpha, beta;
  __device__ __forceinline__ T operator()(T x) const { return smath::unary_op<kOp>(x, alpha, beta); }
};

// Reads only the operand the derivative needs (backends/scalar_math.h, unary_grad_from).
template <UnaryOp kOp, typename T>
__global__ void unary_backward_kernel(T* din, const T* dout, const T* x, const T* y, int64_t n, T alpha) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    din[i] = smath::unary_backward_at<kOp>(dout, x, y, i, alpha);
}

template <typename T>
__global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = static_cast<T>(start + step * static_cast<double>(i));
}

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::fill(DType dt, const Loop& l, double value) {
  HLC_DISPATCH_ALL(dt, T, "fill", {
    const T v = dt == DType::b8 ? T(value != 0) : static_cast<T>(value);
    run_loop<1>(*this, "fill", l, FillOp<T>{v});
  });
}

void CudaBackend::arange(DType dt, void* out, int64_t n, double start, double step) {
  if (n <= 0) return;
  activate();
  HLC_DISPATCH_ALL(dt, T, "arange",
                   { arange_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(out), n, start, step); });
  HL_CUDA_LAUNCH_CHECK("arange");
}

void CudaBackend::copy(DType dst_dt, DType src_dt, const Loop& l) {
  HL_CHECK(dst_dt != DType::bf16 && src_dt != DType::bf16, "cuda copy: bfloat16 is not converted on the GPU yet (",
           dtype_name(src_dt), " to ", dtype_name(dst_dt), "; convert on the CPU)");
  HLC_DISPATCH_ALL(dst_dt, TD, "copy", {
    HLC_DISPATCH_ALL(src_dt, TS, "copy",
                     { run_loop<2>(*this, "copy", l, Map1<TD, TS, CastFn<TD, TS>>{CastFn<TD, TS>{}}); });
  });
}

void CudaBackend::where(DType dt, const Loop& l) {
  HLC_DISPATCH_ALL(dt, T, "where", { run_loop<4>(*this, "where", l, WhereOp<T>{}); });
}

void CudaBackend::unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) {
  HLC_DISPATCH_FLOAT(dt, T, "unary", {
    smath::dispatch_unary_op(op, "cuda unary", [&](auto op_c) {
      using Fn = UnaryFn<decltype(op_c)::value, T>;
      run_loop<2>(*this, "unary", l, Map1<T, T, Fn>{Fn{static_cast<T>(alpha), static_cast<T>(beta)}});
    });
  });
}

void CudaBackend::unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y,
                                 int64_t n, double alpha) {
  if (n <= 0) return;
  smath::check_grad_operand(op, x, y, "cuda unary_backward");
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "unary_backward", {
    smath::dispatch_unary_op(op, "cuda unary_backward", [&](auto op_c) {
      unary_backward_kernel<decltype(op_c)::value, T><<<grid_for(n), kThreads, 0, stream_>>>(
          static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(y), n,
          static_cast<T>(alpha));
    });
  });
  HL_CUDA_LAUNCH_CHECK("unary_backward");
}

}  // namespace headlab
