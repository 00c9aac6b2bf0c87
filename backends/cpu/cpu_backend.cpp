// The CPU backend: GEMMs through blas.h (libxsmm, OpenBLAS), vectorisable OpenMP loops for the rest.
// This file: fill/copy, elementwise, reductions, GEMM, randomness, gather/scatter, and cpu_backend().
// Float reductions accumulate in double so float32 results track PyTorch's to ~1e-7 relative.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

#include "backends/cpu/blas.h"
#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/quant_gemv.h"
#include "backends/philox.h"
#include "backends/quant_blocks.h"
#include "base/bfloat16.h"

namespace headlab::cpu {

// ---- fill, copy, elementwise ----
void CpuBackend::fill(DType dt, const Loop& l, double value) {
  dispatch_all(dt, [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(l.ptr[0]);
    const T v = dt == DType::b8 ? T(value != 0) : static_cast<T>(value);
    for_each_row<1>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
      T* p = o + base[0];
      if (s[0] == 1)
        std::fill(p, p + n, v);
      else
        for (int64_t i = 0; i < n; ++i) p[i * s[0]] = v;
    });
  });
}

void CpuBackend::arange(DType dt, void* out, int64_t n, double start, double step) {
  dispatch_all(dt, [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(start + step * static_cast<double>(i));
  });
}

namespace {
// Copies to or from bfloat16 (to it: through float32, rounded to the nearest even).
void copy_bf16(DType dst_dt, DType src_dt, const Loop& l) {
  HL_CHECK(is_floating(dst_dt) || is_floating(src_dt) || dst_dt == src_dt, "copy: ", dtype_name(src_dt), " to ",
           dtype_name(dst_dt), " is not a conversion bfloat16 takes (float32 and float64 only)");
  for_each_row<2>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
    if (dst_dt == DType::bf16) {
      uint16_t* o = static_cast<uint16_t*>(l.ptr[0]) + base[0];
      if (src_dt == DType::bf16)
        map1(o, s[0], static_cast<const uint16_t*>(l.ptr[1]) + base[1], s[1], n, [](uint16_t x) { return x; });
      else
        dispatch_float(src_dt, "copy", [&](auto tag_TS) {
          using TS = decltype(tag_TS);
          map1(o, s[0], static_cast<const TS*>(l.ptr[1]) + base[1], s[1], n,
               [](TS x) { return bf16_from_float(static_cast<float>(x)); });
        });
      return;
    }
    dispatch_float(dst_dt, "copy", [&](auto tag_TD) {
      using TD = decltype(tag_TD);
      map1(static_cast<TD*>(l.ptr[0]) + base[0], s[0], static_cast<const uint16_t*>(l.ptr[1]) + base[1], s[1], n,
           [](uint16_t x) { return static_cast<TD>(float_from_bf16(x)); });
    });
  });
}
}  // namespace

void CpuBackend::copy(DType dst_dt, DType src_dt, const Loop& l) {
  if (dst_dt == DType::bf16 || src_dt == DType::bf16) return copy_bf16(dst_dt, src_dt, l);
  dispatch_all(dst_dt, [&](auto tag_TD) {
    using TD = decltype(tag_TD);
    dispatch_all(src_dt, [&](auto tag_TS) {
      using TS = decltype(tag_TS);
      TD* o = static_cast<TD*>(l.ptr[0]);
      const TS* a = static_cast<const TS*>(l.ptr[1]);
      for_each_row<2>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
        if constexpr (std::is_same_v<TD, uint8_t> && !std::is_same_v<TS, uint8_t>)
          map1(o + base[0], s[0], a + base[1], s[1], n, [](TS x) { return TD(x != TS(0)); });
        else
          map1(o + base[0], s[0], a + base[1], s[1], n, [](TS x) { return static_cast<TD>(x); });
      });
    });
  });
}

// One loop per op (the switch is hoisted out of the element loop, so each case vectorises).
void CpuBackend::unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) {
  dispatch_float(dt, "unary", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(l.ptr[0]);
    const T* a = static_cast<const T*>(l.ptr[1]);
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    smath::dispatch_unary_op(op, "unary", [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      for_each_row<2>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
        map1(o + base[0], s[0], a + base[1], s[1], n, [=](T x) { return smath::unary_op<kOp, Fast>(x, al, be); });
      });
    });
  });
}

