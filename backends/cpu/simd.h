// The x86 intrinsics the CPU kernels use, and HEADLAB_SIMD_BEGIN / HEADLAB_SIMD_END around code that calls them:
// GCC 12 warns of the "undefined" pass-through vector inside its AVX-512 widening and narrowing intrinsics once they
// are inlined (a false positive: the mask takes every lane).
#pragma once
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define HEADLAB_SIMD_BEGIN                                                                   \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define HEADLAB_SIMD_END _Pragma("GCC diagnostic pop")
#else
#define HEADLAB_SIMD_BEGIN
#define HEADLAB_SIMD_END
#endif
