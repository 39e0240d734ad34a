// The ring-attention driver's C entry points (include/zeppelin.h, "Ring
// attention driver") and their argument checks; the driver itself is
// described in attention.h.
#include <cmath>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "collectives/ext/attention.h"
#include "collectives/ext/attention_pass.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#include "src/util/nvtx.h"
#ifdef ZP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

using zpx::attn::Pass;

zpResult_t zpAttentionCreate(zpAttention_t* attn, zpBatchPlan_t plan, const zpAttnConfig_t* config,
                                    zpComm_t comm) try {
  if (!attn || !plan || !config)
    return zpSetLastError(comm, zpInvalidArgument, "zpAttentionCreate: attn, plan or config is NULL");
  *attn = nullptr;
  int n = 0, me = 0;
  ZPX_CHECK(zpCommCount(comm, &n));
  ZPX_CHECK(zpCommUserRank(comm, &me));
  int planRanks = 0, causal = 0;
  ZPX_CHECK(zpPlanGetInfo(plan, &planRanks, nullptr, nullptr, &causal));
  if (planRanks != n)
    return zpSetLastError(comm, zpInvalidArgument, "zpAttentionCreate: the plan is for %zu ranks, the communicator has %d",
                          (size_t)planRanks, n);
  const zpAttnConfig_t& c = *config;
  if (c.qHeads < 1 || c.kvHeads < 1 || c.headDim < 1 || c.qHeads % c.kvHeads)
    return zpSetLastError(comm, zpInvalidArgument,
                    "zpAttentionCreate: %d query heads, %d key/value heads, head dim %d (key/value heads must "
                    "divide query heads)",
                    c.qHeads, c.kvHeads, c.headDim);
  if (!c.forward) return zpSetLastError(comm, zpInvalidArgument, "zpAttentionCreate: no forward kernel");
  if (!(c.scale >= 0) || std::isinf(c.scale))
    return zpSetLastError(comm, zpInvalidArgument, "zpAttentionCreate: softmax scale %g", (double)c.scale);
  if (c.datatype != zpFloat32 && c.datatype != zpBfloat16 && c.datatype != zpFloat16)
    return zpSetLastError(comm, zpInvalidArgument, "zpAttentionCreate: datatype %d (zpFloat32, zpBfloat16 or zpFloat16)",
                          (int)c.datatype);
  try {
    auto a = std::make_unique<zpAttention>();
    a->causal = causal != 0;
    a->H = c.qHeads;
    a->Hk = c.kvHeads;
    a->D = c.headDim;
    a->scale = c.scale == 0 ? 1.0f / std::sqrt((float)c.headDim) : c.scale;
    a->fwd = c.forward;
    a->bwd = c.backward;
    a->user = c.user;
    a->kernelAccumulates = c.kernelAccumulates != 0;
    a->dt = c.datatype;
    a->es = zpTypeSize(c.datatype);
    a->comm = comm;
    ZPX_CHECK(zpx::attn::buildSchedule(a.get(), plan, n, me));
    a->xchg = std::make_unique<zpx::AsyncP2P>(comm);
    *attn = a.release();
    return zpSuccess;
  } catch (const std::bad_alloc&) {
    return zpSetLastError(comm, zpSystemError, "zpAttentionCreate: out of memory");
  }
} catch (...) {
  return zpx::failFromException("zpAttentionCreate");
}

namespace {

// The buffers of a call suit its stream (zpCommCheckBuffer), and with a
// stream the driver has its exchange stream and events.
zpResult_t checkCall(zpAttention* a, const char* fn, std::initializer_list<std::pair<const char*, const void*>> bufs,
                     zpStream_t stream) {
  for (const auto& b : bufs)
    if (b.second && zpCommCheckBuffer(a->comm, b.second, stream) != zpSuccess) {
      const std::string why = zpGetLastError(a->comm);
      return zpSetLastError(a->comm, zpInvalidArgument, "%s: %s: %s", fn, b.first, why.c_str());
    }
  if (!stream) return zpSuccess;
#ifdef ZP_WITH_CUDA
  cudaError_t e = cudaSuccess;
  if (!a->xs) e = cudaStreamCreateWithFlags(&a->xs, cudaStreamNonBlocking);
  if (e == cudaSuccess && !a->fork) e = cudaEventCreateWithFlags(&a->fork, cudaEventDisableTiming);
  if (e == cudaSuccess && !a->join) e = cudaEventCreateWithFlags(&a->join, cudaEventDisableTiming);
  if (e != cudaSuccess)
    return zpSetLastError(a->comm, zpUnhandledCudaError, "%s: making the exchange stream: %s", fn,
                          cudaGetErrorString(e));
  return zpSuccess;
#else
  return zpSetLastError(a->comm, zpInvalidArgument, "%s: a stream means device buffers: this build has no CUDA", fn);
#endif
}

}  // namespace