void CpuBackend::unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y,
                                int64_t n, double alpha) {
  if (n <= 0) return;
  smath::check_grad_operand(op, x, y, "unary_backward");
  dispatch_float(dt, "unary_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* di = static_cast<T*>(din);
    const T* dy = static_cast<const T*>(dout);
    const T* px = static_cast<const T*>(x);
    const T* py = static_cast<const T*>(y);
    const T al = static_cast<T>(alpha);
    smath::dispatch_unary_op(op, "unary_backward", [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      parallel_for(n, n > kParallelGrain,
                   [&](int64_t i) { di[i] = smath::unary_backward_at<kOp, Fast>(dy, px, py, i, al); });
    });
  });
}

void CpuBackend::binary(BinaryOp op, DType dt, const Loop& l) {
  dispatch_all(dt, [&](auto tag_T) {
    using T = decltype(tag_T);
    const T* a = static_cast<const T*>(l.ptr[1]);
    const T* b = static_cast<const T*>(l.ptr[2]);
    smath::dispatch_binary_op(op, "binary", [&](auto op_c) {
      constexpr BinaryOp kOp = decltype(op_c)::value;
      using TO = std::conditional_t<is_comparison(kOp), uint8_t, T>;  // comparisons write bool
      TO* o = static_cast<TO*>(l.ptr[0]);
      for_each_row<3>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
        map2(o + base[0], s[0], a + base[1], s[1], b + base[2], s[2], n,
             [](T u, T v) { return smath::binary_op<kOp>(u, v); });
      });
    });
  });
}

void CpuBackend::where(DType dt, const Loop& l) {
  dispatch_all(dt, [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(l.ptr[0]);
    const uint8_t* c = static_cast<const uint8_t*>(l.ptr[1]);
    const T* a = static_cast<const T*>(l.ptr[2]);
    const T* b = static_cast<const T*>(l.ptr[3]);
    for_each_row<4>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i)
        o[base[0] + i * s[0]] = c[base[1] + i * s[1]] ? a[base[2] + i * s[2]] : b[base[3] + i * s[3]];
    });
  });
}

void CpuBackend::reduce(ReduceOp op, DType dt, void* out, const void* in, int n_outer, const int64_t* outer_sizes,
                        const int64_t* outer_strides, int n_inner, const int64_t* inner_sizes,
                        const int64_t* inner_strides) {
  dispatch_all(dt, [&](auto tag_T) {
    using T = decltype(tag_T);
    if constexpr (std::is_same_v<T, uint8_t>) {
      HL_FAIL("reduce: bool tensors cannot be reduced; convert with to(int64) first");
    } else {
      reduce_typed<T>(op, out, static_cast<const T*>(in), n_outer, outer_sizes, outer_strides, n_inner, inner_sizes,
                      inner_strides);
    }
  });
}

