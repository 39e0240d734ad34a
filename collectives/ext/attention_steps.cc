// The ring steps of an attention pass (attention_pass.h).
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
#include <utility>
#include <vector>

#include "collectives/ext/attention_pass.h"

namespace zpx::attn {

// Forward step: my query chunks of group g against block buf of position j.
zpResult_t Pass::forwardStep(size_t gi, int j, Held buf) {
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

zpResult_t Pass::runForward() {
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

std::vector<Pass::Work> Pass::backwardWork(const Group& g, int j) const {
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
std::vector<Pass::Work> Pass::splitHalf(std::vector<Work>* work) {
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
zpResult_t Pass::runBackwardWork(size_t gi, const std::vector<Work>& work, Held buf, int64_t nk, float* grad) {
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

// The groups in the reverse of the forward order.
zpResult_t Pass::runBackward() {
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
}  // namespace zpx::attn
