// Binary elementwise kernels of the CUDA backend: arithmetic (out has the input dtype) and
// comparisons / logical_and (out is bool, one byte 0/1), over broadcasting Loops. The formulas are
// the CPU's (backends/scalar_math.h): maximum/minimum propagate NaN as in PyTorch.
#include <type_traits>

#include "backends/cuda/cuda_loops.cuh"

namespace headlab {
namespace cuda {
namespace {

template <BinaryOp kOp, typename T>
struct BinaryFn {
  __device__ __forceinline__ auto operator()(T a, T b) const { return smath::binary_op<kOp>(a, b); }
};

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::binary(BinaryOp op, DType dt, const Loop& l) {
  HLC_DISPATCH_ALL(dt, T, "binary", {
    smath::dispatch_binary_op(op, "cuda binary", [&](auto op_c) {
      constexpr BinaryOp kOp = decltype(op_c)::value;
      using TO = std::conditional_t<is_comparison(kOp), uint8_t, T>;
      run_loop<3>(*this, "binary", l, Map2<TO, T, T, BinaryFn<kOp, T>>{BinaryFn<kOp, T>{}});
    });
  });
}

}  // namespace headlab
