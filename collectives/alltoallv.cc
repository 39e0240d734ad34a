#include <algorithm>
#include <deque>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "src/core/routing.h"
#include "src/core/log.h"
#include "src/core/msg_id.h"

namespace zp {

namespace {

// Communicators up to this size send counts along with the data (16 n + 8 bytes a message).
constexpr int kCountsInBand = 64;

struct Range {
  uintptr_t begin, end;
  int peer;
};

// Where a block of count elements at displ starts in buf; buf itself for an
// empty block (buf may be NULL then, and NULL plus an offset is undefined).
char* blockAt(const void* buf, size_t displ, size_t count, size_t ts) {
  return count ? (char*)buf + displ * ts : (char*)buf;
}

// Checks counts and displacements of one side; fills the byte ranges it touches.
zpResult_t checkSide(const char* side, const void* buf, const size_t counts[], const size_t displs[], int n,
                     size_t ts, std::vector<Range>* ranges) {
  const char* countName = side[0] == 's' ? "sendcounts" : "recvcounts";
  const char* displName = side[0] == 's' ? "sdispls" : "rdispls";
  if (!counts) return fail(zpInvalidArgument, "zpAlltoallv: %s is NULL", countName);
  if (!displs) return fail(zpInvalidArgument, "zpAlltoallv: %s is NULL", displName);
  for (int p = 0; p < n; p++) {
    if (counts[p] > maxElements(ts))
      return fail(zpInvalidArgument, "zpAlltoallv: %s[%d]=%zu is too large (a negative value cast to size_t?)",
                  countName, p, counts[p]);
    if (displs[p] > maxElements(ts))
      return fail(zpInvalidArgument, "zpAlltoallv: %s[%d]=%zu is too large (a negative value cast to size_t?)",
                  displName, p, displs[p]);
    if (counts[p] == 0) continue;
    if (!buf) return fail(zpInvalidArgument, "zpAlltoallv: %sbuff is NULL but %s[%d]=%zu", side, countName, p, counts[p]);
    uintptr_t b = (uintptr_t)buf + displs[p] * ts;
    if (b < (uintptr_t)buf || b + counts[p] * ts < b)
      return fail(zpInvalidArgument, "zpAlltoallv: %s range for rank %d wraps around the address space", side, p);
    ranges->push_back({b, b + counts[p] * ts, p});
  }
  return zpSuccess;
}


// ---- Routed (ZP_ROUTING=rail or balanced, several nodes and rails) ----
// Every rank first learns every rank's counts: the router plans the call's
// inter-node transfers from the whole matrix, and every rank computes the
// same plan without further messages. A mismatch is found here by all ranks
// at once, before any data moves. Then blocks within the node go straight
// over shared memory, and the others through the relay along their pieces.

zpResult_t runAll(Comm* c, std::deque<Op>& ops) {
  std::vector<Op*> ptrs;
  for (Op& op : ops) ptrs.push_back(&op);
  return c->runOps(ptrs);
}

// The count matrix (collectives.h), with this rank's row filled in; the
// other rows are filled by peers' messages.
std::vector<uint64_t> countMatrix(Comm* c, const size_t sendcounts[], const size_t recvcounts[], size_t ts) {
  const int n = c->nranks();
  std::vector<uint64_t> rows((size_t)n * countRowLen(n), 0);
  uint64_t* mine = rows.data() + (size_t)c->rank() * countRowLen(n);
  for (int p = 0; p < n; p++) {
    mine[p] = sendcounts[p];
    mine[n + p] = recvcounts[p];
  }
  mine[2 * n] = ts;
  if (const Routing* routing = c->routing()) mine[2 * n + 1] = routing->railReport();
  mine[2 * n + 2] = c->waitStats().outsideBefore(stampUs());
  return rows;
}

// Each rank's time outside the library before the call, from the rows
// (for the wait statistics); clear: the words leave the rows (a routed
// call's rows are its plan's key, and these change from call to call).
std::vector<uint64_t> timesOutside(std::vector<uint64_t>& rows, int n, bool clear) {
  const size_t rowLen = countRowLen(n);
  std::vector<uint64_t> out(n);
  for (int r = 0; r < n; r++) {
    out[r] = rows[(size_t)r * rowLen + 2 * n + 2];
    if (clear) rows[(size_t)r * rowLen + 2 * n + 2] = 0;
  }
  return out;
}

// The type-size word of the row of a rank that refused its own arguments
// (it takes part with this row, its counts 0, so that every rank learns of
// it from the matrix; see refuseAlltoallv).
constexpr uint64_t kRefusedRow = ~uint64_t(0);
std::vector<uint64_t> refusedMatrix(const Comm* c) {
  std::vector<uint64_t> rows((size_t)c->nranks() * countRowLen(c->nranks()), 0);
  rows[(size_t)c->rank() * countRowLen(c->nranks()) + 2 * (size_t)c->nranks()] = kRefusedRow;
  return rows;
}

// Once every rank has every row: if any rank refused, every rank says so
// (a status round, the same on every rank, brings the first refusing
// rank's reason) and fails the call: this rank with its own error if it
// refused (code, why), the others with zpInvalidUsage naming the first
// refusing rank and its reason. zpSuccess if nobody refused.
zpResult_t settleRefusals(Comm* c, uint64_t seq, const std::vector<uint64_t>& rows, zpResult_t code,
                          const std::string& why) {
  const int n = c->nranks();
  bool refused = false;
  for (int r = 0; r < n; r++) refused |= rows[(size_t)r * countRowLen(n) + 2 * (size_t)n] == kRefusedRow;
  if (!refused) return zpSuccess;
  std::string mine;
  if (code != zpSuccess) {
    mine = why;
    if (mine.compare(0, 13, "zpAlltoallv: ") == 0) mine.erase(0, 13);
    mine = "rank " + std::to_string(c->rank()) + " refused zpAlltoallv: " + mine;
  }
  const zpResult_t all = c->agreeOnResult(seq, code == zpSuccess ? zpSuccess : zpInvalidUsage, mine);
  if (code != zpSuccess) return fail(code, "%s", why.c_str());
  return all;
}

// The whole count matrix at every rank.
// rows: this rank's row filled in (countMatrix, or refusedMatrix).
zpResult_t gatherCounts(Comm* c, uint64_t seq, std::vector<uint64_t>* rows) {
  const int n = c->nranks(), me = c->rank();
  const size_t rowLen = countRowLen(n);
  uint64_t* mine = rows->data() + (size_t)me * rowLen;
  std::deque<Op> ops;
  for (int i = 1; i < n; i++) {
    int to = (me + i) % n, from = (me - i + n) % n;
    ops.emplace_back(OpKind::kAlltoallv, true, to, mine, rowLen * sizeof(uint64_t), 1);
    ops.emplace_back(OpKind::kAlltoallv, false, from, rows->data() + (size_t)from * rowLen,
                     rowLen * sizeof(uint64_t), 1);
  }
  // Across nodes through the relay too, which knows the paths that work.
  RoutedXfer xfer;
  xfer.id = msgid::countsXfer(seq);  // apart from the data's (plainXfer(seq))
  std::vector<Op*> ptrs;
  for (Op& op : ops) {
    if (!c->isLocal(op.peer)) op.routed = &xfer;
    ptrs.push_back(&op);
  }
  // Each peer's row is its first message of the call: when it came is when
  // the peer entered (the wait statistics, as a collective's header round).
  markArrivals(c, ptrs);
  const zpResult_t res = c->runOps(ptrs);
  const std::vector<uint64_t> outside = timesOutside(*rows, n, true);
  recordArrivals(c, ptrs, res, &outside, false);  // the call goes on (alltoallv stamps its end)
  return res;
}

zpResult_t checkCounts(const Comm* c, const std::vector<uint64_t>& rows) {
  return checkCountMatrix(c->rank(), c->nranks(), rows);
}

// The router's plan of a call's inter-node bytes, from the count matrix
// (the same at every rank, so every rank gets the same plan).
zpResult_t planCall(Comm* c, Routing* routing, const std::vector<uint64_t>& rows, size_t ts,
                    const std::vector<Transfer>** plan) {
  const int n = c->nranks();
  const size_t rowLen = countRowLen(n);
  std::vector<std::vector<uint64_t>> bytes(n, std::vector<uint64_t>(n, 0));
  std::vector<uint64_t> railReports(n);
  const std::vector<int>& nodeOf = c->nodeOf();
  for (int s = 0; s < n; s++) {
    for (int d = 0; d < n; d++)
      if (nodeOf[s] != nodeOf[d]) bytes[s][d] = rows[(size_t)s * rowLen + d] * ts;
    railReports[s] = rows[(size_t)s * rowLen + 2 * n + 1];
  }
  std::string why;
  if (routing->plan(rows, bytes, railReports, plan, &why) != zpSuccess)
    return fail(zpInternalError, "rank %d: alltoallv: the router cannot plan this call: %s", c->rank(), why.c_str());
  return zpSuccess;
}

zpResult_t routedAlltoallv(Comm* c, Routing* routing, uint64_t seq, const void* sendbuff, const size_t sendcounts[],
                           const size_t sdispls[], void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           size_t ts) {
  const int n = c->nranks(), me = c->rank();
  std::vector<uint64_t> rows = countMatrix(c, sendcounts, recvcounts, ts);
  ZP_CHECK(gatherCounts(c, seq, &rows));
  ZP_CHECK(settleRefusals(c, seq, rows, zpSuccess, std::string()));
  ZP_CHECK(checkCounts(c, rows));

  const std::vector<Transfer>* plan = nullptr;
  ZP_CHECK(planCall(c, routing, rows, ts, &plan));

  const char* sbuf = (const char*)sendbuff;
  char* rbuf = (char*)recvbuff;
  std::deque<Op> ops;
  std::deque<RoutedXfer> xfers;  // deques: addresses stay put
  auto add = [&](bool isSend, int peer, const char* buf, size_t count) {
    ops.emplace_back(OpKind::kAlltoallv, isSend, peer, (void*)buf, count * ts, ts);
    return &ops.back();
  };
  auto route = [&](const std::vector<RouteChunk>* chunks) {
    xfers.push_back(RoutedXfer{msgid::plainXfer(seq), chunks});
    return &xfers.back();
  };
  for (const Transfer& t : *plan)
    if (t.src == me)
      add(true, t.dst, blockAt(sbuf, sdispls[t.dst], sendcounts[t.dst], ts), sendcounts[t.dst])->routed =
          route(&t.chunks);
  for (int i = 1; i < n; i++) {
    int to = (me + i) % n, from = (me - i + n) % n;
    if (c->isLocal(to)) add(true, to, blockAt(sbuf, sdispls[to], sendcounts[to], ts), sendcounts[to]);
    if (c->isLocal(from)) add(false, from, blockAt(rbuf, rdispls[from], recvcounts[from], ts), recvcounts[from]);
    else if (recvcounts[from])
      add(false, from, blockAt(rbuf, rdispls[from], recvcounts[from], ts), recvcounts[from])->routed = route(nullptr);
  }
  if (sendcounts[me]) memmove(rbuf + rdispls[me] * ts, sbuf + sdispls[me] * ts, sendcounts[me] * ts);
  return runAll(c, ops);
}

// ---- Device buffers (a CUDA stream) ----
// With routing off (or one node, or one rail), one NCCL group of sends and
// receives, this rank's own block included, goes on the stream, and the host
// exchanges nothing with the peers unless ZP_CHECK_MODE=full: then the count
// matrix is gathered and checked over the host transports first, so that a
// mismatch is zpInvalidUsage on every rank before anything is enqueued,
// never a hang on the device. With routing on, the router plans from the
// count matrix, so every rank gathers it (one message to and from each peer,
// never a wait on the device) and checks it whatever the mode; the plan runs
// as NCCL steps (deviceRouted below).

// A staging slot of this rank as a proxy: chunks of round k wait in area
// kOut (source side, between dispatch and transfer) or kIn (destination
// side, between transfer and combine), half k % 2 of it. A slot written in
// stage s is read in stage s + 1 and written again in stage s + 2 (rounds
// of one parity are two stages apart), and the stages run in stream order.
enum SlotArea { kNoSlot = -1, kOut = 0, kIn = 1 };
struct Slot {
  int area = kNoSlot, half = 0;
  size_t offset = 0;
};

// This rank's slots in one area: by round, bytes taken so far.
struct SlotAlloc {
  std::vector<size_t> used;
  size_t peak = 0;  // the fullest round
  Slot take(SlotArea area, int round, size_t bytes) {
    if ((size_t)round >= used.size()) used.resize(round + 1, 0);
    Slot s{area, round % 2, used[round]};
    used[round] += (bytes + 15) / 16 * 16;  // 16-byte aligned slots
    peak = std::max(peak, used[round]);
    return s;
  }
};

// One message of a routed device alltoallv: `from` sends `bytes` to `to` in
// pipeline stage `stage`. Its addresses matter only at this rank's ends: a
// user buffer (src, dst) or a staging slot.
struct DeviceHop {
  int stage, from, to;
  size_t bytes;
  const char* src;
  char* dst;
  Slot srcSlot, dstSlot;
};

// The router's schedule (the same chunks the host relay carries:
// src/route/route_schedule.h) as stream-ordered NCCL steps. A chunk of
// round k moves in up to three steps:
//   dispatch  (stage k)      source -> srcProxy, over the node's links,
//   transfer  (stage k + 1)  srcProxy -> dstProxy, from srcProxy's GPU (NCCL
//                            leaves through the NIC nearest it),
//   combine   (stage k + 2)  dstProxy -> destination, over its node's links.
// Each stage is one NCCL group on the caller's stream, so stage s carries
// round s's dispatch, round s - 1's transfer and round s - 2's combine at
// once: the three steps of consecutive rounds overlap. Stage 0 also carries
// every message with no relay hop (blocks within the node, this rank's own
// block, and a transfer's chunks whose proxies are its own ends, joined
// into one message per contiguous run). Every rank derives the same message
// list from the same schedule and posts its ends in that order, which is
// how NCCL pairs each pair's sends and receives.
zpResult_t deviceRouted(Comm* c, Routing* routing, const std::vector<uint64_t>& rows, const void* sendbuff,
                        const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                        const size_t recvcounts[], const size_t rdispls[], size_t ts, void* stream) {
  const int n = c->nranks(), me = c->rank();
  const std::vector<int>& nodeOf = c->nodeOf();
  const std::vector<Transfer>* plan = nullptr;
  ZP_CHECK(planCall(c, routing, rows, ts, &plan));

  const char* sbuf = (const char*)sendbuff;
  char* rbuf = (char*)recvbuff;
  std::vector<DeviceHop> hops;
  SlotAlloc slots[2];  // kOut, kIn
  auto hop = [&](int stage, int from, int to, const char* src, char* dst, size_t len) -> DeviceHop& {
    hops.push_back(DeviceHop{stage, from, to, len, from == me ? src : nullptr, to == me ? dst : nullptr, {}, {}});
    return hops.back();
  };
  for (int i = 1; i < n; i++) {  // this rank's own block last
    int to = (me + i) % n, from = (me - i + n) % n;
    if (nodeOf[to] == nodeOf[me] && sendcounts[to])
      hop(0, me, to, blockAt(sbuf, sdispls[to], sendcounts[to], ts), nullptr, sendcounts[to] * ts);
    if (nodeOf[from] == nodeOf[me] && recvcounts[from])
      hop(0, from, me, nullptr, blockAt(rbuf, rdispls[from], recvcounts[from], ts), recvcounts[from] * ts);
  }
  for (const Transfer& t : *plan) {
    // This rank's side of the transfer's buffers (only its ends touch them).
    const char* from = t.src == me ? sbuf + sdispls[t.dst] * ts : nullptr;
    char* into = t.dst == me ? rbuf + rdispls[t.src] * ts : nullptr;
    size_t run = SIZE_MAX;  // index of the transfer's last no-relay message, while chunks extend it
    uint64_t runEnd = 0;
    for (const RouteChunk& k : t.chunks) {
      const uint64_t at = k.offset;
      const size_t len = (size_t)k.bytes;
      if (k.direct(t.src, t.dst)) {  // no relay hop: one message per contiguous run
        if (run != SIZE_MAX && runEnd == at) {
          hops[run].bytes += len;
        } else {
          hop(0, t.src, t.dst, from ? from + at : nullptr, into ? into + at : nullptr, len);
          run = hops.size() - 1;
        }
        runEnd = at + len;
        continue;
      }
      const bool dispatch = k.srcProxy != t.src, combine = k.dstProxy != t.dst;
      Slot out, in;  // where the chunk waits at this rank, if it is a proxy of it
      if (dispatch && k.srcProxy == me) out = slots[kOut].take(kOut, k.round, len);
      if (combine && k.dstProxy == me) in = slots[kIn].take(kIn, k.round, len);
      if (dispatch) hop(k.round, t.src, k.srcProxy, from ? from + at : nullptr, nullptr, len).dstSlot = out;
      DeviceHop& x = hop(k.round + 1, k.srcProxy, k.dstProxy, dispatch || !from ? nullptr : from + at,
                         combine || !into ? nullptr : into + at, len);
      x.srcSlot = out;
      x.dstSlot = in;
      if (combine) hop(k.round + 2, k.dstProxy, t.dst, nullptr, into ? into + at : nullptr, len).srcSlot = in;
    }
  }
  if (sendcounts[me])
    hop(0, me, me, blockAt(sbuf, sdispls[me], sendcounts[me], ts), blockAt(rbuf, rdispls[me], recvcounts[me], ts),
        sendcounts[me] * ts);

  StreamTransport* device = c->streamTransport();
  if (!device) return fail(zpInternalError, "rank %d: device ops on a communicator without a device data plane", me);
  // The staging: [kOut half 0 | kOut half 1 | kIn half 0 | kIn half 1].
  const size_t outPeak = slots[kOut].peak, inPeak = slots[kIn].peak;
  const bool staged = outPeak + inPeak > 0;
  char* staging = nullptr;
  if (staged) ZP_CHECK(device->acquireStaging(2 * (outPeak + inPeak), stream, (void**)&staging));
  auto address = [&](const Slot& s) {
    size_t base = s.area == kOut ? s.half * outPeak : 2 * outPeak + s.half * inPeak;
    return staging + base + s.offset;
  };
  // One NCCL group per stage, this rank's ends in message order.
  int stages = 0;
  for (const DeviceHop& h : hops) stages = std::max(stages, h.stage + 1);
  std::vector<std::vector<Op>> groups(stages);
  for (const DeviceHop& h : hops) {
    std::vector<Op>& g = groups[h.stage];
    if (h.from == me)
      g.emplace_back(OpKind::kAlltoallv, true, h.to, (void*)(h.srcSlot.area == kNoSlot ? h.src : address(h.srcSlot)),
                     h.bytes, ts);
    if (h.to == me)
      g.emplace_back(OpKind::kAlltoallv, false, h.from, h.dstSlot.area == kNoSlot ? h.dst : address(h.dstSlot),
                     h.bytes, ts);
  }
  zpResult_t res = zpSuccess;
  for (std::vector<Op>& g : groups) {
    std::vector<Op*> ptrs;
    for (Op& op : g) {
      op.stream = stream;
      ptrs.push_back(&op);
    }
    if (!ptrs.empty() && (res = c->enqueueOnStreams(ptrs)) != zpSuccess) break;
  }
  if (staged) {
    zpResult_t released = device->releaseStaging(stream, staging);
    if (res == zpSuccess) res = released;
  }
  return res;
}

zpResult_t deviceAlltoallv(Comm* c, uint64_t seq, const void* sendbuff, const size_t sendcounts[],
                           const size_t sdispls[], void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           size_t ts, void* stream) {
  const int n = c->nranks(), me = c->rank();
  Routing* routing = c->routing();
  if (routing || c->cfg().checkDeviceCalls) {
    std::vector<uint64_t> rows = countMatrix(c, sendcounts, recvcounts, ts);
    ZP_CHECK(gatherCounts(c, seq, &rows));
    ZP_CHECK(settleRefusals(c, seq, rows, zpSuccess, std::string()));
    ZP_CHECK(checkCounts(c, rows));
    if (routing)
      return deviceRouted(c, routing, rows, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, ts, stream);
  }
  std::vector<Op> ops;
  ops.reserve(2 * n);
  for (int i = 0; i < n; i++) {
    int to = (me + i) % n, from = (me - i + n) % n;
    if (sendcounts[to])
      ops.emplace_back(OpKind::kAlltoallv, true, to, blockAt(sendbuff, sdispls[to], sendcounts[to], ts), sendcounts[to] * ts, ts);
    if (recvcounts[from])
      ops.emplace_back(OpKind::kAlltoallv, false, from, blockAt(recvbuff, rdispls[from], recvcounts[from], ts), recvcounts[from] * ts, ts);
  }
  std::vector<Op*> ptrs;
  for (Op& op : ops) {
    op.stream = stream;
    ptrs.push_back(&op);
  }
  return c->enqueueOnStreams(ptrs);
}

}  // namespace

namespace {

// This rank's own arguments: zpInvalidArgument naming the first bad one.
zpResult_t checkArgs(const Comm* c, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                     const void* recvbuff, const size_t recvcounts[], const size_t rdispls[], size_t ts) {
  const int n = c->nranks();
  std::vector<Range> sendRanges, recvRanges;
  ZP_CHECK(checkSide("send", sendbuff, sendcounts, sdispls, n, ts, &sendRanges));
  ZP_CHECK(checkSide("recv", recvbuff, recvcounts, rdispls, n, ts, &recvRanges));
  // Overlapping receive ranges, or receive ranges over send data, would make
  // the result depend on arrival order.
  auto byBegin = [](const Range& a, const Range& b) { return a.begin < b.begin; };
  std::sort(recvRanges.begin(), recvRanges.end(), byBegin);
  for (size_t i = 1; i < recvRanges.size(); i++)
    if (recvRanges[i].begin < recvRanges[i - 1].end)
      return fail(zpInvalidArgument, "zpAlltoallv: the receive ranges for ranks %d and %d overlap",
                  recvRanges[i - 1].peer, recvRanges[i].peer);
  std::sort(sendRanges.begin(), sendRanges.end(), byBegin);
  for (size_t i = 0, j = 0; i < sendRanges.size() && j < recvRanges.size();) {
    if (sendRanges[i].end <= recvRanges[j].begin) i++;
    else if (recvRanges[j].end <= sendRanges[i].begin) j++;
    else
      return fail(zpInvalidArgument,
                  "zpAlltoallv: the receive range for rank %d overlaps the send range for rank %d (in-place is not "
                  "supported)",
                  recvRanges[j].peer, sendRanges[i].peer);
  }
  return zpSuccess;
}

}  // namespace

zpResult_t refuseAlltoallv(Comm* c, zpResult_t code, const std::string& why, void* stream) {
  const int n = c->nranks();
  if (n == 1 || (stream && !c->routing() && !c->cfg().checkDeviceCalls)) return fail(code, "%s", why.c_str());
  const uint64_t seq = c->nextCollSeq();  // the same number as the peers' call
  std::vector<uint64_t> rows = refusedMatrix(c);
  if (stream || c->routing()) {  // the peers gather the count matrix first
    ZP_CHECK(gatherCounts(c, seq, &rows));
    return settleRefusals(c, seq, rows, code, why);
  }
  // The peers exchange data (and, up to kCountsInBand ranks, their rows as
  // its meta): this rank sends and takes empty messages, with its row, which
  // every peer's receive from it reads (a receive of another size is
  // refused and writes nothing, and the rows come ahead of the data).
  const bool inBand = n <= kCountsInBand;
  const uint32_t rowBytes = (uint32_t)(countRowLen(n) * sizeof(uint64_t));
  std::vector<Op> ops(2 * (size_t)(n - 1));
  std::vector<Op*> ptrs;
  for (int i = 1; i < n; i++) {
    const int to = (c->rank() + i) % n, from = (c->rank() - i + n) % n;
    Op& s = ops[2 * (i - 1)];
    s = Op(OpKind::kAlltoallv, true, to, nullptr, 0, 1);
    Op& r = ops[2 * (i - 1) + 1];
    r = Op(OpKind::kAlltoallv, false, from, nullptr, 0, 1);
    if (inBand) {
      s.meta = &rows[(size_t)c->rank() * countRowLen(n)];
      s.metaBytes = rowBytes;
      r.meta = &rows[(size_t)from * countRowLen(n)];
      r.metaBytes = rowBytes;
    }
    ptrs.push_back(&s);
    ptrs.push_back(&r);
  }
  const zpResult_t res = c->runOps(ptrs);
  if (res != zpSuccess && res != zpInvalidUsage) return fail(code, "%s", why.c_str());  // broken: this rank's error first
  if (c->asyncError() != zpSuccess) return fail(code, "%s", why.c_str());
  std::string mine = why;
  if (mine.compare(0, 13, "zpAlltoallv: ") == 0) mine.erase(0, 13);
  if (inBand) return settleRefusals(c, seq, rows, code, why);
  // Above kCountsInBand ranks the peers agree on the outcome by status
  // messages: the first failing rank's (a peer before this one may report
  // the count mismatch this rank's empty messages made instead).
  (void)c->agreeOnResult(seq, zpInvalidUsage, "rank " + std::to_string(c->rank()) + " refused zpAlltoallv: " + mine);
  return fail(code, "%s", why.c_str());
}

zpResult_t alltoallv(Comm* c, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                     void* recvbuff, const size_t recvcounts[], const size_t rdispls[], zpDataType_t dtype,
                     void* stream) {
  const int n = c->nranks();
  const size_t ts = zpTypeSize(dtype);
  const zpResult_t bad = checkArgs(c, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, ts);
  if (bad != zpSuccess) return refuseAlltoallv(c, bad, lastError(), stream);

  uint64_t seq = c->nextCollSeq();
  if (stream || c->routing()) {
    const zpResult_t res =
        stream ? deviceAlltoallv(c, seq, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, ts, stream)
               : routedAlltoallv(c, c->routing(), seq, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, ts);
    c->waitStats().callEnded(stampUs());  // the count rows' record was not the call's end
    return res;
  }
  // Up to kCountsInBand ranks, every message carries its sender's counts
  // (both rows), so every rank can check every pair itself: a mismatch is
  // caught by all ranks without a second round of messages. Larger
  // communicators exchange a status after the data instead.
  const bool inBand = n <= kCountsInBand;
  // The count matrix, filled by the messages as they arrive.
  const size_t rowLen = countRowLen(n);
  std::vector<uint64_t> rows;
  if (inBand) rows = countMatrix(c, sendcounts, recvcounts, ts);
  const uint32_t rowBytes = (uint32_t)(rowLen * sizeof(uint64_t));

  // Rank r sends to r+1, r+2, ... and receives from r-1, r-2, ..., so that no
  // rank is everybody's first target.
  std::vector<Op> ops(2 * n);
  std::vector<Op*> ptrs;
  for (int i = 0; i < n; i++) {
    int to = (c->rank() + i) % n, from = (c->rank() - i + n) % n;
    Op& s = ops[2 * i];
    s = Op(OpKind::kAlltoallv, true, to, blockAt(sendbuff, sdispls[to], sendcounts[to], ts), sendcounts[to] * ts, ts);
    Op& r = ops[2 * i + 1];
    r = Op(OpKind::kAlltoallv, false, from, blockAt(recvbuff, rdispls[from], recvcounts[from], ts), recvcounts[from] * ts, ts);
    if (inBand && i > 0) {
      s.meta = &rows[(size_t)c->rank() * rowLen];
      s.metaBytes = rowBytes;
      r.meta = &rows[(size_t)from * rowLen];
      r.metaBytes = rowBytes;
    }
    ptrs.push_back(&s);
    ptrs.push_back(&r);
  }
  // When each peer's first bytes (or its counts, ahead of them) came: the
  // wait statistics.
  markArrivals(c, ptrs);
  zpResult_t res = c->runOps(ptrs);
  if (res != zpSuccess && res != zpInvalidUsage) return res;  // the communicator is broken
  if (c->asyncError() != zpSuccess) return res;
  std::vector<uint64_t> outside;
  if (inBand) outside = timesOutside(rows, n, false);
  recordArrivals(c, ptrs, res, inBand ? &outside : nullptr);
  if (inBand) {
    ZP_CHECK(settleRefusals(c, seq, rows, zpSuccess, std::string()));
    ZP_CHECK(checkCounts(c, rows));
    return res;
  }
  // A count mismatch is seen by the receiving rank only: share it, so every
  // rank returns the same error.
  std::string msg;
  for (Op& op : ops)
    if (op.status != zpSuccess) {
      msg = op.error;
      break;
    }
  return c->agreeOnResult(seq, res, msg);
}


// The same verdict on every rank, from the whole matrix (peers' rows came
// over the wire: bounded here before anyone multiplies them).
zpResult_t checkCountMatrix(int me, int n, const std::vector<uint64_t>& rows) {
  const size_t rowLen = countRowLen(n);
  if (n < 1 || rows.size() != (size_t)n * rowLen)
    return fail(zpInternalError, "rank %d: alltoallv: a count matrix of %zu values for %d ranks", me, rows.size(), n);
  for (int i = 0; i < n; i++) {
    uint64_t ts = rows[(size_t)i * rowLen + 2 * n];
    if (ts != 1 && ts != 2 && ts != 4 && ts != 8)
      return fail(zpInvalidUsage, "rank %d: alltoallv: rank %d sent a datatype size of %llu bytes", me, i,
                  (unsigned long long)ts);
    if (ts != rows[2 * n])
      return fail(zpInvalidUsage, "rank %d: alltoallv: rank 0 passes a %llu-byte datatype but rank %d a %llu-byte one",
                  me, (unsigned long long)rows[2 * n], i, (unsigned long long)ts);
    for (int j = 0; j < 2 * n; j++)
      if (rows[(size_t)i * rowLen + j] > maxElements(ts))
        return fail(zpInvalidUsage, "rank %d: alltoallv: rank %d sent a count of %llu elements, beyond any call", me,
                    i, (unsigned long long)rows[(size_t)i * rowLen + j]);
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      uint64_t sent = rows[(size_t)i * rowLen + j], expected = rows[(size_t)j * rowLen + n + i];
      if (sent != expected)
        return fail(zpInvalidUsage, "rank %d: alltoallv: rank %d sends %llu elements to rank %d but rank %d expects %llu",
                    me, i, (unsigned long long)sent, j, j, (unsigned long long)expected);
    }
  return zpSuccess;
}

}  // namespace zp
