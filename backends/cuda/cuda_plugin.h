// The contract between headlab's core and its CUDA plugin, libheadlab_cuda.so (backends/cuda/*.cu):
// one extern "C" entry point that takes the core's services and returns the plugin's table. The core
// loads the plugin with dlopen on first use of a CUDA device (backends/cuda_plugin.cpp), so a process
// that never touches a GPU never loads cudart or cuBLAS. Plain C++, no CUDA headers.
#pragma once
#include <cstddef>
#include <string>

#include "backends/backend.h"

namespace headlab {

// Bump whenever this table, CudaHost or the Backend interface changes: a plugin from another build
// must be refused, not called through a vtable of another shape.
constexpr int kCudaPluginAbi = 4;
constexpr const char* kCudaPluginFile = "libheadlab_cuda.so";
constexpr const char* kCudaPluginEntry = "headlab_cuda_plugin";

// What the plugin borrows from the core that loads it. Out-of-memory errors name the op at work on
// the calling thread, which lives in the core's OpScope, not in the plugin's copy of it.
struct CudaHost {
  int abi = kCudaPluginAbi;
  std::string (*out_of_memory_message)(size_t nbytes, const std::string& device) = nullptr;
  std::string (*format_bytes)(double bytes) = nullptr;
};

// The plugin's side: backends/cuda/cuda_backend.h's functions, which the core forwards here.
// Every function may throw headlab::Error except device_visible.
struct CudaPlugin {
  int abi = kCudaPluginAbi;
  bool (*device_visible)() = nullptr;
  Backend* (*backend_instance)(int device_index) = nullptr;
  void (*set_allow_tf32)(bool allow) = nullptr;
  bool (*allow_tf32)() = nullptr;
  void (*empty_cache)(int device_index) = nullptr;
  size_t (*cached_bytes)(int device_index) = nullptr;
};

// The entry point's type; `host` must outlive the plugin (the core's is a static).
using CudaPluginEntry = const CudaPlugin* (*)(const CudaHost* host);

}  // namespace headlab
