// JSON text as headlab reads it, every file and string in one way: in time linear in its length, nested no
// deeper than the reader allows (checked before a value is built), with nothing after the value, and with a
// watched object's repeated key reported (nlohmann keeps the last one silently).
// Why not nlohmann::json::parse: its callback parser (the usual way to limit depth) rescans an object's
// members at each member's end, quadratic in their count (a safetensors header of 40,000 empty tensors took
// 22 s); and its lexer takes a NUL byte for the end of the input, so "{}" followed by a NUL and anything parsed.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace headlab {

struct JsonLimits {
  int max_depth = 64;               // objects and arrays nested deeper are refused
  std::string_view depth_expected;  // what the reader expects, for that error ("expected an object of ...")
  std::vector<std::string> watch;   // keys from the root to the object whose repeated keys are reported
};

// text as JSON; errors are headlab::Error naming `source` ("<source>: not JSON (...)"). When `repeated` is given,
// it gets the first key seen twice in the watched object ("" when none).
nlohmann::json parse_json_text(std::string_view text, const std::string& source, const JsonLimits& limits = {},
                               std::string* repeated = nullptr);

}  // namespace headlab
