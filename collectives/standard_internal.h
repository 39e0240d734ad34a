// What the standard collectives' files (standard*.cc, split.cc) share: the
// relay ids of their messages, the header check's header, the arithmetic's
// entry points, scratch memory and the step engine (Step, Blocks, Call).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "src/core/msg_id.h"
#include "src/core/routing.h"

namespace zp {
namespace detail {

// Transfer ids of the relay for these calls: msgid::collectiveXfer (a step
// tag, the same on both ends of every message, and the sequence), with the
// step tags' ranges from src/core/msg_id.h.
using msgid::kHierLanes;
using msgid::kLaneRoom;
using msgid::kStepGather;
using msgid::kStepHeaders;
using msgid::kStepHier;
using msgid::kStepNodes;
using msgid::kStepResult;
using msgid::kStepSplit;
constexpr size_t kMaxSlices = 256;
// The size from which this communicator's routing relays a message between
// nodes (smaller ones go direct); 0 when it relays nothing (Routing).
inline size_t routedFrom(const Comm* c) {
  const Routing* r = c->routing();
  return r ? (size_t)r->directBelow() : 0;
}

// Runs the ops, routing those to other nodes through the relay under id
// (standard_step.cc).
zpResult_t run(Comm* c, std::vector<Op>& ops, uint64_t id, const std::vector<uint64_t>* lanes = nullptr);

// ---- The header check (standard_check.cc) ----
// all-gatherv, reduce-scatterv.
bool isV(CollKind k);

// Every rank's call, compared field by field (never by a hash) before any
// data moves. A header is always the first bytes of its message and is
// written here, never by the user: a round's message is a Header, then the
// v calls' recvcounts, then (the fused all-reduce) the data. So user data
// only ever follows a header and can never be taken for one, whatever
// message of whatever call it meets. The settings that choose the
// algorithms are compared at init (src/core/peer_info.h), not here.
// A header is 24 bytes, every field whole (dtype, op and root as the ints
// the caller passed): with a small all-reduce's data behind it, the message
// stays in the first cache line of its shared-memory record (MsgHdr).
constexpr uint8_t kHeaderMagic = 0x5a;  // a header that came (its slot holds 0 until then)
struct Header {
  uint8_t magic = kHeaderMagic;
  uint8_t kind = 0;   // a CollKind
  uint8_t split = 0;  // 1: zpCommSplit's own all-gather (kind kAllGather)
  // This rank refused its own arguments: it takes part in the round so that
  // every rank fails this call with its reason (the second round's) and
  // the next call runs.
  uint8_t refused = 0;
  int32_t root = 0;
  uint64_t count = 0;  // the v calls: the total of recvcounts
  int32_t dtype = 0, op = 0;
  // The v calls' recvcounts follow the header, one word per rank.
  bool hasCounts() const { return isV((CollKind)kind); }
  bool sameCall(const Header& o) const {
    return kind == o.kind && split == o.split && count == o.count && dtype == o.dtype && op == o.op &&
           root == o.root;
  }
};
static_assert(sizeof(Header) == 24, "a small all-reduce's message fits one shared-memory line");
static_assert(sizeof(Header) % 8 == 0, "data after a header stays 8-byte aligned");


// One round's messages, rank r's at base + r * stride: a Header, its
// recvcounts (countWords of them), and whatever follows.
struct HeaderSlots {
  char* base;
  size_t stride;
  Header& at(int r) const { return *(Header*)(base + (size_t)r * stride); }
  const uint64_t* counts(int r) const { return (const uint64_t*)(base + (size_t)r * stride + sizeof(Header)); }
};

// The check goes in one round when the calls agree: every rank sends every
// other its header (and a v call's recvcounts) and compares what comes
// exactly with its own. If any differs, never came, or refuses, then every
// rank sees one that is not its own accepted call, so every rank goes on to
// a second round of fixed-size records (each rank's header and, if it
// refused, its reason), where the error names the refusing rank and its
// reason, or the calls that differ.
// zpInvalidUsage on every rank unless every rank's call is mine (counts: a
// v call's recvcounts, else null).
zpResult_t checkHeaders(Comm* c, uint64_t seq, const Header& mine, const size_t* counts);
// After the first round moved slots s (this rank's own at s.at(me)) with
// result `moved`: a peer's failure (anything but zpInvalidUsage) or a
// broken communicator as it is; else, unless every slot holds this rank's
// call, accepted, the second round and the error; else `moved`
// (zpInvalidUsage there is a message of another size that the headers do
// not explain). refusedCode: this rank's own error when it refused (its
// message is refusedWhy).
zpResult_t settleHeaders(Comm* c, uint64_t seq, const HeaderSlots& s, zpResult_t moved,
                         zpResult_t refusedCode = zpSuccess, const std::string& refusedWhy = std::string());
// The header exchange's lists (the slots, the ops, the fused all-reduce's
// inputs), kept from call to call on the calling thread: a barrier or a
// small all-reduce allocates nothing.
struct HeaderLists {
  std::vector<uint64_t> slots;
  std::vector<uint64_t> arrivedUs;  // when each peer's header came (runHeaderRound)
  std::vector<Op> ops;
  std::vector<const char*> in;
};
HeaderLists& headerLists();
// Runs a header round's ops (run(c, ops, id)), noting when each peer's
// header arrived; the arrivals of a round that succeeded go to the
// communicator's WaitStats, which may name a rank that lags (one WARN line).
zpResult_t runHeaderRound(Comm* c, std::vector<Op>& ops, uint64_t id);
// The ops of a round in which this rank sends its slot to every peer and
// receives each peer's into its slot (every slot's magic cleared first).
std::vector<Op>& headerOps(Comm* c, const HeaderSlots& s);

// A small all-reduce on one node, its header check fused into its one round
// (standard_allreduce.cc); false if this call is not one.
bool fusesCheck(Comm* c, const CollArgs& a);
zpResult_t fusedAllReduce(Comm* c, const CollArgs& a, uint64_t seq, const Header& mine);

// SplitMix64: the split's secret.
inline uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ---- Arithmetic (standard_arith.cc) ----
// The type the data travels and adds in: float32 for the 16-bit floats.
inline bool isHalf(zpDataType_t t) { return t == zpFloat16 || t == zpBfloat16; }
inline zpDataType_t workType(zpDataType_t t) { return isHalf(t) ? zpFloat32 : t; }

// dst = a op b, elems of the work type wt (dst may be a or b).
void reduceElems(void* dst, const void* a, const void* b, size_t elems, zpDataType_t wt, zpRedOp_t op);
// out = in[0] op in[1] op ... op in[k-1], in that order for every element,
// a cache-sized piece at a time (one pass over memory, not k-1). out may be
// in[0], no other.
void reduceMany(void* out, const std::vector<const char*>& in, size_t elems, zpDataType_t wt, zpRedOp_t op);
// The transports' reduce-while-copying: one reducer per (work type, op), at
// [work type * zpNumOps + op].
extern const OpReducer kReducers[zpNumTypes * zpNumOps];
// Work buffers: the data in its work type (float32 for the 16-bit floats).
void toWork(const void* src, void* dst, size_t elems, zpDataType_t t);
void fromWork(const void* src, void* dst, size_t elems, zpDataType_t t);
// zpAvg's division by n, at the end (nothing for the other ops).
void finishAvg(char* work, size_t elems, zpDataType_t wt, zpRedOp_t op, int n);

// ---- Steps (standard_step.cc) ----
// Scratch memory of the calling thread (a call runs under its
// communicator's lock, in one thread), kept between calls so that large
// collectives do not fault fresh pages in every time.
// Each use has its own slot, so that no two of one call share memory.
enum Slot {
  kScratchPending,  // receives whose transport cannot reduce (Step)
  kScratchAcc0,     // partial results: ring reduce-scatter, recursive doubling, direct reduce-scatter
  kScratchAcc1,     // the ring's other partial; the reduce tree's
  kScratchMine,     // a non-root's block of reduce's reduce-scatter
  kScratchHalf,     // float16 / bfloat16 in float32
  kScratchNodeIn,   // the hierarchical reduce-scatter's receives inside the node
  kScratchNodePart, // and its node's partial sums, the rail ring's input
  kScratchCount
};
char* scratch(Slot slot, size_t bytes);

// One round of a call's messages: its sends and receives run together. tag
// names the round in the relay's transfer ids, the same at both ends of each
// message (ranks run different numbers of rounds in the trees).
class Step {
 public:
  Step(Comm* c, uint64_t seq) : c_(c), seq_(seq) {}
  // From now on peers are indices into members (null: ranks), and tags
  // start at tagBase (a subgroup's rounds get ids of their own).
  void within(const std::vector<int>* members, uint64_t tagBase) {
    members_ = members;
    tagBase_ = tagBase;
  }
  // Ops added from now on are on this lane (their round tag plus lane, in
  // the relay's ids), until the step runs: ops of one round with the same
  // peer must be on different lanes.
  void lane(uint64_t l) { lane_ = l; }
  void send(int peer, const void* buf, size_t bytes, size_t ts) {
    ops_.emplace_back(OpKind::kCollective, true, rankOf(peer), (void*)buf, bytes, ts);
    lanes_.push_back(lane_);
  }
  // A send whose receiver reduces what it carries (Op::reducedByPeer).
  void sendToReduce(int peer, const void* buf, size_t bytes, size_t ts) {
    send(peer, buf, bytes, ts);
    ops_.back().reducedByPeer = true;
  }
  void recv(int peer, void* buf, size_t bytes, size_t ts) {
    ops_.emplace_back(OpKind::kCollective, false, rankOf(peer), buf, bytes, ts);
    lanes_.push_back(lane_);
  }
  // Receives bytes of wt and stores dst = a op them: while copying where the
  // transport can, else into scratch and reduced once the round is done.
  void recvReduce(int peer, void* dst, const void* a, size_t bytes, zpDataType_t wt, zpRedOp_t op);
  // A receive that is member `slot` of group g (OpReduceGroup): reduced
  // with the others by the transport, into the group's out.
  void recvInGroup(int peer, const OpReduceGroup* g, int slot, size_t ts) {
    recv(peer, g->out, g->bytes, ts);
    ops_.back().group = g;
    ops_.back().groupSlot = slot;
  }
  // Whether receives of `bytes` from these peers can form a group: all on
  // one transport that can reduce them together.
  bool canGroup(const std::vector<int>& peers, size_t bytes) const;
  // The ops added so far, for a caller that runs them itself (on one node,
  // where no op is routed, so none needs a transfer id). Only plain sends
  // and receives: no lanes, no reduce into scratch.
  std::vector<Op> take();
  // Runs the ops added so far as round tag, then the reduces from scratch.
  zpResult_t run(uint64_t tag);

