// The step engine: relay ids and the running of a round's ops, scratch
// memory, Step's rounds, and what every algorithm of a Call shares (the
// family, the node groups, the all-gather ring).
#include <algorithm>
#include <memory>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"
#include "src/core/routing.h"
#include "src/util/per_thread.h"

namespace zp {
namespace detail {

// Runs the ops, routing those to other nodes through the relay under id,
// its step tag plus lanes[i] for op i if given: the relay tells transfers apart by (source,
// destination, kind, id), so two ops of one round with the same peer need
// lanes of their own.
zpResult_t run(Comm* c, std::vector<Op>& ops, uint64_t id, const std::vector<uint64_t>* lanes) {
  bool remote = false;  // on one node no op is routed: no transfer ids to make
  for (const Op& op : ops) remote |= !c->isLocal(op.peer);
  std::vector<RoutedXfer> xfers(remote ? (lanes ? ops.size() : 1) : 0);
  // Kept from call to call on this thread (a small collective's round
  // allocates nothing); runOps lends it back before anything else runs.
  struct Lists {
    std::vector<Op*> ptrs;
  };
  std::vector<Op*>& ptrs = PerThread<Lists>::get().ptrs;
  ptrs.clear();
  for (size_t i = 0; i < ops.size(); i++) {
    if (remote && !c->isLocal(ops[i].peer)) {
      RoutedXfer& x = xfers[lanes ? i : 0];
      x.id = msgid::collectiveLane(id, lanes ? (*lanes)[i] : 0);
      ops[i].routed = &x;
    }
    ptrs.push_back(&ops[i]);
  }
  return c->runOps(ptrs);
}

char* scratch(Slot slot, size_t bytes) {
  struct Buf {
    std::unique_ptr<char[]> p;
    size_t cap = 0;
  };
  thread_local Buf bufs[kScratchCount];
  Buf& b = bufs[slot];
  if (b.cap < bytes) {
    b.p.reset();  // the old one first: the two need not fit at once
    b.cap = std::max(bytes, b.cap + b.cap / 2);
    b.p.reset(new char[b.cap]);  // not zero-filled: every byte is written before it is read
  }
  return b.p.get();
}

void Step::recvReduce(int peer, void* dst, const void* a, size_t bytes, zpDataType_t wt, zpRedOp_t op) {
  recv(peer, dst, bytes, zpTypeSize(wt));
  if (!bytes) return;
  Op& o = ops_.back();
  if (c_->transportFor(rankOf(peer))->canReduce()) {
    o.reduce = &kReducers[(size_t)wt * zpNumOps + (size_t)op];
    o.reduceSrc = a;
    return;
  }
  pending_.push_back({ops_.size() - 1, pendingBytes_, dst, a, bytes, wt, op});
  pendingBytes_ += (bytes + 63) & ~size_t(63);
}

bool Step::canGroup(const std::vector<int>& peers, size_t bytes) const {
  if (peers.empty() || !bytes) return false;
  const Transport* t = c_->transportFor(rankOf(peers[0]));
  for (int p : peers)
    if (c_->transportFor(rankOf(p)) != t || !t->canReduceGroup(rankOf(p), bytes)) return false;
  return true;
}

std::vector<Op> Step::take() {
  std::vector<Op> ops;
  ops.swap(ops_);
  lanes_.clear();
  return ops;
}

zpResult_t Step::run(uint64_t tag) {
  if (ops_.empty()) return zpSuccess;
  char* base = pending_.empty() ? nullptr : scratch(kScratchPending, pendingBytes_);
  for (Pending& p : pending_) ops_[p.op].buf = base + p.at;
  const bool lanes = std::any_of(lanes_.begin(), lanes_.end(), [](uint64_t l) { return l != 0; });
  ZP_CHECK(detail::run(c_, ops_, msgid::collectiveXfer(seq_, tagBase_ + tag), lanes ? &lanes_ : nullptr));
  for (Pending& p : pending_) reduceElems(p.dst, p.a, base + p.at, p.bytes / zpTypeSize(p.wt), p.wt, p.redop);
  ops_.clear();
  lanes_.clear();
  lane_ = 0;
  pending_.clear();
  pendingBytes_ = 0;
  return zpSuccess;
}

// The family of algorithms for this many bytes per rank: the same on
// every rank, as it depends only on what the header check made sure is
// the same (the settings included). Below the threshold the latency ones;
// from it on, on one node, direct exchange (single-copy shared memory
// gains nothing from a ring's n-1 hops, and every hop is a wait for a
// peer that may not be running), across nodes rings.
Call::Family Call::family(size_t bytesPerRank) const {
  switch (c->cfg().collAlgo) {
    case CollAlgo::kRing: return Family::kRing;
    case CollAlgo::kTree: return Family::kLatency;
    case CollAlgo::kDirect: return Family::kDirect;
    case CollAlgo::kAuto: break;
  }
  if (bytesPerRank < c->cfg().collRingAbove) return Family::kLatency;
  return allLocal() ? Family::kDirect : Family::kRing;
}

bool Call::allLocal() const {
  for (int p = 0; p < n; p++)
    if (!c->isLocal(p)) return false;
  return true;
}

// The ranks of my node (local) and the ranks at my place on every node
// (rail, in the order of the nodes' first ranks), and if asked every
// node's ranks in that order (grid[m][l]: the rank at place l of node m):
// false unless there are two nodes or more with the same number of ranks
// each.
bool Call::nodeGroups(std::vector<int>* local, std::vector<int>* rail,
                      std::vector<std::vector<int>>* grid) const {
  const std::vector<int>& nodeOf = c->nodeOf();
  std::vector<int> nodes;  // in order of their first rank
  std::vector<std::vector<int>> ranksOf;
  for (int r = 0; r < n; r++) {
    const size_t i = (size_t)(std::find(nodes.begin(), nodes.end(), nodeOf[r]) - nodes.begin());
    if (i == nodes.size()) {
      nodes.push_back(nodeOf[r]);
      ranksOf.emplace_back();
    }
    ranksOf[i].push_back(r);
  }
  if (nodes.size() < 2) return false;
  for (const std::vector<int>& rs : ranksOf)
    if (rs.size() != ranksOf[0].size()) return false;
  const size_t mine = (size_t)(std::find(nodes.begin(), nodes.end(), nodeOf[me]) - nodes.begin());
  *local = ranksOf[mine];
  const size_t place = (size_t)(std::find(local->begin(), local->end(), me) - local->begin());
  rail->clear();
  for (const std::vector<int>& rs : ranksOf) rail->push_back(rs[place]);
  if (grid) grid->swap(ranksOf);
  return true;
}
// The same, for the hierarchical all-gather and reduce-scatter: only with
// two ranks per node or more (with one, a flat ring is already the rail's).
bool Call::nodeGrid(std::vector<int>* local, std::vector<int>* rail, std::vector<std::vector<int>>* grid) const {
  return nodeGroups(local, rail, grid) && local->size() > 1;
}

// All-gather round the ring in buf (element size es) over blocks `b`:
// rank r starts holding block r+k (at `first` if given, else in buf) and
// ends holding all. A rank that has every block already (hasAll:
// broadcast's root) takes none, and its left neighbour sends it none.
zpResult_t Call::ringAllGather(char* buf, size_t es, const Blocks& b, int k, const char* first, int hasAll) {
  for (int s = 0; s < n - 1; s++) {
    ringAllGatherRound(buf, es, b, k, s, first, hasAll);
    ZP_CHECK(step.run(1000 + (uint64_t)s));
  }
  return zpSuccess;
}
// Round s of it, added to the step (not run).
void Call::ringAllGatherRound(char* buf, size_t es, const Blocks& b, int k, int s, const char* first, int hasAll) {
  const int right = mod(me + 1, n), sb = mod(me + k - s, n), rb = mod(me + k - s - 1, n);
  const char* from = s == 0 && first ? first : buf + b.off[sb] * es;
  if (right != hasAll) step.send(right, from, b.cnt[sb] * es, es);
  if (me != hasAll) step.recv(mod(me - 1, n), buf + b.off[rb] * es, b.cnt[rb] * es, es);
}

}  // namespace detail
}  // namespace zp
