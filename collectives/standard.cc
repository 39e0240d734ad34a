// The standard collectives, with NCCL's semantics, on host buffers: a
// check that every rank called the same thing, then the data by one of two
// families of algorithms.
//
// Every call starts with each rank's header (which collective, count,
// datatype, op, root, the v calls' recvcounts) sent to every other rank and
// compared exactly: a rank that differs makes the call zpInvalidUsage on
// every rank, naming it, before any data moves; a rank that refused its own
// arguments still sends one, saying so, and every rank fails the call with
// its reason (refuseCollective). The exchange is also zpBarrier. A small
// all-reduce on one node sends its header with its data, in one round
// (fusedAllReduce): the header first, so that data is never taken for one.
//
// Then, by the bytes each rank holds (ZP_COLL_RING_ABOVE; ZP_COLL_ALGO
// forces one family):
//  - latency, below the threshold: recursive doubling (all-reduce),
//    binomial trees (broadcast, reduce), direct exchange (all-gather(v),
//    reduce-scatter(v)): log2(n) or one round of messages;
//  - bandwidth, from the threshold on, on one node: direct exchange, one
//    round per phase (reduce-scatter(v): every block to its owner;
//    all-gather(v): every block to every rank; all-reduce: the two,
//    overlapped; broadcast: every rank takes the whole buffer from the
//    root, read by single copy; reduce: a reduce-scatter, then every block
//    to the root);
//  - bandwidth, across nodes: rings. Reduce-scatter(v) is a ring of
//    n-1 steps, each rank sending a partial block to the next and reducing
//    the previous rank's into its own; all-reduce is that, then an all-gather
//    ring (each rank sends 2(n-1)/n of the buffer, the least possible);
//    broadcast scatters from the root, then all-gathers; reduce is a
//    reduce-scatter, then every rank's block to the root.
// A receive that reduces does so as the bytes arrive where the transport
// can (shared memory: Op::reduce, out of the ring's fragments or the
// sender's memory by single copy), else right after its step from scratch.
// The direct reduce-scatter's receives from every peer are one reduce group
// (OpReduceGroup) where all come by single copy: the transport reads a
// piece of each and reduces them together, straight into the output.
// float16 and bfloat16 travel and reduce in float32 and are rounded once at
// the end, as the API promises (twice the bytes on the wire for them).
// Across nodes the steps go through the relay like any collective's
// messages. On nodes of equal size (two ranks each or more) the bandwidth
// algorithms are hierarchical, so that every rank's NIC carries its share
// of the cross-node bytes instead of the one NIC whose rank's ring
// neighbour is on the next node:
//  - all-reduce: reduce-scatter in the node, one rail per shard across
//    nodes, all-gather in the node (allReduceNodes), its phases pipelined
//    over slices of the shards (ZP_COLL_SLICE, 1 MiB by default; 0 runs
//    them one after another);
//  - reduce-scatter(v) (and so reduce): reduce-scatter in the node, so that
//    local rank l holds its node's partial of the block of the rank at
//    place l on every node, then a ring among the ranks at place l of every
//    node over those pieces (reduceScatterNodes);
//  - all-gather(v): the mirror, a ring among the ranks at my place first,
//    then a direct all-gather in the node (allGatherNodes).
// Elsewhere (nodes of different sizes, one rank per node) flat rings.
//
// This file is the entry, collective(); the header check is in
// standard_check.cc, the arithmetic in standard_arith.cc, the step engine
// in standard_step.cc, the algorithms one collective per file
// (standard_allreduce.cc, standard_reduce_scatter.cc, standard_allgather.cc,
// standard_broadcast.cc, standard_reduce.cc; across nodes standard_nodes.cc), zpCommSplit's
// exchange in split.cc (standard_internal.h declares what they share).
#include <vector>

#include "collectives/collectives.h"
#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {

