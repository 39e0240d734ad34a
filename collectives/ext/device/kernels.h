// The extension layer's device kernels, as host-callable launchers: each
// enqueues its kernel on the stream and returns. The kernels themselves are
// functors in kernels.cu, compiled by nvcc for the GPU (sm_80, sm_90) and, for
// the CUDA test double, as host code (tests/fakecuda/ext_kernels.cc) that runs each functor
// on the stream's own thread through the double's aliases of device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace zpx {

// dst[r * dstStride + c] += src[r * width + c] for r < rows, c < width:
// summing a contiguous block into a strided one (float or double; elem is
// sizeof the type, 4 or 8).
cudaError_t launchAddStrided(void* dst, size_t dstStride, const void* src, size_t rows, size_t width, size_t elem,
                             cudaStream_t stream);

}  // namespace zpx
