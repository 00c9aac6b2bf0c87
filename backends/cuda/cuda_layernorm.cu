// Layer norm over the last dim of contiguous (rows, cols) for the CUDA backend.
// Forward: a team (warp or block) per row; two passes over the row for mean and biased variance.
// Backward: dx per row the same way; dw and db are column sums over rows, computed
// deterministically as per-chunk partials (a block per 32 columns x chunk of rows) added up in a
// second kernel, then written (not accumulated). Accumulation as on the CPU: double for float.
#include "backends/cuda/cuda_internal.cuh"

namespace headlab {
namespace cuda {
namespace {

// x, y: (rows, cols); w, b: (cols) or null; mean, rstd: (rows) or null.
template <typename T, bool kBlock>
__global__ void layernorm_forward_kernel(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t rows,
                                         int64_t cols, double eps) {
  using Team = RowTeam<kBlock>;
  using A = Acc<T>;
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const T* xr = x + r * cols;
    const A mu = team_row_sum<Team, A>(cols, [&](int64_t j) { return xr[j]; }) / static_cast<A>(cols);
    const A v = team_row_sum<Team, A>(cols, [&](int64_t j) { return (xr[j] - mu) * (xr[j] - mu); });
    const T m = static_cast<T>(mu);
    const T rs = static_cast<T>(1.0 / sqrt(static_cast<double>(v) / static_cast<double>(cols) + eps));
    if (tid == 0) {
      if (mean) mean[r] = m;
      if (rstd) rstd[r] = rs;
    }
    T* yr = y + r * cols;
    for (int64_t j = tid; j < cols; j += nt) {
      T h = (xr[j] - m) * rs;
      if (w) h *= w[j];
      if (b) h += b[j];
      yr[j] = h;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, xhat = (x - mean) * rstd.
template <typename T, bool kBlock>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* mean, const T* rstd, const T* w,
                                             int64_t rows, int64_t cols) {
  using Team = RowTeam<kBlock>;
  using A = Acc<T>;
  __shared__ A shm_a[32];
  const int tid = Team::rank(), nt = Team::size();
  for (int64_t r = Team::first_row(); r < rows; r += Team::row_step()) {
    const T* dyr = dy + r * cols;
    const T* xr = x + r * cols;
    const T m = mean[r], rs = rstd[r];
    A mean_g = 0, mean_gx = 0;
    for (int64_t j = tid; j < cols; j += nt) {
      const T xhat = (xr[j] - m) * rs;
      const T g = w ? dyr[j] * w[j] : dyr[j];
      mean_g += g;
      mean_gx += g * xhat;
    }
    mean_g = Team::sum(mean_g, shm_a) / static_cast<A>(cols);
    mean_gx = Team::sum(mean_gx, shm_a) / static_cast<A>(cols);
    const T mg = static_cast<T>(mean_g), mgx = static_cast<T>(mean_gx);
    for (int64_t j = tid; j < cols; j += nt) {
      const T xhat = (xr[j] - m) * rs;
      const T g = w ? dyr[j] * w[j] : dyr[j];
      dx[r * cols + j] = rs * (g - mg - xhat * mgx);
    }
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// part_w[c, j] = sum over rows r of chunk c of dy[r, j] * xhat[r, j]; part_b likewise of dy.
// block (kColTile, kRowLanes), grid (column tiles, chunks).
template <typename T>
__global__ void layernorm_backward_wb_partial_kernel(Acc<T>* part_w, Acc<T>* part_b, const T* dy, const T* x,
                                                     const T* mean, const T* rstd, int64_t rows, int64_t cols,
                                                     int64_t rows_per_chunk) {
  using A = Acc<T>;
  __shared__ A sw[kRowLanes][kColTile + 1], sb[kRowLanes][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  A aw = 0, ab = 0;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const T d = dy[r * cols + col];
      const T xhat = (x[r * cols + col] - mean[r]) * rstd[r];
      aw += d * xhat;
      ab += d;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 1; k < kRowLanes; ++k) {
      aw += sw[k][threadIdx.x];
      ab += sb[k][threadIdx.x];
    }
    part_w[blockIdx.y * cols + col] = aw;
    part_b[blockIdx.y * cols + col] = ab;
  }
}

template <typename T>
__global__ void layernorm_backward_wb_final_kernel(T* dw, T* db, const Acc<T>* part_w, const Acc<T>* part_b,
                                                   int64_t cols, int64_t chunks) {
  for (int64_t j = global_thread(); j < cols; j += grid_threads()) {
    Acc<T> sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += part_w[c * cols + j];
      sb += part_b[c * cols + j];
    }
    if (dw) dw[j] = static_cast<T>(sw);
    if (db) db[j] = static_cast<T>(sb);
  }
}

}  // namespace
}  // namespace cuda

using namespace cuda;

void CudaBackend::layernorm_forward(DType dt, void* y, void* mean, void* rstd, const void* x, const void* w,
                                    const void* b, int64_t rows, int64_t cols, double eps) {
  if (rows <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "layernorm_forward", {
    launch_rows(*this, "layernorm_forward", rows, cols, layernorm_forward_kernel<T, false>,
                layernorm_forward_kernel<T, true>, static_cast<T*>(y), static_cast<T*>(mean), static_cast<T*>(rstd),
                static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), rows, cols, eps);
  });
}

void CudaBackend::layernorm_backward(DType dt, void* dx, void* dw, void* db, const void* dy, const void* x,
                                     const void* mean, const void* rstd, const void* w, int64_t rows, int64_t cols) {
  if (cols <= 0) return;
  activate();
  HLC_DISPATCH_FLOAT(dt, T, "layernorm_backward", {
    using A = Acc<T>;
    if (rows > 0 && dx)
      launch_rows(*this, "layernorm_backward", rows, cols, layernorm_backward_dx_kernel<T, false>,
                  layernorm_backward_dx_kernel<T, true>, static_cast<T*>(dx), static_cast<const T*>(dy),
                  static_cast<const T*>(x), static_cast<const T*>(mean), static_cast<const T*>(rstd),
                  static_cast<const T*>(w), rows, cols);
    if (dw || db) {
      // Enough (column tile, row chunk) blocks to fill the GPU; at least 32 rows per chunk.
      const int64_t tiles = ceil_div(cols, kColTile);
      int64_t chunks = std::clamp<int64_t>(ceil_div(4 * sm_count(), tiles), 1, 1024);
      chunks = std::max<int64_t>(std::min(chunks, ceil_div(rows, 32)), 1);
      const int64_t rows_per_chunk = std::max<int64_t>(ceil_div(rows, chunks), 1);
      chunks = std::max<int64_t>(ceil_div(rows, rows_per_chunk), 1);
      TempBuffer part(*this, static_cast<size_t>(2 * chunks * cols) * sizeof(A));
      A* part_w = part.as<A>();
      A* part_b = part_w + chunks * cols;
      if (rows > 0) {
        layernorm_backward_wb_partial_kernel<T>
            <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)), dim3(kColTile, kRowLanes), 0,
               stream_>>>(part_w, part_b, static_cast<const T*>(dy), static_cast<const T*>(x),
                          static_cast<const T*>(mean), static_cast<const T*>(rstd), rows, cols, rows_per_chunk);
        HL_CUDA_LAUNCH_CHECK("layernorm_backward (dw, db partials)");
      } else {
        HL_CUDA_CHECK("layernorm_backward",
                      cudaMemsetAsync(part.as<void>(), 0, 2 * chunks * cols * sizeof(A), stream_));
      }
      layernorm_backward_wb_final_kernel<T><<<grid_for(cols), kThreads, 0, stream_>>>(
          static_cast<T*>(dw), static_cast<T*>(db), part_w, part_b, cols, chunks);
      HL_CUDA_LAUNCH_CHECK("layernorm_backward (dw, db)");
    }
  });
}

}  // namespace headlab
