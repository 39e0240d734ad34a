// The ring-attention driver (include/zeppelin.h, "Ring attention driver").
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
//
// Forward, step t of a ring of G ranks (this rank at position i): the rank
// holds block b_t of ring position (i - t) mod G (its own at t = 0), computes
// its query chunks against it while exchange X_t forwards b_t to the next
// rank and brings b_{t+1} from the previous one; G steps, G-1 exchanges.
// Backward adds the key/value gradients: during step t the rank computes
// block b_t's gradient share into a zeroed buffer while X_t also carries the
// finished gradient of b_{t-1} forward and brings the previous rank's
// partial gradient of b_t, which is added once X_t is over; after the last
// step one more exchange brings every rank its own block's full gradient
// (G hops, so the gradients never wait for a kernel).
//
// The same schedule runs on the host (NULL stream) or on a device stream:
// every copy, fill, merge and addition goes through Mem, which does it at
// once on the host or enqueues it on the caller's stream; exchanges run on
// the driver's own stream, forked from the caller's stream when they start
// and joined back when they are waited for, so the device sees the order
// the host path has (an exchange overlaps the kernels between its start and
// its wait) and the host never waits for the GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "collectives/ext/async_p2p.h"
#include "collectives/ext/device/attn_kernels.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#ifdef ZP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "collectives/ext/device/kernels.h"
#endif

namespace {

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

}  // namespace

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
  std::vector<Group> groups;      // the rings this rank is in, in the plan's order
  std::vector<LocalSeq> locals;   // this rank's local sequences, in the plan's order
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

