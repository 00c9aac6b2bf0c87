// Row kernels of the CUDA backend over contiguous (rows, cols): softmax (plain, masked by
// per-row lengths, causal) and log-softmax, forward and backward, and cross-entropy over logits.
// A warp per row up to kWarpRowMaxCols columns, a block per row above. The row log-sum-exp is
// team_row_logsumexp (cuda_internal.cuh): max-subtracted and accumulated like the CPU backend
// (float sums in double), so the two agree to rounding.
#include "backends/cuda/cuda_internal.cuh"

namespace headlab {
namespace cuda {
namespace {

// y = softmax(scale * x) over the first valid columns of each row; the rest (and rows with nothing
// valid) are 0.
template <typename T, bool kBlock>
__global__ void softmax_forward_kernel(T* y, const T* x, int64_t rows, int64_t cols, T scale, SoftmaxMask mask,
                                       const int64_t* lengths, int64_t q_len) {
  using Team = RowTeam<kBlock>;
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const int64_t valid = smath::softmax_valid_cols(mask, lengths, q_len, r, cols);
    const smath::RowLse<T> lse = team_row_logsumexp<Team>(xr, valid, scale);
    const T inv = valid > 0 ? static_cast<T>(1.0 / lse.sum) : T(0);
    for (int64_t j = tid; j < cols; j += nt) yr[j] = j < valid ? smath::exp(scale * xr[j] - lse.max) * inv : T(0);
  }
}

// dx = scale * y * (dy - sum(dy * y))
template <typename T, bool kBlock>
__global__ void softmax_backward_kernel(T* dx, const T* dy, const T* y, int64_t rows, int64_t cols, T scale) {
  using Team = RowTeam<kBlock>;
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const T* dyr = dy + r * cols;
    const T* yr = y + r * cols;
    const T d = static_cast<T>(team_row_sum<Team, Acc<T>>(cols, [&](int64_t j) { return dyr[j] * yr[j]; }));
    for (int64_t j = tid; j < cols; j += nt) dx[r * cols + j] = scale * yr[j] * (dyr[j] - d);
  }
}

template <typename T, bool kBlock>
__global__ void log_softmax_forward_kernel(T* y, const T* x, int64_t rows, int64_t cols) {
  using Team = RowTeam<kBlock>;
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const T* xr = x + r * cols;
    const T lse = team_row_logsumexp<Team>(xr, cols).lse();
    for (int64_t j = tid; j < cols; j += nt) y[r * cols + j] = xr[j] - lse;
  }
}

// dx = dy - exp(y) * sum(dy)
template <typename T, bool kBlock>
__global__ void log_softmax_backward_kernel(T* dx, const T* dy, const T* y, int64_t rows, int64_t cols) {
  using Team = RowTeam<kBlock>;
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const T s = static_cast<T>(team_row_sum<Team, Acc<T>>(cols, [&](int64_t j) { return dy[r * cols + j]; }));
    for (int64_t j = tid; j < cols; j += nt) dx[r * cols + j] = dy[r * cols + j] - smath::exp(y[r * cols + j]) * s;
  }
}

// loss[r] = logsumexp(logits[r]) - logits[r, target[r]]; 0 when ignored. A target outside
// [0, classes) (the op layer validates first) gives NaN instead of an out-of-bounds read.
template <typename T, bool kBlock>
__global__ void cross_entropy_forward_kernel(T* loss, const T* logits, const int64_t* targets, int64_t rows,
                                             int64_t classes, int64_t ignore_index) {
  using Team = RowTeam<kBlock>;
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const int64_t t = targets[r];  // the same for the whole team: the branches below are uniform
    if (t == ignore_index) {
      if (Team::rank() == 0) loss[r] = T(0);
      continue;
    }
    const T* xr = logits + r * classes;
    const smath::RowLse<T> lse = team_row_logsumexp<Team>(xr, classes);
    if (Team::rank() == 0) {
      if (t < 0 || t >= classes)
        loss[r] = static_cast<T>(NAN);
      else
        loss[r] = static_cast<T>(lse.max + lse.log_sum() - xr[t]);
    }
  }
}

