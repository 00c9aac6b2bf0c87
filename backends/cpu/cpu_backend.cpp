// The CPU backend: OpenBLAS for GEMMs, OpenMP-parallel vectorisable loops for everything else.
// Float reductions accumulate in double so float32 results track PyTorch's to ~1e-7 relative.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/cpu_loops.h"
#include "backends/cpu/fast_math.h"
#include "backends/philox.h"
#include "backends/scalar_math.h"

namespace headlab {
namespace {

using cpu::for_each_row;
using cpu::kParallelGrain;
using cpu::map1;
using cpu::map2;
using cpu::fast_exp;
using smath::Acc;
using Fast = cpu::FastExpTanh;  // the exp/tanh of the shared formulas (backends/scalar_math.h)

// dtype dispatch: the body is a generic lambda taking a value of the element type.
template <typename F>
void dispatch_float(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    default: HL_FAIL(who, ": expected a floating dtype, got ", dtype_name(dt));
  }
}

template <typename F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::i64: f(int64_t{}); break;
    case DType::b8: f(uint8_t{}); break;
  }
}

// Max and sum of exp(scale * x[j] - max) over the contiguous row x[0, n): the max-subtracted first
// half of softmax, log-softmax and cross entropy. exps, when given, receives exp(scale * x[j] - max).
template <typename T>
inline smath::RowLse<T> row_logsumexp(const T* x, int64_t n, T scale = T(1), T* exps = nullptr) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * x[j]);
  Acc<T> sum = 0;
  if (exps) {
    for (int64_t j = 0; j < n; ++j) {
      const T e = fast_exp(scale * x[j] - m);
      exps[j] = e;
      sum += e;
    }
  } else {
    for (int64_t j = 0; j < n; ++j) sum += fast_exp(scale * x[j] - m);
  }
  return {m, sum};
}

struct CpuBackend final : Backend {
  std::atomic<size_t> in_use{0}, peak{0};

  const char* name() const override { return "cpu"; }

