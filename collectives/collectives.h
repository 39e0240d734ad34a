// Collectives and point-to-point calls: each turns a call into Ops (and, for
// collectives, an agreement on the outcome) and hands them to the executor.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "include/zeppelin.h"
#include "src/core/comm.h"

namespace zp {

// Bytes in one call are capped far below what size_t holds, so that counts
// that came from negative ints are caught instead of wrapping around.
constexpr size_t kMaxCallBytes = size_t(1) << 48;

// The standard collectives (collectives/coll.cc).
enum class CollKind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kBarrier,
  kAllGatherv,
  kReduceScatterv
};
struct CollArgs {
  CollKind kind = CollKind::kBarrier;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // count, sendcount (all-gather, all-gatherv) or recvcount (reduce-scatter)
  zpDataType_t dtype = zpUint8;
  zpRedOp_t op = zpSum;
  int root = 0;
  const size_t* counts = nullptr;  // the v calls' recvcounts
  const size_t* displs = nullptr;  // all-gatherv's rdispls
};
// Runs one collective (under the communicator's lock): every rank's
// arguments are compared first, and all fail alike if they disagree.
zpResult_t collective(Comm* comm, const CollArgs& args);
const char* collectiveName(CollKind kind);

// zpCommSplit's collective part, under the parent's lock: every rank's
// (color, key) and the verdict on them (localCheck: this rank's own
// arguments, its message in lastError()), then the child's transports set up
// through the parent. *child stays empty for ZP_SPLIT_NOCOLOR.
zpResult_t commSplit(Comm* parent, int color, int key, zpResult_t localCheck, const Config& cfg,
                     std::unique_ptr<Comm>* child);

zpResult_t alltoallv(Comm* comm, const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                     void* recvbuff, const size_t recvcounts[], const size_t rdispls[], zpDataType_t dtype);

// Groups (thread-local, as in NCCL).
zpResult_t groupStart();
zpResult_t groupEnd();
bool groupOpen();
// Queues a send or receive (runs it at once outside a group).
zpResult_t enqueueP2P(const std::shared_ptr<Comm>& comm, bool isSend, void* buf, size_t count, zpDataType_t dtype, int peer);
// Queues a collective (runs it at once outside a group).
zpResult_t enqueueCollective(const std::shared_ptr<Comm>& comm, std::function<zpResult_t()> run);
// True if the calling thread's open group has calls queued on comm.
bool groupUses(Comm* comm);

}  // namespace zp
