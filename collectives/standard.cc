// The standard collectives, with NCCL's semantics, on host buffers: a
// check that every rank called the same thing, then the data by one of two
// families of algorithms.
//
// Every call starts with each rank's header (which collective, count,
// datatype, op, root, a hash of the v calls' recvcounts) sent to every other
// rank: a rank that differs makes the call zpInvalidUsage on every rank,
// naming it, before any data moves. The exchange is also zpBarrier.
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
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/collectives.h"
#include "src/core/log.h"
#include "src/route/relay.h"

namespace zp {

namespace {

// Transfer ids of the relay for these calls, apart from alltoallv's: bit 61,
// a step tag from bit 40 (0 the header check, then each algorithm's own,
// the same on both ends of every message), the sequence.
constexpr uint64_t kCollectiveXfer = 1ull << 61;
constexpr uint64_t kStepGather = 0xFFFE, kStepResult = 0xFFFD, kStepSplit = 0xFFF0;
// The hierarchical all-reduce's rounds: tags from kStepNodes on, kLaneRoom
// of them (the step field has 21 bits).
constexpr uint64_t kStepNodes = 0x10000, kLaneRoom = (1u << 21) - kStepNodes;
// The hierarchical all-gather's and reduce-scatter's rounds: the node's
// round at kStepHier, the rail ring's messages from kStepHier + 1 on, one
// lane each, kHierLanes of them (below kStepFixed, where the fixed tags
// are: reduce's kStepGather follows its reduce-scatter in one call).
constexpr uint64_t kStepHier = 0x8000, kStepFixed = 0xFFF0, kHierLanes = kStepFixed - kStepHier - 1;
constexpr size_t kMaxSlices = 256;
uint64_t xferId(uint64_t seq, uint64_t step) { return kCollectiveXfer | step << 40 | (seq & ((1ull << 40) - 1)); }

const char* kindName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "allreduce";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kReduce: return "reduce";
    case CollKind::kAllGather: return "allgather";
    case CollKind::kReduceScatter: return "reducescatter";
    case CollKind::kBarrier: return "barrier";
    case CollKind::kAllGatherv: return "allgatherv";
    case CollKind::kReduceScatterv: return "reducescatterv";
  }
  return "collective";
}

// Runs the ops, routing those to other nodes through the relay under id,
// its step tag plus lanes[i] for op i if given: the relay tells transfers apart by (source,
// destination, kind, id), so two ops of one round with the same peer need
// lanes of their own.
zpResult_t run(Comm* c, std::vector<Op>& ops, uint64_t id, const std::vector<uint64_t>* lanes = nullptr) {
  bool remote = false;  // on one node no op is routed: no transfer ids to make
  for (const Op& op : ops) remote |= !c->isLocal(op.peer);
  std::vector<RoutedXfer> xfers(remote ? (lanes ? ops.size() : 1) : 0);
  std::vector<Op*> ptrs;
  ptrs.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); i++) {
    if (remote && !c->isLocal(ops[i].peer)) {
      RoutedXfer& x = xfers[lanes ? i : 0];
      x.id = id + ((lanes ? (*lanes)[i] : 0) << 40);  // in the step tag's bits (xferId)
      ops[i].routed = &x;
    }
    ptrs.push_back(&ops[i]);
  }
  return c->runOps(ptrs);
}

// ---- The header check ----
// count: the v calls' total of recvcounts (their per-rank counts agree
// when countsHash does).
// settings: the ones that choose the algorithm, which must agree too.
struct Header {
  uint64_t kind, count, dtype, op, root, countsHash, settings = 0;
  bool operator==(const Header& o) const {
    return kind == o.kind && count == o.count && dtype == o.dtype && op == o.op && root == o.root &&
           countsHash == o.countsHash;
  }
};

bool isV(CollKind k) { return k == CollKind::kAllGatherv || k == CollKind::kReduceScatterv; }
bool reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter ||
         k == CollKind::kReduceScatterv;
}

uint64_t hashCounts(const size_t* counts, int n) {  // FNV-1a over the counts' bytes
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) h = (h ^ (((uint64_t)counts[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  return h;
}

// A header's kind carries this bit for zpCommSplit's own all-gather.
constexpr uint64_t kSplitHeader = uint64_t(1) << 32;

std::string describe(const Header& h) {
  if (h.kind & kSplitHeader) return "zpCommSplit";
  CollKind k = (CollKind)h.kind;
  std::string s = kindName(k);
  if (k == CollKind::kBarrier) return s;
  s += " of " + std::to_string(h.count) + " " + typeName((zpDataType_t)h.dtype);
  if (isV(k)) s += " in all, split by recvcounts with hash " + std::to_string(h.countsHash % 100000);
  if (reduces(k)) s += std::string(" (") + opName((zpRedOp_t)h.op) + ")";
  if (k == CollKind::kBroadcast || k == CollKind::kReduce) s += " to root " + std::to_string(h.root);
  return s;
}

zpResult_t checkHeaders(Comm* c, uint64_t seq, const Header& mine) {
  const int n = c->nranks(), me = c->rank();
  std::vector<Header> all(n);
  all[me] = mine;
  std::vector<Op> ops;
  ops.reserve(2 * (size_t)(n - 1));
  for (int i = 1; i < n; i++) {
    int to = (me + i) % n, from = (me - i + n) % n;
    ops.push_back(makeOp(OpKind::kCollective, true, to, &all[me], sizeof(Header), 1));
    ops.push_back(makeOp(OpKind::kCollective, false, from, &all[from], sizeof(Header), 1));
  }
  ZP_CHECK(run(c, ops, xferId(seq, 0)));
  for (int r = 1; r < n; r++)
    if (!(all[r] == all[0]))
      return fail(zpInvalidUsage, "rank %d: rank 0 calls %s but rank %d calls %s", me, describe(all[0]).c_str(), r,
                  describe(all[r]).c_str());
  for (int r = 1; r < n; r++)
    if (all[r].settings != all[0].settings)
      return fail(zpInvalidUsage, "rank %d: ranks 0 and %d choose collective algorithms differently (ZP_COLL_ALGO, "
                  "ZP_COLL_RING_ABOVE, ZP_COLL_SLICE, ZP_ROUTING, ZP_ROUTE_DIRECT_BELOW must be the same on every rank)",
                  me, r);
  return zpSuccess;
}

// ---- Arithmetic ----
float halfToFloat(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do {
        e++;
        m <<= 1;
      } while (!(m & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (m & 0x3FF) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {  // round to nearest even
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) return sign | (absx > 0x7F800000 ? 0x7E00 : 0x7C00);  // NaN, inf
  if (absx >= 0x477FF000) return sign | 0x7C00;  // rounds past the largest half: inf
  if (absx < 0x33000000) return sign;  // below half the smallest subnormal: zero
  if (absx < 0x38800000) {  // below the smallest normal: a subnormal, in units of 2^-24
    const int shift = 126 - (int)(absx >> 23);  // 14..24
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t r = absx - 0x38000000;  // rebias the exponent from 127 to 15
  const uint32_t rem = r & 0x1FFF;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return sign | (uint16_t)r;
}

float bf16ToFloat(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {  // round to nearest even
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40);  // NaN stays NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

// dst[i] = a[i] op b[i] (dst may be a or b); zpAvg sums, divided at the end.
// The bulk goes 16 bytes at a time as GCC vectors (the compiler picks the
// instructions: SSE2 on any x86-64): the plain loop stayed scalar at -O2,
// one element per instruction, a fifth of a large all-reduce's time, as
// GCC's cheap cost model vectorises no loop that needs a run-time check
// that dst does not overlap a or b. f works on vectors and scalars alike.
template <class T, class F>
void reduceWith(T* dst, const T* a, const T* b, size_t n, F f) {
  typedef T Vec __attribute__((vector_size(16)));  // SSE2: wider ones change the ABI of f
  constexpr size_t kLanes = sizeof(Vec) / sizeof(T);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Vec x, y;
    memcpy(&x, a + i, sizeof(Vec));
    memcpy(&y, b + i, sizeof(Vec));
    x = f(x, y);
    memcpy(dst + i, &x, sizeof(Vec));
  }
  for (; i < n; i++) dst[i] = f(a[i], b[i]);
}
template <class T>
void reduce3(T* dst, const T* a, const T* b, size_t n, zpRedOp_t op) {
  // decltype(x)(...): back to the element type after C++'s integer promotion.
  switch (op) {
    case zpSum:
    case zpAvg: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(x + y); }); break;
    case zpProd: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(x * y); }); break;
    case zpMax: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(x < y ? y : x); }); break;  // std::max
    case zpMin: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(y < x ? y : x); }); break;  // std::min
    default: break;
  }
}