namespace {

// Which part of a causal (query chunk, key/value chunk) pair is visible:
// chunks of a sequence do not interleave, so an earlier chunk is whole.
zpAttnMask_t maskOf(bool causal, const Chunk& q, const Chunk& k) {
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

// One forward or backward call: the caller's buffers, the pass's scratch,
// the queue of local sequences left.
class Pass {
 public:
  Pass(zpAttention* a, bool backward, zpStream_t stream)
      : a_(a), backward_(backward), mem_(stream), ran_(backward ? &a->ran.backward : &a->ran.forward) {
    // Backward runs the plan's order reversed, local sequences too.
    for (const LocalSeq& l : a->locals) {
      if (backward)
        localsLeft_.push_front(l);
      else
        localsLeft_.push_back(l);
      localCostTotal_ += localCost(l);
    }
    ran_->clear();
    for (const Group& g : a->groups) waitsTotal_ += backward ? g.G() + 1 : g.G() - 1;
  }
  ~Pass() { release(); }

  // The caller's buffers. Inputs of the datatype: q, k, v, dout; the
  // caller's outputs (and backward's out) of the datatype; lse float32.
  const char *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  void* userOut = nullptr;        // forward's out
  const void* userOutIn = nullptr; // backward's out
  float* lse = nullptr;
  const float* lseIn = nullptr;
  void *userDq = nullptr, *userDk = nullptr, *userDv = nullptr;

  zpResult_t run(const char* fn) {
    fn_ = fn;
    zpResult_t r = allocate();
    if (r == zpSuccess) {
      prepare();
      r = backward_ ? runBackward() : runForward();
    }
    while (r == zpSuccess && !localsLeft_.empty()) r = runLocal();
    if (r == zpSuccess) finish();
    release();
    if (r == zpSuccess) r = mem_.check(a_->comm, fn_);
    return r;
  }

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

  // Carves the pass's scratch out of one allocation: the host's kept one,
  // or one allocated in stream order on the caller's stream.
  zpResult_t allocate() {
    const size_t kr = a_->kvRow(), qr = a_->qRow(), H = a_->H;
    std::vector<std::pair<void**, size_t>> parts;  // (where the pointer goes, bytes)
    lseAt_.assign(a_->groups.size() + 1, 0);
    int64_t rowsMost = 0;
    for (const LocalSeq& l : a_->locals) rowsMost = std::max(rowsMost, l.len);
    for (size_t gi = 0; gi < a_->groups.size(); gi++) {
      Group& g = a_->groups[gi];
      size_t most = 0;
      for (int j = 0; j < g.G(); j++) most = std::max(most, kvElems(g, j));
      parts.push_back({(void**)&g.own, g.ownAt < 0 ? kvElems(g, g.pos) * es() : 0});
      for (int i = 0; i < 2; i++) {
        parts.push_back({(void**)&g.kv[i], most * es()});
        parts.push_back({(void**)&g.grad[i], backward_ ? most * sizeof(float) : 0});
      }
      parts.push_back({(void**)&g.part, backward_ ? most * sizeof(float) : 0});
      for (const Chunk& c : g.blocks[g.pos]) rowsMost = std::max(rowsMost, c.count);
      lseAt_[gi + 1] = lseAt_[gi] + (size_t)g.tokens[g.pos] * H;
    }
    parts.push_back({(void**)&lseAcc_, lseAt_.back() * sizeof(float)});
    parts.push_back({(void**)&partOut_, backward_ ? 0 : rowsMost * qr * sizeof(float)});
    parts.push_back({(void**)&partLse_, rowsMost * H * sizeof(float)});
    const bool f32 = a_->dt == zpFloat32;
    const size_t T = (size_t)a_->T;
    if (!backward_) {
      out = (float*)userOut;
      if (!f32) parts.push_back({(void**)&out, T * qr * sizeof(float)});
    } else {
      outIn = (const float*)userOutIn;
      dq = (float*)userDq;
      dk = (float*)userDk;
      dv = (float*)userDv;
      if (!f32) {
        parts.push_back({(void**)&outIn, T * qr * sizeof(float)});
        parts.push_back({(void**)&dq, T * qr * sizeof(float)});
        parts.push_back({(void**)&dk, T * kr * sizeof(float)});
        parts.push_back({(void**)&dv, T * kr * sizeof(float)});
      }
    }
    auto round = [](size_t b) { return (b + 255) / 256 * 256; };
    size_t total = 0;
    for (auto& p : parts) total += round(p.second);
    if (!device()) {
      if (a_->hostArena.size() < total) a_->hostArena.resize(total);
      arena_ = a_->hostArena.data();
    } else if (total) {
#ifdef ZP_WITH_CUDA
      cudaError_t e = cudaMallocAsync((void**)&arena_, total, (cudaStream_t)mem_.stream());
      if (e != cudaSuccess) {
        arena_ = nullptr;
        return zpSetLastError(a_->comm, zpUnhandledCudaError, "%s: cudaMallocAsync of %zu bytes of scratch: %s", fn_,
                              total, cudaGetErrorString(e));
      }
#endif
    }
    size_t at = 0;
    for (auto& p : parts) {
      if (p.second) *p.first = arena_ + at;
      at += round(p.second);
    }
    return zpSuccess;
  }

  // Device: the exchange stream joins the caller's stream, then the scratch
  // is freed in stream order (after everything that uses it).
  void release() {
    if (released_) return;
    released_ = true;
    a_->xchg->drain();
#ifdef ZP_WITH_CUDA
    if (device()) {
      if (forked_) joinExchange();
      if (arena_) cudaFreeAsync(arena_, (cudaStream_t)mem_.stream());
    }
#endif
  }

  // ---- Exchanges: on the host by the exchange's thread; on the device on the
  // driver's stream, forked from the caller's stream and joined back ----
  zpResult_t startExchange(std::vector<zpx::P2POp> ops) {
    if (!device()) return a_->xchg->start(std::move(ops), fn_);
#ifdef ZP_WITH_CUDA
    cudaError_t e = cudaEventRecord(a_->fork, (cudaStream_t)mem_.stream());
    if (e == cudaSuccess) e = cudaStreamWaitEvent(a_->xs, a_->fork, 0);
    if (e != cudaSuccess)
      return zpSetLastError(a_->comm, zpUnhandledCudaError, "%s: forking the exchange stream: %s", fn_,
                            cudaGetErrorString(e));
    forked_ = true;
    return a_->xchg->start(std::move(ops), fn_, (zpStream_t)a_->xs);
#else
    return zpInternalError;
#endif
  }
#ifdef ZP_WITH_CUDA
  zpResult_t joinExchange() {
    cudaError_t e = cudaEventRecord(a_->join, a_->xs);
    if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)mem_.stream(), a_->join, 0);
    if (e != cudaSuccess)
      return zpSetLastError(a_->comm, zpUnhandledCudaError, "%s: joining the exchange stream: %s", fn_,
                            cudaGetErrorString(e));
    forked_ = false;
    return zpSuccess;
  }
#endif

