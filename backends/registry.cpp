// Picks the backend that owns a device's memory. The CUDA backend is built only when HEADLAB_HAS_CUDA
// is defined (HEADLAB_CUDA=ON, or AUTO with nvcc present), as a plugin loaded on first use of a CUDA
// device (backends/cuda_plugin.cpp).
#include "backends/backend.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "backends/cpu/omp_policy.h"
#ifdef HEADLAB_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace headlab {

void prepare_process(char** argv) { cpu::restart_with_passive_omp_waits(argv); }

bool cuda_built() {
#ifdef HEADLAB_HAS_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available() {
#ifdef HEADLAB_HAS_CUDA
  return cuda_device_visible();
#else
  return false;
#endif
}

std::string format_bytes(double b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (std::abs(b) >= 1024 && u < 6) b /= 1024, ++u;
  std::ostringstream os;
  if (u == 0)
    os << static_cast<int64_t>(b) << " B";
  else if (std::isfinite(b))
    os << std::fixed << std::setprecision(1) << b << ' ' << units[u];
  else
    os << "more than 1024 EiB";
  return os.str();
}

std::string out_of_memory_message(size_t nbytes, const std::string& device) {
  const char* op = OpScope::current();
  return detail::str_cat(op ? op : (device + " alloc").c_str(), ": out of memory allocating ",
                         format_bytes(static_cast<double>(nbytes)), " (", nbytes, " bytes) on ", device);
}

Backend& backend_for(Device device) {
  if (device.kind == Device::cpu) return cpu_backend();
#ifdef HEADLAB_HAS_CUDA
  return cuda_backend_instance(device.index);
#else
  HL_FAIL("headlab was built without CUDA (HEADLAB_CUDA=OFF); cannot use device ", device.str());
#endif
}

}  // namespace headlab