  // ---- memory ----
  void* alloc(size_t nbytes) override {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded + 64);  // header keeps the size for accounting
    HL_CHECK(p != nullptr, "cpu: out of memory allocating ", nbytes, " bytes");
    *static_cast<size_t*>(p) = rounded;
    const size_t now = in_use += rounded;
    size_t prev = peak.load();
    while (now > prev && !peak.compare_exchange_weak(prev, now)) {}
    return static_cast<char*>(p) + 64;
  }
  void free(void* p) override {
    if (!p) return;
    char* base = static_cast<char*>(p) - 64;
    in_use -= *reinterpret_cast<size_t*>(base);
    std::free(base);
  }
  void copy_from_host(void* dst, const void* src, size_t n) override { if (n) std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n) override { if (n) std::memcpy(dst, src, n); }
  void synchronize() override {}
  size_t bytes_in_use() const override { return in_use.load(); }
  size_t peak_bytes() const override { return peak.load(); }
  void reset_peak() override { peak = in_use.load(); }

  // ---- fill, copy, elementwise ----
  void fill(DType dt, const Loop& l, double value) override {
    dispatch_all(dt, [&](auto tag_T) { using T = decltype(tag_T);
      T* o = static_cast<T*>(l.ptr[0]);
      const T v = dt == DType::b8 ? T(value != 0) : static_cast<T>(value);
      for_each_row<1>(l, [&](const int64_t* base, int64_t n, const int64_t* s) {
        T* p = o + base[0];
        if (s[0] == 1) std::fill(p, p + n, v);
        else for (int64_t i = 0; i < n; ++i) p[i * s[0]] = v;
      });
    });
  }

  void arange(DType dt, void* out, int64_t n, double start, double step) override {
    dispatch_all(dt, [&](auto tag_T) { using T = decltype(tag_T);
      T* o = static_cast<T*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(start + step * static_cast<double>(i));
    });
  }

  void copy(DType dst_dt, DType src_dt, const Loop& l) override {
    dispatch_all(dst_dt, [&](auto tag_TD) { using TD = decltype(tag_TD);
      dispatch_all(src_dt, [&](auto tag_TS) { using TS = decltype(tag_TS);
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
  void unary(UnaryOp op, DType dt, const Loop& l, double alpha, double beta) override {
    dispatch_float(dt, "unary", [&](auto tag_T) { using T = decltype(tag_T);
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

  void unary_backward(UnaryOp op, DType dt, void* din, const void* dout, const void* x, const void* y,
                      int64_t n, double alpha) override {
    if (n <= 0) return;
    smath::check_grad_operand(op, x, y, "unary_backward");
    dispatch_float(dt, "unary_backward", [&](auto tag_T) { using T = decltype(tag_T);
      T* di = static_cast<T*>(din);
      const T* dy = static_cast<const T*>(dout);
      const T* px = static_cast<const T*>(x);
      const T* py = static_cast<const T*>(y);
      const T al = static_cast<T>(alpha);
      smath::dispatch_unary_op(op, "unary_backward", [&](auto op_c) {
        constexpr UnaryOp kOp = decltype(op_c)::value;
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
        for (int64_t i = 0; i < n; ++i) di[i] = smath::unary_backward_at<kOp, Fast>(dy, px, py, i, al);
      });
    });
  }

  void binary(BinaryOp op, DType dt, const Loop& l) override {
    dispatch_all(dt, [&](auto tag_T) { using T = decltype(tag_T);
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

  void where(DType dt, const Loop& l) override {
    dispatch_all(dt, [&](auto tag_T) { using T = decltype(tag_T);
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

  void reduce(ReduceOp op, DType dt, void* out, const void* in, int n_outer, const int64_t* outer_sizes,
              const int64_t* outer_strides, int n_inner, const int64_t* inner_sizes,
              const int64_t* inner_strides) override {
    dispatch_all(dt, [&](auto tag_T) { using T = decltype(tag_T);
      if constexpr (std::is_same_v<T, uint8_t>) {
        HL_FAIL("reduce: bool tensors cannot be reduced; convert with to(int64) first");
      } else {
        reduce_typed<T>(op, out, static_cast<const T*>(in), n_outer, outer_sizes, outer_strides, n_inner,
                        inner_sizes, inner_strides);
      }
    });
  }

  template <typename T>
  void reduce_typed(ReduceOp op, void* out, const T* in, int n_outer, const int64_t* osz, const int64_t* ost,
                    int n_inner, const int64_t* isz, const int64_t* ist) {
    int64_t n_out = 1, n_red = 1;
    for (int d = 0; d < n_outer; ++d) n_out *= osz[d];
    for (int d = 0; d < n_inner; ++d) n_red *= isz[d];
    // Column sums of a row-major matrix (bias gradients): accumulate whole rows, cache friendly.
    if (op == ReduceOp::sum && n_outer == 1 && ost[0] == 1 && n_inner == 1 && n_red > 1) {
      T* o = static_cast<T*>(out);
      const int64_t cols = osz[0], rs = ist[0];
#pragma omp parallel if (cols * n_red > kParallelGrain)
      {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t lo = cols * t / nt, hi = cols * (t + 1) / nt;
        std::vector<Acc<T>> acc(static_cast<size_t>(hi - lo), Acc<T>(0));
        for (int64_t r = 0; r < n_red; ++r) {
          const T* row = in + r * rs;
          for (int64_t c = lo; c < hi; ++c) acc[c - lo] += row[c];
        }
        for (int64_t c = lo; c < hi; ++c) o[c] = static_cast<T>(acc[c - lo]);
      }
      return;
    }
    const bool contiguous_inner = n_inner == 1 && ist[0] == 1;
#pragma omp parallel for schedule(static) if (n_out * n_red > kParallelGrain && n_out > 1)
    for (int64_t o = 0; o < n_out; ++o) {
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
        if (contiguous_inner)
          for (int64_t j = 0; j < n_red; ++j) s += p[j];
        else
          for (int64_t j = 0; j < n_red; ++j) s += p[offset_of(j)];
        static_cast<T*>(out)[o] = static_cast<T>(s);
      } else {
        // max / min / argmax: NaN wins (as in PyTorch); argmax keeps the first occurrence.
        T best = p[offset_of(0)];
        int64_t best_j = 0;
        for (int64_t j = 1; j < n_red && !(best != best); ++j) {
          const T v = p[offset_of(j)];
          const bool better = (v != v) || (op == ReduceOp::min ? v < best : v > best);
          if (better) { best = v; best_j = j; }
        }
        if (op == ReduceOp::argmax) static_cast<int64_t*>(out)[o] = best_j;
        else static_cast<T*>(out)[o] = best;
      }
    }
  }

  bool all_finite(DType dt, const void* p, int64_t n) override {
    bool ok = true;
    dispatch_float(dt, "all_finite", [&](auto tag_T) { using T = decltype(tag_T);
      const T* x = static_cast<const T*>(p);
      for (int64_t i = 0; i < n; ++i) ok &= std::isfinite(x[i]);
    });
    return ok;
  }

  bool indices_in_range(const int64_t* idx, int64_t n, int64_t lo, int64_t hi) override {
    bool ok = true;
    for (int64_t i = 0; i < n; ++i) ok &= idx[i] >= lo && idx[i] < hi;
    return ok;
  }

  // ---- GEMM ----
  void gemm(DType dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void* A,
            int64_t lda, int64_t sa, const void* B, int64_t ldb, int64_t sb, double beta, void* C, int64_t ldc,
            int64_t sc, int64_t batch) override {
    if (M == 0 || N == 0 || batch == 0) return;
    const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    // Many small products: one thread per matrix (OpenBLAS's OpenMP build runs serially inside a
    // parallel region). Few large ones: let OpenBLAS thread each product. A tiny batch in all
    // (attention heads of a toy model, gradcheck) stays serial: waking threads costs more than it saves.
    const bool per_matrix_threads = batch * M * N * std::max<int64_t>(K, 1) > kParallelGrain &&
                                    (batch >= 2 * omp_get_max_threads() || (batch > 1 && M * N * K < (1 << 18)));
    dispatch_float(dt, "gemm", [&](auto tag_T) { using T = decltype(tag_T);
      const T* a = static_cast<const T*>(A);
      const T* b = static_cast<const T*>(B);
      T* c = static_cast<T*>(C);
#pragma omp parallel for schedule(static) if (per_matrix_threads)
      for (int64_t i = 0; i < batch; ++i) {
        if (K == 0) {  // BLAS may not touch C when K == 0; PyTorch semantics: C = beta * C
          for (int64_t r = 0; r < M; ++r)
            for (int64_t q = 0; q < N; ++q) c[i * sc + r * ldc + q] = beta == 0 ? T(0) : T(beta) * c[i * sc + r * ldc + q];
          continue;
        }
        if constexpr (std::is_same_v<T, float>)
          cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, static_cast<float>(alpha), a + i * sa, lda, b + i * sb, ldb,
                      static_cast<float>(beta), c + i * sc, ldc);
        else
          cblas_dgemm(CblasRowMajor, TA, TB, M, N, K, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, ldc);
      }
    });
  }

  // ---- softmax ----
  void softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols, double scale,
                       SoftmaxMask mask, const int64_t* lengths, int64_t q_len) override {
    dispatch_float(dt, "softmax", [&](auto tag_T) { using T = decltype(tag_T);
      T* py = static_cast<T*>(y);
      const T* px = static_cast<const T*>(x);
      const T sc = static_cast<T>(scale);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = px + r * cols;
        T* yr = py + r * cols;
        const int64_t valid = smath::softmax_valid_cols(mask, lengths, q_len, r, cols);
        const smath::RowLse<T> lse = row_logsumexp(xr, valid, sc, yr);  // yr[j] = exp(sc * xr[j] - max)
        const T inv = valid > 0 ? static_cast<T>(1.0 / lse.sum) : T(0);
        for (int64_t j = 0; j < valid; ++j) yr[j] *= inv;
        for (int64_t j = valid; j < cols; ++j) yr[j] = T(0);
      }
    });
  }

  void softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                        double scale) override {
    dispatch_float(dt, "softmax_backward", [&](auto tag_T) { using T = decltype(tag_T);
      T* pdx = static_cast<T*>(dx);
      const T* pdy = static_cast<const T*>(dy);
      const T* py = static_cast<const T*>(y);
      const T sc = static_cast<T>(scale);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        const T* dyr = pdy + r * cols;
        const T* yr = py + r * cols;
        Acc<T> dot = 0;
        for (int64_t j = 0; j < cols; ++j) dot += dyr[j] * yr[j];
        const T d = static_cast<T>(dot);
        for (int64_t j = 0; j < cols; ++j) pdx[r * cols + j] = sc * yr[j] * (dyr[j] - d);
      }
    });
  }

  void log_softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols) override {
    dispatch_float(dt, "log_softmax", [&](auto tag_T) { using T = decltype(tag_T);
      T* py = static_cast<T*>(y);
      const T* px = static_cast<const T*>(x);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = px + r * cols;
        const T lse = row_logsumexp(xr, cols).lse();
        for (int64_t j = 0; j < cols; ++j) py[r * cols + j] = xr[j] - lse;
      }
    });
  }

  void log_softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows,
                            int64_t cols) override {
    dispatch_float(dt, "log_softmax_backward", [&](auto tag_T) { using T = decltype(tag_T);
      T* pdx = static_cast<T*>(dx);
      const T* pdy = static_cast<const T*>(dy);
      const T* py = static_cast<const T*>(y);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        Acc<T> sum = 0;
        for (int64_t j = 0; j < cols; ++j) sum += pdy[r * cols + j];
        const T s = static_cast<T>(sum);
        for (int64_t j = 0; j < cols; ++j) pdx[r * cols + j] = pdy[r * cols + j] - fast_exp(py[r * cols + j]) * s;
      }
    });
  }

  // ---- layer norm ----
  void layernorm_forward(DType dt, void* y, void* mean, void* rstd, const void* x, const void* w, const void* b,
                         int64_t rows, int64_t cols, double eps) override {
    dispatch_float(dt, "layer_norm", [&](auto tag_T) { using T = decltype(tag_T);
      T* py = static_cast<T*>(y);
      T* pm = static_cast<T*>(mean);
      T* pr = static_cast<T*>(rstd);
      const T* px = static_cast<const T*>(x);
      const T* pw = static_cast<const T*>(w);
      const T* pb = static_cast<const T*>(b);
#pragma omp parallel for schedule(static) if (rows * cols > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = px + r * cols;
        Acc<T> s = 0;
        for (int64_t j = 0; j < cols; ++j) s += xr[j];
        const Acc<T> mu = s / cols;
        Acc<T> v = 0;
        for (int64_t j = 0; j < cols; ++j) v += (xr[j] - mu) * (xr[j] - mu);
        const T m = static_cast<T>(mu), rs = static_cast<T>(1.0 / std::sqrt(v / cols + eps));
        pm[r] = m;
        pr[r] = rs;
        T* yr = py + r * cols;
        for (int64_t j = 0; j < cols; ++j) {
          T h = (xr[j] - m) * rs;
          if (pw) h *= pw[j];
          if (pb) h += pb[j];
          yr[j] = h;
        }
      }
    });
  }

  void layernorm_backward(DType dt, void* dx, void* dw, void* db, const void* dy, const void* x, const void* mean,
                          const void* rstd, const void* w, int64_t rows, int64_t cols) override {
    dispatch_float(dt, "layer_norm_backward", [&](auto tag_T) { using T = decltype(tag_T);
      T* pdx = static_cast<T*>(dx);
      const T* pdy = static_cast<const T*>(dy);
      const T* px = static_cast<const T*>(x);
      const T* pm = static_cast<const T*>(mean);
      const T* pr = static_cast<const T*>(rstd);
      const T* pw = static_cast<const T*>(w);
      const int nt = rows * cols > kParallelGrain ? omp_get_max_threads() : 1;
      // Per-thread partial column sums for dw and db, added up at the end (no atomics, deterministic).
      std::vector<Acc<T>> part_w(static_cast<size_t>(nt * cols), 0), part_b(static_cast<size_t>(nt * cols), 0);
#pragma omp parallel num_threads(nt)
      {
        const int t = omp_get_thread_num();
        Acc<T>* aw = part_w.data() + t * cols;
        Acc<T>* ab = part_b.data() + t * cols;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          const T* dyr = pdy + r * cols;
          const T* xr = px + r * cols;
          const T m = pm[r], rs = pr[r];
          Acc<T> mean_g = 0, mean_gx = 0;
          for (int64_t j = 0; j < cols; ++j) {
            const T xhat = (xr[j] - m) * rs;
            const T g = pw ? dyr[j] * pw[j] : dyr[j];
            mean_g += g;
            mean_gx += g * xhat;
            aw[j] += dyr[j] * xhat;
            ab[j] += dyr[j];
          }
          mean_g /= cols;
          mean_gx /= cols;
          for (int64_t j = 0; j < cols; ++j) {
            const T xhat = (xr[j] - m) * rs;
            const T g = pw ? dyr[j] * pw[j] : dyr[j];
            pdx[r * cols + j] = rs * (g - static_cast<T>(mean_g) - xhat * static_cast<T>(mean_gx));
          }
        }
      }
      for (int64_t j = 0; j < cols; ++j) {
        Acc<T> sw = 0, sb = 0;
        for (int t = 0; t < nt; ++t) { sw += part_w[t * cols + j]; sb += part_b[t * cols + j]; }
        if (dw) static_cast<T*>(dw)[j] = static_cast<T>(sw);
        if (db) static_cast<T*>(db)[j] = static_cast<T>(sb);
      }
    });
  }

  // ---- randomness ----
  void random_uniform(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double lo, double hi) override {
    dispatch_float(dt, "rand", [&](auto tag_T) { using T = decltype(tag_T);
      T* o = static_cast<T*>(out);
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(lo + (hi - lo) * philox::uniform(seed, offset, i));
    });
  }
  void random_normal(DType dt, void* out, int64_t n, uint64_t seed, uint64_t offset, double mean, double std) override {
    dispatch_float(dt, "randn", [&](auto tag_T) { using T = decltype(tag_T);
      T* o = static_cast<T*>(out);
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(mean + std * philox::normal(seed, offset, i));
    });
  }
  void random_int(void* out, int64_t n, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) override {
    int64_t* o = static_cast<int64_t*>(out);
    const uint64_t range = static_cast<uint64_t>(hi - lo);
    for (int64_t i = 0; i < n; ++i) o[i] = philox::uniform_int(seed, offset, i, lo, range);
  }
  void dropout(DType dt, void* out, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset) override {
    dispatch_float(dt, "dropout", [&](auto tag_T) { using T = decltype(tag_T);
      T* o = static_cast<T*>(out);
      const T* px = static_cast<const T*>(x);
      const T keep_scale = philox::dropout_scale<T>(p);
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) o[i] = philox::dropout(px[i], p, keep_scale, seed, offset, i);
    });
  }

  // ---- gather / scatter ----
  void index_select(DType dt, void* out, const void* in, const int64_t* idx, int64_t outer, int64_t in_dim,
                    int64_t inner, int64_t n_idx) override {
    dispatch_all(dt, [&](auto tag_T) { using T = decltype(tag_T);
      T* o = static_cast<T*>(out);
      const T* a = static_cast<const T*>(in);
#pragma omp parallel for schedule(static) if (outer * n_idx * inner > kParallelGrain)
      for (int64_t k = 0; k < outer * n_idx; ++k) {
        const int64_t oi = k / n_idx, i = k % n_idx;
        std::memcpy(o + k * inner, a + (oi * in_dim + idx[i]) * inner, sizeof(T) * inner);
      }
    });
  }
  void index_add(DType dt, void* dst, const void* src, const int64_t* idx, int64_t outer, int64_t dst_dim,
                 int64_t inner, int64_t n_idx) override {
    dispatch_float(dt, "index_add", [&](auto tag_T) { using T = decltype(tag_T);
      T* d = static_cast<T*>(dst);
      const T* s = static_cast<const T*>(src);
      // Parallel over the outer dim only: repeated indices would race inside one slice.
#pragma omp parallel for schedule(static) if (outer > 1 && outer * n_idx * inner > kParallelGrain)
      for (int64_t oi = 0; oi < outer; ++oi)
        for (int64_t i = 0; i < n_idx; ++i) {
          T* drow = d + (oi * dst_dim + idx[i]) * inner;
          const T* srow = s + (oi * n_idx + i) * inner;
          for (int64_t j = 0; j < inner; ++j) drow[j] += srow[j];
        }
    });
  }

  // ---- cross entropy ----
  void cross_entropy_forward(DType dt, void* loss, const void* logits, const int64_t* targets, int64_t rows,
                             int64_t classes, int64_t ignore_index) override {
    dispatch_float(dt, "cross_entropy", [&](auto tag_T) { using T = decltype(tag_T);
      T* l = static_cast<T*>(loss);
      const T* x = static_cast<const T*>(logits);
#pragma omp parallel for schedule(static) if (rows * classes > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        if (targets[r] == ignore_index) { l[r] = T(0); continue; }
        const T* xr = x + r * classes;
        const smath::RowLse<T> lse = row_logsumexp(xr, classes);
        l[r] = static_cast<T>(lse.max + lse.log_sum() - xr[targets[r]]);
      }
    });
  }
  void cross_entropy_backward(DType dt, void* dlogits, const void* dloss, int64_t dloss_stride, double scale,
                              const void* logits, const int64_t* targets, int64_t rows, int64_t classes,
                              int64_t ignore_index) override {
    dispatch_float(dt, "cross_entropy_backward", [&](auto tag_T) { using T = decltype(tag_T);
      T* dx = static_cast<T*>(dlogits);
      const T* dl = static_cast<const T*>(dloss);
      const T* x = static_cast<const T*>(logits);
#pragma omp parallel for schedule(static) if (rows * classes > kParallelGrain)
      for (int64_t r = 0; r < rows; ++r) {
        T* dr = dx + r * classes;
        if (targets[r] == ignore_index) { std::fill(dr, dr + classes, T(0)); continue; }
        const T* xr = x + r * classes;
        const smath::RowLse<T> lse = row_logsumexp(xr, classes);
        const T g = static_cast<T>(dl[r * dloss_stride] * scale);
        const T inv = static_cast<T>(1.0 / lse.sum);
        for (int64_t j = 0; j < classes; ++j) dr[j] = g * fast_exp(xr[j] - lse.max) * inv;
        dr[targets[r]] -= g;
      }
    });
  }

  // ---- optimizers (firstprivate: each thread's own copy, which no store through p can alias) ----
  void sgd_step(DType dt, void* param, const void* grad, void* buf, int64_t n, double lr, double momentum,
                double dampening, double wd, bool nesterov, bool first_step) override {
    dispatch_float(dt, "sgd_step", [&](auto tag_T) { using T = decltype(tag_T);
      T* p = static_cast<T*>(param);
      const T* g = static_cast<const T*>(grad);
      T* b = static_cast<T*>(buf);
      const smath::SgdParams<T> h{T(lr), T(momentum), T(dampening), T(wd), nesterov, first_step};
#pragma omp parallel for schedule(static) firstprivate(h) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) smath::sgd_update(p, g, b, i, h);
    });
  }
  void adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n, double lr,
                 double beta1, double beta2, double eps, double wd, int64_t step, bool decoupled) override {
    dispatch_float(dt, "adam_step", [&](auto tag_T) { using T = decltype(tag_T);
      T* p = static_cast<T*>(param);
      const T* g = static_cast<const T*>(grad);
      T* m = static_cast<T*>(exp_avg);
      T* v = static_cast<T*>(exp_avg_sq);
      const smath::AdamParams<T> h = smath::adam_params<T>(lr, beta1, beta2, eps, wd, step, decoupled);
#pragma omp parallel for schedule(static) firstprivate(h) if (n > kParallelGrain)
      for (int64_t i = 0; i < n; ++i) smath::adam_update(p, g, m, v, i, h);
    });
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace headlab
