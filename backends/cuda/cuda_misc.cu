// CUDA backend kernels that are one grid-stride loop each: random draws and dropout (Philox from
// backends/philox.h, element i = counter offset + i / 4, lane i % 4, exactly as on the CPU),
// gather / scatter-add along one dim (embedding forward / backward), and the SGD and Adam(W)
// updates with the CPU backend's (PyTorch's) formulas (backends/scalar_math.h).
#include "backends/cuda/cuda_internal.cuh"
#include "backends/philox.h"
#include "backends/scalar_math.h"

namespace headlab {
namespace cuda {
namespace {

template <typename T>
__global__ void random_uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = static_cast<T>(lo + (hi - lo) * philox::uniform(seed, offset, i));
}

template <typename T>
__global__ void random_normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = static_cast<T>(mean + std * philox::normal(seed, offset, i));
}

__global__ void random_int_kernel(int64_t* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, uint64_t range) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = philox::uniform_int(seed, offset, i, lo, range);
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* x, int64_t n, double p, T keep_scale, uint64_t seed, uint64_t offset) {
  for (int64_t i = global_thread(); i < n; i += grid_threads())
    out[i] = philox::dropout(x[i], p, keep_scale, seed, offset, i);
}

// out: (outer, n_idx, inner) = in: (outer, in_dim, inner) at idx. An index outside [0, in_dim)
// (the op layer validates first) reads as 0 instead of out of bounds.
template <typename T>
__global__ void index_select_kernel(T* out, const T* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                                    int64_t inner, int64_t n_idx) {
  const int64_t total = outer * n_idx * inner;
  for (int64_t e = global_thread(); e < total; e += grid_threads()) {
    const int64_t k = e % inner, t = e / inner, i = t % n_idx, o = t / n_idx;
    const int64_t src = idx[i];
    out[e] = (src >= 0 && src < in_dim) ? in[(o * in_dim + src) * inner + k] : T(0);
  }
}

// dst: (outer, dst_dim, inner) += src: (outer, n_idx, inner) at idx. Atomics, because indices repeat
// (every position of every sequence adds into the same embedding rows).
template <typename T>
__global__ void index_add_kernel(T* dst, const T* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                                 int64_t inner, int64_t n_idx) {
  const int64_t total = outer * n_idx * inner;
  for (int64_t e = global_thread(); e < total; e += grid_threads()) {
    const int64_t k = e % inner, t = e / inner, i = t % n_idx, o = t / n_idx;
    const int64_t d = idx[i];
    if (d >= 0 && d < dst_dim) atomicAdd(dst + (o * dst_dim + d) * inner + k, src[e]);
  }
}

template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, smath::SgdParams<T> h) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) smath::sgd_update(p, g, buf, i, h);
}

template <typename T>
__global__ void adam_kernel(T* p, const T* g, T* m, T* v, int64_t n, smath::AdamParams<T> h) {
  for (int64_t i = global_thread(); i < n; i += grid_threads()) smath::adam_update(p, g, m, v, i, h);
}

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::random_uniform(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  if (n <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "random_uniform", {
    random_uniform_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(out), n, seed, offset, lo, hi);
  });
  HL_CUDA_LAUNCH_CHECK("random_uniform");
}

void CudaBackend::random_normal(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean,
                                double std) {
  if (n <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "random_normal", {
    random_normal_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(out), n, seed, offset, mean, std);
  });
  HL_CUDA_LAUNCH_CHECK("random_normal");
}

void CudaBackend::random_int(void* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  if (n <= 0) return;
  activate();
  const uint64_t range = static_cast<uint64_t>(hi - lo);
  random_int_kernel<<<grid_for(n), kThreads, 0, stream_>>>(static_cast<int64_t*>(out), n, seed, offset, lo, range);
  HL_CUDA_LAUNCH_CHECK("random_int");
}

void CudaBackend::dropout(DType dt, void* out, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset) {
  if (n <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "dropout", {
    const T keep_scale = philox::dropout_scale<T>(p);
    dropout_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(out), static_cast<const T*>(x), n, p,
                                                             keep_scale, seed, offset);
  });
  HL_CUDA_LAUNCH_CHECK("dropout");
}

void CudaBackend::index_select(DType dt, void* out, const void* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                               int64_t inner, int64_t n_idx) {
  const int64_t total = outer * n_idx * inner;
  if (total <= 0) return;
  activate();
  HLC_DISPATCH_ALL(dt, T, "index_select", {
    index_select_kernel<T><<<grid_for(total), kThreads, 0, stream_>>>(static_cast<T*>(out), static_cast<const T*>(in),
                                                                      idx, outer, in_dim, inner, n_idx);
  });
  HL_CUDA_LAUNCH_CHECK("index_select");
}

void CudaBackend::index_add(DType dt, void* dst, const void* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                            int64_t inner, int64_t n_idx) {
  const int64_t total = outer * n_idx * inner;
  if (total <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "index_add", {
    index_add_kernel<T><<<grid_for(total), kThreads, 0, stream_>>>(static_cast<T*>(dst), static_cast<const T*>(src),
                                                                   idx, outer, dst_dim, inner, n_idx);
  });
  HL_CUDA_LAUNCH_CHECK("index_add");
}

void CudaBackend::sgd_step(DType dt, void* param, const void* grad, void* momentum_buf, int64_t n, double lr,
                           double momentum, double dampening, double weight_decay, bool nesterov, bool first_step) {
  if (n <= 0) return;
  HL_CHECK(momentum == 0 || momentum_buf != nullptr, "cuda sgd_step: momentum ", momentum, " needs a momentum buffer");
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "sgd_step", {
    const smath::SgdParams<T> h{
        static_cast<T>(lr), static_cast<T>(momentum), static_cast<T>(dampening), static_cast<T>(weight_decay), nesterov,
        first_step};
    sgd_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(param), static_cast<const T*>(grad),
                                                         static_cast<T*>(momentum_buf), n, h);
  });
  HL_CUDA_LAUNCH_CHECK("sgd_step");
}

void CudaBackend::adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n,
                            double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step,
                            bool decoupled) {
  if (n <= 0) return;
  HL_CHECK(step >= 1, "cuda adam_step: step must be >= 1 (bias correction), got ", step);
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "adam_step", {
    const auto h = smath::adam_params<T>(lr, beta1, beta2, eps, weight_decay, step, decoupled);
    adam_kernel<T><<<grid_for(n), kThreads, 0, stream_>>>(static_cast<T*>(param), static_cast<const T*>(grad),
                                                          static_cast<T*>(exp_avg), static_cast<T*>(exp_avg_sq), n, h);
  });
  HL_CUDA_LAUNCH_CHECK("adam_step");
}

}  // namespace headlab
