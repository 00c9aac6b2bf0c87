// Config fields from JSON (checkpoint configs, tools' files), with headlab::Error instead of
// nlohmann's unchecked conversions: a number read into an integer must be a whole number in range
// (3.5 is not truncated, 1e93 is not undefined behaviour, -1 is no count), and a value of the
// wrong type names its key. Used by every from_json of nn, optim and train.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace headlab {

// v as an integer of type T; false when v is not an integer JSON number within T's range.
template <typename T>
bool json_to_integer(const nlohmann::json& v, T& out) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
    out = static_cast<T>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (std::is_unsigned_v<T> && i < 0) return false;
    out = static_cast<T>(i);
    return true;
  }
  return false;
}

// A value for messages, whatever bytes its strings hold.
inline std::string json_text(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Reads j[key] into out when j has the key, else leaves out as it is. who prefixes the error
// ("GPT config").
template <typename T>
void read_json_field(const nlohmann::json& j, const char* key, T& out, const char* who) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    HL_CHECK(json_to_integer(v, out), who, ": key '", key, "' must be an integer",
             std::is_unsigned_v<T> ? " >= 0" : "", ", got ", json_text(v));
  } else {
    try {
      v.get_to(out);
    } catch (const nlohmann::json::exception&) {
      HL_FAIL(who, ": key '", key, "' has the wrong type (", v.type_name(), ")");
    }
  }
}

// j[key] as lists of head indices, one list per layer ([[0, 2], [1]]), when j has the key.
inline void read_head_lists(const nlohmann::json& j, const char* key, std::vector<std::vector<int64_t>>& out,
                            const char* who) {
  if (!j.contains(key)) return;
  const nlohmann::json& lists = j.at(key);
  HL_CHECK(lists.is_array(), who, ": ", key, " must be a list of lists of head indices, got ", json_text(lists));
  out.clear();
  for (const nlohmann::json& layer : lists) {
    HL_CHECK(layer.is_array(), who, ": ", key, " must be a list of lists of head indices, got ", json_text(lists));
    std::vector<int64_t>& heads = out.emplace_back();
    for (const nlohmann::json& h : layer)
      HL_CHECK(json_to_integer(h, heads.emplace_back()), who, ": ", key, " holds ", json_text(h),
               ", expected head indices");
  }
}

// Checks head lists read by read_head_lists: empty (all heads), or one list per layer of indices < n_heads.
inline void check_head_lists(const std::vector<std::vector<int64_t>>& lists, int64_t n_layers, int64_t n_heads,
                             const char* who, const char* key) {
  if (lists.empty()) return;
  HL_CHECK(static_cast<int64_t>(lists.size()) == n_layers, who, ": ", key, " lists ", lists.size(),
           " layers, expected ", n_layers);
  for (size_t l = 0; l < lists.size(); ++l)
    for (int64_t h : lists[l])
      HL_CHECK(h >= 0 && h < n_heads, who, ": ", key, " of layer ", l, " holds head ", h, ", expected 0..", n_heads - 1);
}

}  // namespace headlab