template <class T>
void divideBy(T* acc, size_t n, int by) {
  for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)by);
}

// The type the data travels and adds in: float32 for the 16-bit floats.
bool isHalf(zpDataType_t t) { return t == zpFloat16 || t == zpBfloat16; }
zpDataType_t workType(zpDataType_t t) { return isHalf(t) ? zpFloat32 : t; }

template <class F>
void dispatch(zpDataType_t t, F f) {
  switch (t) {
    case zpInt8: f((int8_t*)nullptr); break;
    case zpUint8: f((uint8_t*)nullptr); break;
    case zpInt32: f((int32_t*)nullptr); break;
    case zpUint32: f((uint32_t*)nullptr); break;
    case zpInt64: f((int64_t*)nullptr); break;
    case zpUint64: f((uint64_t*)nullptr); break;
    case zpFloat64: f((double*)nullptr); break;
    default: f((float*)nullptr); break;  // float32, and the 16-bit floats' work type
  }
}

void reduceElems(void* dst, const void* a, const void* b, size_t elems, zpDataType_t wt, zpRedOp_t op) {
  dispatch(wt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduce3((T*)dst, (const T*)a, (const T*)b, elems, op);
  });
}

// out = in[0] op in[1] op ... op in[k-1], in that order for every element,
// a cache-sized piece at a time (one pass over memory, not k-1). out may be
// in[0], no other.
void reduceMany(void* out, const std::vector<const char*>& in, size_t elems, zpDataType_t wt, zpRedOp_t op) {
  const size_t es = zpTypeSize(wt), piece = (32u << 10) / es;
  for (size_t at = 0; at < elems; at += piece) {
    const size_t len = std::min(piece, elems - at), skip = at * es;
    char* o = (char*)out + skip;
    reduceElems(o, in[0] + skip, in[1] + skip, len, wt, op);
    for (size_t r = 2; r < in.size(); r++) reduceElems(o, o, in[r] + skip, len, wt, op);
  }
}

// The transports' reduce-while-copying: one reducer per (work type, op).
template <int T, int O>
void reduceBytes(void* dst, const void* a, const void* b, size_t bytes) {
  reduceElems(dst, a, b, bytes / zpTypeSize((zpDataType_t)T), (zpDataType_t)T, (zpRedOp_t)O);
}
template <int T>
constexpr OpReducer reducerOf(int o) {
  return OpReducer{o == 0   ? reduceBytes<T, 0>
                   : o == 1 ? reduceBytes<T, 1>
                   : o == 2 ? reduceBytes<T, 2>
                   : o == 3 ? reduceBytes<T, 3>
                            : reduceBytes<T, 4>,
                   T == zpInt8 || T == zpUint8 ? 1u : T == zpInt64 || T == zpUint64 || T == zpFloat64 ? 8u : 4u};
}
#define ZP_REDUCERS(T) reducerOf<T>(0), reducerOf<T>(1), reducerOf<T>(2), reducerOf<T>(3), reducerOf<T>(4)
const OpReducer kReducers[zpNumTypes * zpNumOps] = {ZP_REDUCERS(0), ZP_REDUCERS(1), ZP_REDUCERS(2), ZP_REDUCERS(3),
                                                    ZP_REDUCERS(4), ZP_REDUCERS(5), ZP_REDUCERS(6), ZP_REDUCERS(7),
                                                    ZP_REDUCERS(8), ZP_REDUCERS(9)};
#undef ZP_REDUCERS

// Work buffers: the data in its work type (float32 for the 16-bit floats).
void toWork(const void* src, void* dst, size_t elems, zpDataType_t t) {
  if (t == zpFloat16)
    for (size_t i = 0; i < elems; i++) ((float*)dst)[i] = halfToFloat(((const uint16_t*)src)[i]);
  else if (t == zpBfloat16)
    for (size_t i = 0; i < elems; i++) ((float*)dst)[i] = bf16ToFloat(((const uint16_t*)src)[i]);
  else if (src != dst)
    memmove(dst, src, elems * zpTypeSize(t));
}

void fromWork(const void* src, void* dst, size_t elems, zpDataType_t t) {
  if (t == zpFloat16)
    for (size_t i = 0; i < elems; i++) ((uint16_t*)dst)[i] = floatToHalf(((const float*)src)[i]);
  else if (t == zpBfloat16)
    for (size_t i = 0; i < elems; i++) ((uint16_t*)dst)[i] = floatToBf16(((const float*)src)[i]);
  else if (src != dst)
    memmove(dst, src, elems * zpTypeSize(t));
}

