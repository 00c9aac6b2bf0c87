// headlab::Error and HL_CHECK: the one way the library reports bad input.
// The library never aborts or prints on bad input; it throws an Error whose message starts with
// the op, module or file name and states what was expected and what came.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace headlab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace headlab

// HL_CHECK(cond, "op: expected ", x, " but got ", y): throws headlab::Error with the streamed message.
#define HL_CHECK(cond, ...)                                                  \
  do {                                                                       \
    if (!(cond)) throw ::headlab::Error(::headlab::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define HL_FAIL(...) throw ::headlab::Error(::headlab::detail::str_cat(__VA_ARGS__))
