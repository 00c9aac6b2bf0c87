// FNV-1a, 64 bits: a fast, stable fingerprint of bytes (the same on every machine and build), for
// checking that two copies agree, not for security.
#pragma once
#include <cstddef>
#include <cstdint>

namespace headlab {

constexpr uint64_t kFnv1aStart = 1469598103934665603ull;

// Continues `hash` over n bytes at p; start from kFnv1aStart.
inline uint64_t fnv1a64(const void* p, size_t n, uint64_t hash = kFnv1aStart) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

}  // namespace headlab