  // Waits for the exchange in flight, running local sequences meanwhile: on
  // the host until it is over; on the device (where the host cannot see
  // it end) each wait takes an equal share of the local work's cost.
  zpResult_t waitFilling() {
    if (!device()) {
      while (!localsLeft_.empty() && !a_->xchg->finished()) ZPX_CHECK(runLocal());
      return a_->xchg->wait(fn_);
    }
    const double due = localCostTotal_ * ++waitsDone_ / std::max(waitsTotal_, 1);
    while (!localsLeft_.empty() && localCostDone_ < due) ZPX_CHECK(runLocal());
    ZPX_CHECK(a_->xchg->wait(fn_));
#ifdef ZP_WITH_CUDA
    ZPX_CHECK(joinExchange());
#endif
    return zpSuccess;
  }

  // The keys and values of the block held at step t (ring position j).
  struct Held {
    const char *k, *v;
  };
  Held held(Group& g, int t, int j) {
    const size_t half = (size_t)g.tokens[j] * a_->kvRow() * es();
    if (t == 0 && g.ownAt >= 0) return {k + g.ownAt * a_->kvRow() * es(), v + g.ownAt * a_->kvRow() * es()};
    const char* b = t == 0 ? g.own : g.kv[t % 2];
    return {b, b + half};
  }
  // Sending the block held at step t and receiving the next one into
  // kv[(t + 1) % 2]. At step 0 the keys and values go as two messages, so
  // that my own block leaves straight from the caller's buffers; later
  // blocks lie together in kv[] and go as one.
  void sendHeld(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer) {
    const int j = posMod(g.pos - t, g.G());
    const Held h = held(g, t, j);
    const size_t bytes = (size_t)g.tokens[j] * a_->kvRow() * es();
    if (t > 0) {
      ops->push_back({true, (void*)h.k, 2 * bytes, peer});
      return;
    }
    ops->push_back({true, (void*)h.k, bytes, peer});
    ops->push_back({true, (void*)h.v, bytes, peer});
  }
  void recvNext(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer) {
    const int j = posMod(g.pos - t - 1, g.G());
    const Held h = held(g, t + 1, j);
    const size_t bytes = (size_t)g.tokens[j] * a_->kvRow() * es();
    if (t > 0) {
      ops->push_back({false, (void*)h.k, 2 * bytes, peer});
      return;
    }
    ops->push_back({false, (void*)h.k, bytes, peer});
    ops->push_back({false, (void*)h.v, bytes, peer});
  }

  // Packs my key/value chunks where they do not lie together in the
  // caller's buffers, zeroes what kernels add into, and (backward) gathers
  // my chunks' lse in the kernels' [H, count] layout and widens out to
  // float32 if it is not.
  void prepare() {
    const size_t kr = a_->kvRow(), qr = a_->qRow(), kb = kr * es();
    const int H = a_->H;
    for (Group& g : a_->groups) {
      const int64_t n = g.tokens[g.pos];
      if (g.ownAt < 0)
        for (const Chunk& c : g.blocks[g.pos]) {
          mem_.copy(g.own + c.blockOff * kb, k + c.userOff * kb, c.count * kb);
          mem_.copy(g.own + (n + c.blockOff) * kb, v + c.userOff * kb, c.count * kb);
        }
      g.written.assign(g.blocks[g.pos].size(), 0);
    }
    if (!backward_) return;
    if (a_->dt != zpFloat32) mem_.convert((void*)outIn, zpFloat32, userOutIn, a_->dt, (size_t)a_->T * qr);
    mem_.fill(dq, 0.0f, (size_t)a_->T * qr);
    // Ring chunks' dk and dv are written whole at the end; the kernels
    // add into local sequences' in place.
    for (const LocalSeq& l : a_->locals) {
      mem_.fill(dk + l.userOff * kr, 0.0f, l.len * kr);
      mem_.fill(dv + l.userOff * kr, 0.0f, l.len * kr);
    }
    // The kernels take a chunk's lse as [H, count]: gather mine from [H, T].
    for (size_t gi = 0; gi < a_->groups.size(); gi++)
      for (const Chunk& c : a_->groups[gi].blocks[a_->groups[gi].pos])
        mem_.copy2D(&lseAcc_[lseAt_[gi] + c.blockOff * H], c.count * sizeof(float), lseIn + c.userOff,
                    a_->T * sizeof(float), c.count * sizeof(float), H);
  }

