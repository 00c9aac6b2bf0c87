// Picks the backend that owns a device's memory. The CUDA backend is built only when HEADLAB_HAS_CUDA
// is defined (HEADLAB_CUDA=ON, or AUTO with nvcc present), as a plugin loaded on first use of a CUDA
// device (backends/cuda_plugin.cpp).
#include "backends/backend.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "backends/cpu/omp_policy.h"
#ifdef HEADLAB_HAS_XSMM
#include "backends/cpu/xsmm_gemm.h"
#endif
#ifdef HEADLAB_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace headlab {

void prepare_process(char** argv) { cpu::restart_with_omp_wait_policy(argv); }

const char* cpu_gemm_kernels() {
#ifdef HEADLAB_HAS_XSMM
  if (cpu::xsmm_pays()) return "libxsmm";
#endif
  return "OpenBLAS";
}

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
