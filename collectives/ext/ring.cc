// Rings over an ordered subset of a communicator's ranks, with a
// non-blocking exchange (send my block to the next rank, receive the
// previous rank's): start hands the grouped send/receive to the ring's
// worker thread and returns, so the caller computes on one block while the
// next moves; wait returns the exchange's result. Blocks may change size
// every step (variable-length sequences).
#include <vector>

#include "collectives/ext/async_p2p.h"
#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#include "src/util/nvtx.h"

struct zpRing {
  int next = -1, prev = -1;
  bool bidirectional = false;
  zpx::AsyncP2P exchange;
  explicit zpRing(zpComm_t comm) : exchange(comm) {}
};

zpResult_t zpRingCreate(zpRing_t* ring, zpComm_t comm, int nranks, const int* ranks, int bidirectional) try {
  if (!ring || !ranks) return zpSetLastError(comm, zpInvalidArgument, "zpRingCreate: ring or ranks is NULL");
  *ring = nullptr;
  int n = 0, me = 0;
  zpResult_t res = zpCommCount(comm, &n);
  if (res != zpSuccess) return res;
  ZPX_CHECK(zpCommUserRank(comm, &me));
  if (nranks < 1 || nranks > n)
    return zpSetLastError(comm, zpInvalidArgument, "zpRingCreate: %d ranks in a ring of a %d-rank communicator", nranks, n);
  int pos = -1;
  std::vector<bool> seen(n, false);
  for (int i = 0; i < nranks; i++) {
    if (ranks[i] < 0 || ranks[i] >= n || seen[ranks[i]])
      return zpSetLastError(comm, zpInvalidArgument, "zpRingCreate: ranks[%d] = %d is out of range or repeated", i, ranks[i]);
    seen[ranks[i]] = true;
    if (ranks[i] == me) pos = i;
  }
  if (pos < 0) return zpSetLastError(comm, zpInvalidArgument, "zpRingCreate: rank %d is not in the ring", me);
  zpRing* r = new zpRing(comm);
  r->next = ranks[(pos + 1) % nranks];
  r->prev = ranks[(pos + nranks - 1) % nranks];
  r->bidirectional = bidirectional != 0;
  *ring = r;
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpRingCreate");
}

zpResult_t zpRingExchangeStart(zpRing_t ring, const void* sendbuf, size_t sendBytes, void* recvbuf,
                                      size_t recvBytes, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpRingExchangeStart");
  if (!ring) return zpSetLastError(nullptr, zpInvalidArgument, "zpRingExchangeStart: ring is NULL");
  if ((sendBytes && !sendbuf) || (recvBytes && !recvbuf))
    return zpSetLastError(nullptr, zpInvalidArgument, "zpRingExchangeStart: a NULL buffer with a nonzero size");
  char* send = (char*)sendbuf;
  char* recv = (char*)recvbuf;
  if (!ring->bidirectional)
    return ring->exchange.start({{true, send, sendBytes, ring->next}, {false, recv, recvBytes, ring->prev}},
                                "zpRingExchangeStart", stream);
  // The first half goes forward, the second backward: both directions of every link carry half.
  size_t sh = sendBytes / 2, rh = recvBytes / 2;
  return ring->exchange.start({{true, send, sh, ring->next},
                               {true, send + sh, sendBytes - sh, ring->prev},
                               {false, recv, rh, ring->prev},
                               {false, recv + rh, recvBytes - rh, ring->next}},
                              "zpRingExchangeStart", stream);
} catch (...) {
  return zpx::failFromException("zpRingExchangeStart");
}

zpResult_t zpRingExchangeWait(zpRing_t ring) try {
  ZP_NVTX_RANGE("zpRingExchangeWait");
  if (!ring) return zpSetLastError(nullptr, zpInvalidArgument, "zpRingExchangeWait: ring is NULL");
  return ring->exchange.wait("zpRingExchangeWait");
} catch (...) {
  return zpx::failFromException("zpRingExchangeWait");
}

zpResult_t zpRingDestroy(zpRing_t ring) try {
  if (!ring) return zpSetLastError(nullptr, zpInvalidArgument, "zpRingDestroy: ring is NULL");
  delete ring;  // an exchange in flight finishes first
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpRingDestroy");
}