template <typename T>
void CpuBackend::reduce_typed(ReduceOp op, void* out, const T* in, int n_outer, const int64_t* osz, const int64_t* ost,
                              int n_inner, const int64_t* isz, const int64_t* ist) {
  int64_t n_out = 1, n_red = 1;
  for (int d = 0; d < n_outer; ++d) n_out *= osz[d];
  for (int d = 0; d < n_inner; ++d) n_red *= isz[d];
  // Column sums of a row-major matrix (bias gradients, a layer's heads' outputs): each thread's columns a
  // block at a time, down every row, the block's sums staying in L1. (Across all of a thread's columns at
  // once, a (12, 737,280) sum read and wrote 2.9 MB of sums 12 times: 5 GB/s on one thread.)
  if (op == ReduceOp::sum && n_outer == 1 && ost[0] == 1 && n_inner == 1 && n_red > 1) {
    constexpr int64_t kBlock = 1024;
    T* o = static_cast<T*>(out);
    const int64_t cols = osz[0], rs = ist[0];
    parallel_team(cols * n_red > kParallelGrain ? omp_get_max_threads() : 1, [&](int t, int nt) {
      const int64_t lo = cols * t / nt, hi = cols * (t + 1) / nt;
      Acc<T> acc[kBlock];
      for (int64_t c0 = lo; c0 < hi; c0 += kBlock) {
        const int64_t n = std::min(kBlock, hi - c0);
        std::fill(acc, acc + n, Acc<T>(0));
        for (int64_t r = 0; r < n_red; ++r) {
          const T* row = in + r * rs + c0;
          for (int64_t c = 0; c < n; ++c) acc[c] += row[c];
        }
        for (int64_t c = 0; c < n; ++c) o[c0 + c] = static_cast<T>(acc[c]);
      }
    });
    return;
  }
  const bool contiguous_inner = n_inner == 1 && ist[0] == 1;
  parallel_for(n_out, n_out * n_red > kParallelGrain && n_out > 1, [&](int64_t o) {
    int64_t base = 0, rem = o;
    for (int d = n_outer - 1; d >= 0; --d) {
      base += (rem % osz[d]) * ost[d];
      rem /= osz[d];
    }
    const T* p = in + base;
    auto offset_of = [&](int64_t j) {
      if (contiguous_inner) return j;
      int64_t off = 0, r = j;
      for (int d = n_inner - 1; d >= 0; --d) {
        off += (r % isz[d]) * ist[d];
        r /= isz[d];
      }
      return off;
    };
    if (op == ReduceOp::sum) {
      Acc<T> s = 0;
      if (contiguous_inner) {
        s = lane_sum<T>(n_red, [=](int64_t j) { return p[j]; });
      } else {
        for (int64_t j = 0; j < n_red; ++j) s += p[offset_of(j)];
      }
      static_cast<T*>(out)[o] = static_cast<T>(s);
    } else {
      // max / min / argmax: NaN wins (as in PyTorch); argmax keeps the first occurrence.
      T best = p[offset_of(0)];
      int64_t best_j = 0;
      for (int64_t j = 1; j < n_red && !(best != best); ++j) {
        const T v = p[offset_of(j)];
        const bool better = (v != v) || (op == ReduceOp::min ? v < best : v > best);
        if (better) {
          best = v;
          best_j = j;
        }
      }
      if (op == ReduceOp::argmax)
        static_cast<int64_t*>(out)[o] = best_j;
      else
        static_cast<T*>(out)[o] = best;
    }
  });
}

bool CpuBackend::all_finite(DType dt, const void* p, int64_t n) {
  bool ok = true;
  dispatch_float(dt, "all_finite", [&](auto tag_T) {
    using T = decltype(tag_T);
    const T* x = static_cast<const T*>(p);
    for (int64_t i = 0; i < n; ++i) ok &= std::isfinite(x[i]);
  });
  return ok;
}

bool CpuBackend::indices_in_range(const int64_t* idx, int64_t n, int64_t lo, int64_t hi) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= idx[i] >= lo && idx[i] < hi;
  return ok;
}

void CpuBackend::check_indices(const char* op, const int64_t* idx, int64_t n, int64_t size) {
  if (indices_in_range(idx, n, 0, size)) return;
  for (int64_t i = 0; i < n; ++i)
    HL_CHECK(idx[i] >= 0 && idx[i] < size, op, ": index ", idx[i], " is out of range for size ", size, " (expected 0..",
             size - 1, ")");
}

// ---- GEMM ----
// The threading policy for products: headlab's OpenMP threads split the work and each block is one
// single-threaded BLAS call. Many matrices: one thread per matrix. Few: each C is cut into bands of
// rows (or of columns when C is wider than tall), one per thread. At the toy GPT's shapes ((2048 x
// 128) @ (128 x 128) and the like, 2 threads) this ran at 185 GFLOP/s where OpenBLAS's own threading
// reached 137. Below kGemmParallelWork multiply-adds one thread beats waking another; a GEMV (one row)
// reads each of its weights once, so it pays from fewer: kGemvParallelWork (1 MB of floats, ~50 us of one
// thread's reads; GPT-2's attention out_proj, 768 x 768, ran on one thread while the other waited).
namespace {
constexpr double kGemmParallelWork = 1 << 20;
constexpr double kGemvParallelWork = 1 << 18;
constexpr int64_t kGemvBandsPerThread = 4;
// Band s of `splits` over [0, n): edges on multiples of 16 floats (whole SIMD registers).
int64_t band_edge(int64_t n, int64_t s, int64_t splits) { return s == splits ? n : n * s / splits / 16 * 16; }
}  // namespace

