// Elementwise kernels of the CUDA backend: fill, arange, copy (casting between all dtypes),
// unary ops and their derivatives, where. Formulas mirror backends/cpu/cpu_backend.cpp term by
// term (same constants, same evaluation order) so CPU and CUDA agree to rounding.
#include <type_traits>

#include "backends/cuda/cuda_loops.cuh"

namespace headlab {
namespace cuda {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

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
    if constexpr (std::is_same_v<TD, uint8_t> && !std::is_same_v<TS, uint8_t>) return TD(x != TS(0));
    else return static_cast<TD>(x);
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
  __device__ __forceinline__ T operator()(T x) const {
    if constexpr (kOp == UnaryOp::neg) return -x;
    else if constexpr (kOp == UnaryOp::exp) return m_exp(x);
    else if constexpr (kOp == UnaryOp::log) return m_log(x);
    else if constexpr (kOp == UnaryOp::sqrt) return m_sqrt(x);
    else if constexpr (kOp == UnaryOp::rsqrt) return T(1) / m_sqrt(x);
    else if constexpr (kOp == UnaryOp::abs) return m_abs(x);
    else if constexpr (kOp == UnaryOp::tanh) return m_tanh(x);
    else if constexpr (kOp == UnaryOp::sigmoid) return T(1) / (T(1) + m_exp(-x));
    else if constexpr (kOp == UnaryOp::relu) return x > T(0) ? x : T(0);
    else if constexpr (kOp == UnaryOp::gelu) return T(0.5) * x * (T(1) + m_erf(x * T(kInvSqrt2)));
    else if constexpr (kOp == UnaryOp::gelu_tanh)
      return T(0.5) * x * (T(1) + m_tanh(T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x)));
    else if constexpr (kOp == UnaryOp::pow) return m_pow(x, alpha);
    else if constexpr (kOp == UnaryOp::affine) return alpha * x + beta;
    else if constexpr (kOp == UnaryOp::sign) return T((x > T(0)) - (x < T(0)));
    else return x > T(0) ? T(1) : T(0);  // gt_zero
  }
};

// d op(x) / dx given x and y = op(x); x or y may be absent (null) when the op does not need it.
template <UnaryOp kOp, typename T>
__device__ __forceinline__ T unary_derivative(T x, T y, T alpha) {
  if constexpr (kOp == UnaryOp::neg) return T(-1);
  else if constexpr (kOp == UnaryOp::exp) return y;
  else if constexpr (kOp == UnaryOp::log) return T(1) / x;
  else if constexpr (kOp == UnaryOp::sqrt) return T(0.5) / y;
  else if constexpr (kOp == UnaryOp::rsqrt) return T(-0.5) * y * y * y;
  else if constexpr (kOp == UnaryOp::abs) return T((x > T(0)) - (x < T(0)));
  else if constexpr (kOp == UnaryOp::tanh) return T(1) - y * y;
  else if constexpr (kOp == UnaryOp::sigmoid) return y * (T(1) - y);
  else if constexpr (kOp == UnaryOp::relu) return x > T(0) ? T(1) : T(0);
  else if constexpr (kOp == UnaryOp::gelu) {
    const T cdf = T(0.5) * (T(1) + m_erf(x * T(kInvSqrt2)));
    return cdf + x * T(kInvSqrt2Pi) * m_exp(T(-0.5) * x * x);
  } else if constexpr (kOp == UnaryOp::gelu_tanh) {
    const T u = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
    const T t = m_tanh(u);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x * x);
  } else if constexpr (kOp == UnaryOp::pow) return alpha * m_pow(x, alpha - T(1));
  else if constexpr (kOp == UnaryOp::affine) return alpha;
  else return T(0);  // sign, gt_zero
}

template <UnaryOp kOp, typename T>
__global__ void unary_backward_kernel(T* din, const T* dout, const T* x, const T* y, int64_t n, T alpha) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    din[i] = dout[i] * unary_derivative<kOp, T>(x ? x[i] : T(0), y ? y[i] : T(0), alpha);
}

template <typename T>
__global__ void arange_kernel(T* out, int64_t n, double start, double step) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = static_cast<T>(start + step * static_cast<double>(i));
}

// Runtime op -> compile-time op, once per call.
template <typename F>
void dispatch_unary_op(UnaryOp op, const char* who, F&& f) {
  switch (op) {
#define HLC_UNARY_CASE(name) \
  case UnaryOp::name: f(std::integral_constant<UnaryOp, UnaryOp::name>{}); return;
    HLC_UNARY_CASE(neg)
    HLC_UNARY_CASE(exp)
    HLC_UNARY_CASE(log)
    HLC_UNARY_CASE(sqrt)
    HLC_UNARY_CASE(rsqrt)
    HLC_UNARY_CASE(abs)
    HLC_UNARY_CASE(tanh)
    HLC_UNARY_CASE(sigmoid)
    HLC_UNARY_CASE(relu)
    HLC_UNARY_CASE(gelu)
    HLC_UNARY_CASE(gelu_tanh)
    HLC_UNARY_CASE(pow)
    HLC_UNARY_CASE(affine)
    HLC_UNARY_CASE(sign)
    HLC_UNARY_CASE(gt_zero)
#undef HLC_UNARY_CASE
  }
  HL_FAIL("cuda ", who, ": unknown unary op ", static_cast<int>(op));
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
  HLC_DISPATCH_ALL(dt, T, "arange", {
    arange_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(out), n, start, step);
  });
  HL_CUDA_LAUNCH_CHECK("arange");
}

void CudaBackend::copy(DType dst_dt, DType src_dt, const Loop& l) {
  HLC_DISPATCH_ALL(dst_dt, TD, "copy", {
    HLC_DISPATCH_ALL(src_dt, TS, "copy", {
      run_loop<2>(*this, "copy", l, Map1<TD, TS, CastFn<TD, TS>>{CastFn<TD, TS>{}});
    });
  });
}

void CudaBackend::where(DType dt, const Loop& l) {
  HLC_DISPATCH_ALL(dt, T, "where", { run_loop<4>(*this, "where", l, WhereOp<T>{}); });
}

void CudaBackend::unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) {
  HLC_DISPATCH_FLOAT(dt, T, "unary", {
    dispatch_unary_op(op, "unary", [&](auto op_c) {
      using Fn = UnaryFn<decltype(op_c)::value, T>;
      run_loop<2>(*this, "unary", l, Map1<T, T, Fn>{Fn{static_cast<T>(alpha), static_cast<T>(beta)}});
    });
  });
}

void CudaBackend::unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y,
                                 int64_t n, double alpha) {
  if (n <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "unary_backward", {
    dispatch_unary_op(op, "unary_backward", [&](auto op_c) {
      unary_backward_kernel<decltype(op_c)::value, T><<<grid_for(n), kThreads, 0, stream_>>>(
          static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(x), static_cast<const T*>(y), n,
          static_cast<T>(alpha));
    });
  });
  HL_CUDA_LAUNCH_CHECK("unary_backward");
}

}  // namespace headlab