 private:
  struct Pending {
    size_t op, at;  // which op, where in scratch
    void* dst;
    const void* a;
    size_t bytes;
    zpDataType_t wt;
    zpRedOp_t redop;
  };
  int rankOf(int peer) const { return members_ ? (*members_)[peer] : peer; }
  Comm* c_;
  uint64_t seq_;
  const std::vector<int>* members_ = nullptr;
  uint64_t tagBase_ = 0;
  std::vector<Op> ops_;  // detail::run takes their addresses only once they are all here
  std::vector<uint64_t> lanes_;  // each op's
  uint64_t lane_ = 0;
  std::vector<Pending> pending_;
  size_t pendingBytes_ = 0;
};

// A buffer cut into n blocks, in elements: block b is [off[b], off[b] + cnt[b]).
struct Blocks {
  std::vector<size_t> off, cnt;
  size_t maxCnt = 0, total = 0;
  static Blocks even(size_t count, int n) {  // count cut as evenly as can be
    std::vector<size_t> c(n);
    for (int i = 0; i < n; i++) c[i] = count * (i + 1) / n - count * i / n;
    return of(c.data(), nullptr, n);
  }
  static Blocks of(const size_t* counts, const size_t* displs, int n) {  // packed without displs
    Blocks b;
    for (int i = 0; i < n; i++) {
      b.off.push_back(displs ? displs[i] : b.total);
      b.cnt.push_back(counts[i]);
      b.total += counts[i];
      b.maxCnt = std::max(b.maxCnt, counts[i]);
    }
    return b;
  }
};

inline int mod(int a, int n) { return ((a % n) + n) % n; }

// One call on host buffers, with what its algorithms need. Each algorithm
// uses its own range of round tags (the header check is 0).
// What all algorithms share is in standard_step.cc (the ring reduce-scatter
// here, as a template), the algorithms in standard_allreduce.cc,
// standard_reduce_scatter.cc, standard_allgather.cc, standard_nodes.cc,
// standard_broadcast.cc and standard_reduce.cc.
struct Call {
  Comm* c;
  const CollArgs& a;
  int n, me;  // the ranks the algorithms run over and my index among them (see within)
  const zpDataType_t wt;  // the work type
  const size_t ts, wts;   // the user's and the work type's element sizes
  Step step;
  std::deque<OpReduceGroup> groups;  // the call's reduce groups (their ops point at them)
  Call(Comm* comm, const CollArgs& args, uint64_t seq)
      : c(comm),
        a(args),
        n(comm->nranks()),
        me(comm->rank()),
        wt(workType(args.dtype)),
        ts(zpTypeSize(args.dtype)),
        wts(zpTypeSize(workType(args.dtype))),
        step(comm, seq) {}

