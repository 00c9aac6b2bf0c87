// The CPU backend's neural-network row kernels: softmax, log-softmax, layer norm, dropout, cross
// entropy and the SGD/Adam updates. One OpenMP-parallel loop over rows (or elements) per kernel;
// float sums over many terms accumulate in double (smath::Acc), in SIMD lanes (`omp simd reduction`: without it
// the compiler must add in order, one latency-bound add per element). The CpuBackend class is in cpu_internal.h.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_internal.h"
#include "backends/philox.h"

namespace headlab::cpu {
namespace {

// Max and sum of exp(scale * x[j] - max) over the contiguous row x[0, n): the max-subtracted first
// half of softmax, log-softmax and cross entropy. exps, when given, receives exp(scale * x[j] - max).
template <typename T>
inline smath::RowLse<T> row_logsumexp(const T* x, int64_t n, T scale = T(1), T* exps = nullptr) {
  const T m = lane_max<T>(n, [=](int64_t j) { return scale * x[j]; });
  const Acc<T> sum = exps ? lane_sum<T>(n,
                                        [=](int64_t j) {
                                          const T e = fast_exp(scale * x[j] - m);
                                          exps[j] = e;
                                          return e;
                                        })
                          : lane_sum<T>(n, [=](int64_t j) { return fast_exp(scale * x[j] - m); });
  return {m, sum};
}

// A thread's column sums over its rows (a norm's weight and bias gradients): each row adds into a block
// in T, which is added into the Acc totals every kRows rows. The row loops then vectorise at T's width
// (Acc adds beside T loads made GCC gather), and the long sums over rows still run in Acc.
template <typename T>
class ColumnSums {
 public:
  ColumnSums(Acc<T>* totals, int64_t cols) : totals_(totals), block_(static_cast<size_t>(cols), T(0)) {}
  T* row() { return block_.data(); }  // add this row's terms here, then call end_row()
  void end_row() {
    if (++rows_ == kRows) flush();
  }
  void flush() {
    const int64_t n = static_cast<int64_t>(block_.size());
    T* b = block_.data();
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      totals_[j] += b[j];
      b[j] = T(0);
    }
    rows_ = 0;
  }

 private:
  static constexpr int kRows = 16;
  Acc<T>* totals_;
  std::vector<T> block_;
  int rows_ = 0;
};

// rows_of(t, team, has_w) on each thread of a team of nt, has_w a compile-time flag (std::true_type or
// std::false_type): the norms' row loops then test for a weight once, not at every element.
template <typename RowsOf>
void rows_on_team(int nt, bool has_w, RowsOf& rows_of) {
  parallel_team(nt, [&](int t, int team) {
    if (has_w)
      rows_of(t, team, std::true_type{});
    else
      rows_of(t, team, std::false_type{});
  });
}

}  // namespace

// ---- softmax ----
void CpuBackend::softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols, double scale,
                                 SoftmaxMask mask, const int64_t* lengths, int64_t q_len) {
  dispatch_float(dt, "softmax", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* py = static_cast<T*>(y);
    const T* px = static_cast<const T*>(x);
    const T sc = static_cast<T>(scale);
    parallel_for(rows, rows * cols > kParallelGrain, [&](int64_t r) {
      const T* xr = px + r * cols;
      T* yr = py + r * cols;
      const int64_t valid = smath::softmax_valid_cols(mask, lengths, q_len, r, cols);
      const smath::RowLse<T> lse = row_logsumexp(xr, valid, sc, yr);  // yr[j] = exp(sc * xr[j] - max)
      const T inv = valid > 0 ? static_cast<T>(1.0 / lse.sum) : T(0);
      for (int64_t j = 0; j < valid; ++j) yr[j] *= inv;
      for (int64_t j = valid; j < cols; ++j) yr[j] = T(0);
    });
  });
}

void CpuBackend::softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols,
                                  double scale) {
  dispatch_float(dt, "softmax_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* pdx = static_cast<T*>(dx);
    const T* pdy = static_cast<const T*>(dy);
    const T* py = static_cast<const T*>(y);
    const T sc = static_cast<T>(scale);
    parallel_for(rows, rows * cols > kParallelGrain, [&](int64_t r) {
      const T* dyr = pdy + r * cols;
      const T* yr = py + r * cols;
      const T d = static_cast<T>(lane_sum<T>(cols, [=](int64_t j) { return dyr[j] * yr[j]; }));
      for (int64_t j = 0; j < cols; ++j) pdx[r * cols + j] = sc * yr[j] * (dyr[j] - d);
    });
  });
}

