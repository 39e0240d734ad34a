// The ring-attention driver (include/zeppelin.h, "Ring attention driver").
//
// Sequences that share a ring (the same ranks in the same order) form a
// group and travel together: one exchange per step carries all their
// key/value chunks. A rank runs its groups in one order that every rank
// derives from the plan (inter-node rings, then intra-node rings, each by
// first sequence), so the exchanges of two ranks that share several rings
// always meet; local sequences fill the time spent waiting for a ring's next
// block, and whatever is left runs at the end.
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
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "collectives/ext/async_p2p.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"

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
  int pos = 0;                             // this rank's position
  std::vector<std::vector<Chunk>> blocks;  // blocks[j]: the chunks of ring position j, by sequence
  std::vector<int64_t> tokens;             // tokens of each block
  // Kept from call to call (no allocation or page faults per step): my own
  // packed block; blocks and gradients in flight (double buffered); a
  // gradient received. Each holds keys (or their gradient), then values.
  std::vector<float> own, kv[2], grad[2], part;
  int64_t ownAt = -1;  // >= 0: my block lies in my buffers from this token on, in block order (no packing)
  std::vector<char> written;  // forward: my chunk c already holds a result
  int G() const { return (int)ranks.size(); }
};

struct LocalSeq {
  int64_t userOff = 0, len = 0;
};

}  // namespace

struct zpAttention {
  bool causal = false;
  int H = 0, Hk = 0, D = 0;
  float scale = 1;
  zpAttnKernel_t fwd = nullptr, bwd = nullptr;
  void* user = nullptr;
  bool kernelAccumulates = false;
  int64_t T = 0;                  // this rank's tokens
  std::vector<Group> groups;      // the rings this rank is in, in run order
  std::vector<LocalSeq> locals;   // this rank's local sequences
  std::unique_ptr<zpx::AsyncP2P> xchg;
  std::vector<float> lseAcc, partOut, partLse;  // a call's scratch (see Pass)
  std::vector<size_t> lseAt;

  size_t qRow() const { return (size_t)H * D; }
  size_t kvRow() const { return (size_t)Hk * D; }
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

// One forward or backward call: the user's buffers, the queue of local
// sequences left, and the per-group buffers.
class Pass {
 public:
  Pass(zpAttention* a, bool backward) : a_(a), backward_(backward) {
    for (const LocalSeq& l : a->locals) localsLeft_.push_back(l);
  }

  // Forward buffers.
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  float *out = nullptr, *lse = nullptr;
  // Backward buffers (q, k, v as above; out and lse are inputs).
  const float *outIn = nullptr, *lseIn = nullptr, *dout = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;

  zpResult_t run(const char* fn) {
    fn_ = fn;
    prepare();
    ZPX_CHECK(backward_ ? runBackward() : runForward());
    while (!localsLeft_.empty()) ZPX_CHECK(runLocal());
    if (!backward_) finishLse();
    return zpSuccess;
  }

 private:
  zpAttention* a_;
  bool backward_;
  const char* fn_ = "";
  std::deque<LocalSeq> localsLeft_;
  // Kept in the driver from call to call (no page faults on every call).
  std::vector<float>& lseAcc_ = a_->lseAcc;  // merged (forward) or given (backward) lse of my chunks, [H, count] each
  std::vector<size_t>& lseAt_ = a_->lseAt;   // where each group's part of lseAcc_ starts
  std::vector<float>& partOut_ = a_->partOut;
  std::vector<float>& partLse_ = a_->partLse;

  size_t kvFloats(const Group& g, int j) const { return 2 * (size_t)g.tokens[j] * a_->kvRow(); }

