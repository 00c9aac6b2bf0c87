// Internals shared by the CUDA backend's translation units: the CudaBackend class, the caching
// allocator, error checks, dtype dispatch, launch sizing, the warp/block reductions and the row
// log-sum-exp. The scalar maths (shared with the CPU backend) is in backends/scalar_math.h.
// Every kernel and cuBLAS call runs on the backend's one stream (see CudaBackend::stream_).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_plugin.h"
#include "backends/scalar_math.h"
#include "base/error.h"

// `what` names the op; the message is "cuda <what>: <CUDA error string>".
#define HL_CUDA_CHECK(what, expr)                                                          \
  do {                                                                                     \
    const cudaError_t hl_err_ = (expr);                                                    \
    if (hl_err_ != cudaSuccess) HL_FAIL("cuda ", what, ": ", cudaGetErrorString(hl_err_)); \
  } while (0)

#define HL_CUBLAS_CHECK(what, expr)                                                                                  \
  do {                                                                                                               \
    const cublasStatus_t hl_st_ = (expr);                                                                            \
    if (hl_st_ != CUBLAS_STATUS_SUCCESS)                                                                             \
      HL_FAIL("cuda ", what, ": cuBLAS error ", cublasGetStatusString(hl_st_), " (", static_cast<int>(hl_st_), ")"); \
  } while (0)

// After every launch: catches bad launch configurations at once; faults inside a kernel surface at
// the next synchronising call (run with CUDA_LAUNCH_BLOCKING=1 to pin them on the kernel).
#define HL_CUDA_LAUNCH_CHECK(what) HL_CUDA_CHECK(what, cudaGetLastError())