void CpuBackend::log_softmax_forward(DType dt, void* y, const void* x, int64_t rows, int64_t cols) {
  dispatch_float(dt, "log_softmax", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* py = static_cast<T*>(y);
    const T* px = static_cast<const T*>(x);
    parallel_for(rows, rows * cols > kParallelGrain, [&](int64_t r) {
      const T* xr = px + r * cols;
      const T lse = row_logsumexp(xr, cols).lse();
      for (int64_t j = 0; j < cols; ++j) py[r * cols + j] = xr[j] - lse;
    });
  });
}

void CpuBackend::log_softmax_backward(DType dt, void* dx, const void* dy, const void* y, int64_t rows, int64_t cols) {
  dispatch_float(dt, "log_softmax_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* pdx = static_cast<T*>(dx);
    const T* pdy = static_cast<const T*>(dy);
    const T* py = static_cast<const T*>(y);
    parallel_for(rows, rows * cols > kParallelGrain, [&](int64_t r) {
      const T* dyr = pdy + r * cols;
      const T s = static_cast<T>(lane_sum<T>(cols, [=](int64_t j) { return dyr[j]; }));
      for (int64_t j = 0; j < cols; ++j) pdx[r * cols + j] = pdy[r * cols + j] - fast_exp(py[r * cols + j]) * s;
    });
  });
}

// ---- layer norm ----
void CpuBackend::layernorm_forward(DType dt, void* y, void* mean, void* rstd, const void* x, const void* w,
                                   const void* b, int64_t rows, int64_t cols, double eps) {
  dispatch_float(dt, "layer_norm", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* py = static_cast<T*>(y);
    T* pm = static_cast<T*>(mean);
    T* pr = static_cast<T*>(rstd);
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    const T* pb = static_cast<const T*>(b);
    parallel_for(rows, rows * cols > kParallelGrain, [&](int64_t r) {
      const T* xr = px + r * cols;
      const T m = static_cast<T>(lane_sum<T>(cols, [=](int64_t j) { return xr[j]; }) / cols);
      const Acc<T> v = lane_sum<T>(cols, [=](int64_t j) { return (xr[j] - m) * (xr[j] - m); });
      const T rs = static_cast<T>(1.0 / std::sqrt(v / cols + eps));
      pm[r] = m;
      pr[r] = rs;
      T* const yr = py + r * cols;
      const T* const wt = pw;
      const T* const bt = pb;
      if (wt && bt) {  // the common case, branch-free
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - m) * rs * wt[j] + bt[j];
      } else {
        for (int64_t j = 0; j < cols; ++j) {
          T h = (xr[j] - m) * rs;
          if (wt) h *= wt[j];
          if (bt) h += bt[j];
          yr[j] = h;
        }
      }
    });
  });
}

void CpuBackend::layernorm_backward(DType dt, void* dx, void* dw, void* db, const void* dy, const void* x,
                                    const void* mean, const void* rstd, const void* w, int64_t rows, int64_t cols) {
  dispatch_float(dt, "layer_norm_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* pdx = static_cast<T*>(dx);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pm = static_cast<const T*>(mean);
    const T* pr = static_cast<const T*>(rstd);
    const T* pw = static_cast<const T*>(w);
    const int nt = rows * cols > kParallelGrain ? omp_get_max_threads() : 1;
    // Per-thread partial column sums for dw and db, added up at the end (no atomics, deterministic).
    std::vector<Acc<T>> part_w(static_cast<size_t>(nt * cols), 0), part_b(static_cast<size_t>(nt * cols), 0);
    const auto rows_of = [&](int t, int team, auto has_w) {
      ColumnSums<T> sum_w(part_w.data() + t * cols, cols), sum_b(part_b.data() + t * cols, cols);
      const T* const wt = pw;  // a local, not a captured reference, in the vectorised loops
      for (int64_t r = rows * t / team; r < rows * (t + 1) / team; ++r) {
        const T* const dyr = pdy + r * cols;
        const T* const xr = px + r * cols;
        T* const dxr = pdx + r * cols;
        T* const bw = sum_w.row();
        T* const bb = sum_b.row();
        const T m = pm[r], rs = pr[r];
        T mean_g = 0, mean_gx = 0;  // in T's SIMD lanes, as PyTorch's CPU kernel sums a row
#pragma omp simd reduction(+ : mean_g, mean_gx)
        for (int64_t j = 0; j < cols; ++j) {
          const T xhat = (xr[j] - m) * rs;
          const T g = has_w ? dyr[j] * wt[j] : dyr[j];
          mean_g += g;
          mean_gx += g * xhat;
          bw[j] += dyr[j] * xhat;
          bb[j] += dyr[j];
        }
        const T mg = mean_g / static_cast<T>(cols), mgx = mean_gx / static_cast<T>(cols);
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) {
          const T xhat = (xr[j] - m) * rs;
          const T g = has_w ? dyr[j] * wt[j] : dyr[j];
          dxr[j] = rs * (g - mg - xhat * mgx);
        }
        sum_w.end_row();
        sum_b.end_row();
      }
      sum_w.flush();
      sum_b.flush();
    };
    rows_on_team(nt, pw != nullptr, rows_of);
    for (int64_t j = 0; j < cols; ++j) {
      Acc<T> sw = 0, sb = 0;
      for (int t = 0; t < nt; ++t) {
        sw += part_w[t * cols + j];
        sb += part_b[t * cols + j];
      }
      if (dw) static_cast<T*>(dw)[j] = static_cast<T>(sw);
      if (db) static_cast<T*>(db)[j] = static_cast<T>(sb);
    }
  });
}

