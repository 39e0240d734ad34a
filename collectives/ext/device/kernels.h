// The extension layer's device kernels, as host-callable launchers: each
// enqueues its kernel on the stream and returns. The kernels themselves are
// functors in kernels.cu and attn_kernels.h, compiled by nvcc for the GPU
// (sm_80, sm_90) and, for the CUDA test double, as host code
// (tests/fakecuda/ext_kernels.cc) that runs each functor on the stream's own
// thread through the double's aliases of device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "include/zeppelin.h"

namespace zpx {

// Loads every kernel of kernels.cu on the current device (cudaFuncGetAttributes
// on each), so that none of them is loaded at its first launch: with CUDA's
// lazy loading (the default since CUDA 12.2) that load may synchronise the
// whole device, and so wait for a stream the caller holds (docs/device.md,
// "The device and the NCCL communicator"). Called in each process once per device, where its first
// device communicator is created (zpAddDeviceInitHook). The first failure,
// if any; the thread's last CUDA error is cleared.
cudaError_t loadKernels();

// dst[r * dstStride + c] += src[r * width + c] for r < rows, c < width:
// summing a contiguous block into a strided one (float or double; elem is
// sizeof the type, 4 or 8).
cudaError_t launchAddStrided(void* dst, size_t dstStride, const void* src, size_t rows, size_t width, size_t elem,
                             cudaStream_t stream);

// The attention driver's kernels (attn_kernels.h).
// dst[i] = value for i < n.
cudaError_t launchFillF32(float* dst, float value, size_t n, cudaStream_t stream);
// n elements converted between float32 and an attention input type
// (float32, float16, bfloat16): one of the two types is float32.
cudaError_t launchConvert(void* dst, zpDataType_t dstType, const void* src, zpDataType_t srcType, size_t n,
                          cudaStream_t stream);
// zpAttnMergeLse on device buffers.
cudaError_t launchMergeLse(float* out, float* lse, const float* partOut, const float* partLse, int64_t sq, int heads,
                           int headDim, cudaStream_t stream);
// The reference block kernels (zpAttnRefForward / zpAttnRefBackward) on
// block.stream; headDim at most kAttnRefMaxHeadDim. cudaErrorInvalidValue
// for a datatype that is not an attention input type.
cudaError_t launchAttnRef(const zpAttnBlock_t& block, bool backward);

}  // namespace zpx
