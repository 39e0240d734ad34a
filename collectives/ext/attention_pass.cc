// One forward or backward call of the attention driver (attention_pass.h):
// its scratch, its exchanges and the waits that local sequences fill, and
// its kernel calls. The ring steps are in attention_steps.cc.
#include "collectives/ext/attention_pass.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifdef ZP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zpx::attn {

Pass::Pass(zpAttention* a, bool backward, zpStream_t stream)
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

zpResult_t Pass::run(const char* fn) {
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

// Carves the pass's scratch out of one allocation: the host's kept one,
// or one allocated in stream order on the caller's stream.
zpResult_t Pass::allocate() {
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
void Pass::release() {
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
zpResult_t Pass::startExchange(std::vector<zpx::P2POp> ops) {
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
zpResult_t Pass::joinExchange() {
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
zpResult_t Pass::waitFilling() {
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

Pass::Held Pass::held(Group& g, int t, int j) {
  const size_t half = (size_t)g.tokens[j] * a_->kvRow() * es();
  if (t == 0 && g.ownAt >= 0) return {k + g.ownAt * a_->kvRow() * es(), v + g.ownAt * a_->kvRow() * es()};
  const char* b = t == 0 ? g.own : g.kv[t % 2];
  return {b, b + half};
}

// Sending the block held at step t and receiving the next one into
// kv[(t + 1) % 2]. At step 0 the keys and values go as two messages, so
// that my own block leaves straight from the caller's buffers; later
// blocks lie together in kv[] and go as one.
void Pass::sendHeld(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer) {
  addBlock(ops, true, g, t, posMod(g.pos - t, g.G()), t > 0, peer);
}

void Pass::recvNext(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer) {
  addBlock(ops, false, g, t + 1, posMod(g.pos - t - 1, g.G()), t > 0, peer);
}

// Chunk j's key/value block as held at step `at`: one message if its keys
// and values lie together, else two.
void Pass::addBlock(std::vector<zpx::P2POp>* ops, bool send, Group& g, int at, int j, bool together, int peer) {
  const Held h = held(g, at, j);
  const size_t bytes = (size_t)g.tokens[j] * a_->kvRow() * es();
  if (together) {
    ops->push_back({send, (void*)h.k, 2 * bytes, peer});
    return;
  }
  ops->push_back({send, (void*)h.k, bytes, peer});
  ops->push_back({send, (void*)h.v, bytes, peer});
}

// Packs my key/value chunks where they do not lie together in the
// caller's buffers, zeroes what kernels add into, and (backward) gathers
// my chunks' lse in the kernels' [H, count] layout and widens out to
// float32 if it is not.
void Pass::prepare() {
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
void Pass::finish() {
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

zpAttnBlock_t Pass::blockFor(int64_t sq, int64_t sk, zpAttnMask_t mask) const {
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

zpResult_t Pass::callKernel(const zpAttnBlock_t& b) {
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
zpResult_t Pass::runLocal() {
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
}  // namespace zpx::attn