// ---- Steps ----
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
    ops_.push_back(makeOp(OpKind::kCollective, true, rankOf(peer), (void*)buf, bytes, ts));
    lanes_.push_back(lane_);
  }
  void recv(int peer, void* buf, size_t bytes, size_t ts) {
    ops_.push_back(makeOp(OpKind::kCollective, false, rankOf(peer), buf, bytes, ts));
    lanes_.push_back(lane_);
  }
  // Receives bytes of wt and stores dst = a op them: while copying where the
  // transport can, else into scratch and reduced once the round is done.
  void recvReduce(int peer, void* dst, const void* a, size_t bytes, zpDataType_t wt, zpRedOp_t op) {
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
  // A receive that is member `slot` of group g (OpReduceGroup): reduced
  // with the others by the transport, into the group's out.
  void recvInGroup(int peer, const OpReduceGroup* g, int slot, size_t ts) {
    recv(peer, g->out, g->bytes, ts);
    ops_.back().group = g;
    ops_.back().groupSlot = slot;
  }
  // Whether receives of `bytes` from these peers can form a group: all on
  // one transport that can reduce them together.
  bool canGroup(const std::vector<int>& peers, size_t bytes) const {
    if (peers.empty() || !bytes) return false;
    const Transport* t = c_->transportFor(rankOf(peers[0]));
    for (int p : peers)
      if (c_->transportFor(rankOf(p)) != t || !t->canReduceGroup(rankOf(p), bytes)) return false;
    return true;
  }
  // The ops added so far, for a caller that runs them itself (on one node,
  // where no op is routed, so none needs a transfer id). Only plain sends
  // and receives: no lanes, no reduce into scratch.
  std::vector<Op> take() {
    std::vector<Op> ops;
    ops.swap(ops_);
    lanes_.clear();
    return ops;
  }
  zpResult_t run(uint64_t tag) {
    if (ops_.empty()) return zpSuccess;
    char* base = pending_.empty() ? nullptr : scratch(kScratchPending, pendingBytes_);
    for (Pending& p : pending_) ops_[p.op].buf = base + p.at;
    const bool lanes = std::any_of(lanes_.begin(), lanes_.end(), [](uint64_t l) { return l != 0; });
    ZP_CHECK(zp::run(c_, ops_, xferId(seq_, tagBase_ + tag), lanes ? &lanes_ : nullptr));
    for (Pending& p : pending_) reduceElems(p.dst, p.a, base + p.at, p.bytes / zpTypeSize(p.wt), p.wt, p.redop);
    ops_.clear();
    lanes_.clear();
    lane_ = 0;
    pending_.clear();
    pendingBytes_ = 0;
    return zpSuccess;
  }

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
  std::vector<Op> ops_;  // zp::run takes their addresses only once they are all here
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

int mod(int a, int n) { return ((a % n) + n) % n; }

// One call on host buffers, with what its algorithms need. Each algorithm
// uses its own range of round tags (the header check is 0).
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

  // The family of algorithms for this many bytes per rank: the same on
  // every rank, as it depends only on what the header check made sure is
  // the same (the settings included). Below the threshold the latency ones;
  // from it on, on one node, direct exchange (single-copy shared memory
  // gains nothing from a ring's n-1 hops, and every hop is a wait for a
  // peer that may not be running), across nodes rings.
  enum class Family { kLatency, kRing, kDirect };
  Family family(size_t bytesPerRank) const {
    switch (c->cfg().collAlgo) {
      case CollAlgo::kRing: return Family::kRing;
      case CollAlgo::kTree: return Family::kLatency;
      case CollAlgo::kDirect: return Family::kDirect;
      case CollAlgo::kAuto: break;
    }
    if (bytesPerRank < c->cfg().collRingAbove) return Family::kLatency;
    return allLocal() ? Family::kDirect : Family::kRing;
  }
  bool ring(size_t bytesPerRank) const { return family(bytesPerRank) == Family::kRing; }

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

  // The ranks of my node (local) and the ranks at my place on every node
  // (rail, in the order of the nodes' first ranks), and if asked every
  // node's ranks in that order (grid[m][l]: the rank at place l of node m):
  // false unless there are two nodes or more with the same number of ranks
  // each.
  bool nodeGroups(std::vector<int>* local, std::vector<int>* rail,
                  std::vector<std::vector<int>>* grid = nullptr) const {
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
  bool nodeGrid(std::vector<int>* local, std::vector<int>* rail, std::vector<std::vector<int>>* grid) const {
    return nodeGroups(local, rail, grid) && local->size() > 1;
  }

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
    step.send(mod(me + 1, n), from, b.cnt[sb] * wts, wts);
    step.recvReduce(mod(me - 1, n), acc(s, rb), src + b.off[rb] * wts, b.cnt[rb] * wts, wt, a.op);
  }

  // All-gather round the ring in buf (element size es) over blocks `b`:
  // rank r starts holding block r+k (at `first` if given, else in buf) and
  // ends holding all. A rank that has every block already (hasAll:
  // broadcast's root) takes none, and its left neighbour sends it none.
  zpResult_t ringAllGather(char* buf, size_t es, const Blocks& b, int k, const char* first, int hasAll = -1) {
    for (int s = 0; s < n - 1; s++) {
      ringAllGatherRound(buf, es, b, k, s, first, hasAll);
      ZP_CHECK(step.run(1000 + (uint64_t)s));
    }
    return zpSuccess;
  }
  // Round s of it, added to the step (not run).
  void ringAllGatherRound(char* buf, size_t es, const Blocks& b, int k, int s, const char* first, int hasAll = -1) {
    const int right = mod(me + 1, n), sb = mod(me + k - s, n), rb = mod(me + k - s - 1, n);
    const char* from = s == 0 && first ? first : buf + b.off[sb] * es;
    if (right != hasAll) step.send(right, from, b.cnt[sb] * es, es);
    if (me != hasAll) step.recv(mod(me - 1, n), buf + b.off[rb] * es, b.cnt[rb] * es, es);
  }

  // ---- All-reduce: count elements of the work type from src into w (src may be w) ----
  zpResult_t allReduce(const char* src, char* w, size_t count) {
    const size_t bytes = count * wts;
    if (n == 1 || count == 0) {
      if (src != w && bytes) memmove(w, src, bytes);
      return zpSuccess;
    }
    std::vector<int> local, rail;
    if (ring(bytes) && nodeGroups(&local, &rail)) return allReduceNodes(src, w, count, local, rail);
    if (ring(bytes)) {
      // Rank r ends the reduce-scatter with block r+1, reduced where it lies
      // in w; block r is never written until the all-gather brings it.
      Blocks b = Blocks::even(count, n);
      ZP_CHECK(ringReduceScatter(src, b, 0, [&](int, int blk) { return w + b.off[blk] * wts; }));
      return ringAllGather(w, wts, b, 1, nullptr);
    }
    if (family(bytes) == Family::kDirect) {
      // Direct reduce-scatter (rank r ends with block r reduced into w),
      // then direct all-gather of the blocks: two rounds in all.
      Blocks b = Blocks::even(count, n);
      if (allLocal()) return allReduceDirectOverlapped(src, w, b);
      ZP_CHECK(reduceScatter(src, w + b.off[me] * wts, b, Family::kDirect));
      return allGatherDirect(w, wts, b, nullptr);
    }
    // Recursive doubling among the largest power of two p of ranks; the n-p
    // others first hand their data to a partner below p and get the result
    // back at the end. a op b == b op a bit for bit (IEEE), so every rank
    // ends with the same bits.
    int p = 1;
    while (p * 2 <= n) p *= 2;
    if (me >= p) {
      step.send(me - p, src, bytes, wts);
      ZP_CHECK(step.run(2000));
      step.recv(me - p, w, bytes, wts);
      return step.run(kStepResult);
    }
    // Rounds alternate between w and a scratch buffer: a round reads one
    // (and sends it) while the incoming data is reduced into the other.
    char* bufs[2] = {w, scratch(kScratchAcc0, bytes)};
    int cur = src == w ? 0 : -1;  // -1: still src
    auto at = [&](int i) { return i < 0 ? src : bufs[i]; };
    if (me < n - p) {
      step.recvReduce(me + p, bufs[0], src, bytes, wt, a.op);
      ZP_CHECK(step.run(2000));
      cur = 0;
    }
    uint64_t tag = 2001;
    for (int mask = 1; mask < p; mask <<= 1, tag++) {
      const int peer = me ^ mask, next = cur == 0 ? 1 : 0;
      step.send(peer, at(cur), bytes, wts);
      step.recvReduce(peer, bufs[next], at(cur), bytes, wt, a.op);
      ZP_CHECK(step.run(tag));
      cur = next;
    }
    if (cur != 0) memcpy(w, at(cur), bytes);
    if (me < n - p) {
      step.send(me + p, w, bytes, wts);
      ZP_CHECK(step.run(kStepResult));
    }
    return zpSuccess;
  }

  // ---- Hierarchical all-reduce across nodes (local: my node's ranks, rail: the ranks at my place) ----
  // Reduce-scatter inside the node (direct exchange over shared memory), so
  // that local rank l holds shard l reduced over its node; then the
  // all-reduce of shard l among the ranks at place l of every node, a ring
  // over the network, every local rank's over its own NIC at once
  // (rail-aligned); then all-gather of the shards inside the node. Each NIC
  // carries 2(N-1)/N of a shard, not of the buffer.
  //
  // Pipelined (ZP_COLL_SLICE; 0 turns it off): every
  // shard is cut into S slices (ZP_COLL_SLICE bytes of the largest shard
  // at most), and each slice goes through 2N stages, one per
  // round: 0 the node's reduce-scatter, 1..N-1 the ring's reduce-scatter
  // steps, N..2N-2 its all-gather steps, 2N-1 the node's all-gather. Round r
  // runs stage r-j of every slice j that has one, so while slice j crosses
  // the network, slice j+1 is reduced in the node and slice j-1 gathered:
  // the NICs and the cores work at once instead of in turn. The slices of
  // one round touch disjoint bytes, so a round needs no order among its
  // messages; both ends of every pair post them in the same order.
  zpResult_t allReduceNodes(const char* src, char* w, size_t count, const std::vector<int>& local,
                            const std::vector<int>& rail) {
    const int L = (int)local.size(), N = (int)rail.size(), stages = 2 * N;
    const int place = (int)(std::find(local.begin(), local.end(), me) - local.begin());
    const Blocks bl = Blocks::even(count, L);
    const size_t sliceBytes = c->cfg().collSliceBytes;
    // Round r's ops of slice j are on lane r * stages + (r - j), which must
    // fit the relay's ids: fewer slices for long rings, none below 2N nodes'
    // worth of room (then one slice, one stage per round, lane r).
    size_t slices = sliceBytes == 0 ? 1 : (bl.maxCnt * wts + sliceBytes - 1) / sliceBytes;
    // With routing on, slices small enough that the ring's messages go
    // direct (below ZP_ROUTE_DIRECT_BELOW): rail-aligned, every NIC already
    // carries its share, and the relay, choosing paths from the queues of
    // the moment, loads some NICs twice as much as others when the messages
    // are many and staggered (measured: docs/collectives.md).
    const size_t directBelow = c->cfg().routeDirectBelow;
    if (sliceBytes && c->cfg().routing != zpRoutingOff && directBelow > 3 * wts) {
      const size_t room = N * (directBelow - 3 * wts);  // a ring block is at most 2 elements over slice / N
      slices = std::max(slices, (bl.maxCnt * wts + room - 1) / room);
    }
    slices = std::max<size_t>(1, std::min(slices, kMaxSlices));
    slices = std::min(slices, std::max<size_t>(1, kLaneRoom / stages - std::min<size_t>(kLaneRoom / stages, stages)));
    std::vector<Blocks> sl;  // sl[p]: shard p cut into the slices
    for (int p = 0; p < L; p++) sl.push_back(Blocks::even(bl.cnt[p], (int)slices));
    // Slice j of every shard, as blocks of the whole buffer.
    auto sliceOf = [&](size_t j) {
      std::vector<size_t> cnt(L), off(L);
      for (int p = 0; p < L; p++) {
        cnt[p] = sl[p].cnt[j];
        off[p] = bl.off[p] + sl[p].off[j];
      }
      return Blocks::of(cnt.data(), off.data(), L);
    };
    char* in = scratch(kScratchAcc0, sl[place].maxCnt * wts * L);  // the node's partials of the slice at stage 0
    bool grouped = false;  // the slice at stage 0 is reduced by a group (reduceScatterDirectRound)
    for (size_t r = 0; r + 1 < slices + stages; r++) {
      const size_t first = r < (size_t)stages ? 0 : r - stages + 1, last = std::min(r, slices - 1);
      for (size_t j = first; j <= last; j++) {
        const int stage = (int)(r - j);
        const Blocks b = sliceOf(j);
        step.lane(slices == 1 ? r : r * stages + stage);
        char* mine = w + b.off[place] * wts;  // my shard's slice j
        if (stage == 0) {
          within(local, 0, [&] { return grouped = reduceScatterDirectRound(src, b, in, mine), zpSuccess; });
        } else if (stage < stages - 1) {
          const Blocks br = Blocks::even(b.cnt[place], N);
          within(rail, 0, [&] {
            if (stage < N)  // in place: ring block i of the slice is reduced where it lies
              ringReduceScatterRound(mine, br, 0, stage - 1, [&](int, int blk) { return mine + br.off[blk] * wts; });
            else
              ringAllGatherRound(mine, wts, br, 1, stage - N, nullptr);
            return zpSuccess;
          });
        } else {
          within(local, 0, [&] { return allGatherDirectRound(w, wts, b, nullptr), zpSuccess; });
        }
      }
      ZP_CHECK(step.run(kStepNodes));
      if (r < slices) {  // slice r was at stage 0
        const Blocks b = sliceOf(r);
        within(local, 0, [&] {
          return reduceScatterDirectFinish(src, w + b.off[place] * wts, b, in, grouped), zpSuccess;
        });
      }
    }
    return zpSuccess;
  }

  bool allLocal() const {
    for (int p = 0; p < n; p++)
      if (!c->isLocal(p)) return false;
    return true;
  }

  // Direct reduce-scatter then direct all-gather on one node, without the
  // wait between them: this rank reduces its block as soon as its own
  // receives are in and offers it to the others at once, while they may
  // still be reading its input (their reads of it need not be finished
  // first). With more ranks than cores that wait was a core left idle. In
  // place, the blocks the all-gather overwrites are ones the peers read
  // before they could offer theirs. Same messages and order per pair as
  // the two steps, the same reduction order: the same bits.
  zpResult_t allReduceDirectOverlapped(const char* src, char* w, const Blocks& b) {
    const size_t mine = b.cnt[me] * wts;
    char* in = scratch(kScratchAcc0, mine * n);
    const bool grouped = reduceScatterDirectRound(src, b, in, w + b.off[me] * wts);
    std::vector<Op> rs = step.take(), ag;
    auto done = [](const std::vector<Op>& ops, bool recvsOnly) {
      for (const Op& o : ops)
        if (!o.done && !(recvsOnly && o.isSend)) return false;
      return true;
    };
    std::vector<Op*> ptrs;
    for (Op& o : rs) ptrs.push_back(&o);
    ZP_CHECK(c->runOps(ptrs, [&] { return done(rs, true); }));
    // My receives are in (and good: runOps reported none that failed).
    reduceScatterDirectFinish(src, w + b.off[me] * wts, b, in, grouped);
    allGatherDirectRound(w, wts, b, nullptr);
    ag = step.take();
    ptrs.clear();
    for (Op& o : ag) ptrs.push_back(&o);
    ZP_CHECK(c->runOps(ptrs, [&] { return done(rs, false) && done(ag, false); }));
    for (const Op& o : rs)  // the reduce-scatter's sends: the second runOps did not look at them
      if (o.status != zpSuccess) return fail(o.status, "rank %d: %s", c->rank(), o.error.c_str());
    return zpSuccess;
  }

  // ---- Reduce-scatter over blocks b: src the whole input in the work type, out this rank's block ----
  zpResult_t reduceScatter(const char* src, char* out, const Blocks& b) {
    const Family f = family(b.total * wts / n);
    std::vector<int> local, rail;
    std::vector<std::vector<int>> grid;
    if (f == Family::kRing && nodeGrid(&local, &rail, &grid)) return reduceScatterNodes(src, out, b, local, rail, grid);
    return reduceScatter(src, out, b, f);
  }
  zpResult_t reduceScatter(const char* src, char* out, const Blocks& b, Family f) {
    const size_t mine = b.cnt[me] * wts;
    if (n == 1) {
      if (src != out && mine) memmove(out, src, mine);
      return zpSuccess;
    }
    if (f == Family::kRing) {
      // Partials alternate between two scratch blocks; the last round (it
      // brings this rank's own block) reduces into out.
      char* acc[2] = {scratch(kScratchAcc0, b.maxCnt * wts), scratch(kScratchAcc1, b.maxCnt * wts)};
      return ringReduceScatter(src, b, -1, [&](int s, int) { return s == n - 2 ? out : acc[s % 2]; });
    }
    char* in = scratch(kScratchAcc0, mine * n);
    const bool grouped = reduceScatterDirectRound(src, b, in, out);
    ZP_CHECK(step.run(3000));
    reduceScatterDirectFinish(src, out, b, in, grouped);
    return zpSuccess;
  }
  // Direct: every rank sends each block to its owner (added to the step, not
  // run), which reduces the others' into out: where the transport can, as
  // one reduce group read from the senders' memory (nothing in between;
  // returns true), else received into `in` (b.cnt[me] * n elements)...
  bool reduceScatterDirectRound(const char* src, const Blocks& b, char* in, char* out) {
    const size_t mine = b.cnt[me] * wts;
    std::vector<int> from;
    for (int i = 1; i < n; i++) from.push_back(mod(me - i, n));
    const OpReduceGroup* g = nullptr;
    if (step.canGroup(from, mine))  // the same order as reduceScatterDirectFinish's: the same bits
      g = &groups.emplace_back(OpReduceGroup{out, src + b.off[me] * wts, mine,
                                             &kReducers[(size_t)wt * zpNumOps + (size_t)a.op], n - 1});
    for (int i = 1; i < n; i++) {
      const int to = mod(me + i, n), f = from[i - 1];
      step.send(to, src + b.off[to] * wts, b.cnt[to] * wts, wts);
      if (g)
        step.recvInGroup(f, g, f < me ? f : f - 1, wts);
      else
        step.recv(f, in + mine * f, mine, wts);
    }
    return g != nullptr;
  }
  // ...and, once the round has run, reduces the n it has in one pass: its
  // own first (so that in place, where out is its own block, each element is
  // read before it is written), then the others' in rank order (a fixed
  // order, the same bits on every run). Nothing if the round was a group.
  void reduceScatterDirectFinish(const char* src, char* out, const Blocks& b, const char* in, bool grouped) {
    const size_t mine = b.cnt[me] * wts;
    if (!mine || grouped) return;
    if (n == 1) {
      if (src != out) memmove(out, src + b.off[me] * wts, mine);
      return;
    }
    std::vector<const char*> blocks(1, src + b.off[me] * wts);
    for (int r = 0; r < n; r++)
      if (r != me) blocks.push_back(in + mine * r);
    reduceMany(out, blocks, b.cnt[me], wt, a.op);
  }

  // Direct all-gather in buf (element size es) over blocks b: this rank's
  // block (at `first` if given, else in buf) to every other rank, theirs
  // from them, in one round. hasAll as in ringAllGather.
  zpResult_t allGatherDirect(char* buf, size_t es, const Blocks& b, const char* first, int hasAll = -1) {
    allGatherDirectRound(buf, es, b, first, hasAll);
    return step.run(4000);
  }
  void allGatherDirectRound(char* buf, size_t es, const Blocks& b, const char* first, int hasAll = -1) {
    const char* from = first ? first : buf + b.off[me] * es;
    for (int i = 1; i < n; i++) {
      const int to = mod(me + i, n), src = mod(me - i, n);
      if (to != hasAll) step.send(to, from, b.cnt[me] * es, es);
      if (me != hasAll) step.recv(src, buf + b.off[src] * es, b.cnt[src] * es, es);
    }
  }

  // ---- Hierarchical reduce-scatter(v) and all-gather(v) across nodes ----
  // (local: my node's ranks, rail: the ranks at my place, grid[m][l]: the
  // rank at place l of node m; L ranks per node, N nodes.) Block r of the
  // user's buffer is rank r's, wherever its node is.
  //
  // Reduce-scatter: a direct reduce-scatter inside the node leaves local
  // rank l with, for every node m, its node's partial of block grid[m][l]
  // (N pieces, packed in node order); then the ranks at place l of every
  // node reduce-scatter those N pieces by a ring over the network, so that
  // the one on node m ends with piece m, its own block reduced over every
  // rank. Every place at once, each over its own NIC (rail-aligned): a
  // node sends (N-1)/N of the buffer across nodes, 1/L of it on each rank's
  // NIC, where the flat ring sent it all through the one rank whose right
  // neighbour is on the next node. Each element is reduced in a fixed order
  // (the same bits every run): inside node i, P_i = its owner-place rank's
  // own value first, then the node's others in place order
  // (reduceScatterDirectFinish); then round the rail ring, ending at the
  // owner's node m: P_m op (P_m-1 op (... op (P_m+2 op P_m+1))), node
  // indices mod N.
  zpResult_t reduceScatterNodes(const char* src, char* out, const Blocks& b, const std::vector<int>& local,
                                const std::vector<int>& rail, const std::vector<std::vector<int>>& grid) {
    const int L = (int)local.size(), N = (int)rail.size();
    const int place = (int)(std::find(local.begin(), local.end(), me) - local.begin());
    std::vector<size_t> pieceCnt(N);
    for (int m = 0; m < N; m++) pieceCnt[m] = b.cnt[grid[m][place]];
    const Blocks pieces = Blocks::of(pieceCnt.data(), nullptr, N);
    char* part = scratch(kScratchNodePart, pieces.total * wts);
    char* in = scratch(kScratchNodeIn, pieces.total * L * wts);  // piece m's from every local rank
    std::vector<Blocks> nodeBlocks;  // [m]: node m's blocks, block l of the rank at place l
    for (int m = 0; m < N; m++) nodeBlocks.push_back(nodeBlocksOf(b, grid[m]));
    ZP_CHECK(within(local, kStepHier, [&] {
      std::vector<char> grouped(N);  // piece m reduced by a group (reduceScatterDirectRound)
      for (int m = 0; m < N; m++)
        grouped[m] =
            reduceScatterDirectRound(src, nodeBlocks[m], in + pieces.off[m] * L * wts, part + pieces.off[m] * wts);
      ZP_CHECK(step.run(0));
      for (int m = 0; m < N; m++)
        reduceScatterDirectFinish(src, part + pieces.off[m] * wts, nodeBlocks[m], in + pieces.off[m] * L * wts,
                                  grouped[m]);
      return zpSuccess;
    }));
    return within(rail, kStepHier, [&] {
      // Partials alternate between two scratch blocks; the last round (it
      // brings this rank's own piece) reduces into out.
      char* acc[2] = {scratch(kScratchAcc0, pieces.maxCnt * wts), scratch(kScratchAcc1, pieces.maxCnt * wts)};
      return railRing(pieces, wts, [&](int s, const Blocks& slice, const std::vector<size_t>& at) {
        ringReduceScatterRound(part, slice, -1, s,
                               [&](int t, int blk) { return (t == n - 2 ? out : acc[t % 2]) + at[blk] * wts; });
      });
    });
  }
  // All-gather, the mirror: a ring among the ranks at my place of every
  // node brings each the blocks of the others at its place (each NIC
  // carries (N-1)/N of 1/L of the gathered buffer, rail-aligned), then a
  // direct all-gather inside the node, over shared memory, gives every
  // local rank those N blocks of every other. No copies: blocks land at
  // their place in recvbuff and are sent from there (my own from sendbuff).
  zpResult_t allGatherNodes(const char* sendbuff, char* recvbuff, const Blocks& b, const std::vector<int>& local,
                            const std::vector<int>& rail, const std::vector<std::vector<int>>& grid) {
    const int N = (int)rail.size();
    const int node = (int)(std::find(rail.begin(), rail.end(), me) - rail.begin());
    ZP_CHECK(within(rail, kStepHier, [&] {
      return railRing(nodeBlocksOf(b, rail), ts, [&](int s, const Blocks& slice, const std::vector<size_t>& at) {
        ringAllGatherRound(recvbuff, ts, slice, 0, s, sendbuff + at[me] * ts);
      });
    }));
    return within(local, kStepHier, [&] {
      for (int m = 0; m < N; m++)
        allGatherDirectRound(recvbuff, ts, nodeBlocksOf(b, grid[m]), m == node ? sendbuff : nullptr);
      return step.run(0);
    });
  }
  // The rail ring's n-1 rounds over blocks b (element size es): round(s,
  // slice, at) adds round s of the ring over one slice of the blocks (at[p]:
  // where block p's slice starts in it). With routing on, every message is
  // cut into slices below ZP_ROUTE_DIRECT_BELOW, each on a lane of its own,
  // so that they go direct: rail-aligned, every NIC carries its share
  // already, and relaying them through other ranks' NICs only adds hops
  // (measured: docs/collectives.md). With routing off, one slice.
  template <class Round>
  zpResult_t railRing(const Blocks& b, size_t es, Round round) {
    const size_t directBelow = c->cfg().routeDirectBelow;
    size_t slices = 1;
    if (c->cfg().routing != zpRoutingOff && directBelow > es && b.maxCnt) {
      const size_t perSlice = (directBelow - 1) / es;  // elements of a slice below directBelow
      slices = std::min({(b.maxCnt + perSlice - 1) / perSlice, kMaxSlices, (size_t)(kHierLanes / (n - 1))});
    }
    std::vector<Blocks> cut;  // cut[p]: block p in slices
    for (int p = 0; p < n; p++) cut.push_back(Blocks::even(b.cnt[p], (int)slices));
    std::vector<size_t> cnt(n), off(n), at(n);
    for (int s = 0; s < n - 1; s++) {
      for (size_t j = 0; j < slices; j++) {
        for (int p = 0; p < n; p++) {
          cnt[p] = cut[p].cnt[j];
          at[p] = cut[p].off[j];
          off[p] = b.off[p] + at[p];
        }
        step.lane(s * slices + j);
        round(s, Blocks::of(cnt.data(), off.data(), n), at);
      }
      ZP_CHECK(step.run(1));
    }
    return zpSuccess;
  }
  // Blocks b of the given ranks, in their order.
  static Blocks nodeBlocksOf(const Blocks& b, const std::vector<int>& ranks) {
    std::vector<size_t> cnt, off;
    for (int r : ranks) {
      cnt.push_back(b.cnt[r]);
      off.push_back(b.off[r]);
    }
    return Blocks::of(cnt.data(), off.data(), (int)ranks.size());
  }

  // ---- All-gather over blocks b (the user's type, user displacements) ----
  zpResult_t allGather(const char* sendbuff, char* recvbuff, const Blocks& b) {
    char* mine = recvbuff + b.off[me] * ts;
    const Family f = n > 1 ? family(b.total * ts / n) : Family::kLatency;
    std::vector<int> local, rail;
    std::vector<std::vector<int>> grid;
    if (n > 1 && f == Family::kRing && nodeGrid(&local, &rail, &grid))
      ZP_CHECK(allGatherNodes(sendbuff, recvbuff, b, local, rail, grid));
    else if (n > 1 && f == Family::kRing)
      ZP_CHECK(ringAllGather(recvbuff, ts, b, 0, sendbuff));
    else if (n > 1)
      ZP_CHECK(allGatherDirect(recvbuff, ts, b, sendbuff));
    if (sendbuff != mine && b.cnt[me]) memmove(mine, sendbuff, b.cnt[me] * ts);
    return zpSuccess;
  }

  // ---- Broadcast ----
  zpResult_t broadcast() {
    const size_t bytes = a.count * ts;
    const int root = a.root;
    const char* sb = (const char*)a.send;
    char* rb = (char*)a.recv;
    const Family f = family(bytes / n);
    if (n > 1 && f == Family::kDirect && allLocal()) {
      // One node: every rank takes the whole buffer from the root at once.
      // By single copy each reads it straight from the root's memory, the
      // least any rank can move, in one round, while the root copies nothing.
      if (me == root) {
        for (int p = 0; p < n; p++)
          if (p != root) step.send(p, sb, bytes, ts);
      } else {
        step.recv(root, rb, bytes, ts);
      }
      ZP_CHECK(step.run(5002));
    } else if (n > 1 && f != Family::kLatency) {
      // Scatter from the root, then all-gather (the root takes nothing
      // back): the root sends the buffer once, not n-1 times.
      Blocks b = Blocks::even(a.count, n);
      if (me == root) {
        for (int p = 0; p < n; p++)
          if (p != root) step.send(p, sb + b.off[p] * ts, b.cnt[p] * ts, ts);
      } else {
        step.recv(root, rb + b.off[me] * ts, b.cnt[me] * ts, ts);
      }
      ZP_CHECK(step.run(5000));
      char* buf = me == root ? (char*)sb : rb;
      ZP_CHECK(f == Family::kRing ? ringAllGather(buf, ts, b, 0, nullptr, root)
                                  : allGatherDirect(buf, ts, b, nullptr, root));
    } else if (n > 1) {
      // Binomial tree over ranks counted from the root: log2(n) rounds.
      const int vr = mod(me - root, n);
      int mask = 1;
      while (mask < n) {
        if (vr & mask) {
          step.recv(mod(vr - mask + root, n), rb, bytes, ts);
          ZP_CHECK(step.run(5001));
          break;
        }
        mask <<= 1;
      }
      const char* from = me == root ? sb : rb;
      for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n) step.send(mod(vr + mask + root, n), from, bytes, ts);
      ZP_CHECK(step.run(5001));
    }
    if (me == root && sb != rb) memmove(rb, sb, bytes);
    return zpSuccess;
  }

  // ---- Reduce: src count elements of the work type; out (the root's) as many ----
  zpResult_t reduce(const char* src, char* out, size_t count) {
    const int root = a.root;
    const size_t bytes = count * wts;
    if (n == 1) {
      if (out != src) memmove(out, src, bytes);
      return zpSuccess;
    }
    if (family(bytes) != Family::kLatency) {
      // Reduce-scatter (rank r ends with block r), then every block to the root.
      Blocks b = Blocks::even(count, n);
      char* mine = me == root ? out + b.off[me] * wts : scratch(kScratchMine, b.maxCnt * wts);
      ZP_CHECK(reduceScatter(src, mine, b));
      if (me == root) {
        for (int p = 0; p < n; p++)
          if (p != root && b.cnt[p]) step.recv(p, out + b.off[p] * wts, b.cnt[p] * wts, wts);
      } else if (b.cnt[me]) {
        step.send(root, mine, b.cnt[me] * wts, wts);
      }
      return step.run(kStepGather);
    }
    // Binomial tree toward the root; inner ranks add their children's
    // partials into scratch (the root into out).
    const int vr = mod(me - root, n);
    char* acc = me == root ? out : scratch(kScratchAcc1, bytes);
    const char* cur = src;  // what this rank holds so far
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vr & mask) {
        step.send(mod(vr - mask + root, n), cur, bytes, wts);
        return step.run(6000 + (uint64_t)mask);
      }
      if (vr + mask < n) {
        step.recvReduce(mod(vr + mask + root, n), acc, cur, bytes, wt, a.op);
        ZP_CHECK(step.run(6000 + (uint64_t)mask));
        cur = acc;
      }
    }
    return zpSuccess;
  }
};

