#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "src/core/log.h"

namespace zp {

namespace {

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
  // Rank r sends to r+1, r+2, ... and receives from r-1, r-2, ..., so that no
  // rank is everybody's first target.
  std::vector<Op> ops(2 * n);
  std::vector<Op*> ptrs;
  for (int i = 0; i < n; i++) {
    int to = (c->rank + i) % n, from = (c->rank - i + n) % n;
    Op& s = ops[2 * i];
    s.isSend = true;
    s.peer = to;
    s.kind = OpKind::kAlltoallv;
    s.buf = (char*)sendbuff + sdispls[to] * ts;
    s.bytes = sendcounts[to] * ts;
    s.typeSize = ts;
    Op& r = ops[2 * i + 1];
    r.peer = from;
    r.kind = OpKind::kAlltoallv;
    r.buf = (char*)recvbuff + rdispls[from] * ts;
    r.bytes = recvcounts[from] * ts;
    r.typeSize = ts;
    ptrs.push_back(&s);
    ptrs.push_back(&r);
  }
  zpResult_t res = runOps(c, ptrs);
  if (res != zpSuccess && res != zpInvalidUsage) return res;  // the communicator is broken
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