  // The family of algorithms for this many bytes per rank (the same on
  // every rank).
  enum class Family { kLatency, kRing, kDirect };
  Family family(size_t bytesPerRank) const;
  bool ring(size_t bytesPerRank) const { return family(bytesPerRank) == Family::kRing; }
  bool allLocal() const;  // every rank on my node

  // Runs f with the algorithms over some of the ranks (members, in the
  // order they take): n and me are their count and my index among them.
  template <class F>
  zpResult_t within(const std::vector<int>& members, uint64_t tagBase, F f) {
    const int n0 = n, me0 = me;
    n = (int)members.size();
    me = (int)(std::find(members.begin(), members.end(), c->rank()) - members.begin());
    step.within(&members, tagBase);
    const zpResult_t r = f();
    n = n0;
    me = me0;
    step.within(nullptr, 0);
    return r;
  }

  // My node's ranks, the ranks at my place on every node, every node's
  // ranks: false unless the nodes are two or more of the same size.
  bool nodeGroups(std::vector<int>* local, std::vector<int>* rail,
                  std::vector<std::vector<int>>* grid = nullptr) const;
  // The same, with two ranks per node or more.
  bool nodeGrid(std::vector<int>* local, std::vector<int>* rail, std::vector<std::vector<int>>* grid) const;

