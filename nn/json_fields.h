// Config fields from JSON (checkpoint configs, tools' files), with headlab::Error instead of
// nlohmann's unchecked conversions: a number read into an integer must be a whole number in range
// (3.5 is not truncated, 1e93 is not undefined behaviour, -1 is no count), and a value of the
// wrong type names its key. Used by every from_json of nn, optim and train.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "autograd/error.h"

namespace headlab::nn {

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

}  // namespace headlab::nn