  // Forward: scatters the merged lse of my chunks to [H, T] (a chunk that
  // saw no block at all is the empty merge: out 0, lse -inf). Both: rounds
  // the float32 accumulators into the caller's buffers if they are not float32.
  void finish() {
    const size_t qr = a_->qRow(), kr = a_->kvRow(), T = (size_t)a_->T;
    const int H = a_->H;
    if (!backward_) {
      for (size_t gi = 0; gi < a_->groups.size(); gi++)
        for (const Chunk& c : a_->groups[gi].blocks[a_->groups[gi].pos]) {
          float* acc = &lseAcc_[lseAt_[gi] + c.blockOff * H];
          if (!a_->groups[gi].written[&c - &a_->groups[gi].blocks[a_->groups[gi].pos][0]]) {
            mem_.fill(out + c.userOff * qr, 0.0f, c.count * qr);
            mem_.fill(acc, -INFINITY, c.count * H);
          }
          mem_.copy2D(lse + c.userOff, T * sizeof(float), acc, c.count * sizeof(float), c.count * sizeof(float), H);
        }
    }
    if (a_->dt == zpFloat32) return;
    if (!backward_) {
      mem_.convert(userOut, a_->dt, out, zpFloat32, T * qr);
      return;
    }
    mem_.convert(userDq, a_->dt, dq, zpFloat32, T * qr);
    mem_.convert(userDk, a_->dt, dk, zpFloat32, T * kr);
    mem_.convert(userDv, a_->dt, dv, zpFloat32, T * kr);
  }

  zpAttnBlock_t blockFor(int64_t sq, int64_t sk, zpAttnMask_t mask) const {
    zpAttnBlock_t b;
    memset(&b, 0, sizeof(b));
    b.sq = sq;
    b.sk = sk;
    b.qHeads = a_->H;
    b.kvHeads = a_->Hk;
    b.headDim = a_->D;
    b.scale = a_->scale;
    b.mask = mask;
    b.datatype = a_->dt;
    b.stream = mem_.stream();
    return b;
  }

  zpResult_t callKernel(const zpAttnBlock_t& b) {
    zpAttnKernel_t kern = backward_ ? a_->bwd : a_->fwd;
    zpSetLastError(nullptr, zpSuccess, "%s", "");
    zpResult_t r = kern(&b, a_->user);
    if (r != zpSuccess) {
      const std::string why = *zpGetLastError(nullptr) ? zpGetLastError(nullptr) : zpGetErrorString(r);
      return zpSetLastError(nullptr, r, "%s: the %s block kernel failed on a block of %lld x %lld tokens: %s", fn_,
                      backward_ ? "backward" : "forward", (long long)b.sq, (long long)b.sk, why.c_str());
    }
    return zpSuccess;
  }