void finishAvg(char* work, size_t elems, zpDataType_t wt, zpRedOp_t op, int n) {
  if (op != zpAvg) return;
  dispatch(wt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    divideBy((T*)work, elems, n);
  });
}

uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

const char* opName(zpRedOp_t op) {
  switch (op) {
    case zpSum: return "sum";
    case zpProd: return "prod";
    case zpMax: return "max";
    case zpMin: return "min";
    case zpAvg: return "avg";
    default: return "?";
  }
}

const char* typeName(zpDataType_t t) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64",
                                "float16", "float32", "float64", "bfloat16"};
  return (int)t >= 0 && (int)t < 10 ? names[t] : "?";
}

zpResult_t commSplit(Comm* parent, int color, int key, zpResult_t localCheck, const Config& cfg,
                     std::unique_ptr<Comm>* child) {
  const int n = parent->nranks(), me = parent->rank();
  const std::string localMsg = localCheck == zpSuccess ? "" : lastError();
  // Every rank's (color, key, whether its own arguments were good), by an
  // all-gather whose header names the split: a rank calling something else
  // meanwhile (a plain all-gather of three int32 too) is caught by the
  // collective's header check like any other.
  int32_t mine[3] = {color, key, localCheck == zpSuccess ? 1 : 0};
  std::vector<int32_t> all(3 * (size_t)n);
  CollArgs gather{CollKind::kAllGather, mine, all.data(), 3, zpInt32, zpSum, 0};
  gather.forSplit = true;
  ZP_CHECK(collective(parent, gather, nullptr));
  // Every rank takes the next sequence number, those that join no child too,
  // so that the parent's numbering stays the same everywhere.
  const uint64_t seq = parent->nextCollSeq();
  if (localCheck != zpSuccess) return fail(localCheck, "rank %d: %s", me, localMsg.c_str());
  for (int r = 0; r < n; r++)
    if (!all[3 * r + 2])
      return fail(zpInvalidUsage, "rank %d: zpCommSplit: rank %d passed an invalid argument (its zpGetLastError says "
                  "which)", me, r);
  if (color == ZP_SPLIT_NOCOLOR) return zpSuccess;
  std::vector<int> members;
  for (int r = 0; r < n; r++)
    if (all[3 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) { return all[3 * x + 1] < all[3 * y + 1]; });
  const int newRank = (int)(std::find(members.begin(), members.end(), me) - members.begin());
  // The child's secret (it names the child's shared memory): the parent's,
  // this split's number and the color, so that siblings and later splits
  // never share a name.
  uint64_t x = splitmix(seq ^ splitmix((uint64_t)(uint32_t)color));
  for (int i = 0; i < 16; i++) x = splitmix(x ^ parent->secret()[i]);
  const uint64_t h[2] = {splitmix(x), splitmix(x ^ 0x5a5a5a5a5a5a5a5aull)};
  uint8_t secret[16];
  memcpy(secret, h, 16);
  // The transports' blob round among the child's members, over the parent:
  // the sizes, then the blobs (a UCX address has no fixed size).
  int round = 0;
  auto exchange = [&](const std::string& blob, std::vector<std::string>* out) -> zpResult_t {
    const int m = (int)members.size();
    out->assign(m, std::string());
    std::vector<uint64_t> sizes(m, 0);
    sizes[newRank] = blob.size();
    std::vector<Op> ops;
    for (int i = 0; i < m; i++)
      if (i != newRank) {
        ops.push_back(makeOp(OpKind::kCollective, true, members[i], &sizes[newRank], sizeof(uint64_t), 1));
        ops.push_back(makeOp(OpKind::kCollective, false, members[i], &sizes[i], sizeof(uint64_t), 1));
      }
    ZP_CHECK(run(parent, ops, xferId(seq, kStepSplit + (uint64_t)round++)));
    for (int i = 0; i < m; i++) {
      if (sizes[i] > (1u << 20))
        return fail(zpInternalError, "rank %d: zpCommSplit: rank %d's transport address is %llu bytes", me, members[i],
                    (unsigned long long)sizes[i]);
      (*out)[i].resize(sizes[i]);
    }
    (*out)[newRank] = blob;
    ops.clear();
    for (int i = 0; i < m; i++)
      if (i != newRank) {
        ops.push_back(makeOp(OpKind::kCollective, true, members[i], (void*)blob.data(), blob.size(), 1));
        ops.push_back(makeOp(OpKind::kCollective, false, members[i], &(*out)[i][0], sizes[i], 1));
      }
    return run(parent, ops, xferId(seq, kStepSplit + (uint64_t)round++));
  };
  return Comm::createChild(*parent, members, newRank, cfg, secret, exchange, child);
}