void CpuBackend::gemm(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void* A,
                      int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb, double beta, void* C,
                      int64_t ldc, int64_t sc, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const int64_t threads = omp_get_max_threads();
  const bool split_rows = M >= N;
  const int64_t dim = split_rows ? M : N;
  const bool parallel = threads > 1 && static_cast<double>(batch) * M * N * std::max<int64_t>(K, 1) >
                                           (M == 1 ? kGemvParallelWork : kGemmParallelWork);
  // A GEMV's bands go kGemvBandsPerThread to a thread, taken as each finishes one: equal bands finished up to
  // 10% apart while the other tenants of the memory bus slowed one thread's reads more than the other's.
  const bool gemv = M == 1 && batch == 1;
  const int64_t per_thread = gemv ? kGemvBandsPerThread : 1;
  const int64_t splits =
      parallel && batch < 2 * threads ? std::min<int64_t>(threads * per_thread, std::max<int64_t>(dim / 32, 1)) : 1;
  const int64_t items = batch * splits;
  dispatch_float(dt, "gemm", [&](auto tag_T) {
    using T = decltype(tag_T);
    const auto band = [&](int64_t it) {
      const int64_t i = it / splits, lo = band_edge(dim, it % splits, splits),
                    hi = band_edge(dim, it % splits + 1, splits);
      const T* a = static_cast<const T*>(A) + i * sa;
      const T* b = static_cast<const T*>(B) + i * sb;
      T* c = static_cast<T*>(C) + i * sc;
      if (split_rows)  // rows lo..hi of C come from rows (columns when transposed) lo..hi of op(A)
        blas_gemm<T>(ta, tb, hi - lo, N, K, T(alpha), a + (ta ? lo : lo * lda), lda, b, ldb, T(beta), c + lo * ldc,
                     ldc);
      else
        blas_gemm<T>(ta, tb, M, hi - lo, K, T(alpha), a, lda, b + (tb ? lo * ldb : lo), ldb, T(beta), c + lo, ldc);
    };
    if (gemv)
      parallel_for_dynamic(items, parallel && items > 1, band);
    else
      parallel_for(items, parallel && items > 1, band);
  });
}

#ifdef HEADLAB_HAS_XSMM
namespace {
// A linear layer with its bias through libxsmm (xsmm_linear: the bias broadcast block by block), each thread
// on a band of rows, after_rows(first, count) applied to each block of finished rows; false where a band
// would be one libxsmm does not serve (the op then copies the bias into out and runs gemm).
bool linear_in_bands(float* out, const float* x, int64_t ldx, const float* w, const float* bias, int64_t rows,
                     int64_t N, int64_t K, const std::function<void(int64_t, int64_t)>& after_rows) {
  const int64_t threads = omp_get_max_threads();
  const bool parallel = threads > 1 && static_cast<double>(rows) * N * K > kGemmParallelWork;
  const int64_t bands = parallel ? threads : 1;
  if (!xsmm_pays() || !xsmm_linear_serves(rows / bands, N, K)) return false;
  parallel_for(bands, bands > 1, [&](int64_t b) {
    const int64_t lo = band_edge(rows, b, bands), hi = band_edge(rows, b + 1, bands);
    const auto after_band_rows = [&](int64_t first, int64_t count) { after_rows(lo + first, count); };
    if (xsmm_linear(hi - lo, N, K, x + lo * ldx, ldx, w, bias, out + lo * N,
                    after_rows ? after_band_rows : std::function<void(int64_t, int64_t)>{}))
      return;
    for (int64_t r = lo; r < hi; ++r)  // a kernel libxsmm would not build: the op's own way, on this band
      std::memcpy(out + r * N, bias, static_cast<size_t>(N) * sizeof(float));
    blas_gemm<float>(false, true, hi - lo, N, K, 1.0f, x + lo * ldx, ldx, w, K, 1.0f, out + lo * N, N);
    if (after_rows) after_rows(lo, hi - lo);
  });
  return true;
}
}  // namespace
#endif