  // A local sequence: one kernel call over the whole of it.
  zpResult_t runLocal() {
    LocalSeq l = localsLeft_.front();
    localsLeft_.pop_front();
    localCostDone_ += localCost(l);
    ran_->push_back(l.seq);
    const int H = a_->H;
    const size_t qb = a_->qRow() * es(), kb = a_->kvRow() * es(), T4 = a_->T * sizeof(float), n4 = l.len * sizeof(float);
    zpAttnBlock_t b = blockFor(l.len, l.len, a_->causal ? zpMaskCausal : zpMaskFull);
    b.q = q + l.userOff * qb;
    b.k = k + l.userOff * kb;
    b.v = v + l.userOff * kb;
    b.lse = partLse_;
    if (!backward_) {
      b.out = out + l.userOff * a_->qRow();
      ZPX_CHECK(callKernel(b));
      mem_.copy2D(lse + l.userOff, T4, partLse_, n4, n4, H);
      return zpSuccess;
    }
    mem_.copy2D(partLse_, n4, lseIn + l.userOff, T4, n4, H);
    b.out = const_cast<float*>(outIn) + l.userOff * a_->qRow();
    b.dout = dout + l.userOff * qb;
    b.dq = dq + l.userOff * a_->qRow();
    b.dk = dk + l.userOff * a_->kvRow();
    b.dv = dv + l.userOff * a_->kvRow();
    return callKernel(b);
  }

  // Forward step: my query chunks of group g against block buf of position j.
  zpResult_t forwardStep(size_t gi, int j, Held buf) {
    Group& g = a_->groups[gi];
    const size_t kb = a_->kvRow() * es(), qr = a_->qRow();
    return forPairs(g.blocks[g.pos], g.blocks[j], [&](const Chunk& cq, const Chunk& ck) -> zpResult_t {
      zpAttnMask_t mask = maskOf(a_->causal, cq, ck);
      if (mask == zpMaskSkip) return zpSuccess;
      zpAttnBlock_t b = blockFor(cq.count, ck.count, mask);
      float* accOut = out + cq.userOff * qr;
      float* accLse = &lseAcc_[lseAt_[gi] + cq.blockOff * a_->H];
      b.q = q + cq.userOff * qr * es();
      b.k = buf.k + ck.blockOff * kb;
      b.v = buf.v + ck.blockOff * kb;
      // In place: the chunk's first block (nothing to merge with), or any
      // block if the kernel folds it in itself.
      char& written = g.written[&cq - &g.blocks[g.pos][0]];
      if (!written || a_->kernelAccumulates) {
        b.out = accOut;
        b.lse = accLse;
        b.accumulate = written;
        written = 1;
        return callKernel(b);
      }
      b.out = partOut_;
      b.lse = partLse_;
      ZPX_CHECK(callKernel(b));
      return mem_.merge(accOut, accLse, partOut_, partLse_, cq.count, a_->H, a_->D);
    });
  }

  // A backward kernel call: query rows [row0, row0 + rows) of chunk cq
  // against chunk ck.
  struct Work {
    const Chunk* cq;
    const Chunk* ck;
    zpAttnMask_t mask;
    int64_t row0, rows;
    double cost() const { return mask == zpMaskCausal ? 0.5 * rows * (rows + 1) : (double)rows * ck->count; }
  };

  std::vector<Work> backwardWork(const Group& g, int j) const {
    std::vector<Work> w;
    forPairs(g.blocks[g.pos], g.blocks[j], [&](const Chunk& cq, const Chunk& ck) -> zpResult_t {
      zpAttnMask_t mask = maskOf(a_->causal, cq, ck);
      if (mask != zpMaskSkip) w.push_back({&cq, &ck, mask, 0, cq.count});
      return zpSuccess;
    });
    return w;
  }

  // Splits work into a first part of about half the cost and the rest
  // (cutting a full block by query rows where that evens it out).
  static std::vector<Work> splitHalf(std::vector<Work>* work) {
    double total = 0, done = 0;
    for (const Work& w : *work) total += w.cost();
    size_t i = 0;
    for (; i < work->size() && done + (*work)[i].cost() <= total / 2; i++) done += (*work)[i].cost();
    std::vector<Work> late(work->begin() + i, work->end());
    work->resize(i);
    if (!late.empty() && late[0].mask == zpMaskFull) {
      Work& w = late[0];
      const int64_t take = std::min<int64_t>(w.rows, (int64_t)((total / 2 - done) / w.ck->count));
      if (take > 0) {
        work->push_back({w.cq, w.ck, w.mask, w.row0, take});
        w.row0 += take;
        w.rows -= take;
      }
    }
    return late;
  }

