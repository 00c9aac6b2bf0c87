// A cache of large freed host blocks, reused by size class. glibc hands blocks this large back to
// the OS on free (mmap/munmap), so without it every training step faults its activations and
// gradients in again, page by page (measured: ~22,000 page faults in 3 s of the toy GPT step).
// Small blocks are left to malloc, whose bins already reuse them.
#pragma once
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace headlab::cpu {

class BlockCache {
 public:
  static constexpr size_t kMinBytes = size_t(64) << 10;  // smaller blocks are not cached
  static constexpr size_t kMaxCached = size_t(2) << 30;  // beyond this, freed blocks go back to the OS

  // The size a block of n >= kMinBytes bytes is allocated with: a quarter-octave class, so at most
  // 25% is wasted and blocks of nearly equal size share a class.
  static size_t size_class(size_t n) {
    size_t octave = 1;
    while (octave * 2 <= n) octave *= 2;
    const size_t step = octave / 4;
    return (n + step - 1) / step * step;
  }

  // A cached block of exactly `bytes` (a size_class), or nullptr; one this thread gave back if any, as
  // it may still sit in this core's cache (data-parallel threads that traded blocks every step ran a
  // few percent slower).
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    std::vector<Block>& blocks = it->second;
    auto pick = blocks.end() - 1;
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)
      if (b->thread == this_thread()) {
        pick = b.base() - 1;
        break;
      }
    void* p = pick->p;
    blocks.erase(pick);
    cached_ -= bytes;
    return p;
  }
  // Keeps the block for reuse; false when the cache is full (the caller frees it).
  bool give(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + bytes > kMaxCached) return false;
    free_[bytes].push_back({p, this_thread()});
    cached_ += bytes;
    return true;
  }
  // Hands every cached block to release(p) (e.g. std::free) and forgets them.
  template <typename F>
  void clear(F release) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [bytes, blocks] : free_)
      for (const Block& b : blocks) release(b.p);
    free_.clear();
    cached_ = 0;
  }

 private:
  struct Block {
    void* p;
    const void* thread;  // the thread that gave it back
  };
  // A per-thread address: cheaper than std::this_thread::get_id(), and only ever compared.
  static const void* this_thread() {
    static thread_local char tag;
    return &tag;
  }
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Block>> free_;  // size class -> free blocks
  size_t cached_ = 0;
};

}  // namespace headlab::cpu