zpResult_t zpAttentionForward(zpAttention_t attn, const void* q, const void* k, const void* v, void* out, float* lse,
                              zpStream_t stream) try {
  ZP_NVTX_RANGE("zpAttentionForward");
  const char* fn = "zpAttentionForward";
  if (!attn) return zpSetLastError(nullptr, zpInvalidArgument, "%s: attn is NULL", fn);
  if (attn->T > 0 && (!q || !k || !v || !out || !lse))
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a NULL buffer among q, k, v, out, lse (this rank holds %lld tokens)", fn,
                    (long long)attn->T);
  ZPX_CHECK(checkCall(attn, fn, {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}}, stream));
  try {
    Pass pass(attn, false, stream);
    pass.q = (const char*)q;
    pass.k = (const char*)k;
    pass.v = (const char*)v;
    pass.userOut = out;
    pass.lse = lse;
    return pass.run(fn);
  } catch (const std::bad_alloc&) {
    return zpSetLastError(nullptr, zpSystemError, "%s: out of memory", fn);
  }
} catch (...) {
  return zpx::failFromException("zpAttentionForward");
}

zpResult_t zpAttentionBackward(zpAttention_t attn, const void* q, const void* k, const void* v, const void* out,
                               const float* lse, const void* dout, void* dq, void* dk, void* dv,
                               zpStream_t stream) try {
  ZP_NVTX_RANGE("zpAttentionBackward");
  const char* fn = "zpAttentionBackward";
  if (!attn) return zpSetLastError(nullptr, zpInvalidArgument, "%s: attn is NULL", fn);
  if (!attn->bwd) return zpSetLastError(nullptr, zpInvalidUsage, "%s: the driver was created without a backward kernel", fn);
  if (attn->T > 0 && (!q || !k || !v || !out || !lse || !dout || !dq || !dk || !dv))
    return zpSetLastError(nullptr, zpInvalidArgument,
                    "%s: a NULL buffer among q, k, v, out, lse, dout, dq, dk, dv (this rank holds %lld tokens)", fn,
                    (long long)attn->T);
  ZPX_CHECK(checkCall(attn, fn,
                      {{"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}, {"dout", dout}, {"dq", dq},
                       {"dk", dk}, {"dv", dv}},
                      stream));
  try {
    Pass pass(attn, true, stream);
    pass.q = (const char*)q;
    pass.k = (const char*)k;
    pass.v = (const char*)v;
    pass.userOutIn = out;
    pass.lseIn = lse;
    pass.dout = (const char*)dout;
    pass.userDq = dq;
    pass.userDk = dk;
    pass.userDv = dv;
    return pass.run(fn);
  } catch (const std::bad_alloc&) {
    return zpSetLastError(nullptr, zpSystemError, "%s: out of memory", fn);
  }
} catch (...) {
  return zpx::failFromException("zpAttentionBackward");
}

const zpx::AttentionRunLog* zpx::attentionRunLog(zpAttention_t attn) { return attn ? &attn->ran : nullptr; }

zpResult_t zpAttentionDestroy(zpAttention_t attn) try {
  if (!attn) return zpSetLastError(nullptr, zpInvalidArgument, "zpAttentionDestroy: attn is NULL");
#ifdef ZP_WITH_CUDA
  // Destroying waits for the exchange stream, which a stream capture forbids
  // (the wait would fail and invalidate the caller's capture): refused while
  // the exchange stream is part of a capture, that is until it ends.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (attn->xs && cudaStreamIsCapturing(attn->xs, &capturing) == cudaSuccess &&
      capturing != cudaStreamCaptureStatusNone)
    return zpSetLastError(attn->comm, zpInvalidUsage,
                          "zpAttentionDestroy cannot be captured: the driver's exchange stream is part of a stream "
                          "capture that has not ended, and destroying waits for it; call it after "
                          "cudaStreamEndCapture");
#endif
  delete attn;
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpAttentionDestroy");
}
