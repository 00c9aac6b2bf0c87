// Binary elementwise kernels of the CUDA backend: arithmetic (out has the input dtype) and
// comparisons / logical_and (out is bool, one byte 0/1), over broadcasting Loops. Semantics mirror
// backends/cpu/cpu_backend.cpp: maximum/minimum propagate NaN as in PyTorch.
#include <type_traits>

#include "backends/cuda/cuda_loops.cuh"

namespace headlab {
namespace cuda {
namespace {

template <BinaryOp kOp, typename T>
struct BinaryFn {
  // Arithmetic results are converted back to T (for bool, as the CPU does: the int result is
  // narrowed to one byte); comparisons give 0/1.
  __device__ __forceinline__ auto operator()(T a, T b) const {
    if constexpr (kOp == BinaryOp::add) return static_cast<T>(a + b);
    else if constexpr (kOp == BinaryOp::sub) return static_cast<T>(a - b);
    else if constexpr (kOp == BinaryOp::mul) return static_cast<T>(a * b);
    else if constexpr (kOp == BinaryOp::div) return static_cast<T>(a / b);
    else if constexpr (kOp == BinaryOp::maximum) return (a != a || a > b) ? a : b;  // NaN propagates
    else if constexpr (kOp == BinaryOp::minimum) return (a != a || a < b) ? a : b;
    else if constexpr (kOp == BinaryOp::eq) return static_cast<uint8_t>(a == b);
    else if constexpr (kOp == BinaryOp::ne) return static_cast<uint8_t>(a != b);
    else if constexpr (kOp == BinaryOp::lt) return static_cast<uint8_t>(a < b);
    else if constexpr (kOp == BinaryOp::le) return static_cast<uint8_t>(a <= b);
    else if constexpr (kOp == BinaryOp::gt) return static_cast<uint8_t>(a > b);
    else if constexpr (kOp == BinaryOp::ge) return static_cast<uint8_t>(a >= b);
    else return static_cast<uint8_t>((a != T(0)) && (b != T(0)));  // logical_and
  }
};

template <typename F>
void dispatch_binary_op(BinaryOp op, F&& f) {
  switch (op) {
#define HLC_BINARY_CASE(name) \
  case BinaryOp::name: f(std::integral_constant<BinaryOp, BinaryOp::name>{}); return;
    HLC_BINARY_CASE(add)
    HLC_BINARY_CASE(sub)
    HLC_BINARY_CASE(mul)
    HLC_BINARY_CASE(div)
    HLC_BINARY_CASE(maximum)
    HLC_BINARY_CASE(minimum)
    HLC_BINARY_CASE(eq)
    HLC_BINARY_CASE(ne)
    HLC_BINARY_CASE(lt)
    HLC_BINARY_CASE(le)
    HLC_BINARY_CASE(gt)
    HLC_BINARY_CASE(ge)
    HLC_BINARY_CASE(logical_and)
#undef HLC_BINARY_CASE
  }
  HL_FAIL("cuda binary: unknown binary op ", static_cast<int>(op));
}

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::binary(BinaryOp op, DType dt, const Loop& l) {
  HLC_DISPATCH_ALL(dt, T, "binary", {
    dispatch_binary_op(op, [&](auto op_c) {
      constexpr BinaryOp kOp = decltype(op_c)::value;
      using TO = std::conditional_t<(kOp >= BinaryOp::eq), uint8_t, T>;
      run_loop<3>(*this, "binary", l, Map2<TO, T, T, BinaryFn<kOp, T>>{BinaryFn<kOp, T>{}});
    });
  });
}

}  // namespace headlab