// Dispatch on the element type once per call; bool is stored as one byte 0/1 (uint8_t).
#define HLC_DISPATCH_FLOAT(dt, T, who, ...)                                                  \
  switch (dt) {                                                                              \
    case ::headlab::DType::f32: {                                                            \
      using T = float;                                                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::headlab::DType::f64: {                                                            \
      using T = double;                                                                      \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    default:                                                                                 \
      HL_FAIL("cuda ", who, ": expected a floating dtype, got ", ::headlab::dtype_name(dt)); \
  }

#define HLC_DISPATCH_ALL(dt, T, who, ...)                              \
  switch (dt) {                                                        \
    case ::headlab::DType::f32: {                                      \
      using T = float;                                                 \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
    case ::headlab::DType::f64: {                                      \
      using T = double;                                                \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
    case ::headlab::DType::i64: {                                      \
      using T = int64_t;                                               \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
    case ::headlab::DType::b8: {                                       \
      using T = uint8_t;                                               \
      __VA_ARGS__;                                                     \
      break;                                                           \
    }                                                                  \
    default:                                                           \
      HL_FAIL("cuda ", who, ": unknown dtype ", static_cast<int>(dt)); \
  }

namespace headlab {
namespace cuda {

using smath::Acc;  // float sums accumulate in double, as on the CPU

constexpr int kThreads = 256;              // default block size of elementwise kernels
constexpr int64_t kWarpRowMaxCols = 1024;  // rows up to this many columns get one warp each
constexpr int kRowWarpsPerBlock = 8;       // warps (rows) per block in the warp-per-row kernels
constexpr int kRowBlockThreads = 256;      // threads per row in the block-per-row kernels

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The services of the core that loaded this plugin (set by the entry point, headlab_cuda_plugin).
const CudaHost& host();

// ---- the caching allocator ----
// Sizes are rounded to a class (512 B multiples up to 1 MiB, 2 MiB multiples above); freed blocks
// go to a free list keyed by class and are handed out again without touching the driver. Blocks
// are never split or merged, so a block is exactly one cudaMalloc. All device work runs on one
// stream, so a block freed by the host while kernels that use it are still queued can be handed out
// at once: whatever the next owner enqueues runs after those kernels (stream order).
class CachingAllocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}
  void* allocate(size_t nbytes, cudaStream_t stream);
  void release(void* p);
  void empty_cache(cudaStream_t stream);
  size_t in_use() const;
  size_t peak() const;
  size_t cached() const;
  void reset_peak();
  static size_t round_size(size_t nbytes);

 private:
  void free_cached_locked(cudaStream_t stream);  // mu_ held
  int device_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;     // handed out: pointer -> block size
  std::map<size_t, std::vector<void*>> free_;  // cached: block size -> blocks (LIFO)
  size_t in_use_ = 0, peak_ = 0, cached_ = 0;
};

}  // namespace cuda

struct CudaBackend final : Backend {
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return name_; }

  void* alloc(size_t nbytes) override;
  void free(void* p) override;
  void copy_from_host(void* dst, const void* src, size_t nbytes) override;
  void copy_to_host(void* dst, const void* src, size_t nbytes) override;
  void synchronize() override;
  size_t bytes_in_use() const override { return alloc_.in_use(); }
  size_t peak_bytes() const override { return alloc_.peak(); }
  void reset_peak() override { alloc_.reset_peak(); }

  void fill(DType dt, const Loop& l, double value) override;
  void arange(DType dt, void* out, int64_t n, double start, double step) override;
  void copy(DType dst_dt, DType src_dt, const Loop& l) override;
  void unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) override;
  void unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y, int64_t n,
                      double alpha) override;
  void binary(BinaryOp op, DType dt, const Loop& l) override;
  void where(DType dt, const Loop& l) override;
  void reduce(ReduceOp op, DType dt, void* out, const void* in, int n_outer, const int64_t* outer_sizes,
              const int64_t* outer_strides, int n_inner, const int64_t* inner_sizes,
              const int64_t* inner_strides) override;
  bool all_finite(DType dt, const void* p, int64_t n) override;
  bool indices_in_range(const int64_t* idx, int64_t n, int64_t lo, int64_t hi) override;
  void check_indices(const char* op, const int64_t* idx, int64_t n, int64_t size) override;

  void gemm(DType dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const void* A,
            int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, double beta, void* C,
            int64_t ldc, int64_t stride_c, int64_t batch) override;

  bool linear_rows(DType dt, void* out, const void* x, int64_t ldx, const void* w, const void* bias, int64_t rows,
                   int64_t N, int64_t K) override;  // rows up to 4

  void softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols, double scale, SoftmaxMask mask,
                       const int64_t* lengths, int64_t q_len) override;
  void softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                        double scale) override;
  void log_softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols) override;
  void log_softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols) override;

  void layernorm_forward(DType dt, void* y, void* mean, void* rstd, const void* x, const void* w, const void* b,
                         int64_t rows, int64_t cols, double eps) override;
  void layernorm_backward(DType dt, void* dx, void* dw, void* db, const void* dy, const void* x, const void* mean,
                          const void* rstd, const void* w, int64_t rows, int64_t cols) override;

  void random_uniform(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) override;
  void random_normal(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) override;
  void random_int(void* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) override;
  void dropout(DType dt, void* out, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset) override;

  void index_select(DType dt, void* out, const void* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                    int64_t inner, int64_t n_idx) override;
  void index_add(DType dt, void* dst, const void* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                 int64_t inner, int64_t n_idx) override;

  void cross_entropy_forward(DType dt, void* loss, const void* logits, const int64_t* targets, int64_t rows,
                             int64_t classes, int64_t ignore_index) override;
  void cross_entropy_backward(DType dt, void* dlogits, const void* dloss, int64_t dloss_stride, double scale,
                              const void* logits, const int64_t* targets, int64_t rows, int64_t classes,
                              int64_t ignore_index) override;

  bool has_fused_attention(int64_t D, int64_t Dv) const override;  // head sizes up to 256
  bool fused_attention_is_faster(DType dt, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, bool dropout,
                                 bool backward) const override;
  void attention_forward(DType dt, const AttnResult& out, void* lse, const AttnOperand& q, const AttnOperand& k,
                         const AttnOperand& v, const AttnParams& a) override;
  void attention_backward(DType dt, const AttnResult& dq, const AttnResult& dk, const AttnResult& dv,
                          const AttnOperand& dout, const AttnOperand& q, const AttnOperand& k, const AttnOperand& v,
                          const AttnOperand& out, const void* lse, const AttnParams& a) override;

  void sgd_step(DType dt, void* param, const void* grad, void* momentum_buf, int64_t n, double lr, double momentum,
                double dampening, double weight_decay, bool nesterov, bool first_step) override;
  void adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n, double lr,
                 double beta1, double beta2, double eps, double weight_decay, int64_t step, bool decoupled) override;

  // ---- helpers for the kernels' translation units ----
  void activate() const;  // makes this backend's device current on the calling thread
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Blocks for a grid-stride loop over n items with `threads` per block: enough to fill the GPU,
  // never more than needed, never more than the grid limit.
  int grid_for(int64_t n, int threads = cuda::kThreads) const;
  int max_blocks() const { return sm_count_ * 32; }
  int sm_count() const { return sm_count_; }
  int compute_major() const { return compute_major_; }  // 8: Ampere (tensor-core TF32), 9: Hopper
  void empty_cache();
  // After every wait for the stream: throws the first failed check_indices since the last wait.
  void raise_failed_checks();
  void release_at_exit();  // cached blocks, the check slots and the cuBLAS handle; no more GEMMs or checks
  size_t cached_bytes() const { return alloc_.cached(); }

 private:
  int device_;
  char name_[16];
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int sm_count_ = 1;
  int compute_major_ = 0;
  int cublas_tf32_ = -1;  // math mode last set on the handle: -1 unknown, 0 default, 1 TF32
  std::mutex cublas_mu_;  // the handle's math mode is per handle state
  mutable cuda::CachingAllocator alloc_;
  // check_indices in flight: slot i of check_slots_ (mapped host memory the kernels write, {failed, value})
  // belongs to pending_checks_[i]; all are read and cleared at the next wait for the stream.
  struct PendingCheck {
    const char* op;
    int64_t size;
  };
  static constexpr size_t kCheckSlots = 4096;
  unsigned long long* check_slots_ = nullptr;
  std::vector<PendingCheck> pending_checks_;
  std::mutex checks_mu_;
};

