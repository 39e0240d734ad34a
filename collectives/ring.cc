// Rings over an ordered subset of a communicator's ranks, with a
// non-blocking exchange (send my block to the next rank, receive the
// previous rank's): start hands the grouped send/receive to the ring's
// worker thread and returns, so the caller computes on one block while the
// next moves; wait returns the exchange's result. Blocks may change size
// every step (variable-length sequences).
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/log.h"

#define ZP_API extern "C" __attribute__((visibility("default")))

struct zpRing {
  zpComm_t comm = nullptr;
  int next = -1, prev = -1;
  bool bidirectional = false;
  // The exchange handed to the worker.
  std::mutex mu;
  std::condition_variable cv;
  bool pending = false, running = false, stop = false;
  const char* send = nullptr;
  char* recv = nullptr;
  size_t sendBytes = 0, recvBytes = 0;
  zpResult_t result = zpSuccess;
  std::string error;
  std::thread worker;

  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return pending || stop; });
      if (stop) return;
      lock.unlock();
      zpResult_t r = exchange();
      std::string why = r == zpSuccess ? "" : zpGetLastError(comm);
      lock.lock();
      result = r;
      error = why;
      pending = false;
      cv.notify_all();
    }
  }

  zpResult_t exchange() {
    zpGroupStart();
    if (!bidirectional) {
      zpSend(send, sendBytes, zpUint8, next, comm, nullptr);
      zpRecv(recv, recvBytes, zpUint8, prev, comm, nullptr);
    } else {
      // The first half goes forward, the second backward: both directions of every link carry half.
      size_t sh = sendBytes / 2, rh = recvBytes / 2;
      zpSend(send, sh, zpUint8, next, comm, nullptr);
      zpSend(send + sh, sendBytes - sh, zpUint8, prev, comm, nullptr);
      zpRecv(recv, rh, zpUint8, prev, comm, nullptr);
      zpRecv(recv + rh, recvBytes - rh, zpUint8, next, comm, nullptr);
    }
    return zpGroupEnd();
  }
};

ZP_API zpResult_t zpRingCreate(zpRing_t* ring, zpComm_t comm, int nranks, const int* ranks, int bidirectional) {
  if (!ring || !ranks) return zp::fail(zpInvalidArgument, "zpRingCreate: ring or ranks is NULL");
  *ring = nullptr;
  int n = 0, me = 0;
  zpResult_t res = zpCommCount(comm, &n);
  if (res != zpSuccess) return res;
  ZP_CHECK(zpCommUserRank(comm, &me));
  if (nranks < 1 || nranks > n)
    return zp::fail(zpInvalidArgument, "zpRingCreate: %d ranks in a ring of a %d-rank communicator", nranks, n);
  int pos = -1;
  std::vector<bool> seen(n, false);
  for (int i = 0; i < nranks; i++) {
    if (ranks[i] < 0 || ranks[i] >= n || seen[ranks[i]])
      return zp::fail(zpInvalidArgument, "zpRingCreate: ranks[%d] = %d is out of range or repeated", i, ranks[i]);
    seen[ranks[i]] = true;
    if (ranks[i] == me) pos = i;
  }
  if (pos < 0) return zp::fail(zpInvalidArgument, "zpRingCreate: rank %d is not in the ring", me);
  zpRing* r = new zpRing;
  r->comm = comm;
  r->next = ranks[(pos + 1) % nranks];
  r->prev = ranks[(pos + nranks - 1) % nranks];
  r->bidirectional = bidirectional != 0;
  r->worker = std::thread([r] { r->loop(); });
  *ring = r;
  return zpSuccess;
}

ZP_API zpResult_t zpRingExchangeStart(zpRing_t ring, const void* sendbuf, size_t sendBytes, void* recvbuf,
                                      size_t recvBytes) {
  if (!ring) return zp::fail(zpInvalidArgument, "zpRingExchangeStart: ring is NULL");
  if ((sendBytes && !sendbuf) || (recvBytes && !recvbuf))
    return zp::fail(zpInvalidArgument, "zpRingExchangeStart: a NULL buffer with a nonzero size");
  std::lock_guard<std::mutex> lock(ring->mu);
  if (ring->pending || ring->running)
    return zp::fail(zpInvalidUsage, "zpRingExchangeStart: the ring's previous exchange was not waited for");
  ring->send = (const char*)sendbuf;
  ring->recv = (char*)recvbuf;
  ring->sendBytes = sendBytes;
  ring->recvBytes = recvBytes;
  ring->pending = ring->running = true;
  ring->cv.notify_all();
  return zpSuccess;
}

ZP_API zpResult_t zpRingExchangeWait(zpRing_t ring) {
  if (!ring) return zp::fail(zpInvalidArgument, "zpRingExchangeWait: ring is NULL");
  std::unique_lock<std::mutex> lock(ring->mu);
  if (!ring->running) return zp::fail(zpInvalidUsage, "zpRingExchangeWait: no exchange was started");
  ring->cv.wait(lock, [&] { return !ring->pending; });
  ring->running = false;
  if (ring->result != zpSuccess) return zp::fail(ring->result, "zpRingExchangeWait: %s", ring->error.c_str());
  return zpSuccess;
}

ZP_API zpResult_t zpRingDestroy(zpRing_t ring) {
  if (!ring) return zp::fail(zpInvalidArgument, "zpRingDestroy: ring is NULL");
  {
    std::unique_lock<std::mutex> lock(ring->mu);
    ring->cv.wait(lock, [&] { return !ring->pending; });  // an exchange in flight finishes first
    ring->stop = true;
    ring->cv.notify_all();
  }
  ring->worker.join();
  delete ring;
  return zpSuccess;
}
