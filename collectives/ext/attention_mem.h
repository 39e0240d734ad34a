// Where an attention pass moves its bytes (attention_pass.h): every copy,
// fill, merge and addition goes through Mem, which does it at once on the
// host or enqueues it on the caller's stream.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include "collectives/ext/device/attn_kernels.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#ifdef ZP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "collectives/ext/device/kernels.h"
#endif

namespace zpx::attn {

// Conversion between float32 and an input type on the host.
struct HostConvert {
  void* dst;
  const void* src;
  size_t n;
  bool toF32;
  template <class T>
  void run() {
    if (toF32) {
      const zpx::Convert<float, T> c{(float*)dst, (const T*)src, n};
      for (size_t i = 0; i < n; i++) c(i);
    } else {
      const zpx::Convert<T, float> c{(T*)dst, (const float*)src, n};
      for (size_t i = 0; i < n; i++) c(i);
    }
  }
};

// Where a pass moves its bytes: on the host, at once, or enqueued on the
// caller's stream (device buffers). A device call that fails is kept and
// reported by check().
class Mem {
 public:
  explicit Mem(zpStream_t stream) : stream_(stream) {}
  bool device() const { return stream_ != nullptr; }
  zpStream_t stream() const { return stream_; }

  void copy(void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
#ifdef ZP_WITH_CUDA
    if (device()) return note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s()), "cudaMemcpyAsync");
#endif
    memcpy(dst, src, bytes);
  }
  // rows rows of width bytes.
  void copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
    if (!width || !rows) return;
#ifdef ZP_WITH_CUDA
    if (device())
      return note(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s()),
                  "cudaMemcpy2DAsync");
#endif
    for (size_t r = 0; r < rows; r++) memcpy((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
  }
  void fill(float* p, float value, size_t n) {
#ifdef ZP_WITH_CUDA
    if (device()) return note(zpx::launchFillF32(p, value, n, s()), "the fill kernel");
#endif
    std::fill(p, p + n, value);
  }
  // dst[i] += src[i]
  void add(float* dst, const float* src, size_t n) {
#ifdef ZP_WITH_CUDA
    if (device()) return note(zpx::launchAddStrided(dst, n, src, 1, n, sizeof(float), s()), "the add kernel");
#endif
    for (size_t e = 0; e < n; e++) dst[e] += src[e];
  }
  zpResult_t merge(float* out, float* lse, const float* partOut, const float* partLse, int64_t sq, int H, int D) {
    return zpAttnMergeLse(out, lse, partOut, partLse, sq, H, D, stream_);
  }
  // n elements between float32 and an input type (one of them float32).
  void convert(void* dst, zpDataType_t dstType, const void* src, zpDataType_t srcType, size_t n) {
#ifdef ZP_WITH_CUDA
    if (device()) return note(zpx::launchConvert(dst, dstType, src, srcType, n, s()), "the conversion kernel");
#endif
    HostConvert host{dst, src, n, dstType == zpFloat32};
    zpx::withInputType(dstType == zpFloat32 ? srcType : dstType, host);
  }

  zpResult_t check(zpComm_t comm, const char* fn) const {
    if (failed_.empty()) return zpSuccess;
    return zpSetLastError(comm, zpUnhandledCudaError, "%s: %s", fn, failed_.c_str());
  }

 private:
  zpStream_t stream_;
  std::string failed_;
#ifdef ZP_WITH_CUDA
  cudaStream_t s() const { return (cudaStream_t)stream_; }
  void note(cudaError_t e, const char* what) {
    if (e != cudaSuccess && failed_.empty()) failed_ = std::string(what) + ": " + cudaGetErrorString(e);
  }
#endif
};

}  // namespace zpx::attn