  // The keys and values of the block held at step t (ring position j).
  struct Held {
    float *k, *v;
  };
  Held held(Group& g, int t, int j) {
    const size_t half = (size_t)g.tokens[j] * a_->kvRow();
    if (t == 0 && g.ownAt >= 0)
      return {const_cast<float*>(k) + g.ownAt * a_->kvRow(), const_cast<float*>(v) + g.ownAt * a_->kvRow()};
    float* b = t == 0 ? g.own.data() : g.kv[t % 2].data();
    return {b, b + half};
  }
  // Sending the block held at step t and receiving the next one into
  // kv[(t + 1) % 2]. At step 0 the keys and values go as two messages, so
  // that my own block leaves straight from the caller's buffers; later
  // blocks lie together in kv[] and go as one.
  void sendHeld(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer) {
    const int j = posMod(g.pos - t, g.G());
    const Held h = held(g, t, j);
    const size_t bytes = (size_t)g.tokens[j] * a_->kvRow() * sizeof(float);
    if (t > 0) {
      ops->push_back({true, h.k, 2 * bytes, peer});
      return;
    }
    ops->push_back({true, h.k, bytes, peer});
    ops->push_back({true, h.v, bytes, peer});
  }
  void recvNext(std::vector<zpx::P2POp>* ops, Group& g, int t, int peer) {
    const int j = posMod(g.pos - t - 1, g.G());
    const Held h = held(g, t + 1, j);
    const size_t bytes = (size_t)g.tokens[j] * a_->kvRow() * sizeof(float);
    if (t > 0) {
      ops->push_back({false, h.k, 2 * bytes, peer});
      return;
    }
    ops->push_back({false, h.k, bytes, peer});
    ops->push_back({false, h.v, bytes, peer});
  }

  // Sizes the group buffers, packs my key/value chunks where they do not lie
  // together in the caller's buffers, zeroes what kernels add into, and
  // (backward) gathers my chunks' lse in the kernels' [H, count] layout.
  void prepare() {
    const size_t kr = a_->kvRow(), qr = a_->qRow();
    lseAt_.assign(a_->groups.size() + 1, 0);
    for (size_t gi = 0; gi < a_->groups.size(); gi++) {
      Group& g = a_->groups[gi];
      const int64_t n = g.tokens[g.pos];
      size_t most = 0;
      for (int j = 0; j < g.G(); j++) most = std::max(most, kvFloats(g, j));
      for (std::vector<float>* b : {&g.kv[0], &g.kv[1], &g.grad[0], &g.grad[1], &g.part}) b->resize(most);
      const std::vector<Chunk>& mine = g.blocks[g.pos];
      if (g.ownAt < 0) {
        g.own.resize(kvFloats(g, g.pos));
        for (const Chunk& c : mine) {
          memcpy(&g.own[c.blockOff * kr], k + c.userOff * kr, c.count * kr * sizeof(float));
          memcpy(&g.own[(n + c.blockOff) * kr], v + c.userOff * kr, c.count * kr * sizeof(float));
        }
      }
      g.written.assign(g.blocks[g.pos].size(), 0);
      lseAt_[gi + 1] = lseAt_[gi] + (size_t)n * a_->H;
    }
    if (!backward_) {
      lseAcc_.resize(lseAt_.back());
    } else {
      std::fill(dq, dq + a_->T * qr, 0.0f);
      // Ring chunks' dk and dv are written whole at the end; the kernels
      // add into local sequences' in place.
      for (const LocalSeq& l : a_->locals) {
        std::fill(dk + l.userOff * kr, dk + (l.userOff + l.len) * kr, 0.0f);
        std::fill(dv + l.userOff * kr, dv + (l.userOff + l.len) * kr, 0.0f);
      }
      // The kernels take a chunk's lse as [H, count]: gather mine from [H, T].
      lseAcc_.resize(lseAt_.back());
      for (size_t gi = 0; gi < a_->groups.size(); gi++)
        for (const Chunk& c : a_->groups[gi].blocks[a_->groups[gi].pos])
          for (int h = 0; h < a_->H; h++)
            memcpy(&lseAcc_[lseAt_[gi] + c.blockOff * a_->H + h * c.count], lseIn + h * a_->T + c.userOff,
                   c.count * sizeof(float));
    }
  }

