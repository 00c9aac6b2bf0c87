// Helpers shared by the files of tasks/ (not part of the public API): the counter-based random
// streams every task draws from, UTF-8 decoding and printable forms of text for error messages.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "base/sizes.h"
#include "tasks/task.h"

namespace headlab::tasks::detail {

// ---------------------------------------------------------------------------------------------
// Counter-based randomness. splitmix64's finaliser is a bijective avalanche mix, so hashing the
// tuple (seed, split, n, attempt, counter) gives independent-looking draws that need no state:
// the same tuple gives the same number on every machine, in any order of evaluation.

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t hash_combine(uint64_t h, uint64_t v) { return splitmix64(h ^ splitmix64(v)); }

// Keys that separate the train and val streams (any two distinct constants would do).
inline constexpr uint64_t kTrainKey = 0x747261696e5f5f31ULL;  // "train__1"
inline constexpr uint64_t kValKey = 0x76616c5f5f5f5f32ULL;    // "val____2"
// Salt of the train/val partition of prompts. Deliberately independent of the seed: a model
// trained with one seed and validated with another must still never have seen its val prompts.
inline constexpr uint64_t kPartitionSalt = 0x6865616476616c31ULL;  // "headval1"
inline constexpr uint64_t kValModulus = 8;                         // 1/8 of prompts are validation

inline uint64_t split_key(Split split) { return split == Split::train ? kTrainKey : kValKey; }

class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t next() { return hash_combine(key_, counter_++); }
  // Uniform in [0, n) by the multiply-shift map; the bias (< n / 2^64) is irrelevant here.
  uint64_t below(uint64_t n) {
    __extension__ using u128 = unsigned __int128;
    return static_cast<uint64_t>((static_cast<u128>(next()) * n) >> 64);
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

inline uint64_t example_key(uint64_t seed, Split split, uint64_t n) {
  return hash_combine(hash_combine(splitmix64(seed), split_key(split)), n);
}

// ---------------------------------------------------------------------------------------------
// UTF-8 and text (defined in tasks/text.cpp)

bool next_code_point(std::string_view s, size_t& pos, uint32_t& cp);  // false on malformed input
std::string encode_utf8(uint32_t cp);
// Throws "<label>: invalid UTF-8 at byte offset N (byte 0xXX)" at the first malformed byte; the
// tokenizers check a text once, so their regex and merge loops may assume valid UTF-8.
void check_utf8(std::string_view text, std::string_view label);
// Bytes as text to show: valid UTF-8, each byte that does not complete a character as U+FFFD (a
// byte-level token may hold part of a character).
std::string valid_utf8(std::string_view bytes);
std::string printable(std::string_view ch);      // one character, escaped for messages
std::string printable_text(std::string_view s);  // a text, escaped and shortened for messages
std::string trim(const std::string& s);
// The first character of s that is not a digit nor in also_allowed, printable; "" if none.
std::string first_non_digit(std::string_view s, std::string_view also_allowed = "");
std::string range_text(int64_t lo, int64_t hi);  // "4 to 8", or "4"
// The whole file, or "" with why_not set.
std::string read_text_file(const std::string& path, WholeFile kind, std::string& why_not);

inline constexpr int64_t kTrainPercent = 90;  // chars: the first 90% of the characters train, the rest val

}  // namespace headlab::tasks::detail
