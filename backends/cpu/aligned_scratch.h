// A scratch buffer reused across calls, from a 64-byte boundary: GEMM kernels read the operands copied
// into it (a transposed B) with 512-bit loads, which split across cache lines from a std::vector's
// 16-byte one (libxsmm's FF-up product of the toy step ran at 90-100 GFLOP/s from there, 167-169 aligned).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace headlab::cpu {

template <typename T>
class AlignedScratch {
 public:
  // At least n elements; the contents are not kept when it grows.
  T* get(size_t n) {
    if (n > capacity_) {
      const size_t bytes = (std::max<size_t>(n, 1) * sizeof(T) + 63) / 64 * 64;
      T* p = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (!p) throw std::bad_alloc();
      buf_.reset(p);
      capacity_ = n;
    }
    return buf_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> buf_;
  size_t capacity_ = 0;
};

}  // namespace headlab::cpu