  // Runs backward work against block buf (of nk tokens): adds into dq and
  // into grad (the block's key/value gradient: keys', then values').
  zpResult_t runBackwardWork(size_t gi, const std::vector<Work>& work, Held buf, int64_t nk, float* grad) {
    const size_t kr = a_->kvRow(), qr = a_->qRow();
    const int H = a_->H;
    for (const Work& w : work) {
      const Chunk &cq = *w.cq, &ck = *w.ck;
      zpAttnBlock_t b = blockFor(w.rows, ck.count, w.mask);
      const int64_t at = cq.userOff + w.row0;
      b.q = q + at * qr * es();
      b.k = buf.k + ck.blockOff * kr * es();
      b.v = buf.v + ck.blockOff * kr * es();
      b.out = const_cast<float*>(outIn) + at * qr;
      b.dout = dout + at * qr * es();
      b.dq = dq + at * qr;
      b.dk = grad + ck.blockOff * kr;
      b.dv = grad + (nk + ck.blockOff) * kr;
      const float* lse = &lseAcc_[lseAt_[gi] + cq.blockOff * H];  // [H, cq.count]
      if (w.rows == cq.count) {
        b.lse = const_cast<float*>(lse);
      } else {  // some rows of the chunk: their lse as [H, rows]
        mem_.copy2D(partLse_, w.rows * sizeof(float), lse + w.row0, cq.count * sizeof(float), w.rows * sizeof(float),
                    H);
        b.lse = partLse_;
      }
      ZPX_CHECK(callKernel(b));
    }
    return zpSuccess;
  }

  static int posMod(int a, int G) { return ((a % G) + G) % G; }
  int prevOf(const Group& g) const { return g.ranks[posMod(g.pos - 1, g.G())]; }
  int nextOf(const Group& g) const { return g.ranks[posMod(g.pos + 1, g.G())]; }

  zpResult_t runForward() {
    const size_t n = a_->groups.size();
    // X_t of group gi: forward b_t (held in src), bring b_{t+1}.
    auto startX = [&](size_t gi, int t) {
      Group& g = a_->groups[gi];
      std::vector<zpx::P2POp> ops;
      sendHeld(&ops, g, t, nextOf(g));
      recvNext(&ops, g, t, prevOf(g));
      return startExchange(std::move(ops));
    };
    if (n) ZPX_CHECK(startX(0, 0));
    for (size_t gi = 0; gi < n; gi++) {
      Group& g = a_->groups[gi];
      const int G = g.G();
      for (int t = 0; t < G; t++) {
        const int j = posMod(g.pos - t, G);
        if (t == 0) ran_->push_back(g.first);
        ZPX_CHECK(forwardStep(gi, j, held(g, t, j)));
        if (t == G - 1) break;
        ZPX_CHECK(waitFilling());
        if (t + 1 < G - 1)
          ZPX_CHECK(startX(gi, t + 1));
        else if (gi + 1 < n)  // the last step needs no exchange: start the next ring's first one
          ZPX_CHECK(startX(gi + 1, 0));
      }
    }
    return zpSuccess;
  }

