// The CUDA backend's core: device instances and discovery, the caching allocator, host <-> device
// copies, GEMM through cuBLAS and the few-row linear kernel (decoding). The other kernels live in the
// other cuda_*.cu files.
//
// Stream choice: each device gets one non-blocking stream created at init, and every kernel,
// cuBLAS call and copy of that backend goes to it. One stream keeps execution in program order,
// which is what makes the caching allocator safe without events; a stream of our own (rather
// than the legacy default stream) never serialises with unrelated work that some other library
// puts on the default stream, keeps cuBLAS bound to a known stream, and behaves the same when
// the code is built with --default-stream per-thread. The host waits only in copy_to_host,
// copy_from_host (the source may be pageable and is the caller's to free on return), synchronize,
// and the validation helpers (all_finite, indices_in_range) that must return an answer.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "backends/cuda/cuda_internal.cuh"

namespace headlab {

namespace {

constexpr int kMaxDevices = 64;
std::atomic<CudaBackend*> g_instances[kMaxDevices];
std::mutex g_instances_mu;
std::atomic<bool> g_allow_tf32{false};

__global__ void probe_kernel(int* out) {
  if (out) *out = 1;
}

// C[b] = beta * C[b] (0 when beta == 0, so NaNs in C do not survive), for GEMMs with K == 0.
template <typename T>
__global__ void scale_matrix_kernel(T* c, int64_t M, int64_t N, int64_t ldc, int64_t stride_c, int64_t batch, T beta) {
  const int64_t total = batch * M * N;
  for (int64_t e = cuda::global_thread(); e < total; e += cuda::grid_threads()) {
    const int64_t q = e % N, t = e / N, r = t % M, b = t / M;
    T* p = c + b * stride_c + r * ldc + q;
    *p = beta == T(0) ? T(0) : beta * *p;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Caching allocator
// ---------------------------------------------------------------------------------------------
namespace cuda {

size_t CachingAllocator::round_size(size_t nbytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  if (nbytes == 0) nbytes = 1;  // like the CPU backend: every allocation is a real, unique block
  if (nbytes <= kSmallLimit) return (nbytes + kSmall - 1) / kSmall * kSmall;
  return (nbytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::allocate(size_t nbytes, cudaStream_t stream) {
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  size_t got = 0;
  // Exact size class first. Large blocks may also be served by a cached block up to 1/8 bigger,
  // which absorbs the small size jitter of variable-length batches without a cudaMalloc.
  auto it = free_.lower_bound(size);
  const size_t slack = size > (size_t{1} << 20) ? size / 8 : 0;
  if (it != free_.end() && it->first <= size + slack) {
    got = it->first;
    p = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) free_.erase(it);
    cached_ -= got;
  } else {
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && cached_ > 0) {
      (void)cudaGetLastError();  // clear the (non-sticky) OOM before retrying
      free_cached_locked(stream);
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (err == cudaErrorMemoryAllocation) {
        size_t dev_free = 0, dev_total = 0;
        if (cudaMemGetInfo(&dev_free, &dev_total) != cudaSuccess) (void)cudaGetLastError();
        const auto size_of = [](size_t n) { return host().format_bytes(static_cast<double>(n)); };
        HL_FAIL(host().out_of_memory_message(nbytes, "cuda:" + std::to_string(device_)), "; ", size_of(in_use_),
                " in use by tensors (peak ", size_of(peak_), "), ", size_of(cached_), " cached, ", size_of(dev_free),
                " free of ", size_of(dev_total), " on the device");
      }
      HL_FAIL("cuda alloc: cudaMalloc of ", nbytes, " bytes failed on cuda:", device_, ": ", cudaGetErrorString(err));
    }
    got = size;
  }
  live_.emplace(p, got);
  in_use_ += got;
  peak_ = std::max(peak_, in_use_);
  return p;
}

void CachingAllocator::release(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  HL_CHECK(it != live_.end(), "cuda free: pointer ", p, " was not allocated by the cuda:", device_,
           " backend (or was already freed)");
  const size_t size = it->second;
  live_.erase(it);
  in_use_ -= size;
  free_[size].push_back(p);  // stream order makes immediate reuse safe (see the class comment)
  cached_ += size;
}

void CachingAllocator::free_cached_locked(cudaStream_t stream) {
  if (free_.empty()) return;
  // Blocks in the cache may still be read by queued kernels of their previous owner.
  HL_CUDA_CHECK("empty_cache (cudaStreamSynchronize)", cudaStreamSynchronize(stream));
  for (auto& [size, blocks] : free_)
    for (void* b : blocks) HL_CUDA_CHECK("empty_cache (cudaFree)", cudaFree(b));
  free_.clear();
  cached_ = 0;
}

void CachingAllocator::empty_cache(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  free_cached_locked(stream);
}

size_t CachingAllocator::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
size_t CachingAllocator::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
size_t CachingAllocator::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}
void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

}  // namespace cuda

// ---------------------------------------------------------------------------------------------
// The backend object
// ---------------------------------------------------------------------------------------------
CudaBackend::CudaBackend(int device) : device_(device), alloc_(device) {
  std::snprintf(name_, sizeof name_, "cuda");
  HL_CUDA_CHECK("init (cudaSetDevice)", cudaSetDevice(device));
  HL_CUDA_CHECK("init (cudaDeviceGetAttribute)",
                cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  sm_count_ = std::max(sm_count_, 1);
  HL_CUDA_CHECK("init (cudaDeviceGetAttribute)",
                cudaDeviceGetAttribute(&compute_major_, cudaDevAttrComputeCapabilityMajor, device));
  HL_CUDA_CHECK("init (cudaStreamCreateWithFlags)", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  // A first launch tells at once whether this binary has code for the GPU (wrong -arch otherwise
  // shows up as "no kernel image is available" in the middle of a training step).
  probe_kernel<<<1, 1, 0, stream_>>>(nullptr);
  const cudaError_t probe = cudaGetLastError();
  if (probe == cudaSuccess) {
    HL_CUDA_CHECK("init (probe kernel)", cudaStreamSynchronize(stream_));
  } else {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    HL_FAIL("cuda: cannot run kernels on cuda:", device, " (compute capability ", major, ".", minor,
            "): ", cudaGetErrorString(probe), "; rebuild with CMAKE_CUDA_ARCHITECTURES including ", major, minor);
  }
  HL_CUBLAS_CHECK("init (cublasCreate)", cublasCreate(&cublas_));
  HL_CUBLAS_CHECK("init (cublasSetStream)", cublasSetStream(cublas_, stream_));
  HL_CUBLAS_CHECK("init (cublasSetPointerMode)", cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST));
  HL_CUDA_CHECK("init (cudaHostAlloc)",
                cudaHostAlloc(reinterpret_cast<void**>(&check_slots_), 2 * kCheckSlots * sizeof(unsigned long long),
                              cudaHostAllocMapped));
  std::fill_n(check_slots_, 2 * kCheckSlots, 0ull);
  pending_checks_.reserve(kCheckSlots);
}

// Instances are created once and never destroyed (see cuda_backend_instance); this runs only if
// someone owns a CudaBackend directly. It must not throw.
CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  try {
    alloc_.empty_cache(stream_);
  } catch (...) {}
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
  if (check_slots_) cudaFreeHost(check_slots_);
  (void)cudaGetLastError();
}

void CudaBackend::activate() const {
  int current = -1;
  HL_CUDA_CHECK("cudaGetDevice", cudaGetDevice(&current));
  if (current != device_) HL_CUDA_CHECK("cudaSetDevice", cudaSetDevice(device_));
}

int CudaBackend::grid_for(int64_t n, int threads) const {
  if (n <= 0) return 1;
  return static_cast<int>(std::min<int64_t>(cuda::ceil_div(n, threads), max_blocks()));
}

void* CudaBackend::alloc(size_t nbytes) {
  activate();
  return alloc_.allocate(nbytes, stream_);
}

// No CUDA call here, so freeing from a destructor never throws on a healthy pointer.
void CudaBackend::free(void* p) {
  if (p) alloc_.release(p);
}

void CudaBackend::empty_cache() {
  activate();
  alloc_.empty_cache(stream_);
}

void CudaBackend::release_at_exit() {
  empty_cache();
  {
    std::lock_guard<std::mutex> lock(checks_mu_);
    if (check_slots_) {
      cudaStreamSynchronize(stream_);  // no queued check may still write into the slots
      cudaFreeHost(check_slots_);
      check_slots_ = nullptr;  // a check after this fails with a clear error (check_indices checks)
      pending_checks_.clear();
    }
  }
  std::lock_guard<std::mutex> lock(cublas_mu_);
  if (cublas_) cublasDestroy(cublas_);
  cublas_ = nullptr;  // a GEMM after this fails with a clear error (gemm checks)
}

void CudaBackend::copy_from_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  activate();
  // cudaMemcpyDefault (unified addressing) also serves a device or other-GPU source correctly.
  HL_CUDA_CHECK("copy_from_host", cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_));
  // The source is ordinary pageable memory that the caller may free or reuse on return.
  HL_CUDA_CHECK("copy_from_host", cudaStreamSynchronize(stream_));
  raise_failed_checks();
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  activate();
  HL_CUDA_CHECK("copy_to_host", cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_));
  HL_CUDA_CHECK("copy_to_host", cudaStreamSynchronize(stream_));
  raise_failed_checks();
}