  // ---- Rings ----
  // Reduce-scatter round the ring over blocks `b` of the work type: src holds
  // this rank's contribution to every block. Rank r sends block r+k first
  // and ends holding block r+k+1 reduced over every rank, at acc(n-2, block);
  // acc(s, block) is where round s leaves its partial result (it must stay
  // put until round s+1 has sent it).
  template <class Acc>
  zpResult_t ringReduceScatter(const char* src, const Blocks& b, int k, Acc acc) {
    for (int s = 0; s < n - 1; s++) {
      ringReduceScatterRound(src, b, k, s, acc);
      ZP_CHECK(step.run(1 + (uint64_t)s));
    }
    return zpSuccess;
  }
  // Round s of it, added to the step (not run).
  template <class Acc>
  void ringReduceScatterRound(const char* src, const Blocks& b, int k, int s, Acc acc) {
    const int sb = mod(me + k - s, n), rb = mod(me + k - s - 1, n);
    const char* from = s == 0 ? src + b.off[sb] * wts : acc(s - 1, sb);
    step.sendToReduce(mod(me + 1, n), from, b.cnt[sb] * wts, wts);
    step.recvReduce(mod(me - 1, n), acc(s, rb), src + b.off[rb] * wts, b.cnt[rb] * wts, wt, a.op);
  }

  // All-gather round the ring in buf over blocks b, and round s of it.
  zpResult_t ringAllGather(char* buf, size_t es, const Blocks& b, int k, const char* first, int hasAll = -1);
  void ringAllGatherRound(char* buf, size_t es, const Blocks& b, int k, int s, const char* first, int hasAll = -1);

  // ---- All-reduce (standard_allreduce.cc) ----
  zpResult_t allReduce(const char* src, char* w, size_t count);
  zpResult_t allReduceNodes(const char* src, char* w, size_t count, const std::vector<int>& local,
                            const std::vector<int>& rail);
  zpResult_t allReduceDirectOverlapped(const char* src, char* w, const Blocks& b);

  // ---- Reduce-scatter(v) and all-gather(v) (standard_reduce_scatter.cc,
  // standard_allgather.cc; across nodes standard_nodes.cc) ----
  zpResult_t reduceScatter(const char* src, char* out, const Blocks& b);
  zpResult_t reduceScatter(const char* src, char* out, const Blocks& b, Family f);
  bool reduceScatterDirectRound(const char* src, const Blocks& b, char* in, char* out);
  void reduceScatterDirectFinish(const char* src, char* out, const Blocks& b, const char* in, bool grouped);
  zpResult_t allGatherDirect(char* buf, size_t es, const Blocks& b, const char* first, int hasAll = -1);
  void allGatherDirectRound(char* buf, size_t es, const Blocks& b, const char* first, int hasAll = -1);
  zpResult_t reduceScatterNodes(const char* src, char* out, const Blocks& b, const std::vector<int>& local,
                                const std::vector<int>& rail, const std::vector<std::vector<int>>& grid);
  zpResult_t allGatherNodes(const char* sendbuff, char* recvbuff, const Blocks& b, const std::vector<int>& local,
                            const std::vector<int>& rail, const std::vector<std::vector<int>>& grid);
  template <class Round>
  zpResult_t railRing(const Blocks& b, size_t es, Round round);
  static Blocks nodeBlocksOf(const Blocks& b, const std::vector<int>& ranks);
  zpResult_t allGather(const char* sendbuff, char* recvbuff, const Blocks& b);

  // ---- Broadcast and reduce (standard_broadcast.cc, standard_reduce.cc) ----
  zpResult_t broadcast();
  zpResult_t reduce(const char* src, char* out, size_t count);
};

}  // namespace detail
}  // namespace zp