bool CpuBackend::linear_rows(DType dt, void* out, const void* x, int64_t ldx, const void* w, const void* bias,
                             int64_t rows, int64_t N, int64_t K) {
#ifdef HEADLAB_HAS_XSMM
  return dt == DType::f32 && bias != nullptr &&
         linear_in_bands(static_cast<float*>(out), static_cast<const float*>(x), ldx, static_cast<const float*>(w),
                         static_cast<const float*>(bias), rows, N, K, {});
#else
  (void)dt, (void)out, (void)x, (void)ldx, (void)w, (void)bias, (void)rows, (void)N, (void)K;
  return false;
#endif
}

// A few rows (decoding): each thread a band of the output features, every weight row read once, widened as it is
// read (gemv_by_rows: half the bytes of float32 weights; gemv_q8_0, gemv_q4_k: about a quarter, an eighth). More
// rows: the weight widened to float32 kWidenFeatures features at a time (the band's rows split over the threads),
// each band a float32 GEMM into its columns of out (scratch of kWidenFeatures x K floats).
bool CpuBackend::linear_stored(DType wdt, void* out, const void* x, int64_t ldx, const void* w, const void* bias,
                               int64_t rows, int64_t N, int64_t K) {
  constexpr int64_t kGemvRows = 4, kWidenFeatures = 1024;
  if (wdt != DType::bf16 && wdt != DType::q8_0 && wdt != DType::q4_k) return false;
  float* const o = static_cast<float*>(out);
  const float* const X = static_cast<const float*>(x);
  const auto* const W = static_cast<const std::byte*>(w);
  const float* const b = static_cast<const float*>(bias);
  const int64_t row_bytes = K / dtype_block(wdt) * static_cast<int64_t>(dtype_size(wdt));
  if (rows == 0 || N == 0) return true;
  const int64_t threads = omp_get_max_threads();
  if (rows <= kGemvRows) {
    const bool parallel = threads > 1 && static_cast<double>(rows) * N * K > kGemvParallelWork;
    // bands taken as each thread finishes one, as gemm's GEMV takes them
    const int64_t splits =
        parallel ? std::min<int64_t>(threads * kGemvBandsPerThread, std::max<int64_t>(N / 32, 1)) : 1;
    parallel_for_dynamic(splits, splits > 1, [&](int64_t s) {
      const int64_t lo = band_edge(N, s, splits), hi = band_edge(N, s + 1, splits);
      const std::byte* band = W + lo * row_bytes;
      for (int64_t r = 0; r < rows; ++r) {
        float* y = o + r * N + lo;
        if (b) std::memcpy(y, b + lo, static_cast<size_t>(hi - lo) * sizeof(float));
        const float* xr = X + r * ldx;
        if (wdt == DType::bf16)
          gemv_by_rows(hi - lo, K, 1.0f, reinterpret_cast<const uint16_t*>(band), K, xr, b ? 1.0f : 0.0f, y);
        else if (wdt == DType::q8_0)
          gemv_q8_0(hi - lo, K, band, xr, b != nullptr, y);
        else
          gemv_q4_k(hi - lo, K, band, xr, b != nullptr, y);
      }
    });
    return true;
  }
  if (b)  // the GEMMs add to it; without a bias they write out (beta 0: no zeros written first and read back)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(o + r * N, b, static_cast<size_t>(N) * sizeof(float));
  std::vector<float> wide(static_cast<size_t>(std::min(N, kWidenFeatures) * K));
  for (int64_t n0 = 0; n0 < N; n0 += kWidenFeatures) {
    const int64_t nb = std::min(kWidenFeatures, N - n0);
    parallel_for(threads, threads > 1, [&](int64_t t) {
      const int64_t lo = nb * t / threads, hi = nb * (t + 1) / threads;
      const std::byte* src = W + (n0 + lo) * row_bytes;
      float* dst = wide.data() + lo * K;
      if (wdt == DType::bf16)
        map1(dst, 1, reinterpret_cast<const uint16_t*>(src), 1, (hi - lo) * K,
             [](uint16_t v) { return float_from_bf16(v); });
      else if (wdt == DType::q8_0)
        quant::dequantize_q8_0(src, dst, (hi - lo) * K / quant::kQ8_0Weights);
      else
        quant::dequantize_q4_k(src, dst, (hi - lo) * K / quant::kQ4_KWeights);
    });
    gemm(DType::f32, false, true, rows, nb, K, 1.0, X, ldx, 0, wide.data(), K, 0, b ? 1.0 : 0.0, o + n0, N, 0, 1);
  }
  return true;
}