// ---- RMS norm: layer norm without the centring and the bias ----
void CpuBackend::rmsnorm_forward(DType dt, void* y, void* rstd, const void* x, const void* w, int64_t rows,
                                 int64_t cols, double eps) {
  dispatch_float(dt, "rms_norm", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* py = static_cast<T*>(y);
    T* pr = static_cast<T*>(rstd);
    const T* px = static_cast<const T*>(x);
    const T* pw = static_cast<const T*>(w);
    parallel_for(rows, rows * cols > kParallelGrain, [&](int64_t r) {
      const T* xr = px + r * cols;
      const Acc<T> ss = lane_sum<T>(cols, [=](int64_t j) { return xr[j] * xr[j]; });
      const T rs = static_cast<T>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(cols) + eps));
      pr[r] = rs;
      T* yr = py + r * cols;
      if (pw)
        for (int64_t j = 0; j < cols; ++j) yr[j] = xr[j] * rs * pw[j];
      else
        for (int64_t j = 0; j < cols; ++j) yr[j] = xr[j] * rs;
    });
  });
}

// dx = rstd * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * rstd; dw = sum over rows of dy * xhat.
void CpuBackend::rmsnorm_backward(DType dt, void* dx, void* dw, const void* dy, const void* x, const void* rstd,
                                  const void* w, int64_t rows, int64_t cols) {
  dispatch_float(dt, "rms_norm_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* pdx = static_cast<T*>(dx);
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pr = static_cast<const T*>(rstd);
    const T* pw = static_cast<const T*>(w);
    const int nt = rows * cols > kParallelGrain ? omp_get_max_threads() : 1;
    // Per-thread partial column sums for dw (summed, unused, when there is no weight: the loops stay
    // branch-free), added up at the end (no atomics, deterministic).
    std::vector<Acc<T>> part_w(static_cast<size_t>(nt * cols), 0);
    const auto rows_of = [&](int t, int team, auto has_w) {
      ColumnSums<T> sum_w(part_w.data() + t * cols, cols);
      const T* const wt = pw;
      for (int64_t r = rows * t / team; r < rows * (t + 1) / team; ++r) {
        const T* const dyr = pdy + r * cols;
        const T* const xr = px + r * cols;
        T* const dxr = pdx + r * cols;
        T* const bw = sum_w.row();
        const T rs = pr[r];
        T mean_gx = 0;
#pragma omp simd reduction(+ : mean_gx)
        for (int64_t j = 0; j < cols; ++j) mean_gx += (has_w ? dyr[j] * wt[j] : dyr[j]) * (xr[j] * rs);
        const T m = mean_gx / static_cast<T>(cols);
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) {
          const T xhat = xr[j] * rs;
          bw[j] += dyr[j] * xhat;
          dxr[j] = rs * ((has_w ? dyr[j] * wt[j] : dyr[j]) - xhat * m);
        }
        sum_w.end_row();
      }
      sum_w.flush();
    };
    rows_on_team(nt, pw != nullptr, rows_of);
    if (!dw) return;
    for (int64_t j = 0; j < cols; ++j) {
      Acc<T> sw = 0;
      for (int t = 0; t < nt; ++t) sw += part_w[t * cols + j];
      static_cast<T*>(dw)[j] = static_cast<T>(sw);
    }
  });
}