void CudaBackend::synchronize() {
  activate();
  HL_CUDA_CHECK("synchronize", cudaStreamSynchronize(stream_));
  raise_failed_checks();
}

void CudaBackend::raise_failed_checks() {
  std::lock_guard<std::mutex> lock(checks_mu_);
  if (pending_checks_.empty()) return;
  std::string failed;
  for (size_t i = 0; i < pending_checks_.size(); ++i) {
    volatile unsigned long long* slot = check_slots_ + 2 * i;
    if (slot[0] != 0 && failed.empty()) {
      const PendingCheck& c = pending_checks_[i];
      failed = detail::str_cat(c.op, ": index ", static_cast<int64_t>(slot[1]), " is out of range for size ", c.size,
                               " (expected 0..", c.size - 1, "; found on cuda:", device_,
                               " after the op was queued, reported at the next synchronisation)");
    }
    slot[0] = 0;
    slot[1] = 0;
  }
  pending_checks_.clear();
  if (!failed.empty()) HL_FAIL(failed);
}

// ---------------------------------------------------------------------------------------------
// GEMM. The interface is row-major; cuBLAS is column-major. A row-major (R x C) matrix with
// leading dimension ld is, read column-major, its (C x R) transpose with the same ld. So
// C = op(A) op(B) (row-major) is computed as C^T = op(B)^T op(A)^T (column-major): swap A and B,
// swap M and N, keep each operand's transpose flag.
// ---------------------------------------------------------------------------------------------
void CudaBackend::gemm(DType dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                       const void* A, int64_t lda, int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b,
                       double beta, void* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  HL_CHECK(M > 0 && N > 0 && K >= 0 && batch > 0, "cuda gemm: invalid sizes M=", M, " N=", N, " K=", K,
           " batch=", batch);
  if (dt != DType::f32 && dt != DType::f64) HL_FAIL("cuda gemm: expected a floating dtype, got ", dtype_name(dt));
  activate();
  if (K == 0) {  // PyTorch semantics: C = beta * C (cuBLAS would reject lda = 0 here)
    HLC_DISPATCH_FLOAT(dt, T, "gemm", {
      scale_matrix_kernel<T><<<grid_for(batch * M * N), cuda::kThreads, 0, stream_>>>(
          static_cast<T*>(C), M, N, ldc, stride_c, batch, static_cast<T>(beta));
      HL_CUDA_LAUNCH_CHECK("gemm (scale C)");
    });
    return;
  }
  // A row-major matrix with one row has a meaningless leading dimension; cuBLAS still checks it.
  auto fix_ld = [](int64_t ld, int64_t rows, int64_t cols, const char* which) {
    if (rows == 1) return std::max<int64_t>(ld, cols);
    HL_CHECK(ld >= cols, "cuda gemm: leading dimension ", which, " = ", ld, " is smaller than the ", cols,
             " columns of the row-major operand");
    return ld;
  };
  lda = trans_a ? fix_ld(lda, K, M, "lda") : fix_ld(lda, M, K, "lda");
  ldb = trans_b ? fix_ld(ldb, N, K, "ldb") : fix_ld(ldb, K, N, "ldb");
  ldc = fix_ld(ldc, M, N, "ldc");
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;

  std::lock_guard<std::mutex> lock(cublas_mu_);
  HL_CHECK(cublas_ != nullptr, "cuda gemm: called while the process exits (the cuBLAS handle is released)");
  const int want_tf32 = g_allow_tf32.load(std::memory_order_relaxed) ? 1 : 0;
  if (want_tf32 != cublas_tf32_) {
    HL_CUBLAS_CHECK("gemm (cublasSetMathMode)",
                    cublasSetMathMode(cublas_, want_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    cublas_tf32_ = want_tf32;
  }
  if (dt == DType::f32) {
    const float a = static_cast<float>(alpha), b = static_cast<float>(beta);
    HL_CUBLAS_CHECK("gemm (cublasSgemmStridedBatched)",
                    cublasSgemmStridedBatched_64(cublas_, op_b, op_a, N, M, K, &a, static_cast<const float*>(B), ldb,
                                                 stride_b, static_cast<const float*>(A), lda, stride_a, &b,
                                                 static_cast<float*>(C), ldc, stride_c, batch));
  } else {
    HL_CUBLAS_CHECK("gemm (cublasDgemmStridedBatched)",
                    cublasDgemmStridedBatched_64(cublas_, op_b, op_a, N, M, K, &alpha, static_cast<const double*>(B),
                                                 ldb, stride_b, static_cast<const double*>(A), lda, stride_a, &beta,
                                                 static_cast<double*>(C), ldc, stride_c, batch));
  }
}

// ---------------------------------------------------------------------------------------------
// A linear layer over a few rows (decoding), bias included: ksplit warps per output column n each read a
// slice of w's row n (coalesced) against every row of x; the block adds up the slices and the bias. One
// launch where the GEMM path took two (the bias copied into out, then cuBLAS's GEMV). Sums in T, in a
// fixed order (deterministic).
// ---------------------------------------------------------------------------------------------
namespace {

constexpr int64_t kLinearMaxRows = 4;
constexpr int kLinearWarps = 8;

template <typename T, int ROWS>
__global__ void __launch_bounds__(kLinearWarps * 32)
    linear_rows_kernel(T* out, const T* x, int64_t ldx, const T* w, const T* bias, int64_t N, int64_t K, int ksplit) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, outs = kLinearWarps / ksplit;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * outs + warp / ksplit;
  T acc[ROWS] = {};
  if (n < N) {
    const T* wn = w + n * K;
    for (int64_t k = (warp % ksplit) * 32 + lane; k < K; k += 32 * ksplit) {
      const T wk = wn[k];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] += wk * x[r * ldx + k];
    }
  }
  __shared__ T slices[kLinearWarps][ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const T sum = cuda::warp_sum(acc[r]);
    if (lane == 0) slices[warp][r] = sum;
  }
  __syncthreads();
  if (threadIdx.x >= outs * ROWS) return;
  const int o = threadIdx.x / ROWS, r = threadIdx.x % ROWS;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * outs + o;
  if (col >= N) return;
  T sum = bias ? bias[col] : T(0);
  for (int p = 0; p < ksplit; ++p) sum += slices[o * ksplit + p][r];
  out[r * N + col] = sum;
}

}  // namespace

