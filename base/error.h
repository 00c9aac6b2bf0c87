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

// The op at work on this thread, for errors raised far below it: an allocation that fails names
// the op that asked ("matmul: out of memory allocating ..."). The innermost scope wins; op must
// outlive the scope (a string literal, or a node's name during its backward).
class OpScope {
 public:
  explicit OpScope(const char* op) noexcept : prev_(current_) { current_ = op; }
  ~OpScope() { current_ = prev_; }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  static const char* current() noexcept { return current_; }  // nullptr outside every op

 private:
  const char* prev_;
  inline static thread_local const char* current_ = nullptr;
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
#define HL_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) throw ::headlab::Error(::headlab::detail::str_cat(__VA_ARGS__)); \
  } while (0)

#define HL_FAIL(...) throw ::headlab::Error(::headlab::detail::str_cat(__VA_ARGS__))
