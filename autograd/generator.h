// A counter-based random generator: (seed, offset) fully determine every draw, on every device,
// so saving these two numbers is enough to resume a run exactly.
#pragma once
#include <cstdint>

#include "base/error.h"

namespace headlab {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves the Philox counters for a draw of n elements and returns the first one.
  uint64_t reserve(int64_t n) {
    if (shard_rows_ > 0) return reserve_rows(n);
    const uint64_t first = offset_;
    offset_ += static_cast<uint64_t>((n + 3) / 4);
    return first;
  }

  // Data parallelism: this process computes rows [first, first + rows) of a batch of `total` rows.
  // A draw over a batch-major tensor (n / rows elements per row) then takes the counters those rows
  // have in the whole batch's draw, and the generator moves on as if the whole batch had drawn, so
  // that every rank's dropout masks are the single process's. rows 0 turns it off.
  void set_row_shard(int64_t first, int64_t rows, int64_t total) {
    shard_first_ = first;
    shard_rows_ = rows;
    shard_total_ = total;
  }

 private:
  uint64_t reserve_rows(int64_t n) {
    HL_CHECK(n % shard_rows_ == 0, "data parallelism: a random draw of ", n, " elements is not over ", shard_rows_,
             " batch rows");
    const int64_t per_row = n / shard_rows_, before = shard_first_ * per_row;
    // Element i uses counter offset + i / 4, lane i % 4: a shard must start at a counter boundary.
    HL_CHECK(before % 4 == 0, "data parallelism: rows per rank (", shard_rows_, ") x ", per_row,
             " elements per row must start at a multiple of 4 elements; use a batch size whose share per rank "
             "is a multiple of 4");
    const uint64_t first = offset_ + static_cast<uint64_t>(before / 4);
    offset_ += static_cast<uint64_t>((shard_total_ * per_row + 3) / 4);
    return first;
  }
  uint64_t seed_;
  uint64_t offset_ = 0;
  int64_t shard_first_ = 0, shard_rows_ = 0, shard_total_ = 0;
};

// The process's generator, or this thread's own while a ThreadGenerator is alive on it.
Generator& default_generator();
inline void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

// While alive, default_generator() on the thread that made it is its own generator, starting as a copy
// of `start`: data-parallel threads each draw their rows' dropout masks and move on as the whole batch
// does, without sharing (or racing on) the process's generator.
class ThreadGenerator {
 public:
  explicit ThreadGenerator(const Generator& start);
  ~ThreadGenerator();
  ThreadGenerator(const ThreadGenerator&) = delete;
  ThreadGenerator& operator=(const ThreadGenerator&) = delete;

 private:
  Generator own_;
  Generator* previous_;
};

}  // namespace headlab
