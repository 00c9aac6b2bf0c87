// Device names: "cpu", "cuda", "cuda:N".
#include "base/dtype.h"

#include "base/error.h"

namespace headlab {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device{cpu, 0};
  if (s == "cuda") return Device{cuda, 0};
  if (s.rfind("cuda:", 0) == 0) {
    const std::string idx = s.substr(5);
    HL_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos && idx.size() < 4,
             "device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
    return Device{cuda, std::stoi(idx)};
  }
  HL_FAIL("device: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
}

std::string Device::str() const { return kind == cpu ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace headlab