// GELU applied to each block of rows as linear_in_bands finishes it, while the rows sit in L1, with the
// formula (and vector loop) CpuBackend::unary uses.
bool CpuBackend::linear_gelu_rows(DType dt, void* pre, void* post, const void* x, int64_t ldx, const void* w,
                                  const void* bias, int64_t rows, int64_t N, int64_t K, bool tanh_approximation) {
#ifdef HEADLAB_HAS_XSMM
  if (dt != DType::f32 || bias == nullptr) return false;
  float* const h = static_cast<float*>(pre);
  float* const g = static_cast<float*>(post);
  const auto gelu_rows = [&](auto op_c, int64_t first, int64_t count) {
    constexpr UnaryOp kOp = decltype(op_c)::value;
    map1(g + first * N, 1, h + first * N, 1, count * N,
         [](float v) { return smath::unary_op<kOp, Fast>(v, 0.0f, 0.0f); });
  };
  return linear_in_bands(h, static_cast<const float*>(x), ldx, static_cast<const float*>(w),
                         static_cast<const float*>(bias), rows, N, K, [&](int64_t first, int64_t count) {
                           if (tanh_approximation)
                             gelu_rows(std::integral_constant<UnaryOp, UnaryOp::gelu_tanh>{}, first, count);
                           else
                             gelu_rows(std::integral_constant<UnaryOp, UnaryOp::gelu>{}, first, count);
                         });
#else
  (void)dt, (void)pre, (void)post, (void)x, (void)ldx, (void)w, (void)bias, (void)rows, (void)N, (void)K;
  (void)tanh_approximation;
  return false;
#endif
}

// ---- randomness ----
void CpuBackend::random_uniform(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) {
  dispatch_float(dt, "rand", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    parallel_for(n, n > kParallelGrain,
                 [&](int64_t i) { o[i] = static_cast<T>(lo + (hi - lo) * philox::uniform(seed, offset, i)); });
  });
}

void CpuBackend::random_normal(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean,
                               double std) {
  dispatch_float(dt, "randn", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    parallel_for(n, n > kParallelGrain,
                 [&](int64_t i) { o[i] = static_cast<T>(mean + std * philox::normal(seed, offset, i)); });
  });
}

void CpuBackend::random_int(void* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  int64_t* o = static_cast<int64_t*>(out);
  const uint64_t range = static_cast<uint64_t>(hi - lo);
  for (int64_t i = 0; i < n; ++i) o[i] = philox::uniform_int(seed, offset, i, lo, range);
}

// ---- gather / scatter ----
void CpuBackend::index_select(DType dt, void* out, const void* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                              int64_t inner, int64_t n_idx) {
  dispatch_all(dt, [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    const T* a = static_cast<const T*>(in);
    parallel_for(outer * n_idx, outer * n_idx * inner > kParallelGrain, [&](int64_t k) {
      const int64_t oi = k / n_idx, i = k % n_idx;
      std::memcpy(o + k * inner, a + (oi * in_dim + idx[i]) * inner, sizeof(T) * inner);
    });
  });
}

void CpuBackend::index_add(DType dt, void* dst, const void* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                           int64_t inner, int64_t n_idx) {
  dispatch_float(dt, "index_add", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* d = static_cast<T*>(dst);
    const T* s = static_cast<const T*>(src);
    // Parallel over the outer dim only: repeated indices would race inside one slice.
    parallel_for(outer, outer > 1 && outer * n_idx * inner > kParallelGrain, [&](int64_t oi) {
      for (int64_t i = 0; i < n_idx; ++i) {
        T* drow = d + (oi * dst_dim + idx[i]) * inner;
        const T* srow = s + (oi * n_idx + i) * inner;
        for (int64_t j = 0; j < inner; ++j) drow[j] += srow[j];
      }
    });
  });
}

}  // namespace headlab::cpu

namespace headlab {

Backend& cpu_backend() {
  static cpu::CpuBackend backend;
  return backend;
}

}  // namespace headlab