namespace cuda {

// A temporary device buffer from the caching allocator, returned to the cache on scope exit. Safe
// even though kernels using it may still be queued: see CachingAllocator.
class TempBuffer {
 public:
  TempBuffer(CudaBackend& be, size_t nbytes) : be_(be), p_(be.alloc(nbytes)) {}
  ~TempBuffer() { be_.free(p_); }
  TempBuffer(const TempBuffer&) = delete;
  TempBuffer& operator=(const TempBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  CudaBackend& be_;
  void* p_;
};

template <typename T>
__device__ __forceinline__ T neg_inf() {
  return -static_cast<T>(INFINITY);
}
// std::max as the CPU uses it: (a < b) ? b : a (a NaN b is ignored, a NaN a is kept).
template <typename T>
__device__ __forceinline__ T std_max(T a, T b) {
  return (a < b) ? b : a;
}

// ---- warp and block reductions (all lanes / threads get the result) ----
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = std_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// shm: 32 entries of shared memory; blockDim.x a multiple of 32, blockDim.y == 1.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shm) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // shm may still be read by a previous reduction
  if (lane == 0) shm[wid] = v;
  __syncthreads();
  return warp_sum(lane < nw ? shm[lane] : T(0));
}
template <typename T>
__device__ __forceinline__ T block_max(T v, T* shm) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) shm[wid] = v;
  __syncthreads();
  return warp_max(lane < nw ? shm[lane] : neg_inf<T>());
}

// The threads that share one row: a warp (kBlock = false; blockDim = (32, kRowWarpsPerBlock), one
// row per warp) or a whole block (kBlock = true; blockDim = (kRowBlockThreads), one row per block).
// Row loops are uniform over the team, so the team reductions below are always reached by all.
template <bool kBlock>
struct RowTeam {
  __device__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ static int size() { return kBlock ? static_cast<int>(blockDim.x) : 32; }
  __device__ static int64_t first_row() {
    return kBlock ? static_cast<int64_t>(blockIdx.x) : static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  }
  __device__ static int64_t row_step() {
    return kBlock ? static_cast<int64_t>(gridDim.x) : static_cast<int64_t>(gridDim.x) * blockDim.y;
  }
  template <typename T>
  __device__ static T sum(T v, T* shm) {
    if constexpr (kBlock)
      return block_sum(v, shm);
    else
      return warp_sum(v);
  }
  template <typename T>
  __device__ static T max(T v, T* shm) {
    if constexpr (kBlock)
      return block_max(v, shm);
    else
      return warp_max(v);
  }
};

// Sum over j in [0, n) of f(j), accumulated as A by a row team (every thread gets the total).
template <class Team, typename A, typename F>
__device__ __forceinline__ A team_row_sum(int64_t n, F f) {
  __shared__ A shm[32];
  A s = 0;
  for (int64_t j = Team::rank(); j < n; j += Team::size()) s += f(j);
  return Team::sum(s, shm);
}

// The row log-sum-exp of a team: max and sum of exp(scale * x[j] - max) over x[0, n), every thread
// getting both. The max-subtracted first half of softmax, log-softmax and cross entropy.
template <class Team, typename T>
__device__ __forceinline__ smath::RowLse<T> team_row_logsumexp(const T* x, int64_t n, T scale = T(1)) {
  __shared__ T shm[32];
  T m = neg_inf<T>();
  for (int64_t j = Team::rank(); j < n; j += Team::size()) m = std_max(m, scale * x[j]);
  m = Team::max(m, shm);
  return {m, team_row_sum<Team, Acc<T>>(n, [&](int64_t j) { return smath::exp(scale * x[j] - m); })};
}

// Launches kernel<false> (a warp per row) for rows of up to kWarpRowMaxCols columns when there are rows
// enough for every SM, else kernel<true> (a block per row: a decoding step's one row of 768 took 15 us
// through a single warp). Both take the same arguments.
template <typename... KArgs, typename... Args>
void launch_rows(CudaBackend& be, const char* what, int64_t rows, int64_t cols, void (*warp_kernel)(KArgs...),
                 void (*block_kernel)(KArgs...), Args... args) {
  if (rows <= 0) return;
  if (cols <= kWarpRowMaxCols && rows >= be.sm_count()) {
    const int grid = static_cast<int>(std::min<int64_t>(ceil_div(rows, kRowWarpsPerBlock), be.max_blocks()));
    warp_kernel<<<grid, dim3(32, kRowWarpsPerBlock), 0, be.stream()>>>(static_cast<KArgs>(args)...);
  } else {
    const int grid = static_cast<int>(std::min<int64_t>(rows, be.max_blocks()));
    block_kernel<<<grid, kRowBlockThreads, 0, be.stream()>>>(static_cast<KArgs>(args)...);
  }
  HL_CUDA_LAUNCH_CHECK(what);
}

// Grid-stride loop index helpers (64-bit: tensors may exceed 2^31 elements).
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace cuda
}  // namespace headlab
