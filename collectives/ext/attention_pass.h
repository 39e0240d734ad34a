// One forward or backward call of the attention driver (attention.h).
//
// The same schedule runs on the host (NULL stream) or on a device stream:
// every copy, fill, merge and addition goes through Mem, which does it at
// once on the host or enqueues it on the caller's stream; exchanges run on
// the driver's own stream, forked from the caller's stream when they start
// and joined back when they are waited for, so the device sees the order
// the host path has (an exchange overlaps the kernels between its start and
// its wait) and the host never waits for the GPU.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "collectives/ext/async_p2p.h"
#include "collectives/ext/attention.h"
#include "collectives/ext/attention_mem.h"
#include "include/zeppelin.h"

namespace zpx::attn {

// One forward or backward call: the caller's buffers, the pass's scratch,
// the queue of local sequences left.
class Pass {
 public:
  Pass(zpAttention* a, bool backward, zpStream_t stream);
  ~Pass() { release(); }

  // The caller's buffers. Inputs of the datatype: q, k, v, dout; the
  // caller's outputs (and backward's out) of the datatype; lse float32.
  const char *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  void* userOut = nullptr;        // forward's out
  const void* userOutIn = nullptr; // backward's out
  float* lse = nullptr;
  const float* lseIn = nullptr;
  void *userDq = nullptr, *userDk = nullptr, *userDv = nullptr;

  zpResult_t run(const char* fn);

 private:
  zpAttention* a_;
  bool backward_;
  Mem mem_;
  std::vector<int64_t>* ran_;  // the run log of this direction: a group's or local sequence's id as it starts
  const char* fn_ = "";
  std::deque<LocalSeq> localsLeft_;
  double localCostTotal_ = 0, localCostDone_ = 0;
  int waitsTotal_ = 0, waitsDone_ = 0;
  // The accumulators, float32: the caller's buffers for float32, else scratch.
  float *out = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const float* outIn = nullptr;
  // Scratch: merged (forward) or given (backward) lse of my ring chunks,
  // [H, count] each, group gi's from lseAt_[gi] on; a block's partial result.
  float *lseAcc_ = nullptr, *partOut_ = nullptr, *partLse_ = nullptr;
  std::vector<size_t> lseAt_;
  char* arena_ = nullptr;  // device: allocated on the caller's stream for this pass
  bool released_ = false;
  // The exchange stream was forked from the caller's stream and not joined
  // back yet. Only then is there something to join: a join without a fork
  // would make the caller's stream wait for an event recorded outside the
  // pass, which a stream capture refuses (cudaErrorStreamCaptureIsolation).
  [[maybe_unused]] bool forked_ = false;  // used only with ZP_WITH_CUDA

  bool device() const { return mem_.device(); }
  size_t es() const { return a_->es; }
  double localCost(const LocalSeq& l) const { return (double)l.len * l.len * (a_->causal ? 0.5 : 1.0); }
  size_t kvElems(const Group& g, int j) const { return 2 * (size_t)g.tokens[j] * a_->kvRow(); }

  // Scratch (attention_pass.cc).
  zpResult_t allocate();
  void release();
  void prepare();
  void finish();

  // Exchanges, and waiting for them while local sequences run.
  zpResult_t startExchange(std::vector<zpx::P2POp> ops);
#ifdef ZP_WITH_CUDA
  zpResult_t joinExchange();
#endif
  zpResult_t waitFilling();

  // The keys and values of the block held at step t (ring position j).
  struct Held {
    const char *k, *v;
  };
  Held held(Group& g, int t, int j);
  void sendHeld(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer);
  void recvNext(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer);
  void addBlock(std::vector<zpx::P2POp>* ops, bool send, Group& g, int at, int j, bool together, int peer);

  // Kernel calls.
  zpAttnBlock_t blockFor(int64_t sq, int64_t sk, zpAttnMask_t mask) const;
  zpResult_t callKernel(const zpAttnBlock_t& b);
  zpResult_t runLocal();

  // The ring steps (attention_steps.cc).
  zpResult_t forwardStep(size_t gi, int j, Held buf);

  // A backward kernel call: query rows [row0, row0 + rows) of chunk cq
  // against chunk ck.
  struct Work {
    const Chunk* cq;
    const Chunk* ck;
    zpAttnMask_t mask;
    int64_t row0, rows;
    double cost() const { return mask == zpMaskCausal ? 0.5 * rows * (rows + 1) : (double)rows * ck->count; }
  };

  std::vector<Work> backwardWork(const Group& g, int j) const;
  static std::vector<Work> splitHalf(std::vector<Work>* work);
  zpResult_t runBackwardWork(size_t gi, const std::vector<Work>& work, Held buf, int64_t nk, float* grad);

  static int posMod(int a, int G) { return ((a % G) + G) % G; }
  int prevOf(const Group& g) const { return g.ranks[posMod(g.pos - 1, g.G())]; }
  int nextOf(const Group& g) const { return g.ranks[posMod(g.pos + 1, g.G())]; }

  zpResult_t runForward();
  zpResult_t runBackward();
};

}  // namespace zpx::attn