  // The groups in the reverse of the forward order.
  zpResult_t runBackward() {
    const size_t kr = a_->kvRow();
    for (size_t gi = a_->groups.size(); gi-- > 0;) {
      Group& g = a_->groups[gi];
      const int G = g.G(), next = nextOf(g), prev = prevOf(g);
      float** grad = g.grad;
      float* part = g.part;
      auto block = [&](int t) { return posMod(g.pos - t, G); };
      // X_t: forward b_t and the finished gradient of b_{t-1}; bring b_{t+1}
      // and the previous rank's partial gradient of b_t. t = G: the last
      // gradient hop only.
      // Gradients travel as two messages too (keys', then values'), so
      // that the last hop lands straight in the caller's dk and dv.
      // Where my own block's whole gradient ends: the caller's dk / dv when my
      // chunks lie together there, else part (then scattered).
      const int64_t nMine = g.tokens[g.pos];
      const size_t half = (size_t)nMine * kr;
      const bool direct = g.ownAt >= 0;
      float* gk = direct ? dk + g.ownAt * kr : part;
      float* gv = direct ? dv + g.ownAt * kr : part + half;
      auto startX = [&](int t) {
        std::vector<zpx::P2POp> ops;
        if (t < G - 1) sendHeld(&ops, g, t, next);
        if (t >= 1) {
          const size_t half = kvElems(g, block(t - 1)) / 2;
          ops.push_back({true, grad[(t - 1) % 2], half * sizeof(float), next});
          ops.push_back({true, grad[(t - 1) % 2] + half, half * sizeof(float), next});
        }
        if (t < G - 1) recvNext(&ops, g, t, prev);
        if (t >= 1) {
          const size_t size = kvElems(g, block(t)) / 2;
          ops.push_back({false, t == G ? gk : part, size * sizeof(float), prev});
          ops.push_back({false, t == G ? gv : part + size, size * sizeof(float), prev});
        }
        return startExchange(std::move(ops));
      };
      // My own block's work is split: half goes round the ring with the
      // other ranks' shares (step 0, while the first block arrives), half
      // runs while the last gradient hop is in flight and is added to what
      // it brings, so that hop is hidden too.
      std::vector<Work> ownEarly = backwardWork(g, g.pos), ownLate = splitHalf(&ownEarly);
      ZPX_CHECK(startX(0));
      for (int t = 0; t < G; t++) {
        float* acc = grad[t % 2];
        const size_t size = kvElems(g, block(t));
        mem_.fill(acc, 0.0f, size);
        if (t == 0) {
          ran_->push_back(g.first);
          ZPX_CHECK(runBackwardWork(gi, ownEarly, held(g, 0, g.pos), nMine, acc));
        } else {
          ZPX_CHECK(runBackwardWork(gi, backwardWork(g, block(t)), held(g, t, block(t)), g.tokens[block(t)], acc));
        }
        ZPX_CHECK(waitFilling());
        if (t >= 1) mem_.add(acc, part, size);
        ZPX_CHECK(startX(t + 1));
      }
      // grad[G % 2] went out with X_{G-1}: free for the late half.
      float* late = grad[G % 2];
      if (!ownLate.empty()) {
        mem_.fill(late, 0.0f, 2 * half);
        ZPX_CHECK(runBackwardWork(gi, ownLate, held(g, 0, g.pos), nMine, late));
      }
      ZPX_CHECK(waitFilling());
      // My block's whole gradient: what the last hop brought plus the late half.
      if (!ownLate.empty()) {
        mem_.add(gk, late, half);
        mem_.add(gv, late + half, half);
      }
      if (direct) continue;
      for (const Chunk& c : g.blocks[g.pos]) {
        mem_.copy(dk + c.userOff * kr, &part[c.blockOff * kr], c.count * kr * sizeof(float));
        mem_.copy(dv + c.userOff * kr, &part[(nMine + c.blockOff) * kr], c.count * kr * sizeof(float));
      }
    }
    return zpSuccess;
  }
};

