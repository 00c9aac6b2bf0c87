// Entry points of the CUDA backend (backends/cuda/*.cu) for code compiled by the host compiler:
// the registry (backends/registry.cpp) and tests. Plain C++, no CUDA headers, so it can be
// included from any translation unit of a build with -DHEADLAB_HAS_CUDA.
#pragma once
#include <cstddef>

#include "backends/backend.h"

namespace headlab {

// The backend of GPU `device_index` (created on first use, then shared; never destroyed, so no CUDA
// call runs during static destruction). Throws headlab::Error when no GPU is visible or the index
// is out of range.
Backend& cuda_backend_instance(int device_index);

// True iff the CUDA runtime loads and reports at least one device. Never throws; the answer is
// probed once and cached.
bool cuda_device_visible();

// TF32 tensor-core GEMMs for float32 (off by default, so float32 GEMMs match the CPU to ~1e-6).
// Takes effect on the next gemm of every CUDA backend instance.
void cuda_set_allow_tf32(bool allow);
bool cuda_allow_tf32();

// Caching-allocator controls for one device (tests, benchmarks, `headlab` memory reports).
// empty_cache waits for the device's stream, then returns every cached (free) block to the driver.
void cuda_empty_cache(int device_index);
size_t cuda_cached_bytes(int device_index);  // bytes held in free lists, not counted in bytes_in_use

}  // namespace headlab
