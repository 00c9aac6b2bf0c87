// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), shared by the
// CPU and CUDA backends so that one (seed, offset) gives the same numbers on every device.
// Element i of a draw uses counter (offset + i / 4) and output lane i % 4.
#pragma once
#include <cmath>
#include <cstdint>

#include "backends/host_device.h"

namespace headlab::philox {

struct U4 {
  uint32_t v[4];
};

HL_HOST_DEVICE void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 on counter `ctr` with key `seed`.
HL_HOST_DEVICE U4 philox4x32(uint64_t ctr, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return U4{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 bits (exactly representable in float and double alike).
HL_HOST_DEVICE double to_unit(uint32_t x) { return static_cast<double>(x >> 8) * (1.0 / 16777216.0); }

// The 32 random bits of element i.
HL_HOST_DEVICE uint32_t bits(uint64_t seed, uint64_t offset, int64_t i) {
  return philox4x32(offset + static_cast<uint64_t>(i) / 4, seed).v[i % 4];
}

HL_HOST_DEVICE double uniform(uint64_t seed, uint64_t offset, int64_t i) { return to_unit(bits(seed, offset, i)); }

// An integer in [lo, lo + range): lo + floor(bits * range / 2^32) (unbiased enough for range << 2^32).
HL_HOST_DEVICE int64_t uniform_int(uint64_t seed, uint64_t offset, int64_t i, int64_t lo, uint64_t range) {
  return lo + static_cast<int64_t>((static_cast<uint64_t>(bits(seed, offset, i)) * range) >> 32);
}

// Dropout of element i: kept (scaled by keep_scale = dropout_scale(p)) when its uniform draw is >= p.
template <typename T>
HL_HOST_DEVICE T dropout_scale(double p) {
  return p < 1 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
}
template <typename T>
HL_HOST_DEVICE T dropout(T x, double p, T keep_scale, uint64_t seed, uint64_t offset, int64_t i) {
  return uniform(seed, offset, i) >= p ? x * keep_scale : T(0);
}

// Standard normal by Box-Muller: lanes (0, 1) and (2, 3) of one counter each give a cos/sin pair.
HL_HOST_DEVICE double normal(uint64_t seed, uint64_t offset, int64_t i) {
  const U4 r = philox4x32(offset + static_cast<uint64_t>(i) / 4, seed);
  const int lane = static_cast<int>(i % 4), pair = lane / 2 * 2;
  const double u1 = (static_cast<double>(r.v[pair] >> 8) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
  const double u2 = to_unit(r.v[pair + 1]);
  const double radius = ::sqrt(-2.0 * ::log(u1));
  const double angle = 6.283185307179586 * u2;
  return lane % 2 == 0 ? radius * ::cos(angle) : radius * ::sin(angle);
}

// Counters consumed by a draw of n elements, so the next draw starts at fresh counters.
HL_HOST_DEVICE uint64_t counters_for(int64_t n) { return static_cast<uint64_t>((n + 3) / 4); }

}  // namespace headlab::philox
