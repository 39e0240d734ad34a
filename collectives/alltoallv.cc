#include <algorithm>
#include <deque>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "src/core/log.h"
#include "src/core/socket.h"

namespace zp {

namespace {

// Communicators up to this size send counts along with the data (16 n + 8 bytes a message).
constexpr int kCountsInBand = 64;

struct Range {
  uintptr_t begin, end;
  int peer;
};

// Checks counts and displacements of one side; fills the byte ranges it touches.
zpResult_t checkSide(const char* side, const void* buf, const size_t counts[], const size_t displs[], int n,
                     size_t ts, std::vector<Range>* ranges) {
  const char* countName = side[0] == 's' ? "sendcounts" : "recvcounts";
  const char* displName = side[0] == 's' ? "sdispls" : "rdispls";
  if (!counts) return fail(zpInvalidArgument, "zpAlltoallv: %s is NULL", countName);
  if (!displs) return fail(zpInvalidArgument, "zpAlltoallv: %s is NULL", displName);
  for (int p = 0; p < n; p++) {
    if (counts[p] > kMaxCallBytes / ts)
      return fail(zpInvalidArgument, "zpAlltoallv: %s[%d]=%zu is too large (a negative value cast to size_t?)",
                  countName, p, counts[p]);
    if (displs[p] > kMaxCallBytes / ts)
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


// ---- Rail routing (ZP_ROUTING=rail or balanced, several nodes and rails) ----
// NIC k of every node forms rail k, and a NIC reaches only its own rail. A
// block from s to a rank d on another node goes through the proxy on s's node
// that owns a NIC of d's rail: s hands it over shared memory, the proxy sends
// every block it holds for d as one message on d's rail. Each NIC then carries
// the traffic to its own rail's ranks, and every network connection stays on
// one rail. (The router of the routing issue will balance finer; this is its
// rail mode.)

// The rank of s's node that forwards s's blocks for d.
int railProxy(const Comm* c, int s, int d) {
  if (c->rail[s] == c->rail[d]) return s;
  auto it = c->railRanks.find({c->nodeOf[s], c->rail[d]});
  if (it == c->railRanks.end()) return s;  // the node has no NIC on that rail: send directly
  return it->second[c->localIndex[d] % it->second.size()];
}

bool useRailRouting(const Comm* c) {
  if (c->cfg.routing == zpRoutingOff || c->nnodes < 2) return false;
  for (int r = 1; r < c->nranks; r++)
    if (c->rail[r] != c->rail[0]) return true;
  return false;
}

zpResult_t runAll(Comm* c, std::deque<Op>& ops) {
  std::vector<Op*> ptrs;
  for (Op& op : ops) ptrs.push_back(&op);
  zpResult_t res = runOps(c, ptrs);
  ops.clear();
  return res;
}

zpResult_t railAlltoallv(Comm* c, uint64_t seq, const void* sendbuff, const size_t sendcounts[],
                         const size_t sdispls[], void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                         size_t ts) {
  const int n = c->nranks, me = c->rank;
  auto local = [&](int r) { return c->nodeOf[r] == c->nodeOf[me]; };
  const char* sbuf = (const char*)sendbuff;
  char* rbuf = (char*)recvbuff;
  std::deque<Op> ops;  // deque: ops keep their addresses

  // 1. The node's ranks share their send counts, so a proxy knows the size of
  //    every block it forwards.
  std::vector<std::vector<uint64_t>> rows(n);
  rows[me].assign(sendcounts, sendcounts + n);
  for (int q = 0; q < n; q++) {
    if (q == me || !local(q)) continue;
    rows[q].assign(n, 0);
    ops.push_back(makeOp(OpKind::kAlltoallv, true, q, rows[me].data(), n * sizeof(uint64_t), 1));
    ops.push_back(makeOp(OpKind::kAlltoallv, false, q, rows[q].data(), n * sizeof(uint64_t), 1));
  }
  zpResult_t res = runAll(c, ops);
  if (res != zpSuccess) return res;

  // What this rank forwards: per remote destination d, the blocks of the
  // local sources (rank order) whose proxy it is, with their counts. Blocks
  // of other sources are staged in the communicator's scratch memory (kept
  // between calls: fresh pages would cost a fault each); its own block is
  // sent from the send buffer.
  std::vector<std::vector<int>> forwardFrom(n);
  std::vector<std::vector<uint64_t>> forwardCounts(n);
  std::vector<std::vector<size_t>> slot(n);  // scratch offset of source s's block for d
  size_t scratchBytes = 0;
  for (int d = 0; d < n; d++) {
    if (local(d)) continue;
    slot[d].assign(n, 0);
    for (int s = 0; s < n; s++)
      if (local(s) && railProxy(c, s, d) == me) {
        forwardFrom[d].push_back(s);
        forwardCounts[d].push_back(rows[s][d]);
        if (s == me) continue;
        slot[d][s] = scratchBytes;
        scratchBytes += rows[s][d] * ts;
      }
  }
  char* scratch = c->scratch(scratchBytes);

  // 2. Over shared memory: blocks to local ranks, and blocks for other nodes
  //    to their proxies.
  for (int i = 0; i < n; i++) {
    // Per pair the same order on both sides: the direct block, then the
    // blocks forwarded for remote destinations in rank order.
    int to = (me + i) % n, from = (me - i + n) % n;
    if (local(to) && to != me) {
      ops.push_back(makeOp(OpKind::kAlltoallv, true, to, (void*)(sbuf + sdispls[to] * ts), sendcounts[to] * ts, ts));
      for (int d = 0; d < n; d++)
        if (!local(d) && railProxy(c, me, d) == to)
          ops.push_back(makeOp(OpKind::kAlltoallv, true, to, (void*)(sbuf + sdispls[d] * ts), sendcounts[d] * ts, ts));
    }
    if (local(from) && from != me) {
      ops.push_back(makeOp(OpKind::kAlltoallv, false, from, rbuf + rdispls[from] * ts, recvcounts[from] * ts, ts));
      for (int d = 0; d < n; d++)
        if (!local(d) && railProxy(c, from, d) == me)
          ops.push_back(makeOp(OpKind::kAlltoallv, false, from, scratch + slot[d][from], rows[from][d] * ts, ts));
    }
  }
  if (sendcounts[me] != recvcounts[me])
    res = fail(zpInvalidUsage, "rank %d: alltoallv: rank %d sends %zu elements to itself but expects %zu", me, me,
               sendcounts[me], recvcounts[me]);
  else if (sendcounts[me])
    memmove(rbuf + rdispls[me] * ts, sbuf + sdispls[me] * ts, sendcounts[me] * ts);
  uint64_t t2 = nowMs();
  zpResult_t r = runAll(c, ops);
  if (res == zpSuccess) res = r;
  if (res != zpSuccess && res != zpInvalidUsage) return res;
  uint64_t t3 = nowMs();

  // 3. Over the network, on the destination's rail: each forwarded block
  //    lands straight in its receive range; the first block of each (proxy,
  //    destination) pair carries the counts of all of them.
  std::vector<std::vector<int>> sourcesVia(n);  // by proxy: remote sources in rank order
  std::vector<std::vector<uint64_t>> incomingCounts(n);
  for (int s = 0; s < n; s++)
    if (!local(s)) sourcesVia[railProxy(c, s, me)].push_back(s);
  for (int i = 0; i < n; i++) {
    int to = (me + i) % n, from = (me - i + n) % n;
    if (!local(to)) {
      for (size_t k = 0; k < forwardFrom[to].size(); k++) {
        int s = forwardFrom[to][k];
        const char* block = s == me ? sbuf + sdispls[to] * ts : scratch + slot[to][s];
        Op op = makeOp(OpKind::kAlltoallv, true, to, (void*)block, rows[s][to] * ts, ts);
        if (k == 0) {
          op.meta = forwardCounts[to].data();
          op.metaBytes = (uint32_t)(forwardCounts[to].size() * sizeof(uint64_t));
        }
        ops.push_back(op);
      }
    }
    if (!local(from)) {
      incomingCounts[from].assign(sourcesVia[from].size(), 0);
      for (size_t k = 0; k < sourcesVia[from].size(); k++) {
        int s = sourcesVia[from][k];
        Op op = makeOp(OpKind::kAlltoallv, false, from, rbuf + rdispls[s] * ts, recvcounts[s] * ts, ts);
        if (k == 0) {
          op.meta = incomingCounts[from].data();
          op.metaBytes = (uint32_t)(incomingCounts[from].size() * sizeof(uint64_t));
        }
        ops.push_back(op);
      }
    }
  }
  r = runAll(c, ops);
  if (res == zpSuccess) res = r;
  if (res != zpSuccess && res != zpInvalidUsage) return res;
  uint64_t t4 = nowMs();
  ZP_TRACE(kSubColl, "rank %d: routed alltoallv: shared memory %llu ms, network %llu ms", me,
           (unsigned long long)(t3 - t2), (unsigned long long)(t4 - t3));

  // 4. Each block's count, as its source gave it, against this rank's.
  std::string msg = res == zpSuccess ? "" : lastError();
  for (int p = 0; p < n && res == zpSuccess; p++)
    for (size_t k = 0; k < sourcesVia[p].size(); k++) {
      int s = sourcesVia[p][k];
      if (incomingCounts[p][k] != recvcounts[s]) {
        res = fail(zpInvalidUsage, "rank %d: alltoallv: rank %d sends %llu elements to rank %d but rank %d expects %zu",
                   me, s, (unsigned long long)incomingCounts[p][k], me, me, recvcounts[s]);
        msg = lastError();
        break;
      }
    }
  // Some ranks may have seen a mismatch that others could not: agree.
  return agreeOnResult(c, seq, res, msg);
}

}  // namespace

zpResult_t alltoallv(Comm* c, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                     void* recvbuff, const size_t recvcounts[], const size_t rdispls[], zpDataType_t dtype) {
  const int n = c->nranks;
  const size_t ts = zpTypeSize(dtype);
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

  uint64_t seq = c->collSeq++;
  if (useRailRouting(c))
    return railAlltoallv(c, seq, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, ts);
  // Up to kCountsInBand ranks, every message carries its sender's counts
  // (both rows), so every rank can check every pair itself: a mismatch is
  // caught by all ranks without a second round of messages. Larger
  // communicators exchange a status after the data instead.
  const bool inBand = n <= kCountsInBand;
  // [rank][sendcounts..., recvcounts..., element size] as received
  const size_t rowLen = 2 * (size_t)n + 1;
  std::vector<uint64_t> rows;
  if (inBand) {
    rows.assign((size_t)n * rowLen, 0);
    for (int p = 0; p < n; p++) {
      rows[(size_t)c->rank * rowLen + p] = sendcounts[p];
      rows[(size_t)c->rank * rowLen + n + p] = recvcounts[p];
    }
    rows[(size_t)c->rank * rowLen + 2 * n] = ts;
  }
  const uint32_t rowBytes = (uint32_t)(rowLen * sizeof(uint64_t));

  // Rank r sends to r+1, r+2, ... and receives from r-1, r-2, ..., so that no
  // rank is everybody's first target.
  std::vector<Op> ops(2 * n);
  std::vector<Op*> ptrs;
  for (int i = 0; i < n; i++) {
    int to = (c->rank + i) % n, from = (c->rank - i + n) % n;
    Op& s = ops[2 * i];
    s = makeOp(OpKind::kAlltoallv, true, to, (char*)sendbuff + sdispls[to] * ts, sendcounts[to] * ts, ts);
    Op& r = ops[2 * i + 1];
    r = makeOp(OpKind::kAlltoallv, false, from, (char*)recvbuff + rdispls[from] * ts, recvcounts[from] * ts, ts);
    if (inBand && i > 0) {
      s.meta = &rows[(size_t)c->rank * rowLen];
      s.metaBytes = rowBytes;
      r.meta = &rows[(size_t)from * rowLen];
      r.metaBytes = rowBytes;
    }
    ptrs.push_back(&s);
    ptrs.push_back(&r);
  }
  zpResult_t res = runOps(c, ptrs);
  if (res != zpSuccess && res != zpInvalidUsage) return res;  // the communicator is broken
  if (c->asyncError != zpSuccess) return res;
  if (inBand) {
    for (int i = 1; i < n; i++)
      if (rows[(size_t)i * rowLen + 2 * n] != rows[2 * n])
        return fail(zpInvalidUsage, "rank %d: alltoallv: rank 0 passes a %llu-byte datatype but rank %d a %llu-byte one",
                    c->rank, (unsigned long long)rows[2 * n], i, (unsigned long long)rows[(size_t)i * rowLen + 2 * n]);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        uint64_t sent = rows[(size_t)i * rowLen + j], expected = rows[(size_t)j * rowLen + n + i];
        if (sent != expected)
          return fail(zpInvalidUsage, "rank %d: alltoallv: rank %d sends %llu elements to rank %d but rank %d expects %llu",
                      c->rank, i, (unsigned long long)sent, j, j, (unsigned long long)expected);
      }
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
  return agreeOnResult(c, seq, res, msg);
}

}  // namespace zp