  // Scatters the merged lse of my chunks to [H, T]; a chunk that saw no
  // block at all is the empty merge (out 0, lse -inf).
  void finishLse() {
    for (size_t gi = 0; gi < a_->groups.size(); gi++)
      for (const Chunk& c : a_->groups[gi].blocks[a_->groups[gi].pos]) {
        if (!a_->groups[gi].written[&c - &a_->groups[gi].blocks[a_->groups[gi].pos][0]]) {
          std::fill(out + c.userOff * a_->qRow(), out + (c.userOff + c.count) * a_->qRow(), 0.0f);
          std::fill(&lseAcc_[lseAt_[gi] + c.blockOff * a_->H], &lseAcc_[lseAt_[gi] + (c.blockOff + c.count) * a_->H],
                    -INFINITY);
        }
        for (int h = 0; h < a_->H; h++)
          memcpy(lse + h * a_->T + c.userOff, &lseAcc_[lseAt_[gi] + c.blockOff * a_->H + h * c.count],
                 c.count * sizeof(float));
      }
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
    const int H = a_->H;
    zpAttnBlock_t b = blockFor(l.len, l.len, a_->causal ? zpMaskCausal : zpMaskFull);
    b.q = q + l.userOff * a_->qRow();
    b.k = k + l.userOff * a_->kvRow();
    b.v = v + l.userOff * a_->kvRow();
    partLse_.resize((size_t)H * l.len);
    b.lse = partLse_.data();
    if (!backward_) {
      b.out = out + l.userOff * a_->qRow();
      ZPX_CHECK(callKernel(b));
      for (int h = 0; h < H; h++) memcpy(lse + h * a_->T + l.userOff, &partLse_[h * l.len], l.len * sizeof(float));
      return zpSuccess;
    }
    for (int h = 0; h < H; h++) memcpy(&partLse_[h * l.len], lseIn + h * a_->T + l.userOff, l.len * sizeof(float));
    b.out = const_cast<float*>(outIn) + l.userOff * a_->qRow();
    b.dout = dout + l.userOff * a_->qRow();
    b.dq = dq + l.userOff * a_->qRow();
    b.dk = dk + l.userOff * a_->kvRow();
    b.dv = dv + l.userOff * a_->kvRow();
    return callKernel(b);
  }

  // Waits for the exchange in flight, running local sequences meanwhile.
  zpResult_t waitFilling() {
    while (!localsLeft_.empty() && !a_->xchg->finished()) ZPX_CHECK(runLocal());
    return a_->xchg->wait(fn_);
  }

