// All-reduce on host buffers: recursive doubling, the flat ring, direct
// exchange (overlapped on one node), and the hierarchical all-reduce across
// nodes, pipelined over slices.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {
namespace detail {

// ---- Small all-reduces on one node: the header check and the data in one round ----
// Each rank sends one message, its header followed by its data, to every
// other rank at once, checks every header, then reduces the n blocks in
// rank order: one round where the header check and recursive doubling take
// 1 + log2(n), and the same bits on every rank. Nothing is written before
// the headers agree, so a mismatch is still zpInvalidUsage on every rank,
// naming the calls (settleHeaders). The header leads the message as in
// every header round, so a peer in another collective's header round reads
// this rank's header, never its data, and this rank reads that peer's (a
// message of another size is refused and its header counts as missing:
// the second round names the calls). Up to kFusedBytes of the work type
// per rank.
constexpr size_t kFusedBytes = 4096;

bool fusesCheck(Comm* c, const CollArgs& a) {
  const size_t bytes = a.count * zpTypeSize(workType(a.dtype));
  const CollAlgo algo = c->cfg().collAlgo;
  if (a.kind != CollKind::kAllReduce || a.count == 0 || bytes > kFusedBytes) return false;
  return c->nranks() > 1 && c->nnodes() == 1 && (algo == CollAlgo::kAuto || algo == CollAlgo::kTree);
}

zpResult_t fusedAllReduce(Comm* c, const CollArgs& a, uint64_t seq, const Header& mine) {
  const int n = c->nranks(), me = c->rank();
  const zpDataType_t wt = workType(a.dtype);
  const size_t bytes = a.count * zpTypeSize(wt);
  // Rank r's message at r * stride: its header, then its data, padded to
  // 8 bytes so that every header stays aligned (the pad travels, zeroed).
  const size_t stride = (sizeof(Header) + bytes + alignof(Header) - 1) / alignof(Header) * alignof(Header);
  const HeaderSlots s{scratch(kScratchAcc0, stride * n), stride};
  auto data = [&](int r) { return s.base + (size_t)r * s.stride + sizeof(Header); };
  s.at(me) = mine;
  memset(data(me) + bytes, 0, stride - sizeof(Header) - bytes);
  if (isHalf(a.dtype))
    toWork(a.send, data(me), a.count, a.dtype);
  else
    memcpy(data(me), a.send, bytes);
  // A peer that failed or died is that error; a message of the wrong size
  // (zpInvalidUsage) leaves its header missing, which the second round explains.
  ZP_CHECK(settleHeaders(c, seq, s, runHeaderRound(c, headerOps(c, s), msgid::collectiveXfer(seq, 0))));
  std::vector<const char*>& in = headerLists().in;
  in.resize(n);
  for (int r = 0; r < n; r++) in[r] = data(r);
  reduceMany(data(0), in, a.count, wt, a.op);
  finishAvg(data(0), a.count, wt, a.op, n);
  if (isHalf(a.dtype))
    fromWork(data(0), a.recv, a.count, a.dtype);
  else
    memcpy(a.recv, data(0), bytes);
  return zpSuccess;
}

// ---- All-reduce: count elements of the work type from src into w (src may be w) ----
zpResult_t Call::allReduce(const char* src, char* w, size_t count) {
  const size_t bytes = count * wts;
  if (n == 1 || count == 0) {
    if (src != w && bytes) memmove(w, src, bytes);
    return zpSuccess;
  }
  std::vector<int> local, rail;
  if (ring(bytes) && nodeGroups(&local, &rail)) return allReduceNodes(src, w, count, local, rail);
  if (ring(bytes)) {
    // Rank r ends the reduce-scatter with block r+1, reduced where it lies
    // in w; block r is never written until the all-gather brings it.
    Blocks b = Blocks::even(count, n);
    ZP_CHECK(ringReduceScatter(src, b, 0, [&](int, int blk) { return w + b.off[blk] * wts; }));
    return ringAllGather(w, wts, b, 1, nullptr);
  }
  if (family(bytes) == Family::kDirect) {
    // Direct reduce-scatter (rank r ends with block r reduced into w),
    // then direct all-gather of the blocks: two rounds in all.
    Blocks b = Blocks::even(count, n);
    if (allLocal()) return allReduceDirectOverlapped(src, w, b);
    ZP_CHECK(reduceScatter(src, w + b.off[me] * wts, b, Family::kDirect));
    return allGatherDirect(w, wts, b, nullptr);
  }
  // Recursive doubling among the largest power of two p of ranks; the n-p
  // others first hand their data to a partner below p and get the result
  // back at the end. a op b == b op a bit for bit (IEEE), so every rank
  // ends with the same bits.
  int p = 1;
  while (p * 2 <= n) p *= 2;
  if (me >= p) {
    step.sendToReduce(me - p, src, bytes, wts);
    ZP_CHECK(step.run(2000));
    step.recv(me - p, w, bytes, wts);
    return step.run(kStepResult);
  }
  // Rounds alternate between w and a scratch buffer: a round reads one
  // (and sends it) while the incoming data is reduced into the other.
  char* bufs[2] = {w, scratch(kScratchAcc0, bytes)};
  int cur = src == w ? 0 : -1;  // -1: still src
  auto at = [&](int i) { return i < 0 ? src : bufs[i]; };
  if (me < n - p) {
    step.recvReduce(me + p, bufs[0], src, bytes, wt, a.op);
    ZP_CHECK(step.run(2000));
    cur = 0;
  }
  uint64_t tag = 2001;
  for (int mask = 1; mask < p; mask <<= 1, tag++) {
    const int peer = me ^ mask, next = cur == 0 ? 1 : 0;
    step.sendToReduce(peer, at(cur), bytes, wts);
    step.recvReduce(peer, bufs[next], at(cur), bytes, wt, a.op);
    ZP_CHECK(step.run(tag));
    cur = next;
  }
  if (cur != 0) memcpy(w, at(cur), bytes);
  if (me < n - p) {
    step.send(me + p, w, bytes, wts);
    ZP_CHECK(step.run(kStepResult));
  }
  return zpSuccess;
}

// ---- Hierarchical all-reduce across nodes (local: my node's ranks, rail: the ranks at my place) ----
// Reduce-scatter inside the node (direct exchange over shared memory), so
// that local rank l holds shard l reduced over its node; then the
// all-reduce of shard l among the ranks at place l of every node, a ring
// over the network, every local rank's over its own NIC at once
// (rail-aligned); then all-gather of the shards inside the node. Each NIC
// carries 2(N-1)/N of a shard, not of the buffer.
//
// Pipelined (ZP_COLL_SLICE; 0 turns it off): every
// shard is cut into S slices (ZP_COLL_SLICE bytes of the largest shard
// at most), and each slice goes through 2N stages, one per
// round: 0 the node's reduce-scatter, 1..N-1 the ring's reduce-scatter
// steps, N..2N-2 its all-gather steps, 2N-1 the node's all-gather. Round r
// runs stage r-j of every slice j that has one, so while slice j crosses
// the network, slice j+1 is reduced in the node and slice j-1 gathered:
// the NICs and the cores work at once instead of in turn. The slices of
// one round touch disjoint bytes, so a round needs no order among its
// messages; both ends of every pair post them in the same order.
zpResult_t Call::allReduceNodes(const char* src, char* w, size_t count, const std::vector<int>& local,
                                const std::vector<int>& rail) {
  const int L = (int)local.size(), N = (int)rail.size(), stages = 2 * N;
  const int place = (int)(std::find(local.begin(), local.end(), me) - local.begin());
  const Blocks bl = Blocks::even(count, L);
  const size_t sliceBytes = c->cfg().collSliceBytes;
  // Round r's ops of slice j are on lane r * stages + (r - j), which must
  // fit the relay's ids: fewer slices for long rings, none below 2N nodes'
  // worth of room (then one slice, one stage per round, lane r).
  size_t slices = sliceBytes == 0 ? 1 : (bl.maxCnt * wts + sliceBytes - 1) / sliceBytes;
  // With routing on, slices small enough that the ring's messages go
  // direct (below ZP_ROUTE_DIRECT_BELOW): rail-aligned, every NIC already
  // carries its share, and the relay, choosing paths from the queues of
  // the moment, loads some NICs twice as much as others when the messages
  // are many and staggered (measured: docs/collectives.md).
  const size_t directBelow = routedFrom(c);
  if (sliceBytes && directBelow > 3 * wts) {
    const size_t room = N * (directBelow - 3 * wts);  // a ring block is at most 2 elements over slice / N
    slices = std::max(slices, (bl.maxCnt * wts + room - 1) / room);
  }
  slices = std::max<size_t>(1, std::min(slices, kMaxSlices));
  slices = std::min(slices, std::max<size_t>(1, kLaneRoom / stages - std::min<size_t>(kLaneRoom / stages, stages)));
  std::vector<Blocks> sl;  // sl[p]: shard p cut into the slices
  for (int p = 0; p < L; p++) sl.push_back(Blocks::even(bl.cnt[p], (int)slices));
  // Slice j of every shard, as blocks of the whole buffer.
  auto sliceOf = [&](size_t j) {
    std::vector<size_t> cnt(L), off(L);
    for (int p = 0; p < L; p++) {
      cnt[p] = sl[p].cnt[j];
      off[p] = bl.off[p] + sl[p].off[j];
    }
    return Blocks::of(cnt.data(), off.data(), L);
  };
  char* in = scratch(kScratchAcc0, sl[place].maxCnt * wts * L);  // the node's partials of the slice at stage 0
  bool grouped = false;  // the slice at stage 0 is reduced by a group (reduceScatterDirectRound)
  for (size_t r = 0; r + 1 < slices + stages; r++) {
    const size_t first = r < (size_t)stages ? 0 : r - stages + 1, last = std::min(r, slices - 1);
    for (size_t j = first; j <= last; j++) {
      const int stage = (int)(r - j);
      const Blocks b = sliceOf(j);
      step.lane(slices == 1 ? r : r * stages + stage);
      char* mine = w + b.off[place] * wts;  // my shard's slice j
      if (stage == 0) {
        within(local, 0, [&] { return grouped = reduceScatterDirectRound(src, b, in, mine), zpSuccess; });
      } else if (stage < stages - 1) {
        const Blocks br = Blocks::even(b.cnt[place], N);
        within(rail, 0, [&] {
          if (stage < N)  // in place: ring block i of the slice is reduced where it lies
            ringReduceScatterRound(mine, br, 0, stage - 1, [&](int, int blk) { return mine + br.off[blk] * wts; });
          else
            ringAllGatherRound(mine, wts, br, 1, stage - N, nullptr);
          return zpSuccess;
        });
      } else {
        within(local, 0, [&] { return allGatherDirectRound(w, wts, b, nullptr), zpSuccess; });
      }
    }
    ZP_CHECK(step.run(kStepNodes));
    if (r < slices) {  // slice r was at stage 0
      const Blocks b = sliceOf(r);
      within(local, 0, [&] {
        return reduceScatterDirectFinish(src, w + b.off[place] * wts, b, in, grouped), zpSuccess;
      });
    }
  }
  return zpSuccess;
}

// Direct reduce-scatter then direct all-gather on one node, without the
// wait between them: this rank reduces its block as soon as its own
// receives are in and offers it to the others at once, while they may
// still be reading its input (their reads of it need not be finished
// first). With more ranks than cores that wait was a core left idle. In
// place, the blocks the all-gather overwrites are ones the peers read
// before they could offer theirs. Same messages and order per pair as
// the two steps, the same reduction order: the same bits.
zpResult_t Call::allReduceDirectOverlapped(const char* src, char* w, const Blocks& b) {
  const size_t mine = b.cnt[me] * wts;
  char* in = scratch(kScratchAcc0, mine * n);
  const bool grouped = reduceScatterDirectRound(src, b, in, w + b.off[me] * wts);
  std::vector<Op> rs = step.take(), ag;
  auto done = [](const std::vector<Op>& ops, bool recvsOnly) {
    for (const Op& o : ops)
      if (!o.done && !(recvsOnly && o.isSend)) return false;
    return true;
  };
  std::vector<Op*> ptrs;
  for (Op& o : rs) ptrs.push_back(&o);
  ZP_CHECK(c->runOps(ptrs, [&] { return done(rs, true); }));
  // My receives are in (and good: runOps reported none that failed).
  reduceScatterDirectFinish(src, w + b.off[me] * wts, b, in, grouped);
  allGatherDirectRound(w, wts, b, nullptr);
  ag = step.take();
  ptrs.clear();
  for (Op& o : ag) ptrs.push_back(&o);
  ZP_CHECK(c->runOps(ptrs, [&] { return done(rs, false) && done(ag, false); }));
  for (const Op& o : rs)  // the reduce-scatter's sends: the second runOps did not look at them
    if (o.status != zpSuccess) return fail(o.status, "rank %d: %s", c->rank(), o.error.c_str());
  return zpSuccess;
}

}  // namespace detail
}  // namespace zp