// ---- dropout ----
void CpuBackend::dropout(DType dt, void* out, const void* x, int64_t n, double p, uint64_t seed, uint64_t offset) {
  dispatch_float(dt, "dropout", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* o = static_cast<T*>(out);
    const T* px = static_cast<const T*>(x);
    const T keep_scale = philox::dropout_scale<T>(p);
    parallel_for(n, n > kParallelGrain,
                 [&](int64_t i) { o[i] = philox::dropout(px[i], p, keep_scale, seed, offset, i); });
  });
}

// ---- cross entropy ----
void CpuBackend::cross_entropy_forward(DType dt, void* loss, const void* logits, const int64_t* targets, int64_t rows,
                                       int64_t classes, int64_t ignore_index) {
  dispatch_float(dt, "cross_entropy", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* l = static_cast<T*>(loss);
    const T* x = static_cast<const T*>(logits);
    parallel_for(rows, rows * classes > kParallelGrain, [&](int64_t r) {
      if (targets[r] == ignore_index) {
        l[r] = T(0);
        return;
      }
      const T* xr = x + r * classes;
      const smath::RowLse<T> lse = row_logsumexp(xr, classes);
      l[r] = static_cast<T>(lse.max + lse.log_sum() - xr[targets[r]]);
    });
  });
}

void CpuBackend::cross_entropy_backward(DType dt, void* dlogits, const void* dloss, int64_t dloss_stride, double scale,
                                        const void* logits, const int64_t* targets, int64_t rows, int64_t classes,
                                        int64_t ignore_index) {
  dispatch_float(dt, "cross_entropy_backward", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* dx = static_cast<T*>(dlogits);
    const T* dl = static_cast<const T*>(dloss);
    const T* x = static_cast<const T*>(logits);
    parallel_for(rows, rows * classes > kParallelGrain, [&](int64_t r) {
      T* dr = dx + r * classes;
      if (targets[r] == ignore_index) {
        std::fill(dr, dr + classes, T(0));
        return;
      }
      const T* xr = x + r * classes;
      const smath::RowLse<T> lse = row_logsumexp(xr, classes);
      const T g = static_cast<T>(dl[r * dloss_stride] * scale);
      const T inv = static_cast<T>(1.0 / lse.sum);
      for (int64_t j = 0; j < classes; ++j) dr[j] = g * fast_exp(xr[j] - lse.max) * inv;
      dr[targets[r]] -= g;
    });
  });
}

// ---- optimizers (firstprivate: each thread's own copy, which no store through p can alias) ----
void CpuBackend::sgd_step(DType dt, void* param, const void* grad, void* buf, int64_t n, double lr, double momentum,
                          double dampening, double wd, bool nesterov, bool first_step) {
  dispatch_float(dt, "sgd_step", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* p = static_cast<T*>(param);
    const T* g = static_cast<const T*>(grad);
    T* b = static_cast<T*>(buf);
    const smath::SgdParams<T> h{T(lr), T(momentum), T(dampening), T(wd), nesterov, first_step};
    parallel_for(n, n > kParallelGrain, [&, h](int64_t i) { smath::sgd_update(p, g, b, i, h); });
  });
}

void CpuBackend::adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n,
                           double lr, double beta1, double beta2, double eps, double wd, int64_t step, bool decoupled) {
  dispatch_float(dt, "adam_step", [&](auto tag_T) {
    using T = decltype(tag_T);
    T* p = static_cast<T*>(param);
    const T* g = static_cast<const T*>(grad);
    T* m = static_cast<T*>(exp_avg);
    T* v = static_cast<T*>(exp_avg_sq);
    const smath::AdamParams<T> h = smath::adam_params<T>(lr, beta1, beta2, eps, wd, step, decoupled);
    // In blocks with `omp simd` inside: per element, the compiler cannot rule out that the four
    // arrays overlap and leaves the update scalar (a third of its vectorised speed).
    constexpr int64_t kBlock = 4096;
    parallel_for((n + kBlock - 1) / kBlock, n > kParallelGrain, [&, h](int64_t b) {
      const int64_t hi = std::min(n, (b + 1) * kBlock);
#pragma omp simd
      for (int64_t i = b * kBlock; i < hi; ++i) smath::adam_update(p, g, m, v, i, h);
    });
  });
}

}  // namespace headlab::cpu
