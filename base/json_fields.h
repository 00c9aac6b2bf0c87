// Config fields from JSON (checkpoint configs, tools' files), with headlab::Error instead of
// nlohmann's unchecked conversions: a number read into an integer must be a whole number in range
// (3.5 is not truncated, 1e93 is not undefined behaviour, -1 is no count), and a value of the
// wrong type names its key. A config struct lists its fields once (Field: key, member, presence,
// bounds); its to_json, from_json and the per-field part of validate() come from that list.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "base/enum_names.h"
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
      HL_CHECK(h >= 0 && h < n_heads, who, ": ", key, " of layer ", l, " holds head ", h, ", expected 0..",
               n_heads - 1);
}

template <typename T>
inline constexpr bool kIsOptional = false;
template <typename T>
inline constexpr bool kIsOptional<std::optional<T>> = true;

// Reads j[key] into out when j has the key, else leaves out as it is. who prefixes the error
// ("GPT config"). Enums are read by name (base/enum_names.h); lists of lists of integers are head
// lists (read_head_lists); a std::optional is set from its value's JSON.
template <typename T>
void read_json_field(const nlohmann::json& j, const char* key, T& out, const char* who) {
  if (!j.contains(key)) return;
  const nlohmann::json& v = j.at(key);
  if constexpr (kIsOptional<T>) {
    typename T::value_type value{};
    read_json_field(j, key, value, who);
    out = value;
  } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    HL_CHECK(json_to_integer(v, out), who, ": key '", key, "' must be an integer", std::is_unsigned_v<T> ? " >= 0" : "",
             ", got ", json_text(v));
  } else if constexpr (std::is_same_v<T, std::vector<std::vector<int64_t>>>) {
    read_head_lists(j, key, out, who);
  } else if constexpr (NamedEnum<T>) {
    HL_CHECK(v.is_string(), who, ": key '", key, "' has the wrong type (", v.type_name(), ")");
    out = parse_enum<T>(v.get_ref<const std::string&>(), detail::str_cat(who, ": ", key));
  } else {
    try {
      v.get_to(out);
    } catch (const nlohmann::json::exception&) {
      HL_FAIL(who, ": key '", key, "' has the wrong type (", v.type_name(), ")");
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Field lists. A config struct declares its fields once, in the file that converts it:
//   const auto kFields = std::tuple{field("vocab_size", &GPTConfig::vocab_size, Need::required, kPositive),
//                                   field("drop_rate", &GPTConfig::drop_rate, Need::required, kFraction), ...};
// and gets fields_to_json, fields_from_json and check_fields from it; checks that involve several
// fields stay code beside them.

// The values check_fields allows a number: lo <= v <= hi, either end open. Default: any.
struct Bounds {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;

  bool any() const {
    return lo == -std::numeric_limits<double>::infinity() && hi == std::numeric_limits<double>::infinity();
  }
  bool holds(double v) const {  // false for NaN
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  std::string text() const {  // "positive", ">= 0", "in [0, 1)"
    std::ostringstream os;
    if (hi == std::numeric_limits<double>::infinity()) {
      if (lo_open && lo == 0) return "positive";
      os << (lo_open ? "> " : ">= ") << lo;
    } else {
      os << "in " << (lo_open ? "(" : "[") << lo << ", " << hi << (hi_open ? ")" : "]");
    }
    return os.str();
  }
};
inline constexpr Bounds kPositive{0, std::numeric_limits<double>::infinity(), true, false};
inline constexpr Bounds kNonNegative{0, std::numeric_limits<double>::infinity(), false, false};
inline constexpr Bounds kFraction{0, 1, false, true};                                        // [0, 1): dropout rates
inline constexpr Bounds kSmallEps{0, 1, false, true};                                        // [0, 1): a norm's eps
inline constexpr Bounds kAboveOne{1, std::numeric_limits<double>::infinity(), true, false};  // above 1: rope_theta

// required: from_json refuses JSON without the key; optional: the member keeps its default.
enum class Need { optional, required };

// One member of S stored under key. Written by fields_to_json always, except a container that is
// empty (head lists: empty means every head, and configs of unpruned models never had the key).
template <typename S, typename T>
struct Field {
  const char* key;
  T S::*member;
  Need need = Need::optional;
  Bounds bounds = {};  // numbers only
  using Type = T;
};
template <typename S, typename T>
constexpr Field<S, T> field(const char* key, T S::*member, Need need = Need::optional, Bounds bounds = {}) {
  return {key, member, need, bounds};
}
template <typename S, typename T>
constexpr Field<S, T> field(const char* key, T S::*member, Bounds bounds) {
  return {key, member, Need::optional, bounds};
}

// f(field) for each field of a tuple of Fields, in order.
template <typename Fields, typename F>
void for_each_field(const Fields& fields, F&& f) {
  std::apply([&](const auto&... each) { (f(each), ...); }, fields);
}

// j[key] = v (enums by name); nothing for an empty container (head lists: empty means every head) or an
// unset std::optional.
template <typename T>
void write_json_field(nlohmann::json& j, const char* key, const T& v) {
  if constexpr (kIsOptional<T>) {
    if (v) write_json_field(j, key, *v);
  } else if constexpr (NamedEnum<T>) {
    j[key] = enum_name(v);
  } else if constexpr (requires { v.empty(); } && !std::is_same_v<T, std::string>) {
    if (!v.empty()) j[key] = v;
  } else {
    j[key] = v;
  }
}

// The fields of s as a JSON object.
template <typename S, typename Fields>
nlohmann::json fields_to_json(const S& s, const Fields& fields) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field(fields, [&](const auto& f) { write_json_field(j, f.key, s.*f.member); });
  return j;
}

// Reads every field present in j into s through read_json_field's checks; a required key that is
// missing is an error. Keys that no field names are ignored (configs from newer or other writers).
// Bounds are not checked here: check_fields does that, after the cross-field defaults are in.
template <typename S, typename Fields>
void fields_from_json(const nlohmann::json& j, S& s, const Fields& fields, const char* who) {
  HL_CHECK(j.is_object(), who, ": expected a JSON object, got ", j.type_name());
  for_each_field(fields, [&](const auto& f) {
    HL_CHECK(f.need == Need::optional || j.contains(f.key), who, ": missing key '", f.key, "'");
    read_json_field(j, f.key, s.*f.member, who);
  });
}

// How check_fields names a field: by its JSON key (emb_dim), or as the command-line option that sets
// it (--batch-size for batch_size).
enum class FieldNames { keys, options };

// Every numeric field within its bounds: "<who>: emb_dim must be positive, got 0".
template <typename S, typename Fields>
void check_fields(const S& s, const Fields& fields, const char* who, FieldNames names = FieldNames::keys) {
  for_each_field(fields, [&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      const T v = s.*f.member;
      if (f.bounds.any() || f.bounds.holds(static_cast<double>(v))) return;
      std::string name = f.key;
      if (names == FieldNames::options) {
        for (char& c : name)
          if (c == '_') c = '-';
        name.insert(0, "--");
      }
      HL_FAIL(who, ": ", name, " must be ", f.bounds.text(), ", got ", v);
    }
  });
}

}  // namespace headlab
