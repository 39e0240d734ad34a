// The ring-attention driver's shared data (include/zeppelin.h, "Ring
// attention driver"). The driver is cut by job:
//   attention.h           the schedule's data (chunks, groups, local
//                         sequences) and the driver handle, zpAttention
//   attention_schedule.cc the schedule: this rank's groups and local
//                         sequences, built from the plan
//   attention_mem.h       where a pass moves its bytes: host or device stream
//   attention_pass.h/.cc  one forward or backward call: scratch, exchanges,
//                         local sequences, kernel calls
//   attention_steps.cc    the ring steps of a pass, forward and backward
//   attention.cc          the C entry points and their argument checks
//
// Sequences that share a ring (the same ranks in the same order) form a
// group and travel together: one exchange per step carries all their
// key/value chunks. A rank runs its groups in the plan's order
// (zpPlanRingOrder: a group at the place of the first of its sequences)
// forward and in the reverse order backward; every rank derives the same
// order of groups from the plan, so the exchanges of two ranks that share
// several rings always meet. Its local sequences are queued in the same
// order (reversed backward): they fill the time spent waiting for a ring's
// next block, taken from the front of the queue, and whatever is left runs
// after the last ring. So groups keep their order and locals theirs, but
// where the locals fall between the groups depends on the waits (and on the
// host, on how long the exchanges take). What a pass started, in order, is
// kept for tests (zpx::attentionRunLog).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/ext/async_p2p.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#ifdef ZP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zpx::attn {

// One chunk of a sequence, held by one ring position.
struct Chunk {
  int64_t seq = 0;
  int64_t first = 0;      // its first token: chunks in token order decide the mask (zigzag)
  int64_t count = 0;      // tokens
  int64_t blockOff = 0;   // token offset in its ring position's block
  int64_t userOff = -1;   // token offset in this rank's buffers, if this rank holds it
};

// Sequences that share one ring.
struct Group {
  std::vector<int> ranks;
  int64_t first = 0;  // its first sequence in the plan's order (the run log names the group by it)
  int pos = 0;                             // this rank's position
  std::vector<std::vector<Chunk>> blocks;  // blocks[j]: the chunks of ring position j, by sequence
  std::vector<int64_t> tokens;             // tokens of each block
  // A pass's buffers (in its arena): my own packed block; blocks and
  // gradients in flight (double buffered); a gradient received. Each holds
  // keys (or their gradient), then values; blocks in the input type,
  // gradients in float32.
  char *own = nullptr, *kv[2] = {nullptr, nullptr};
  float *grad[2] = {nullptr, nullptr}, *part = nullptr;
  int64_t ownAt = -1;  // >= 0: my block lies in my buffers from this token on, in block order (no packing)
  std::vector<char> written;  // forward: my chunk c already holds a result
  int G() const { return (int)ranks.size(); }
};

struct LocalSeq {
  int64_t seq = 0, userOff = 0, len = 0;
};

// Which part of a causal (query chunk, key/value chunk) pair is visible:
// chunks of a sequence do not interleave, so an earlier chunk is whole.
inline zpAttnMask_t maskOf(bool causal, const Chunk& q, const Chunk& k) {
  if (!causal || k.first < q.first) return zpMaskFull;
  return k.first == q.first ? zpMaskCausal : zpMaskSkip;
}

// Calls f(qChunk, kvChunk) for every pair of the same sequence (both lists
// are sorted by sequence).
template <class F>
zpResult_t forPairs(const std::vector<Chunk>& qs, const std::vector<Chunk>& ks, F f) {
  size_t kb = 0;
  for (const Chunk& q : qs) {
    while (kb < ks.size() && ks[kb].seq < q.seq) kb++;
    for (size_t k = kb; k < ks.size() && ks[k].seq == q.seq; k++) ZPX_CHECK(f(q, ks[k]));
  }
  return zpSuccess;
}

}  // namespace zpx::attn

struct zpAttention {
  bool causal = false;
  int H = 0, Hk = 0, D = 0;
  float scale = 1;
  zpDataType_t dt = zpFloat32;  // of every buffer but lse
  size_t es = 4;                // its size
  zpAttnKernel_t fwd = nullptr, bwd = nullptr;
  void* user = nullptr;
  bool kernelAccumulates = false;
  zpComm_t comm = nullptr;
  int64_t T = 0;                  // this rank's tokens
  std::vector<zpx::attn::Group> groups;     // the rings this rank is in, in the plan's order
  std::vector<zpx::attn::LocalSeq> locals;  // this rank's local sequences, in the plan's order
  zpx::AttentionRunLog ran;       // what the last passes started (attentionRunLog)
  std::unique_ptr<zpx::AsyncP2P> xchg;
  std::vector<char> hostArena;    // the host path's scratch, kept from call to call (no page faults per call)
#ifdef ZP_WITH_CUDA
  // The device path's exchange stream and its fork and join events, made at
  // the first call with a stream.
  cudaStream_t xs = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
#endif

  size_t qRow() const { return (size_t)H * D; }
  size_t kvRow() const { return (size_t)Hk * D; }
  ~zpAttention() {
#ifdef ZP_WITH_CUDA
    if (xs) {
      // The exchange stream is not in a capture (zpAttentionDestroy sees to
      // that), so waiting for it is safe even while the calling thread
      // captures another stream: relaxed mode says so to CUDA, which would
      // otherwise take the wait for one that breaks the capture.
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      cudaThreadExchangeStreamCaptureMode(&mode);
      cudaStreamSynchronize(xs);
      cudaThreadExchangeStreamCaptureMode(&mode);
      cudaStreamDestroy(xs);
    }
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
#endif
  }
};

namespace zpx::attn {

// Builds this rank's groups and local sequences from the plan, read through
// the public API: a ring sequence's chunks are its segments in the attention
// layout, ring position j holding chunks j and 2G-1-j in that order (one
// segment each; empty chunks have none). Groups and locals come out in the
// plan's order (zpPlanRingOrder), a group at the place of the first of its
// sequences.
zpResult_t buildSchedule(zpAttention* a, zpBatchPlan_t plan, int nranks, int me);

}  // namespace zpx::attn
