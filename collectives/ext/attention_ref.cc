// The reference attention block kernels (float64 inside, exact softmax),
// the example of the block-kernel contract in include/zeppelin.h, and the
// log-sum-exp merge of partial outputs: on the host, or enqueued on a
// stream. Both run the functors of device/attn_kernels.h, so the host and
// the device do the same arithmetic.
#include <cmath>
#include <vector>

#include "collectives/ext/device/attn_kernels.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#ifdef ZP_WITH_CUDA
#include "collectives/ext/device/kernels.h"
#endif

namespace {

zpResult_t checkBlock(const zpAttnBlock_t* b, const char* fn, bool backward) {
  if (!b) return zpSetLastError(nullptr, zpInvalidArgument, "%s: block is NULL", fn);
  if (b->sq < 0 || b->sk < 0 || b->qHeads < 1 || b->kvHeads < 1 || b->headDim < 1 || b->qHeads % b->kvHeads)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: sq %lld, sk %lld, %d query heads, %d key/value heads, head dim %d", fn,
                    (long long)b->sq, (long long)b->sk, b->qHeads, b->kvHeads, b->headDim);
  if (b->mask != zpMaskFull && b->mask != zpMaskCausal && b->mask != zpMaskSkip)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: mask %d", fn, (int)b->mask);
  if (b->mask == zpMaskCausal && b->sq != b->sk)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a causal block is a diagonal block: sq %lld != sk %lld", fn,
                    (long long)b->sq, (long long)b->sk);
  bool empty = b->sq == 0 || b->sk == 0 || b->mask == zpMaskSkip;
  if (!empty && (!b->q || !b->k || !b->v || !b->out || !b->lse))
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a NULL pointer among q, k, v, out, lse", fn);
  if (backward && !empty && (!b->dout || !b->dq || !b->dk || !b->dv))
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a NULL pointer among dout, dq, dk, dv", fn);
  if (b->datatype != zpFloat32 && b->datatype != zpBfloat16 && b->datatype != zpFloat16)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: datatype %d (float32, bfloat16 or float16)", fn,
                          (int)b->datatype);
  if (b->stream && b->headDim > zpx::kAttnRefMaxHeadDim)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: the device reference kernel takes head dims up to %d, not %d",
                          fn, zpx::kAttnRefMaxHeadDim, b->headDim);
  return zpSuccess;
}

#ifdef ZP_WITH_CUDA
zpResult_t cudaFailed(const char* fn, cudaError_t e) {
  return zpSetLastError(nullptr, zpUnhandledCudaError, "%s: launching the kernel: %s", fn, cudaGetErrorString(e));
}
#endif

// Enqueues the device kernel of a block with a stream.
zpResult_t refOnStream(const zpAttnBlock_t* b, const char* fn, bool backward) {
#ifdef ZP_WITH_CUDA
  cudaError_t e = zpx::launchAttnRef(*b, backward);
  return e == cudaSuccess ? zpSuccess : cudaFailed(fn, e);
#else
  (void)b, (void)backward;
  return zpSetLastError(nullptr, zpInvalidArgument, "%s: a stream means device buffers: this build has no CUDA", fn);
#endif
}

// The host kernels: every row in order.
struct HostRef {
  const zpAttnBlock_t& b;
  bool backward;
  template <class T>
  void run() {
    const zpx::AttnRefBlock<T> k = zpx::AttnRefBlock<T>::of(b);
    const size_t rows = (size_t)b.sq * b.qHeads;
    if (backward) {
      if (b.mask == zpMaskSkip || b.sq == 0 || b.sk == 0) return;
      for (size_t i = 0; i < rows; i++) k.backward(i, [](float* p, float v) { *p += v; });
      return;
    }
    std::vector<double> acc(b.headDim);
    for (size_t i = 0; i < rows; i++) k.forward(i, acc.data());
  }
};

}  // namespace

// Both reference kernels (fn: the caller's name, for messages): the block
// checked, then run on its stream, or on the host.
static zpResult_t runReference(const zpAttnBlock_t* b, const char* fn, bool backward) {
  ZPX_CHECK(checkBlock(b, fn, backward));
  if (b->stream) return refOnStream(b, fn, backward);
  HostRef run{*b, backward};
  zpx::withInputType(b->datatype, run);
  return zpSuccess;
}

zpResult_t zpAttnRefForward(const zpAttnBlock_t* b, void* /*user*/) try {
  return runReference(b, "zpAttnRefForward", false);
} catch (...) {
  return zpx::failFromException("zpAttnRefForward");
}

zpResult_t zpAttnRefBackward(const zpAttnBlock_t* b, void* /*user*/) try {
  return runReference(b, "zpAttnRefBackward", true);
} catch (...) {
  return zpx::failFromException("zpAttnRefBackward");
}

zpResult_t zpAttnMergeLse(float* out, float* lse, const float* partOut, const float* partLse, int64_t sq, int qHeads,
                          int headDim, zpStream_t stream) try {
  if (sq < 0 || qHeads < 1 || headDim < 1)
    return zpSetLastError(nullptr, zpInvalidArgument, "zpAttnMergeLse: sq %lld, %d heads, head dim %d", (long long)sq,
                          qHeads, headDim);
  if (sq && (!out || !lse || !partOut || !partLse))
    return zpSetLastError(nullptr, zpInvalidArgument, "zpAttnMergeLse: NULL pointer");
  if (stream) {
#ifdef ZP_WITH_CUDA
    cudaError_t e = zpx::launchMergeLse(out, lse, partOut, partLse, sq, qHeads, headDim, (cudaStream_t)stream);
    return e == cudaSuccess ? zpSuccess : cudaFailed("zpAttnMergeLse", e);
#else
    return zpSetLastError(nullptr, zpInvalidArgument, "zpAttnMergeLse: a stream means device buffers: this build has no CUDA");
#endif
  }
  const zpx::MergeLse merge{out, lse, partOut, partLse, sq, qHeads, headDim};
  for (size_t i = 0; i < (size_t)sq * qHeads; i++) merge(i);
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpAttnMergeLse");
}