bool CudaBackend::linear_rows(DType dt, void* out, const void* x, int64_t ldx, const void* w, const void* bias,
                              int64_t rows, int64_t N, int64_t K) {
  if (rows < 1 || rows > kLinearMaxRows || N < 1 || K < 1 || (dt != DType::f32 && dt != DType::f64)) return false;
  activate();
  // Warps per column: the fewest that still give every SM two blocks.
  int ksplit = 1;
  while (ksplit < kLinearWarps && cuda::ceil_div(N * ksplit, kLinearWarps) < 2 * int64_t{sm_count_}) ksplit *= 2;
  const int64_t blocks = cuda::ceil_div(N, kLinearWarps / ksplit);
  HLC_DISPATCH_FLOAT(dt, T, "linear_rows", {
    const auto launch = [&](auto rows_c) {
      linear_rows_kernel<T, decltype(rows_c)::value><<<blocks, kLinearWarps * 32, 0, stream_>>>(
          static_cast<T*>(out), static_cast<const T*>(x), ldx, static_cast<const T*>(w), static_cast<const T*>(bias), N,
          K, ksplit);
    };
    switch (rows) {
      case 1:
        launch(std::integral_constant<int, 1>{});
        break;
      case 2:
        launch(std::integral_constant<int, 2>{});
        break;
      case 3:
        launch(std::integral_constant<int, 3>{});
        break;
      default:
        launch(std::integral_constant<int, 4>{});
        break;
    }
  });
  HL_CUDA_LAUNCH_CHECK("linear_rows");
  return true;
}

