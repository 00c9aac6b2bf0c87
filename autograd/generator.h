// A counter-based random generator: (seed, offset) fully determine every draw, on every device,
// so saving these two numbers is enough to resume a run exactly.
#pragma once
#include <cstdint>

namespace headlab {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) { seed_ = seed; offset_ = 0; }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed; offset_ = offset; }
  // Reserves the Philox counters for a draw of n elements and returns the first one.
  uint64_t reserve(int64_t n) {
    const uint64_t first = offset_;
    offset_ += static_cast<uint64_t>((n + 3) / 4);
    return first;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace headlab
