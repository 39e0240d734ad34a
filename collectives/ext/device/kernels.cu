// The extension layer's device kernels (kernels.h). Each is a functor with
// operator()(i) for one element and mapped(), which gives a copy whose
// pointers went through a map: the test double maps device addresses to
// its host aliases (tests/fakecuda/ext_kernels.cc); a GPU never calls it.
#include "collectives/ext/device/kernels.h"

#include <type_traits>

#include "collectives/ext/device/attn_kernels.h"

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
// On the double: threads of a block run one after another, so a plain add
// is the atomic one.
struct AtomicAdd {
  void operator()(float* p, float v) const { *p += v; }
};
#else
struct AtomicAdd {
  ZPX_HD void operator()(float* p, float v) const {
#ifdef __CUDA_ARCH__
    atomicAdd(p, v);
#else
    *p += v;
#endif
  }
};
#endif

// f(i) for i < n on the stream: one kernel per functor type F (defined below
// the list of them, Kernels).
template <class F>
cudaError_t forEach(const F& f, size_t n, cudaStream_t stream);

// The reference kernels, one thread per (query row, head): the forward
// row's accumulator in local memory, the backward's key/value gradients
// added atomically (on a GPU their order, and so their last bits, vary).
template <class T>
struct AttnRefForwardKernel {
  AttnRefBlock<T> b;
  ZPX_HD void operator()(size_t i) const {
    double acc[kAttnRefMaxHeadDim];
    b.forward(i, acc);
  }
  template <class Map>
  AttnRefForwardKernel mapped(Map map) const {
    return {b.mapped(map)};
  }
};

template <class T>
struct AttnRefBackwardKernel {
  AttnRefBlock<T> b;
  ZPX_HD void operator()(size_t i) const { b.backward(i, AtomicAdd{}); }
  template <class Map>
  AttnRefBackwardKernel mapped(Map map) const {
    return {b.mapped(map)};
  }
};

struct RefLaunch {
  const zpAttnBlock_t& block;
  bool backward;
  size_t rows;
  cudaStream_t stream;
  cudaError_t* e;
  template <class T>
  void run() {
    const AttnRefBlock<T> b = AttnRefBlock<T>::of(block);
    *e = backward ? forEach(AttnRefBackwardKernel<T>{b}, rows, stream) : forEach(AttnRefForwardKernel<T>{b}, rows, stream);
  }
};

// Every kernel of this file, one per functor type forEach is given: what
// loadKernels loads. forEach refuses (at compile time) a type not listed.
template <class... Fs>
struct KernelList {
  template <class F>
  static constexpr bool has() {
    return (std::is_same<F, Fs>::value || ...);
  }
};
using Kernels =
    KernelList<AddStrided<float>, AddStrided<double>, FillF32, Convert<float, Bf16>, Convert<Bf16, float>,
               Convert<float, Half>, Convert<Half, float>, MergeLse, AttnRefForwardKernel<float>,
               AttnRefForwardKernel<Bf16>, AttnRefForwardKernel<Half>, AttnRefBackwardKernel<float>,
               AttnRefBackwardKernel<Bf16>, AttnRefBackwardKernel<Half>>;

#ifdef ZPX_HOST_KERNELS
// On the double: the whole index range on the stream's thread, in order.
// The host function is the kernel (its symbol, for cudaFuncGetAttributes).
template <class F>
struct HostLaunch {
  F f;
  size_t n;
};
template <class F>
void forEachOnHost(void* p) {
  const HostLaunch<F>* l = (const HostLaunch<F>*)p;
  const F g = l->f.mapped([](const void* d, size_t bytes) { return fakecudaAlias(d, bytes); });
  for (size_t i = 0; i < l->n; i++) g(i);
}
template <class F>
const void* kernelOf() {
  return reinterpret_cast<const void*>(&forEachOnHost<F>);
}