// ---------------------------------------------------------------------------------------------
// The plugin's table (backends/cuda/cuda_plugin.h): what the core's cuda_backend.h functions call
// ---------------------------------------------------------------------------------------------
namespace {

const CudaHost* g_host = nullptr;

bool device_visible() {
  static const bool visible = []() noexcept {
    try {
      int count = 0;
      const cudaError_t err = cudaGetDeviceCount(&count);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      return count > 0;
    } catch (...) {
      return false;
    }
  }();
  return visible;
}

void release_at_exit() {
  for (auto& slot : g_instances)
    if (CudaBackend* be = slot.load(std::memory_order_acquire)) try {
        be->release_at_exit();
      } catch (...) {  // nothing can be reported at exit; the driver reclaims the memory anyway
      }
}

CudaBackend& backend_instance(int device_index) {
  if (device_index >= 0 && device_index < kMaxDevices) {
    if (CudaBackend* be = g_instances[device_index].load(std::memory_order_acquire)) return *be;
  }
  std::lock_guard<std::mutex> lock(g_instances_mu);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    HL_FAIL("cuda: no CUDA device is visible (cudaGetDeviceCount: ", cudaGetErrorString(err), "); use --device cpu");
  }
  HL_CHECK(count > 0, "cuda: no CUDA device is visible (cudaGetDeviceCount: 0 devices); use --device cpu");
  HL_CHECK(device_index >= 0 && device_index < count && device_index < kMaxDevices, "cuda: device cuda:", device_index,
           " does not exist (", count, count == 1 ? " device is" : " devices are", " visible: cuda:0",
           count > 1 ? " to cuda:" + std::to_string(count - 1) : std::string(), ")");
  if (CudaBackend* be = g_instances[device_index].load(std::memory_order_acquire)) return *be;
  // Deliberately leaked: destroying it at exit would call into a CUDA runtime that may already be
  // torn down. The driver reclaims everything when the process ends.
  auto* be = new CudaBackend(device_index);
  g_instances[device_index].store(be, std::memory_order_release);
  // Its cached blocks and cuBLAS handle are returned at exit, while the runtime (initialised above, so
  // torn down after this handler) still runs: what a leak checker then reports is memory that tensors
  // still hold.
  static const bool release_registered = (std::atexit(release_at_exit), true);
  (void)release_registered;
  return *be;
}

const CudaPlugin kTable = [] {
  CudaPlugin t;
  t.device_visible = &device_visible;
  t.backend_instance = [](int device_index) -> Backend* { return &backend_instance(device_index); };
  t.set_allow_tf32 = [](bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); };
  t.allow_tf32 = [] { return g_allow_tf32.load(std::memory_order_relaxed); };
  t.empty_cache = [](int device_index) { backend_instance(device_index).empty_cache(); };
  t.cached_bytes = [](int device_index) { return backend_instance(device_index).cached_bytes(); };
  return t;
}();

}  // namespace

const CudaHost& cuda::host() { return *g_host; }

}  // namespace headlab

// The plugin's one exported symbol (everything else is hidden). The core checks the table's abi
// before calling anything in it.
extern "C" __attribute__((visibility("default"))) const headlab::CudaPlugin* headlab_cuda_plugin(
    const headlab::CudaHost* host) {
  headlab::g_host = host;
  return &headlab::kTable;
}