  // Forward step: my query chunks of group g against block buf of position j.
  zpResult_t forwardStep(size_t gi, int j, Held buf) {
    Group& g = a_->groups[gi];
    const size_t kr = a_->kvRow(), qr = a_->qRow();
    return forPairs(g.blocks[g.pos], g.blocks[j], [&](const Chunk& cq, const Chunk& ck) -> zpResult_t {
      zpAttnMask_t mask = maskOf(a_->causal, cq, ck);
      if (mask == zpMaskSkip) return zpSuccess;
      zpAttnBlock_t b = blockFor(cq.count, ck.count, mask);
      float* accOut = out + cq.userOff * qr;
      float* accLse = &lseAcc_[lseAt_[gi] + cq.blockOff * a_->H];
      b.q = q + cq.userOff * qr;
      b.k = buf.k + ck.blockOff * kr;
      b.v = buf.v + ck.blockOff * kr;
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
      partOut_.resize(cq.count * qr);
      partLse_.resize(cq.count * a_->H);
      b.out = partOut_.data();
      b.lse = partLse_.data();
      ZPX_CHECK(callKernel(b));
      return zpAttnMergeLse(accOut, accLse, partOut_.data(), partLse_.data(), cq.count, a_->H, a_->D);
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
      b.q = q + at * qr;
      b.k = buf.k + ck.blockOff * kr;
      b.v = buf.v + ck.blockOff * kr;
      b.out = const_cast<float*>(outIn) + at * qr;
      b.dout = dout + at * qr;
      b.dq = dq + at * qr;
      b.dk = grad + ck.blockOff * kr;
      b.dv = grad + (nk + ck.blockOff) * kr;
      const float* lse = &lseAcc_[lseAt_[gi] + cq.blockOff * H];  // [H, cq.count]
      if (w.rows == cq.count) {
        b.lse = const_cast<float*>(lse);
      } else {  // some rows of the chunk: their lse as [H, rows]
        partLse_.resize((size_t)H * w.rows);
        for (int h = 0; h < H; h++)
          memcpy(&partLse_[h * w.rows], lse + h * cq.count + w.row0, w.rows * sizeof(float));
        b.lse = partLse_.data();
      }
      ZPX_CHECK(callKernel(b));
    }
    return zpSuccess;
  }

  // Declared after the buffers an exchange uses, so that on an early return
  // the exchange in flight ends before they are freed.
  struct DrainOnExit {
    zpx::AsyncP2P* x;
    ~DrainOnExit() { x->drain(); }
  };

  static int posMod(int a, int G) { return ((a % G) + G) % G; }
  int prevOf(const Group& g) const { return g.ranks[posMod(g.pos - 1, g.G())]; }
  int nextOf(const Group& g) const { return g.ranks[posMod(g.pos + 1, g.G())]; }

  zpResult_t runForward() {
    const size_t n = a_->groups.size();
    DrainOnExit drain{a_->xchg.get()};
    // X_t of group gi: forward b_t (held in src), bring b_{t+1}.
    auto startX = [&](size_t gi, int t) {
      Group& g = a_->groups[gi];
      std::vector<zpx::P2POp> ops;
      sendHeld(&ops, g, t, nextOf(g));
      recvNext(&ops, g, t, prevOf(g));
      return a_->xchg->start(std::move(ops), fn_);
    };
    if (n) ZPX_CHECK(startX(0, 0));
    for (size_t gi = 0; gi < n; gi++) {
      Group& g = a_->groups[gi];
      const int G = g.G();
      for (int t = 0; t < G; t++) {
        const int j = posMod(g.pos - t, G);
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

  zpResult_t runBackward() {
    const size_t kr = a_->kvRow();
    for (size_t gi = 0; gi < a_->groups.size(); gi++) {
      Group& g = a_->groups[gi];
      const int G = g.G(), next = nextOf(g), prev = prevOf(g);
      std::vector<float>*grad = g.grad, &part = g.part;
      DrainOnExit drain{a_->xchg.get()};
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
      float* gk = direct ? dk + g.ownAt * kr : part.data();
      float* gv = direct ? dv + g.ownAt * kr : part.data() + half;
      auto startX = [&](int t) {
        std::vector<zpx::P2POp> ops;
        if (t < G - 1) sendHeld(&ops, g, t, next);
        if (t >= 1) {
          const size_t half = kvFloats(g, block(t - 1)) / 2;
          ops.push_back({true, grad[(t - 1) % 2].data(), half * sizeof(float), next});
          ops.push_back({true, grad[(t - 1) % 2].data() + half, half * sizeof(float), next});
        }
        if (t < G - 1) recvNext(&ops, g, t, prev);
        if (t >= 1) {
          const size_t size = kvFloats(g, block(t)) / 2;
          ops.push_back({false, t == G ? gk : part.data(), size * sizeof(float), prev});
          ops.push_back({false, t == G ? gv : part.data() + size, size * sizeof(float), prev});
        }
        return a_->xchg->start(std::move(ops), fn_);
      };
      // My own block's work is split: half goes round the ring with the
      // other ranks' shares (step 0, while the first block arrives), half
      // runs while the last gradient hop is in flight and is added to what
      // it brings, so that hop is hidden too.
      std::vector<Work> ownEarly = backwardWork(g, g.pos), ownLate = splitHalf(&ownEarly);
      ZPX_CHECK(startX(0));
      for (int t = 0; t < G; t++) {
        float* acc = grad[t % 2].data();
        const size_t size = kvFloats(g, block(t));
        std::fill(acc, acc + size, 0.0f);
        if (t == 0)
          ZPX_CHECK(runBackwardWork(gi, ownEarly, held(g, 0, g.pos), nMine, acc));
        else
          ZPX_CHECK(runBackwardWork(gi, backwardWork(g, block(t)), held(g, t, block(t)), g.tokens[block(t)], acc));
        ZPX_CHECK(waitFilling());
        if (t >= 1)
          for (size_t e = 0; e < size; e++) acc[e] += part[e];
        ZPX_CHECK(startX(t + 1));
      }
      // grad[G % 2] went out with X_{G-1}: free for the late half.
      float* late = grad[G % 2].data();
      if (!ownLate.empty()) {
        std::fill(late, late + 2 * half, 0.0f);
        ZPX_CHECK(runBackwardWork(gi, ownLate, held(g, 0, g.pos), nMine, late));
      }
      ZPX_CHECK(waitFilling());
      // My block's whole gradient: what the last hop brought plus the late half.
      if (!ownLate.empty())
        for (size_t e = 0; e < half; e++) {
          gk[e] += late[e];
          gv[e] += late[half + e];
        }
      if (direct) continue;
      for (const Chunk& c : g.blocks[g.pos]) {
        memcpy(dk + c.userOff * kr, &part[c.blockOff * kr], c.count * kr * sizeof(float));
        memcpy(dv + c.userOff * kr, &part[(nMine + c.blockOff) * kr], c.count * kr * sizeof(float));
      }
    }
    return zpSuccess;
  }
};

// Builds this rank's groups and local sequences from the plan, read through
// the public API: a ring sequence's chunks are its segments in the attention
// layout, ring position j holding chunks j and 2G-1-j in that order (one
// segment each; empty chunks have none).
zpResult_t buildSchedule(zpAttention* a, zpBatchPlan_t plan, int nranks, int me) {
  int nseqs = 0, causal = 0;
  const int64_t* lens = nullptr;
  ZPX_CHECK(zpPlanGetInfo(plan, nullptr, &nseqs, &lens, &causal));
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
  std::map<std::vector<int>, size_t> groupOf;
  std::vector<Group> all;
  std::vector<std::pair<int, int64_t>> order;  // (class, first sequence) of each group
  for (int64_t seq = 0; seq < nseqs; seq++) {
    int cls = 0, G = 0;
    const int* ringRanks = nullptr;
    ZPX_CHECK(zpPlanSequence(plan, seq, &cls, &G, &ringRanks));
    std::vector<int> ranks(ringRanks, ringRanks + G);
    if (G == 1) {
      if (ranks[0] == me) a->locals.push_back({at.at({seq, 0}), lens[seq]});
      continue;
    }
    auto it = groupOf.find(ranks);
    if (it == groupOf.end()) {
      it = groupOf.emplace(ranks, all.size()).first;
      Group g;
      g.ranks = ranks;
      g.blocks.resize(G);
      g.tokens.assign(G, 0);
      all.push_back(std::move(g));
      order.push_back({cls, seq});
    }
    Group& g = all[it->second];
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
  // Inter-node rings first, then intra-node ones; every rank sorts alike.
  std::vector<size_t> idx(all.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
    if (order[x].first != order[y].first) return order[x].first > order[y].first;
    return order[x].second < order[y].second;
  });
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

zpResult_t zpAttentionForward(zpAttention_t attn, const float* q, const float* k, const float* v, float* out,
                                     float* lse) try {
  const char* fn = "zpAttentionForward";
  if (!attn) return zpSetLastError(nullptr, zpInvalidArgument, "%s: attn is NULL", fn);
  if (attn->T > 0 && (!q || !k || !v || !out || !lse))
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a NULL buffer among q, k, v, out, lse (this rank holds %lld tokens)", fn,
                    (long long)attn->T);
  try {
    Pass pass(attn, false);
    pass.q = q;
    pass.k = k;
    pass.v = v;
    pass.out = out;
    pass.lse = lse;
    return pass.run(fn);
  } catch (const std::bad_alloc&) {
    return zpSetLastError(nullptr, zpSystemError, "%s: out of memory", fn);
  }
} catch (...) {
  return zpx::failFromException("zpAttentionForward");
}

zpResult_t zpAttentionBackward(zpAttention_t attn, const float* q, const float* k, const float* v,
                                      const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                      float* dv) try {
  const char* fn = "zpAttentionBackward";
  if (!attn) return zpSetLastError(nullptr, zpInvalidArgument, "%s: attn is NULL", fn);
  if (!attn->bwd) return zpSetLastError(nullptr, zpInvalidUsage, "%s: the driver was created without a backward kernel", fn);
  if (attn->T > 0 && (!q || !k || !v || !out || !lse || !dout || !dq || !dk || !dv))
    return zpSetLastError(nullptr, zpInvalidArgument,
                    "%s: a NULL buffer among q, k, v, out, lse, dout, dq, dk, dv (this rank holds %lld tokens)", fn,
                    (long long)attn->T);
  try {
    Pass pass(attn, true);
    pass.q = q;
    pass.k = k;
    pass.v = v;
    pass.outIn = out;
    pass.lseIn = lse;
    pass.dout = dout;
    pass.dq = dq;
    pass.dk = dk;
    pass.dv = dv;
    return pass.run(fn);
  } catch (const std::bad_alloc&) {
    return zpSetLastError(nullptr, zpSystemError, "%s: out of memory", fn);
  }
} catch (...) {
  return zpx::failFromException("zpAttentionBackward");
}

zpResult_t zpAttentionDestroy(zpAttention_t attn) try {
  if (!attn) return zpSetLastError(nullptr, zpInvalidArgument, "zpAttentionDestroy: attn is NULL");
  delete attn;
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpAttentionDestroy");
}