// Builds this rank's groups and local sequences from the plan, read through
// the public API: a ring sequence's chunks are its segments in the attention
// layout, ring position j holding chunks j and 2G-1-j in that order (one
// segment each; empty chunks have none). Groups and locals come out in the
// plan's order (zpPlanRingOrder), a group at the place of the first of its
// sequences.
zpResult_t buildSchedule(zpAttention* a, zpBatchPlan_t plan, int nranks, int me) {
  int nseqs = 0, causal = 0, nOrder = 0;
  const int64_t* lens = nullptr;
  const int64_t* order = nullptr;
  ZPX_CHECK(zpPlanGetInfo(plan, nullptr, &nseqs, &lens, &causal));
  ZPX_CHECK(zpPlanRingOrder(plan, &order, &nOrder));
  // Each sequence's place in the order (zpPlanSetRingOrder checked that it
  // names every sequence once; checked again, as it is read from outside).
  std::vector<int64_t> place(nseqs, -1);
  for (int i = 0; i < nOrder; i++)
    if (order[i] >= 0 && order[i] < nseqs) place[order[i]] = i;
  if (nOrder != nseqs || std::count(place.begin(), place.end(), int64_t{-1}))
    return zpSetLastError(a->comm, zpInternalError,
                          "zpAttentionCreate: the plan's order (%d entries) does not name each of its %d sequences once",
                          nOrder, nseqs);
  // Every rank's segments of every sequence, and where mine start in my buffers.
  std::map<std::pair<int, int64_t>, std::vector<zpSegment_t>> held;  // (rank, seq) -> segments
  std::map<std::pair<int64_t, int64_t>, int64_t> at;
  for (int r = 0; r < nranks; r++) {
    const zpSegment_t* segs = nullptr;
    size_t n = 0;
    ZPX_CHECK(zpPlanRankSegments(plan, zpAttentionLayout, r, &segs, &n));
    int64_t off = 0;
    for (size_t i = 0; i < n; i++) {
      held[{r, segs[i].seq}].push_back(segs[i]);
      if (r == me) at[{segs[i].seq, segs[i].start}] = off;
      off += segs[i].count;
    }
    if (r == me) a->T = off;
  }
  // Chunks are added by sequence id (forPairs needs each block's chunks
  // sorted by sequence); the order of groups and locals comes after.
  std::map<std::vector<int>, size_t> groupOf;
  std::vector<Group> all;
  for (int64_t seq = 0; seq < nseqs; seq++) {
    int cls = 0, G = 0;
    const int* ringRanks = nullptr;
    ZPX_CHECK(zpPlanSequence(plan, seq, &cls, &G, &ringRanks));
    std::vector<int> ranks(ringRanks, ringRanks + G);
    if (G == 1) {
      if (ranks[0] == me) a->locals.push_back({seq, at.at({seq, 0}), lens[seq]});
      continue;
    }
    auto it = groupOf.find(ranks);
    if (it == groupOf.end()) {
      it = groupOf.emplace(ranks, all.size()).first;
      Group g;
      g.ranks = ranks;
      g.first = seq;
      g.blocks.resize(G);
      g.tokens.assign(G, 0);
      all.push_back(std::move(g));
    }
    Group& g = all[it->second];
    if (place[seq] < place[g.first]) g.first = seq;
    for (int j = 0; j < G; j++)
      for (const zpSegment_t& seg : held[{ranks[j], seq}]) {
        Chunk ch;
        ch.seq = seq;
        ch.first = seg.start;
        ch.count = seg.count;
        ch.blockOff = g.tokens[j];
        g.tokens[j] += ch.count;
        if (ranks[j] == me) ch.userOff = at.at({seq, seg.start});
        g.blocks[j].push_back(ch);
      }
  }
  // Groups at the place of their first sequence in the plan's order, and
  // locals at theirs; every rank sorts alike.
  std::vector<size_t> idx(all.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return place[all[x].first] < place[all[y].first]; });
  std::sort(a->locals.begin(), a->locals.end(),
            [&](const LocalSeq& x, const LocalSeq& y) { return place[x.seq] < place[y.seq]; });
  for (size_t i : idx) {
    Group& g = all[i];
    auto p = std::find(g.ranks.begin(), g.ranks.end(), me);
    if (p == g.ranks.end()) continue;
    g.pos = (int)(p - g.ranks.begin());
    const std::vector<Chunk>& mine = g.blocks[g.pos];
    g.ownAt = mine.empty() ? 0 : mine[0].userOff;
    for (const Chunk& c : mine)
      if (c.userOff != g.ownAt + c.blockOff) g.ownAt = -1;
    a->groups.push_back(std::move(g));
  }
  return zpSuccess;
}

}  // namespace

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
    ZPX_CHECK(buildSchedule(a.get(), plan, n, me));
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
