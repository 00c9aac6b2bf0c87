// Picks the backend that owns a device's memory. The CUDA backend is compiled in only when
// HEADLAB_HAS_CUDA is defined (HEADLAB_CUDA=ON, or AUTO with nvcc present).
#include "backends/backend.h"

#ifdef HEADLAB_HAS_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace headlab {

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

Backend& backend_for(Device device) {
  if (device.kind == Device::cpu) return cpu_backend();
#ifdef HEADLAB_HAS_CUDA
  return cuda_backend_instance(device.index);
#else
  HL_FAIL("headlab was built without CUDA (HEADLAB_CUDA=OFF); cannot use device ", device.str());
#endif
}

}  // namespace headlab
