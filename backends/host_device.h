// HL_HOST_DEVICE: a function the CUDA backend's kernels and the CPU backend both call. Under nvcc it
// compiles for host and device (and is force-inlined, as kernels want); elsewhere it is plain inline.
#pragma once

#if defined(__CUDACC__)
#define HL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define HL_HOST_DEVICE inline
#endif
