// Entry points of the CUDA backend for code compiled by the host compiler: the registry
// (backends/registry.cpp), tests and benchmarks. The core defines them (backends/cuda_plugin.cpp):
// each loads the plugin libheadlab_cuda.so on first use and calls into its table. Plain C++, no
// CUDA headers; only a build with -DHEADLAB_HAS_CUDA defines them.
#pragma once
#include <cstddef>

#include "backends/backend.h"

namespace headlab {

// The backend of GPU `device_index` (created on first use, then shared; never destroyed, so no CUDA
// call runs during static destruction). Throws headlab::Error when no GPU is visible or the index
// is out of range, or when the plugin cannot be loaded (the error names the files tried).
Backend& cuda_backend_instance(int device_index);

// True iff the plugin and the CUDA runtime load and report at least one device. Never throws; the
// answer is probed once and cached.
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