// dlogits[r] = dloss[r * dloss_stride] * scale * (softmax(logits[r]) - onehot(target[r])); 0 if ignored.
template <typename T, bool kBlock>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* dloss, int64_t dloss_stride, double scale,
                                              const T* logits, const int64_t* targets, int64_t rows, int64_t classes,
                                              int64_t ignore_index) {
  using Team = RowTeam<kBlock>;
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    T* dr = dlogits + r * classes;
    const int64_t t = targets[r];
    if (t == ignore_index) {
      for (int64_t j = tid; j < classes; j += nt) dr[j] = T(0);
      continue;
    }
    const T* xr = logits + r * classes;
    const smath::RowLse<T> lse = team_row_logsumexp<Team>(xr, classes);
    const T g = static_cast<T>(static_cast<double>(dloss[r * dloss_stride]) * scale);
    const T inv = static_cast<T>(1.0 / lse.sum);
    const bool bad_target = t < 0 || t >= classes;
    for (int64_t j = tid; j < classes; j += nt) {
      const T v = g * smath::exp(xr[j] - lse.max) * inv;
      dr[j] = bad_target ? static_cast<T>(NAN) : (j == t ? v - g : v);
    }
  }
}

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols, double scale,
                                  SoftmaxMask mask, const int64_t* lengths, int64_t q_len) {
  HL_CHECK(mask != SoftmaxMask::causal || q_len > 0, "cuda softmax_forward: causal mask needs q_len > 0, got ", q_len);
  HL_CHECK(mask != SoftmaxMask::lengths || lengths != nullptr || rows == 0,
           "cuda softmax_forward: lengths mask without lengths");
  if (rows <= 0 || cols <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "softmax_forward", {
    launch_rows(*this, "softmax_forward", rows, cols, softmax_forward_kernel<T, false>, softmax_forward_kernel<T, true>,
                static_cast<T*>(y), static_cast<const T*>(x), rows, cols, static_cast<T>(scale), mask, lengths, q_len);
  });
}

void CudaBackend::softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                                   double scale) {
  if (rows <= 0 || cols <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "softmax_backward", {
    launch_rows(*this, "softmax_backward", rows, cols, softmax_backward_kernel<T, false>,
                softmax_backward_kernel<T, true>, static_cast<T*>(dx), static_cast<const T*>(dy),
                static_cast<const T*>(y), rows, cols, static_cast<T>(scale));
  });
}

void CudaBackend::log_softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "log_softmax_forward", {
    launch_rows(*this, "log_softmax_forward", rows, cols, log_softmax_forward_kernel<T, false>,
                log_softmax_forward_kernel<T, true>, static_cast<T*>(y), static_cast<const T*>(x), rows, cols);
  });
}

void CudaBackend::log_softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "log_softmax_backward", {
    launch_rows(*this, "log_softmax_backward", rows, cols, log_softmax_backward_kernel<T, false>,
                log_softmax_backward_kernel<T, true>, static_cast<T*>(dx), static_cast<const T*>(dy),
                static_cast<const T*>(y), rows, cols);
  });
}

void CudaBackend::cross_entropy_forward(DType dt, void* loss, const void* logits, const int64_t* targets, int64_t rows,
                                        int64_t classes, int64_t ignore_index) {
  if (rows <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "cross_entropy_forward", {
    launch_rows(*this, "cross_entropy_forward", rows, classes, cross_entropy_forward_kernel<T, false>,
                cross_entropy_forward_kernel<T, true>, static_cast<T*>(loss), static_cast<const T*>(logits), targets,
                rows, classes, ignore_index);
  });
}

void CudaBackend::cross_entropy_backward(DType dt, void* dlogits, const void* dloss, int64_t dloss_stride, double scale,
                                         const void* logits, const int64_t* targets, int64_t rows, int64_t classes,
                                         int64_t ignore_index) {
  if (rows <= 0 || classes <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "cross_entropy_backward", {
    launch_rows(*this, "cross_entropy_backward", rows, classes, cross_entropy_backward_kernel<T, false>,
                cross_entropy_backward_kernel<T, true>, static_cast<T*>(dlogits), static_cast<const T*>(dloss),
                dloss_stride, scale, static_cast<const T*>(logits), targets, rows, classes, ignore_index);
  });
}

}  // namespace headlab
