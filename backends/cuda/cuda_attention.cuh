// What the CUDA backend's two fused attention implementations share: the row kernels of
// cuda_attention.cu (a thread per row, scalar FMAs, float32 and float64, dropout) and the tensor-core
// tiles of cuda_attention_mma.cu (float32 as 3xTF32, no dropout), which cuda_attention.cu calls where
// they serve. B = batch, H = heads, Tq / Tk = queries / keys, D = q/k head size, Dv = v head size.
#pragma once
#include <type_traits>

#include "backends/cuda/cuda_internal.cuh"

namespace headlab {
namespace cuda {

// The keys row i of head bh may see: j < valid.
__device__ __forceinline__ int64_t valid_keys(const AttnParams& a, int64_t bh, int64_t i) {
  switch (a.mask) {
    case SoftmaxMask::causal:
      return i + 1 < a.Tk ? i + 1 : a.Tk;
    case SoftmaxMask::lengths: {
      const int64_t n = a.lengths[bh * a.Tq + i];
      return n < 0 ? 0 : (n > a.Tk ? a.Tk : n);
    }
    default:
      return a.Tk;
  }
}

// Head bh = b * H + h of a (B, H, T, C) view.
template <typename T, typename Ptr>
__device__ __forceinline__ auto head_ptr(const AttnView<Ptr>& o, int64_t bh, int64_t H) {
  using Elem = std::conditional_t<std::is_const_v<Ptr>, const T, T>;
  return static_cast<Elem*>(o.p) + (bh / H) * o.sb + (bh % H) * o.sh;
}

// Calls f(std::integral_constant<int, DM>) for the narrowest register or tile width DM (32, 64, 128, then
// kWidest) holding both head sizes, which are at most kWidest.
template <int kWidest, typename F>
void with_head_width(int64_t D, int64_t Dv, F&& f) {
  const int64_t w = D > Dv ? D : Dv;
  if (w <= 32)
    f(std::integral_constant<int, 32>{});
  else if (w <= 64)
    f(std::integral_constant<int, 64>{});
  else if (w <= 128)
    f(std::integral_constant<int, 128>{});
  else
    f(std::integral_constant<int, kWidest>{});
}

// The tensor-core path (cuda_attention_mma.cu): float32 without dropout, head sizes up to kMmaMaxHead, on a GPU
// with TF32 tensor cores (compute capability 8 or later).
constexpr int64_t kMmaMaxHead = 128;
bool mma_attention_serves(const CudaBackend& be, DType dt, const AttnParams& a);
void mma_attention_forward(CudaBackend& be, const AttnResult& out, float* lse, const AttnOperand& q,
                           const AttnOperand& k, const AttnOperand& v, const AttnParams& a);
void mma_attention_backward(CudaBackend& be, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                            const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
                            const AttnOperand& out, const float* lse, const AttnParams& a);

}  // namespace cuda
}  // namespace headlab
