// The extension layer's device kernels (kernels.h). Each is a functor with
// operator()(i) for one element and mapped(), which gives a copy whose
// pointers went through a map: the test double maps device addresses to
// its host aliases (tests/fakecuda/ext_kernels.cc); a GPU never calls it.
#include "collectives/ext/device/kernels.h"

#ifdef ZPX_HOST_KERNELS
// tests/fakecuda/ext_kernels.cc includes this file after fakecuda.h.
#define ZPX_HD
#else
#define ZPX_HD __host__ __device__
#endif

namespace zpx {

namespace {

template <class T>
struct AddStrided {
  T* dst;
  const T* src;
  size_t rows, width, dstStride;
  ZPX_HD void operator()(size_t i) const {
    const size_t r = i / width, c = i % width;
    dst[r * dstStride + c] += src[i];
  }
  template <class Map>
  AddStrided mapped(Map map) const {
    const size_t dstSpan = rows ? ((rows - 1) * dstStride + width) * sizeof(T) : 0;
    return {(T*)map(dst, dstSpan), (const T*)map(src, rows * width * sizeof(T)), rows, width, dstStride};
  }
};

#ifdef ZPX_HOST_KERNELS
// On the double: the whole index range on the stream's thread, in order.
template <class F>
cudaError_t forEach(const F& f, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  struct Launch {
    F f;
    size_t n;
  } launch{f, n};
  return fakecudaLaunch(
      stream,
      [](void* p) {
        const Launch* l = (const Launch*)p;
        const F g = l->f.mapped([](const void* d, size_t bytes) { return fakecudaAlias(d, bytes); });
        for (size_t i = 0; i < l->n; i++) g(i);
      },
      &launch, sizeof launch);
}
#else
template <class F>
__global__ void forEachKernel(F f, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) f(i);
}

template <class F>
cudaError_t forEach(const F& f, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned threads = 256;
  const size_t blocks = (n + threads - 1) / threads;
  forEachKernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(f, n);
  return cudaGetLastError();
}
#endif

}  // namespace

cudaError_t launchAddStrided(void* dst, size_t dstStride, const void* src, size_t rows, size_t width, size_t elem,
                             cudaStream_t stream) {
  if (elem == 4)
    return forEach(AddStrided<float>{(float*)dst, (const float*)src, rows, width, dstStride}, rows * width, stream);
  if (elem == 8)
    return forEach(AddStrided<double>{(double*)dst, (const double*)src, rows, width, dstStride}, rows * width, stream);
  return cudaErrorInvalidValue;
}

}  // namespace zpx
