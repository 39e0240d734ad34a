// Collectives and point-to-point calls: each turns a call into Ops (and, for
// collectives, an agreement on the outcome) and hands them to the executor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/comm.h"
#include "src/core/log.h"  // ZP_CHECK
#include "src/core/wait_stats.h"
#include "src/util/clock.h"

namespace zp {

// Bytes in one call are capped far below what size_t holds, so that counts
// that came from negative ints are caught instead of wrapping around.
constexpr size_t kMaxCallBytes = size_t(1) << 48;
// The most elements of ts bytes (a type's size: a power of two, not 0) a
// call may name: a shift, not a division (a 64-bit divide was a tenth of a
// small send's call).
inline size_t maxElements(size_t ts) { return kMaxCallBytes >> __builtin_ctzll(ts); }
// A datatype's size in bytes, 0 for none (zpTypeSize returns this): here,
// so that a call's path reads it without a call into the library's table.
inline size_t typeSize(zpDataType_t t) {
  switch (t) {
    case zpInt8: case zpUint8: return 1;
    case zpFloat16: case zpBfloat16: return 2;
    case zpInt32: case zpUint32: case zpFloat32: return 4;
    case zpInt64: case zpUint64: case zpFloat64: return 8;
    default: return 0;
  }
}

// The wait statistics of a call's receives on one communicator (wait_stats.h):
// when each peer's message began to arrive, against when this rank began to
// wait. A call without such a receive learns nothing (a send cannot tell
// when its peer entered) and is not recorded; nor does a receive from any
// source (its peer is not known until it matches). Whoever makes a call's
// ops marks the receives that count (Op::stampsArrival); the transports
// stamp them in the ops; when the call has run, recordArrivals reads the
// stamps. A call in which this rank never waited (no receive's entry was
// stamped) charges nobody: it is counted clean, at the cost of a pass over
// its ops, and nothing is set up before it runs.

// A host receive from a known peer other than this rank: an op whose
// arrival the statistics use.
inline bool stampsArrival(const Comm* c, const Op& op) {
  return !op.isSend && op.peer >= 0 && op.peer != c->rank() && !op.stream;
}
// Marks a call's ops made without marking them one by one.
inline void markArrivals(const Comm* c, const std::vector<Op*>& ops) {
  for (Op* op : ops) op->stampsArrival = stampsArrival(c, *op);
}
// recordArrivals' work for a call in which this rank waited (entered: its
// earliest entry stamp); p2p.cc.
void recordWaited(Comm* c, const std::vector<Op*>& ops, uint64_t entered, zpResult_t res,
                  const std::vector<uint64_t>* outside, bool endsCall);
// After a call whose ops were marked ran, with the communicator's lock
// still held. outside: each peer's time outside the library before the
// call, if the call carries it (WaitStats::record). endsCall: the call ends
// here (its end starts this rank's time outside until the next; a clean
// call's end is not stamped: its sub-microsecond length counts as time
// outside before the next call, which can only charge this rank more).
// Inlined into each call's path: out of line it was a tenth of a small
// send/recv's instructions.
__attribute__((always_inline)) inline void recordArrivals(Comm* c, const std::vector<Op*>& ops, zpResult_t res,
                                                          const std::vector<uint64_t>* outside = nullptr,
                                                          bool endsCall = true) {
  uint64_t entered = 0;
  bool stamped = false;
  for (const Op* op : ops) {
    stamped |= op->stampsArrival;
    // Only a stamped op has an entry stamp (Op::noteEntered).
    if (op->enteredUs && (!entered || op->enteredUs < entered)) entered = op->enteredUs;
  }
  if (!stamped) return;
  if (entered)
    recordWaited(c, ops, entered, res, outside, endsCall);
  else if (res == zpSuccess)
    c->waitStats().noteClean();
}

// stream: null for host buffers (the executor moves them before returning);
// a CUDA stream for device buffers (enqueued on the StreamTransport).
zpResult_t alltoallv(Comm* comm, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                     void* recvbuff, const size_t recvcounts[], const size_t rdispls[], zpDataType_t dtype,
                     void* stream);

// A zpAlltoallv whose arguments this rank refused (code, why: its own
// error), under the communicator's lock: where the peers' call exchanges
// anything on the host (host buffers; device buffers under
// ZP_CHECK_MODE=full or with routing on), this rank takes part with a row
// that says it refused, so that every rank fails the call (the others with
// zpInvalidUsage naming this rank and why) and the next call lines up.
// Returns code with why.
zpResult_t refuseAlltoallv(Comm* comm, zpResult_t code, const std::string& why, void* stream);

// alltoallv's count matrix, every rank's row [sendcounts..., recvcounts...,
// type size, rail report, time outside] as gathered from the peers (the
// rail report: Routing::railReport, 0 without routing; the time outside:
// the rank's microseconds outside the library before the call, for the
// wait statistics, WaitStats::outsideBefore): zpInvalidUsage (the same on
// every rank) if a datatype size or a count is impossible or a pair of
// ranks disagrees. me only names this rank in the message.
inline size_t countRowLen(int n) { return 2 * (size_t)n + 3; }
zpResult_t checkCountMatrix(int me, int n, const std::vector<uint64_t>& rows);

// The standard collectives (standard*.cc): checked against every rank's call
// first (zpInvalidUsage on every rank if any differs; arguments are checked
// by the caller), then rings on host buffers, or (a stream) NCCL's own
// collective on the StreamTransport.
zpResult_t collective(Comm* comm, const CollArgs& args, void* stream);
// A standard collective of this kind whose arguments this rank refused
// (code, why: its own error), called under the communicator's lock where
// the call would have compared headers (a host call, or ZP_CHECK_MODE=full):
// it still takes part in the header round with a header that says so, so
// that every rank fails this call (the others with zpInvalidUsage naming
// this rank and why) and the next call finds every rank in step. Returns
// code with why.
zpResult_t refuseCollective(Comm* comm, CollKind kind, zpResult_t code, const std::string& why);
// Lower-case names for messages and logs ("float32", "sum"; "?" if invalid).
const char* typeName(zpDataType_t t);
const char* opName(zpRedOp_t op);

// zpCommSplit's collective part (split.cc), under the parent's lock: every rank's
// (color, key) and the verdict on them (localCheck: this rank's own
// arguments, its message in lastError()), then the child's transports set up
// through the parent. *child stays empty for ZP_SPLIT_NOCOLOR. netEagerUpTo:
// the child's TransportSetup::eagerUpTo (the caller asks the routing layer).
zpResult_t commSplit(Comm* parent, int color, int key, zpResult_t localCheck, const Config& cfg,
                     size_t netEagerUpTo, std::unique_ptr<Comm>* child);

// Groups (thread-local, as in NCCL).
zpResult_t groupStart();
zpResult_t groupEnd(bool* ended = nullptr);  // ended: set when this call ended the outermost group
bool groupOpen();
// Queues a send or receive (runs it at once outside a group). hold keeps
// comm alive for the call or the group; it may be null only where the open
// group holds comm already (a send or receive of the group was made on it).
// A receive's peer may be kAnySource; source (receives only, may be null)
// gets the rank it was matched with.
zpResult_t enqueueP2P(Comm* comm, std::shared_ptr<Comm> hold, bool isSend, void* buf, size_t count,
                      zpDataType_t dtype, int peer, void* stream, int* source = nullptr);
// Queues a collective in the calling thread's open group (zpGroupEnd runs it).
void queueCollective(const std::shared_ptr<Comm>& comm, std::function<zpResult_t()> run);
// Queues a collective, or runs it at once outside a group; fn names it in
// errors. A template so that a call outside a group makes no std::function
// (its closure on the heap, per call).
template <class Run>
zpResult_t enqueueCollective(const std::shared_ptr<Comm>& comm, const char* fn, Run&& run) {
  if (groupOpen()) {
    queueCollective(comm, std::function<zpResult_t()>(std::forward<Run>(run)));
    return zpSuccess;
  }
  Comm::Call call(comm.get(), fn);
  ZP_CHECK(call.status());
  return run();
}
// True if the calling thread's open group has calls queued on comm.
bool groupUses(Comm* comm);

}  // namespace zp