namespace {

// *atHeaders: whether the call ended with its header round (a refusal, a
// barrier, an empty call, the fused small all-reduce): no data moved after it.
zpResult_t runCollective(Comm* c, const CollArgs& a, void* stream, bool* atHeaders) {
  using namespace detail;
  const int n = c->nranks(), me = c->rank();
  const uint64_t seq = c->nextCollSeq();
  Header mine;
  mine.kind = (uint8_t)a.kind;
  mine.split = a.forSplit;
  mine.count = a.count;
  mine.dtype = (int32_t)a.dtype;
  mine.op = (int32_t)a.op;
  mine.root = a.root;
  if (isV(a.kind)) {  // every rank's count differs for all-gatherv: the total and the counts are what must agree
    mine.count = 0;
    for (int p = 0; p < n; p++) mine.count += a.counts[p];
  }
  // A host call always compares (it waits on its peers anyway); a device
  // call only with ZP_CHECK_MODE=full, since the exchange makes the host wait
  // for every peer's host. The check blocks on the network, never on the
  // GPU: a mismatch fails on every rank before anything is enqueued, instead
  // of hanging the device.
  *atHeaders = true;
  if (!stream && fusesCheck(c, a)) return fusedAllReduce(c, a, seq, mine);
  if (!stream || c->cfg().checkDeviceCalls) ZP_CHECK(checkHeaders(c, seq, mine, isV(a.kind) ? a.counts : nullptr));
  if (a.kind == CollKind::kBarrier || (isV(a.kind) ? mine.count : a.count) == 0) return zpSuccess;
  *atHeaders = false;
  if (stream) return c->enqueueCollectiveOnStream(a, stream);

  Call k(c, a, seq);
  const bool half = isHalf(a.dtype);
  const char* send = (const char*)a.send;
  char* recv = (char*)a.recv;
  switch (a.kind) {
    case CollKind::kAllGather:
    case CollKind::kAllGatherv: {
      // Every rank's block travels as it is: no arithmetic, no work type.
      std::vector<size_t> counts(n, a.count), displs(n);
      if (a.kind == CollKind::kAllGatherv) {
        counts.assign(a.counts, a.counts + n);
        displs.assign(a.displs, a.displs + n);
      } else {
        for (int p = 0; p < n; p++) displs[p] = (size_t)p * a.count;
      }
      return k.allGather(send, recv, Blocks::of(counts.data(), displs.data(), n));
    }
    case CollKind::kBroadcast:
      return k.broadcast();
    case CollKind::kAllReduce: {
      if (!half) {
        ZP_CHECK(k.allReduce(send, recv, a.count));
        finishAvg(recv, a.count, k.wt, a.op, n);
        return zpSuccess;
      }
      char* w = scratch(kScratchHalf, a.count * k.wts);
      toWork(send, w, a.count, a.dtype);
      ZP_CHECK(k.allReduce(w, w, a.count));
      finishAvg(w, a.count, k.wt, a.op, n);
      fromWork(w, recv, a.count, a.dtype);
      return zpSuccess;
    }
    case CollKind::kReduceScatter:
    case CollKind::kReduceScatterv: {
      std::vector<size_t> counts(n, a.count);
      if (a.kind == CollKind::kReduceScatterv) counts.assign(a.counts, a.counts + n);
      const Blocks b = Blocks::of(counts.data(), nullptr, n);
      const char* src = send;
      char* out = recv;
      if (half) {
        char* w = scratch(kScratchHalf, (b.total + b.cnt[me]) * k.wts);
        toWork(send, w, b.total, a.dtype);
        src = w;
        out = w + b.total * k.wts;
      }
      ZP_CHECK(k.reduceScatter(src, out, b));
      finishAvg(out, b.cnt[me], k.wt, a.op, n);
      if (half) fromWork(out, recv, b.cnt[me], a.dtype);
      return zpSuccess;
    }
    case CollKind::kReduce: {
      const bool root = me == a.root;
      if (!half) {
        ZP_CHECK(k.reduce(send, recv, a.count));
        if (root) finishAvg(recv, a.count, k.wt, a.op, n);
        return zpSuccess;
      }
      char* w = scratch(kScratchHalf, 2 * a.count * k.wts);
      char* out = w + a.count * k.wts;
      toWork(send, w, a.count, a.dtype);
      ZP_CHECK(k.reduce(w, out, a.count));
      if (root) {
        finishAvg(out, a.count, k.wt, a.op, n);
        fromWork(out, recv, a.count, a.dtype);
      }
      return zpSuccess;
    }
    case CollKind::kBarrier:
      break;
  }
  return zpSuccess;
}

}  // namespace

zpResult_t collective(Comm* c, const CollArgs& a, void* stream) {
  bool atHeaders = false;
  const zpResult_t r = runCollective(c, a, stream, &atHeaders);
  // The call's end starts this rank's time outside the library before its
  // next call (WaitStats::outsideBefore). A call that ended with its header
  // round ended at the round's last arrival, without a clock read of its own.
  if (!stream && c->nranks() > 1)
    c->waitStats().callEnded(atHeaders ? lastOf(detail::headerLists().arrivedUs) : stampUs());
  return r;
}

}  // namespace zp