template <class F>
cudaError_t forEach(const F& f, size_t n, cudaStream_t stream) {
  static_assert(Kernels::has<F>(), "a kernel missing from Kernels would not be loaded by loadKernels");
  if (n == 0) return cudaSuccess;
  const HostLaunch<F> launch{f, n};
  return fakecudaLaunch(stream, &forEachOnHost<F>, &launch, sizeof launch);
}
#else
template <class F>
__global__ void forEachKernel(F f, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) f(i);
}
template <class F>
const void* kernelOf() {
  return (const void*)&forEachKernel<F>;
}

template <class F>
cudaError_t forEach(const F& f, size_t n, cudaStream_t stream) {
  static_assert(Kernels::has<F>(), "a kernel missing from Kernels would not be loaded by loadKernels");
  if (n == 0) return cudaSuccess;
  const unsigned threads = 256;
  const size_t blocks = (n + threads - 1) / threads;
  forEachKernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(f, n);
  return cudaGetLastError();
}
#endif

template <class... Fs>
cudaError_t loadEach(KernelList<Fs...>) {
  cudaError_t first = cudaSuccess;
  for (const void* kernel : {kernelOf<Fs>()...}) {
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess && first == cudaSuccess) first = e;
  }
  if (first != cudaSuccess) cudaGetLastError();  // not left for the next launch's check to find
  return first;
}

}  // namespace

cudaError_t loadKernels() { return loadEach(Kernels{}); }

namespace {
// Loaded where a device gets its first communicator in a process, as NCCL
// loads its own kernels in ncclCommInitRank, not at their first launch
// (loadKernels). Registered when the library is loaded, which calls no CUDA:
// a process that never makes a device communicator (a test parent that
// forks its ranks) loads nothing.
[[maybe_unused]] const zpResult_t kLoadedAtDeviceInit = zpAddDeviceInitHook([](int) { loadKernels(); });
}  // namespace

cudaError_t launchAddStrided(void* dst, size_t dstStride, const void* src, size_t rows, size_t width, size_t elem,
                             cudaStream_t stream) {
  if (elem == 4)
    return forEach(AddStrided<float>{(float*)dst, (const float*)src, rows, width, dstStride}, rows * width, stream);
  if (elem == 8)
    return forEach(AddStrided<double>{(double*)dst, (const double*)src, rows, width, dstStride}, rows * width, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launchFillF32(float* dst, float value, size_t n, cudaStream_t stream) {
  return forEach(FillF32{dst, value, n}, n, stream);
}

cudaError_t launchConvert(void* dst, zpDataType_t dstType, const void* src, zpDataType_t srcType, size_t n,
                          cudaStream_t stream) {
  if (srcType == zpFloat32 && dstType == zpFloat32)
    return cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, stream);
  const bool toF32 = dstType == zpFloat32;
  const zpDataType_t other = toF32 ? srcType : dstType;
  if (!toF32 && srcType != zpFloat32) return cudaErrorInvalidValue;
  if (other == zpBfloat16)
    return toF32 ? forEach(Convert<float, Bf16>{(float*)dst, (const Bf16*)src, n}, n, stream)
                 : forEach(Convert<Bf16, float>{(Bf16*)dst, (const float*)src, n}, n, stream);
  if (other == zpFloat16)
    return toF32 ? forEach(Convert<float, Half>{(float*)dst, (const Half*)src, n}, n, stream)
                 : forEach(Convert<Half, float>{(Half*)dst, (const float*)src, n}, n, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launchMergeLse(float* out, float* lse, const float* partOut, const float* partLse, int64_t sq, int heads,
                           int headDim, cudaStream_t stream) {
  return forEach(MergeLse{out, lse, partOut, partLse, sq, heads, headDim}, (size_t)sq * heads, stream);
}

cudaError_t launchAttnRef(const zpAttnBlock_t& block, bool backward) {
  const cudaStream_t stream = (cudaStream_t)block.stream;
  const size_t rows = (size_t)block.sq * block.qHeads;
  if (block.headDim > kAttnRefMaxHeadDim) return cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  RefLaunch launch{block, backward, rows, stream, &e};
  withInputType(block.datatype, launch);
  return e;
}

}  // namespace zpx
