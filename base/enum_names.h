// Names of enum values, declared once per enum as a constexpr table next to the enum; from it come
// enum_name(e), parse_enum<E>(text, who) with an error listing every name, and enum_names<E>() for
// command-line validators and help. Config JSON (base/json_fields.h) reads and writes enums through it.
#pragma once
#include <array>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace headlab {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// An enum has names when a function enum_table(E) returning its table (std::array of EnumName<E>, one
// entry per value, in the order help lists them) is declared in the enum's namespace, found by ADL:
//   enum class AttentionForm { fused, wrapper };
//   constexpr auto enum_table(AttentionForm) {
//     return std::to_array<EnumName<AttentionForm>>(
//         {{AttentionForm::fused, "fused"}, {AttentionForm::wrapper, "wrapper"}});
//   }
// A value listed again under another name is an alias: parse_enum accepts it, enum_name and the
// lists give the first name only.
template <typename E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  enum_table(e);
};

// The canonical names, in table order, without aliases ("fused", "wrapper").
template <NamedEnum E>
std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  const auto table = enum_table(E{});
  for (size_t i = 0; i < table.size(); ++i) {
    bool alias = false;
    for (size_t k = 0; k < i; ++k) alias = alias || table[k].value == table[i].value;
    if (!alias) out.emplace_back(table[i].name);
  }
  return out;
}

// "'fused', 'wrapper'": the names as error messages list them.
template <NamedEnum E>
std::string enum_names_text() {
  std::string out;
  for (const std::string& name : enum_names<E>()) out.append(out.empty() ? "'" : ", '").append(name).append("'");
  return out;
}

// The name of e; "?" for a value outside the table (a cast from a bad integer).
template <NamedEnum E>
constexpr const char* enum_name(E e) {
  for (const EnumName<E>& entry : enum_table(e))
    if (entry.value == e) return entry.name;
  return "?";
}

// The value named text; who prefixes the error: "<who>: expected one of 'a', 'b', got 'x'".
template <NamedEnum E>
E parse_enum(std::string_view text, std::string_view who) {
  for (const EnumName<E>& entry : enum_table(E{}))
    if (text == entry.name) return entry.value;
  HL_FAIL(who, ": expected one of ", enum_names_text<E>(), ", got '", text, "'");
}

}  // namespace headlab