zpResult_t collective(Comm* c, const CollArgs& a, void* stream) {
  const int n = c->nranks(), me = c->rank();
  const uint64_t seq = c->nextCollSeq();
  Header mine{(uint64_t)a.kind | (a.forSplit ? kSplitHeader : 0), a.count, (uint64_t)a.dtype, (uint64_t)a.op,
              (uint64_t)a.root, 0};
  // (the hierarchical all-reduce's slices and the hierarchical all-gather's
  // and reduce-scatter's rail slices depend on the routing settings too)
  const Config& cfg = c->cfg();
  for (uint64_t v : {(uint64_t)cfg.collAlgo, (uint64_t)cfg.collRingAbove, (uint64_t)cfg.collSliceBytes,
                     (uint64_t)cfg.routing, (uint64_t)cfg.routeDirectBelow})
    mine.settings = splitmix(mine.settings ^ v);
  if (isV(a.kind)) {  // every rank's count differs for all-gatherv: the total and the counts are what must agree
    mine.count = 0;
    for (int p = 0; p < n; p++) mine.count += a.counts[p];
    mine.countsHash = hashCounts(a.counts, n);
  }
  // A host call always compares (it waits on its peers anyway); a device
  // call only with ZP_CHECK_MODE=full, since the exchange makes the host wait
  // for every peer's host. The check blocks on the network, never on the
  // GPU: a mismatch fails on every rank before anything is enqueued, instead
  // of hanging the device.
  if (!stream || cfg.checkDeviceCalls) ZP_CHECK(checkHeaders(c, seq, mine));
  if (a.kind == CollKind::kBarrier || (isV(a.kind) ? mine.count : a.count) == 0) return zpSuccess;
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

}  // namespace zp
