// The standard collectives (all-reduce, broadcast, reduce, all-gather,
// reduce-scatter, barrier and the v variants) on host buffers, as Ops over
// the communicator's transports.
//
// Every call starts with an exchange of a small descriptor (kind, datatype,
// op, root, count, a hash of per-rank counts, and whether this rank's own
// arguments were valid) between all ranks. Every rank then holds the same
// descriptors and reaches the same verdict, so a mismatch fails every rank
// with the same message before any data moves: no hang, nothing written.
// The exchange is also the barrier.
//
// Then the data moves by one of two families of algorithms, chosen by the
// bytes each rank holds (ZP_COLL_RING_ABOVE, ZP_COLL_ALGO):
//  - latency: recursive doubling (all-reduce), binomial trees (broadcast,
//    reduce), direct exchange (all-gather, reduce-scatter): log2(n) or one
//    round of messages, each carrying the whole (small) buffer;
//  - bandwidth: rings. All-reduce is a ring reduce-scatter then a ring
//    all-gather (each rank sends 2(n-1)/n of the buffer, the least possible);
//    broadcast scatters from the root then all-gathers; reduce is a ring
//    reduce-scatter then a gather to the root.
// Each algorithm is a sequence of steps; a step's sends and receives run
// together (Comm::runOps), and reductions happen as the bytes arrive where
// the transport can do that (shared memory: Op::reduce), else right after.
#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "src/core/log.h"
#include "src/route/relay.h"

namespace zp {

namespace {

const char* collName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "zpAllReduce";
    case CollKind::kBroadcast: return "zpBroadcast";
    case CollKind::kReduce: return "zpReduce";
    case CollKind::kAllGather: return "zpAllGather";
    case CollKind::kReduceScatter: return "zpReduceScatter";
    case CollKind::kBarrier: return "zpBarrier";
    case CollKind::kAllGatherv: return "zpAllGatherv";
    case CollKind::kReduceScatterv: return "zpReduceScatterv";
  }
  return "collective";
}

bool reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter ||
         k == CollKind::kReduceScatterv;
}
bool rooted(CollKind k) { return k == CollKind::kBroadcast || k == CollKind::kReduce; }
bool hasCounts(CollKind k) { return k == CollKind::kAllGatherv || k == CollKind::kReduceScatterv; }

// What every rank tells every other before a collective. Fixed size, so that
// ranks calling different collectives still exchange it cleanly.
struct Desc {
  uint32_t magic;
  uint8_t kind, dtype, op, bad;  // bad: this rank's own arguments were invalid
  int32_t root;
  uint32_t pad;
  uint64_t count;       // count / sendcount / recvcount (the v calls: sendcount, or 0)
  uint64_t countsHash;  // the v calls: a hash of recvcounts (they must agree)
};
constexpr uint32_t kDescMagic = 0x7a70636fu;  // "zpco"

uint64_t hashCounts(const size_t* counts, int n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++) {
    uint64_t v = counts[i];
    for (int b = 0; b < 8; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

// Scratch memory of the calling thread (a call runs under its communicator's
// lock, in one thread): kept between calls, so that large collectives do not
// fault fresh pages in every time.
char* scratch(int slot, size_t bytes) {
  struct Buf {
    char* p = nullptr;
    size_t cap = 0;
    ~Buf() { free(p); }
  };
  thread_local Buf bufs[4];
  Buf& b = bufs[slot];
  if (b.cap < bytes) {
    free(b.p);
    b.cap = std::max(bytes, b.cap * 2);
    b.p = (char*)malloc(b.cap);
    if (!b.p) {
      b.cap = 0;
      throw std::bad_alloc();
    }
  }
  return b.p;
}
enum Slot { kTmp = 0, kAccA = 1, kAccB = 2, kWork = 3 };

// The ops of one collective call, posted a step at a time. A tag names each
// message of the call so that the relay (across nodes, with routing) matches
// it; shared memory and UCX match by order, which the tags follow anyway.
class Steps {
 public:
  Steps(Comm* c, uint64_t seq, size_t elemSize) : c_(c), seq_(seq), ts_(elemSize), relay_(Relay::of(c)) {}

  void send(int peer, const void* buf, size_t bytes, uint32_t tag) { add(true, peer, (void*)buf, bytes, tag); }
  void recv(int peer, void* buf, size_t bytes, uint32_t tag) { add(false, peer, buf, bytes, tag); }
  // Receives bytes and stores dst = a op (the bytes), elementwise, in the
  // work type: while copying where the transport can, else through scratch.
  void recvReduce(int peer, void* dst, const void* a, size_t bytes, uint32_t tag, zpDataType_t wt, zpRedOp_t op) {
    Op* o = add(false, peer, dst, bytes, tag);
    if (!bytes) return;
    if (c_->transportFor(peer)->canReduce()) {
      o->reduce = &reducers_[reducerIndex(wt, op)];
      o->reduceSrc = a;
      return;
    }
    // Received whole into scratch, reduced after the step (several such
    // receives in one step get disjoint pieces of the scratch).
    size_t off = pendingBytes_;
    pendingBytes_ += (bytes + 63) & ~size_t(63);
    o->buf = (void*)off;  // fixed up in run(), once the scratch is sized
    pending_.push_back({o, dst, a, bytes, wt, op});
  }

  zpResult_t run() {
    if (ops_.empty()) return zpSuccess;
    if (!pending_.empty()) {
      char* base = scratch(kTmp, pendingBytes_);
      for (Pending& p : pending_) p.op->buf = base + (size_t)p.op->buf;
    }
    std::vector<Op*> ptrs;
    for (Op& op : ops_) {
      ptrs.push_back(&op);
      ZP_TRACE(kSubColl, "rank %d: collective #%llu: %s %zu bytes %s rank %d", c_->rank(), (unsigned long long)seq_,
               op.isSend ? "send" : "recv", op.bytes, op.isSend ? "to" : "from", op.peer);
    }
    zpResult_t r = c_->runOps(ptrs);
    // A step that failed on this rank leaves its peers mid-call, expecting
    // messages that will not come: the communicator cannot go on (as with
    // NCCL), and the peers learn it now rather than at their timeout.
    if (r != zpSuccess) c_->breakComm(r == zpInvalidUsage ? zpInvalidUsage : zpRemoteError, lastError());
    if (r == zpSuccess)
      for (Pending& p : pending_) zp::reduce(p.dst, p.a, p.op->buf, p.bytes / typeSizeOf(p.wt), p.wt, p.redop);
    ops_.clear();
    xfers_.clear();
    pending_.clear();
    pendingBytes_ = 0;
    return r;
  }

 private:
  struct Pending {
    Op* op;
    void* dst;
    const void* a;
    size_t bytes;
    zpDataType_t wt;
    zpRedOp_t redop;
  };
  static size_t typeSizeOf(zpDataType_t t) { return zpTypeSize(t); }

  Op* add(bool isSend, int peer, void* buf, size_t bytes, uint32_t tag) {
    ops_.push_back(makeOp(OpKind::kCollective, isSend, peer, buf, bytes, ts_));
    Op* op = &ops_.back();
    if (relay_ && !c_->isLocal(peer)) {
      xfers_.push_back(RoutedXfer{seq_ << 24 | tag, nullptr});
      op->routed = &xfers_.back();
    }
    return op;
  }

  Comm* c_;
  uint64_t seq_;
  size_t ts_;
  Relay* relay_;
  std::deque<Op> ops_;  // deques: addresses stay put
  std::deque<RoutedXfer> xfers_;
  std::vector<Pending> pending_;
  size_t pendingBytes_ = 0;
  static const OpReducer reducers_[zpNumTypes * zpNumOps];
  static size_t reducerIndex(zpDataType_t wt, zpRedOp_t op) { return (size_t)wt * zpNumOps + (size_t)op; }
};

// One reducer per (work type, op), for the transports' reduce-while-copying.
template <int T, int O>
void reduceBytes(void* dst, const void* a, const void* b, size_t bytes) {
  zp::reduce(dst, a, b, bytes / zpTypeSize((zpDataType_t)T), (zpDataType_t)T, (zpRedOp_t)O);
}
template <int T>
constexpr OpReducer reducerRow(int o) {
  return OpReducer{o == 0   ? reduceBytes<T, 0>
                   : o == 1 ? reduceBytes<T, 1>
                   : o == 2 ? reduceBytes<T, 2>
                   : o == 3 ? reduceBytes<T, 3>
                            : reduceBytes<T, 4>,
                   T == zpInt8 || T == zpUint8 ? 1u : T == zpInt64 || T == zpUint64 || T == zpFloat64 ? 8u : 4u};
}
#define ZP_ROW(T) reducerRow<T>(0), reducerRow<T>(1), reducerRow<T>(2), reducerRow<T>(3), reducerRow<T>(4)
const OpReducer Steps::reducers_[zpNumTypes * zpNumOps] = {ZP_ROW(0), ZP_ROW(1), ZP_ROW(2), ZP_ROW(3), ZP_ROW(4),
                                                           ZP_ROW(5), ZP_ROW(6), ZP_ROW(7), ZP_ROW(8), ZP_ROW(9)};
#undef ZP_ROW

// Tags of a call's messages: the descriptor exchange, then one per step.
constexpr uint32_t kDescTag = 0;
constexpr uint32_t kGatherTag = 0xfffff0;  // reduce's gather to the root

// A partition of a buffer of elements into n chunks (offsets and counts).
struct Chunks {
  std::vector<size_t> off, cnt;
  size_t maxCnt = 0;
  static Chunks even(size_t count, int n) {
    Chunks c;
    for (int i = 0; i < n; i++) {
      size_t lo = count * i / n, hi = count * (i + 1) / n;
      c.off.push_back(lo);
      c.cnt.push_back(hi - lo);
      c.maxCnt = std::max(c.maxCnt, hi - lo);
    }
    return c;
  }
  static Chunks of(const size_t* counts, const size_t* displs, int n) {
    Chunks c;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
      c.off.push_back(displs ? displs[i] : at);
      c.cnt.push_back(counts[i]);
      at += counts[i];
      c.maxCnt = std::max(c.maxCnt, counts[i]);
    }
    return c;
  }
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// One call, with everything the algorithms need.
struct Call {
  Comm* c;
  const CollArgs& a;
  int n, me;
  zpDataType_t wt;  // work type
  size_t ts, wts;   // user and work element sizes
  Steps steps;
  Call(Comm* comm, const CollArgs& args, uint64_t seq)
      : c(comm),
        a(args),
        n(comm->nranks()),
        me(comm->rank()),
        wt(workType(args.dtype)),
        ts(zpTypeSize(args.dtype)),
        wts(zpTypeSize(workType(args.dtype))),
        steps(comm, seq, zpTypeSize(workType(args.dtype))) {}

  // ---- Rings ----
  // Ring reduce-scatter over `ch` (elements of the work type): src holds this
  // rank's contribution to every chunk. Rank r starts by sending chunk
  // r+k and ends holding chunk r+k+1, fully reduced, at acc(n-2, chunk);
  // acc(s, chunk) is where step s leaves its partial result (it must stay
  // until step s+1 has sent it).
  template <class Acc>
  zpResult_t ringReduceScatter(const char* src, const Chunks& ch, int k, Acc acc, uint32_t tag0) {
    const int right = mod(me + 1, n), left = mod(me - 1, n);
    for (int s = 0; s < n - 1; s++) {
      int sc = mod(me + k - s, n), rc = mod(me + k - s - 1, n);
      const char* sp = s == 0 ? src + ch.off[sc] * wts : acc(s - 1, sc);
      steps.send(right, sp, ch.cnt[sc] * wts, tag0 + s);
      steps.recvReduce(left, acc(s, rc), src + ch.off[rc] * wts, ch.cnt[rc] * wts, tag0 + s, wt, a.op);
      ZP_CHECK(steps.run());
    }
    return zpSuccess;
  }

  // Ring all-gather in buf (element size es) over `ch`: rank r starts
  // holding chunk r+k (at first, `first` if given, else in buf) and ends
  // holding all. skipRecv: a rank that already has every chunk (broadcast's
  // root) takes none; its left neighbour then sends it nothing.
  zpResult_t ringAllGather(char* buf, size_t es, const Chunks& ch, int k, const char* first, uint32_t tag0,
                           int hasAll = -1) {
    const int right = mod(me + 1, n), left = mod(me - 1, n);
    for (int s = 0; s < n - 1; s++) {
      int sc = mod(me + k - s, n), rc = mod(me + k - s - 1, n);
      const char* sp = s == 0 && first ? first : buf + ch.off[sc] * es;
      if (right != hasAll) steps.send(right, sp, ch.cnt[sc] * es, tag0 + s);
      if (me != hasAll) steps.recv(left, buf + ch.off[rc] * es, ch.cnt[rc] * es, tag0 + s);
      ZP_CHECK(steps.run());
    }
    return zpSuccess;
  }

  // ---- All-reduce ----
  // In place on w (count elements of the work type), from src (may equal w).
  zpResult_t allReduceWork(const char* src, char* w, size_t count, bool ring) {
    if (n == 1 || count == 0) {
      if (src != w && count) memmove(w, src, count * wts);
      return zpSuccess;
    }
    if (ring) {
      Chunks ch = Chunks::even(count, n);
      ZP_CHECK(ringReduceScatter(src, ch, 0, [&](int, int chunk) { return w + ch.off[chunk] * wts; }, 1));
      return ringAllGather(w, wts, ch, 1, nullptr, 1 + n);
    }
    // Recursive doubling among the largest power of two p of ranks; the
    // n - p others first hand their data to a partner below p and get the
    // result back at the end. a op b == b op a bit for bit (IEEE), so every
    // rank ends with the same bits.
    const size_t bytes = count * wts;
    if (src != w) memmove(w, src, bytes);
    int p = 1;
    while (p * 2 <= n) p *= 2;
    if (me >= p) {
      steps.send(me - p, w, bytes, 1);
      ZP_CHECK(steps.run());
      steps.recv(me - p, w, bytes, 100);
      return steps.run();
    }
    if (me < n - p) {
      steps.recvReduce(me + p, w, w, bytes, 1, wt, a.op);
      ZP_CHECK(steps.run());
    }
    uint32_t tag = 2;
    for (int mask = 1; mask < p; mask <<= 1, tag++) {
      int peer = me ^ mask;
      steps.send(peer, w, bytes, tag);
      // Into scratch, not onto w: w is being sent in this same step.
      char* tmp = scratch(kAccA, bytes);
      steps.recv(peer, tmp, bytes, tag);
      ZP_CHECK(steps.run());
      zp::reduce(w, w, tmp, count, wt, a.op);
    }
    if (me < n - p) {
      steps.send(me + p, w, bytes, 100);
      ZP_CHECK(steps.run());
    }
    return zpSuccess;
  }

  // ---- Reduce-scatter (per-rank counts) ----
  // src: the whole buffer in the work type; out: this rank's block.
  zpResult_t reduceScatterWork(const char* src, char* out, const Chunks& ch, bool ring) {
    if (n == 1) {
      if (src != out && ch.cnt[0]) memmove(out, src, ch.cnt[0] * wts);
      return zpSuccess;
    }
    if (ring) {
      // Partials alternate between two scratch chunks; the last step
      // (which receives this rank's own chunk) writes into out.
      char* bufs[2] = {scratch(kAccA, ch.maxCnt * wts), scratch(kAccB, ch.maxCnt * wts)};
      return ringReduceScatter(src, ch, -1, [&](int s, int) { return s == n - 2 ? out : bufs[s % 2]; }, 1);
    }
    // Direct: every rank sends each block to its owner, and reduces the n-1
    // blocks it gets in rank order (so the order is fixed).
    const size_t bytes = ch.cnt[me] * wts;
    char* tmp = scratch(kAccA, bytes * n);
    for (int i = 1; i < n; i++) {
      int to = mod(me + i, n), from = mod(me - i, n);
      steps.send(to, src + ch.off[to] * wts, ch.cnt[to] * wts, 1);
      steps.recv(from, tmp + bytes * from, bytes, 1);
    }
    ZP_CHECK(steps.run());
    const char* mine = src + ch.off[me] * wts;
    memcpy(tmp + bytes * me, mine, bytes);
    if (out != tmp) memcpy(out, tmp, bytes);
    for (int r = 1; r < n; r++) zp::reduce(out, out, tmp + bytes * r, ch.cnt[me], wt, a.op);
    return zpSuccess;
  }

  // ---- All-gather (per-rank counts and displacements) ----
  zpResult_t allGather(const char* sendbuff, char* recvbuff, const Chunks& ch, bool ring) {
    char* mine = recvbuff + ch.off[me] * ts;
    bool inPlace = sendbuff == mine;
    if (n > 1 && ring) {
      ZP_CHECK(ringAllGather(recvbuff, ts, ch, 0, sendbuff, 1));
    } else if (n > 1) {
      for (int i = 1; i < n; i++) {
        int to = mod(me + i, n), from = mod(me - i, n);
        steps.send(to, sendbuff, ch.cnt[me] * ts, 1);
        steps.recv(from, recvbuff + ch.off[from] * ts, ch.cnt[from] * ts, 1);
      }
      ZP_CHECK(steps.run());
    }
    if (!inPlace && ch.cnt[me]) memcpy(mine, sendbuff, ch.cnt[me] * ts);
    return zpSuccess;
  }

  // ---- Broadcast ----
  zpResult_t broadcast(bool ring) {
    const size_t bytes = a.count * ts;
    const int root = a.root;
    const char* sb = (const char*)a.sendbuff;
    char* rb = (char*)a.recvbuff;
    if (n > 1 && bytes && ring) {
      // Scatter from the root, then all-gather round the ring (the root
      // takes nothing back). Chunks in bytes, element aligned.
      Chunks ch = Chunks::even(a.count, n);
      if (me == root) {
        for (int p = 0; p < n; p++)
          if (p != root) steps.send(p, sb + ch.off[p] * ts, ch.cnt[p] * ts, 1);
      } else {
        steps.recv(root, rb + ch.off[me] * ts, ch.cnt[me] * ts, 1);
      }
      ZP_CHECK(steps.run());
      ZP_CHECK(ringAllGather(me == root ? (char*)sb : rb, ts, ch, 0, nullptr, 2, root));
    } else if (n > 1 && bytes) {
      // Binomial tree on ranks relative to the root: log2(n) rounds.
      int vr = mod(me - root, n), mask = 1;
      const char* from = me == root ? sb : rb;
      while (mask < n) {
        if (vr & mask) {
          steps.recv(mod(vr - mask + root, n), rb, bytes, 1);
          ZP_CHECK(steps.run());
          break;
        }
        mask <<= 1;
      }
      for (mask >>= 1; mask > 0; mask >>= 1)
        if (vr + mask < n) steps.send(mod(vr + mask + root, n), from, bytes, 1);
      ZP_CHECK(steps.run());
    }
    if (me == root && sb != rb && bytes) memcpy(rb, sb, bytes);
    return zpSuccess;
  }

  // ---- Reduce ----
  // src in the work type; out (root only): count elements of the work type.
  zpResult_t reduceWork(const char* src, char* out, size_t count, bool ring) {
    const int root = a.root;
    const size_t bytes = count * wts;
    if (n == 1 || count == 0) {
      if (me == root && out != src && bytes) memmove(out, src, bytes);
      return zpSuccess;
    }
    if (ring) {
      // Ring reduce-scatter (rank r ends with chunk r), then each rank sends
      // its chunk to the root, which keeps them in out.
      Chunks ch = Chunks::even(count, n);
      char* bufs[2] = {scratch(kAccA, ch.maxCnt * wts), scratch(kAccB, ch.maxCnt * wts)};
      char* mine = me == root ? out + ch.off[me] * wts : bufs[(n - 2) % 2];
      ZP_CHECK(ringReduceScatter(src, ch, -1, [&](int s, int) { return s == n - 2 ? mine : bufs[s % 2]; }, 1));
      if (me == root) {
        for (int p = 0; p < n; p++)
          if (p != root) steps.recv(p, out + ch.off[p] * wts, ch.cnt[p] * wts, kGatherTag);
      } else {
        steps.send(root, mine, ch.cnt[me] * wts, kGatherTag);
      }
      return steps.run();
    }
    // Binomial tree toward the root; interior ranks accumulate in scratch.
    int vr = mod(me - root, n);
    char* acc = me == root ? out : scratch(kAccB, bytes);
    const char* cur = src;  // what this rank holds so far
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vr & mask) {
        steps.send(mod(vr - mask + root, n), cur, bytes, 1);
        return steps.run();
      }
      if (vr + mask < n) {
        steps.recvReduce(mod(vr + mask + root, n), acc, cur, bytes, 1, wt, a.op);
        ZP_CHECK(steps.run());
        cur = acc;
      }
    }
    if (cur != acc) memmove(acc, cur, bytes);  // the root of a tree with no children (n == 1)
    return zpSuccess;
  }
};

// ---- Arguments ----

struct Span {
  uintptr_t lo, hi;
  bool overlaps(const Span& o) const { return lo < o.hi && o.lo < hi && hi > lo && o.hi > o.lo; }
};
Span span(const void* p, size_t bytes) { return {(uintptr_t)p, (uintptr_t)p + bytes}; }

// This rank's own arguments; a message says what is wrong.
zpResult_t checkLocal(const Comm* c, const CollArgs& a) {
  const char* fn = collName(a.kind);
  const int n = c->nranks(), me = c->rank();
  if (a.kind == CollKind::kBarrier) return zpSuccess;
  const size_t ts = zpTypeSize(a.dtype);
  if (ts == 0) return fail(zpInvalidArgument, "%s: invalid datatype %d", fn, (int)a.dtype);
  if (reduces(a.kind) && !validRedOp(a.op)) return fail(zpInvalidArgument, "%s: invalid op %d", fn, (int)a.op);
  if (rooted(a.kind) && (a.root < 0 || a.root >= n))
    return fail(zpInvalidArgument, "%s: root %d is not a rank of this communicator (0..%d)", fn, a.root, n - 1);
  const size_t maxElems = kMaxCallBytes / ts;
  // Work buffers of the 16-bit floats are twice as large: keep them in range too.
  auto tooLarge = [&](size_t elems) { return elems > maxElems / 2; };
  size_t sendElems = 0, recvElems = 0;
  switch (a.kind) {
    case CollKind::kAllReduce:
    case CollKind::kBroadcast:
    case CollKind::kReduce:
      if (tooLarge(a.count))
        return fail(zpInvalidArgument, "%s: count %zu is too large (a negative value cast to size_t?)", fn, a.count);
      sendElems = recvElems = a.count;
      break;
    case CollKind::kAllGather:
      if (tooLarge(a.count) || a.count > maxElems / 2 / (size_t)n)
        return fail(zpInvalidArgument, "%s: sendcount %zu is too large (a negative value cast to size_t?)", fn,
                    a.count);
      sendElems = a.count;
      recvElems = a.count * n;
      break;
    case CollKind::kReduceScatter:
      if (tooLarge(a.count) || a.count > maxElems / 2 / (size_t)n)
        return fail(zpInvalidArgument, "%s: recvcount %zu is too large (a negative value cast to size_t?)", fn,
                    a.count);
      sendElems = a.count * n;
      recvElems = a.count;
      break;
    case CollKind::kAllGatherv:
    case CollKind::kReduceScatterv: {
      const char* cn = "recvcounts";
      if (!a.counts) return fail(zpInvalidArgument, "%s: recvcounts is NULL", fn);
      if (a.kind == CollKind::kAllGatherv && !a.displs) return fail(zpInvalidArgument, "%s: rdispls is NULL", fn);
      size_t total = 0;
      for (int p = 0; p < n; p++) {
        if (a.counts[p] > maxElems / 2 || total + a.counts[p] > maxElems / 2)
          return fail(zpInvalidArgument, "%s: %s[%d]=%zu is too large (a negative value cast to size_t?)", fn, cn, p,
                      a.counts[p]);
        total += a.counts[p];
      }
      if (a.kind == CollKind::kReduceScatterv) {
        sendElems = total;
        recvElems = a.counts[me];
        break;
      }
      if (tooLarge(a.count))
        return fail(zpInvalidArgument, "%s: sendcount %zu is too large (a negative value cast to size_t?)", fn,
                    a.count);
      if (a.count != a.counts[me])
        return fail(zpInvalidArgument, "%s: rank %d's sendcount %zu differs from its recvcounts[%d]=%zu", fn, me,
                    a.count, me, a.counts[me]);
      sendElems = a.count;
      // Receive ranges: in range, not wrapping, not overlapping each other.
      std::vector<std::pair<Span, int>> rs;
      for (int p = 0; p < n; p++) {
        if (a.displs[p] > maxElems)
          return fail(zpInvalidArgument, "%s: rdispls[%d]=%zu is too large (a negative value cast to size_t?)", fn, p,
                      a.displs[p]);
        if (!a.counts[p]) continue;
        if (!a.recvbuff) return fail(zpInvalidArgument, "%s: recvbuff is NULL but recvcounts[%d]=%zu", fn, p, a.counts[p]);
        rs.push_back({span((const char*)a.recvbuff + a.displs[p] * ts, a.counts[p] * ts), p});
      }
      std::sort(rs.begin(), rs.end(), [](const std::pair<Span, int>& x, const std::pair<Span, int>& y) {
        return x.first.lo < y.first.lo;
      });
      for (size_t i = 1; i < rs.size(); i++)
        if (rs[i].first.lo < rs[i - 1].first.hi)
          return fail(zpInvalidArgument, "%s: the receive ranges of ranks %d and %d overlap", fn, rs[i - 1].second,
                      rs[i].second);
      if (sendElems && !a.sendbuff) return fail(zpInvalidArgument, "%s: sendbuff is NULL with sendcount %zu", fn, sendElems);
      const char* inPlace = (const char*)a.recvbuff + a.displs[me] * ts;
      for (auto& r : rs)
        if (sendElems && a.sendbuff != inPlace && r.first.overlaps(span(a.sendbuff, sendElems * ts)))
          return fail(zpInvalidArgument,
                      "%s: sendbuff overlaps the receive range of rank %d (in place means sendbuff == recvbuff + "
                      "rdispls[%d] elements)",
                      fn, r.second, me);
      return zpSuccess;
    }
    case CollKind::kBarrier:
      break;
  }
  bool needSend = a.kind != CollKind::kBroadcast || me == a.root;
  bool needRecv = a.kind != CollKind::kReduce || me == a.root;
  if (needSend && sendElems && !a.sendbuff)
    return fail(zpInvalidArgument, "%s: sendbuff is NULL with %zu elements to send", fn, sendElems);
  if (needRecv && recvElems && !a.recvbuff)
    return fail(zpInvalidArgument, "%s: recvbuff is NULL with %zu elements to receive", fn, recvElems);
  if (needSend && needRecv && sendElems && recvElems) {
    // NCCL's in-place offsets, or no overlap at all.
    const char* sb = (const char*)a.sendbuff;
    const char* rb = (const char*)a.recvbuff;
    const char* want = rb;
    const char* what = "sendbuff == recvbuff";
    if (a.kind == CollKind::kAllGather) {
      want = rb + (size_t)me * a.count * ts;
      what = "sendbuff == recvbuff + rank * sendcount elements";
    } else if (a.kind == CollKind::kReduceScatter || a.kind == CollKind::kReduceScatterv) {
      size_t off = 0;
      for (int p = 0; p < me; p++) off += a.kind == CollKind::kReduceScatter ? a.count : a.counts[p];
      want = nullptr;
      if (rb != sb + off * ts && span(sb, sendElems * ts).overlaps(span(rb, recvElems * ts)))
        return fail(zpInvalidArgument,
                    "%s: recvbuff overlaps sendbuff but is not at its in-place offset (recvbuff == sendbuff + %zu "
                    "elements)",
                    fn, off);
    }
    if (want && sb != want && span(sb, sendElems * ts).overlaps(span(rb, recvElems * ts)))
      return fail(zpInvalidArgument, "%s: sendbuff and recvbuff overlap but are not in place (%s)", fn, what);
  }
  return zpSuccess;
}

Desc describe(const Comm* c, const CollArgs& a, bool bad) {
  Desc d;
  memset(&d, 0, sizeof(d));
  d.magic = kDescMagic;
  d.kind = (uint8_t)a.kind;
  d.dtype = (uint8_t)a.dtype;
  d.op = reduces(a.kind) ? (uint8_t)a.op : 0;
  d.bad = bad ? 1 : 0;
  d.root = rooted(a.kind) ? a.root : 0;
  d.count = a.kind == CollKind::kBarrier || a.kind == CollKind::kReduceScatterv ? 0 : a.count;
  d.countsHash = hasCounts(a.kind) && a.counts ? hashCounts(a.counts, c->nranks()) : 0;
  return d;
}

// The verdict on every rank's descriptor: the same on every rank.
zpResult_t verdict(const Comm* c, const CollArgs& a, const std::vector<Desc>& d) {
  const int n = c->nranks(), me = c->rank();
  const char* fn = collName(a.kind);
  for (int r = 0; r < n; r++)
    if (d[r].magic != kDescMagic)
      return fail(zpInvalidUsage, "rank %d: %s: rank %d sent a malformed collective descriptor", me, fn, r);
  for (int r = 0; r < n; r++)
    if (d[r].bad)
      return fail(zpInvalidUsage, "rank %d: %s: rank %d passed an invalid argument (its zpGetLastError says which)",
                  me, fn, r);
  for (int r = 1; r < n; r++) {
    const Desc& x = d[0];
    const Desc& y = d[r];
    if (x.kind != y.kind)
      return fail(zpInvalidUsage, "rank %d: rank 0 called %s but rank %d called %s (every rank must call the same "
                  "collectives in the same order)", me, collName((CollKind)x.kind), r, collName((CollKind)y.kind));
    if (x.dtype != y.dtype)
      return fail(zpInvalidUsage, "rank %d: %s: rank 0 passes datatype %s but rank %d passes %s", me, fn,
                  typeName(x.dtype), r, typeName(y.dtype));
    if (x.op != y.op)
      return fail(zpInvalidUsage, "rank %d: %s: rank 0 passes op %s but rank %d passes %s", me, fn, redOpName(x.op),
                  r, redOpName(y.op));
    if (x.root != y.root)
      return fail(zpInvalidUsage, "rank %d: %s: rank 0 passes root %d but rank %d passes root %d", me, fn, x.root, r,
                  y.root);
    if (x.countsHash != y.countsHash)
      return fail(zpInvalidUsage, "rank %d: %s: rank 0 and rank %d pass different recvcounts arrays", me, fn, r);
    if (x.count != y.count && a.kind != CollKind::kAllGatherv)
      return fail(zpInvalidUsage, "rank %d: %s: rank 0 passes count %llu but rank %d passes %llu", me, fn,
                  (unsigned long long)x.count, r, (unsigned long long)y.count);
  }
  // All-gatherv's sendcounts need no check here: each rank's equals its own
  // recvcounts[rank] (checkLocal), and the recvcounts agree.
  return zpSuccess;
}

// The algorithm family: ZP_COLL_ALGO, else by the bytes each rank holds.
bool useRing(const Comm* c, size_t bytes) {
  if (c->cfg().collAlgo == CollAlgo::kRing) return true;
  if (c->cfg().collAlgo == CollAlgo::kTree) return false;
  return bytes >= c->cfg().collRingAbove;
}

zpResult_t runData(Call& k) {
  const CollArgs& a = k.a;
  Comm* c = k.c;
  const int n = k.n, me = k.me;
  const bool half = isHalf(a.dtype);
  switch (a.kind) {
    case CollKind::kBarrier:
      return zpSuccess;
    case CollKind::kBroadcast:
      return k.broadcast(useRing(c, a.count * k.ts));
    case CollKind::kAllGather:
    case CollKind::kAllGatherv: {
      std::vector<size_t> counts(a.counts ? a.counts : nullptr, a.counts ? a.counts + n : nullptr);
      if (a.kind == CollKind::kAllGather) counts.assign(n, a.count);
      std::vector<size_t> displs(n);
      for (int p = 0; p < n; p++) displs[p] = a.kind == CollKind::kAllGather ? p * a.count : a.displs[p];
      Chunks ch = Chunks::of(counts.data(), displs.data(), n);
      size_t total = 0;
      for (size_t x : counts) total += x;
      return k.allGather((const char*)a.sendbuff, (char*)a.recvbuff, ch, useRing(c, total * k.ts / n));
    }
    case CollKind::kAllReduce: {
      bool ring = useRing(c, a.count * k.wts);
      if (!half) {
        ZP_CHECK(k.allReduceWork((const char*)a.sendbuff, (char*)a.recvbuff, a.count, ring));
        if (a.op == zpAvg) finishAvg(a.recvbuff, a.count, k.wt, n);
        return zpSuccess;
      }
      float* w = (float*)scratch(kWork, a.count * sizeof(float));
      halfToFloat(w, a.sendbuff, a.count, a.dtype);
      ZP_CHECK(k.allReduceWork((const char*)w, (char*)w, a.count, ring));
      if (a.op == zpAvg) finishAvg(w, a.count, zpFloat32, n);
      floatToHalf(a.recvbuff, w, a.count, a.dtype);
      return zpSuccess;
    }
    case CollKind::kReduceScatter:
    case CollKind::kReduceScatterv: {
      std::vector<size_t> counts(n, a.count);
      if (a.kind == CollKind::kReduceScatterv) counts.assign(a.counts, a.counts + n);
      Chunks ch = Chunks::of(counts.data(), nullptr, n);
      size_t total = ch.off[n - 1] + ch.cnt[n - 1];
      bool ring = useRing(c, total * k.wts / n);
      const char* src = (const char*)a.sendbuff;
      char* out = (char*)a.recvbuff;
      if (half) {
        float* w = (float*)scratch(kWork, (total + ch.cnt[me]) * sizeof(float));
        halfToFloat(w, a.sendbuff, total, a.dtype);
        src = (const char*)w;
        out = (char*)(w + total);
      }
      ZP_CHECK(k.reduceScatterWork(src, out, ch, ring));
      if (a.op == zpAvg) finishAvg(out, ch.cnt[me], k.wt, n);
      if (half) floatToHalf(a.recvbuff, (const float*)out, ch.cnt[me], a.dtype);
      return zpSuccess;
    }
    case CollKind::kReduce: {
      bool ring = useRing(c, a.count * k.wts);
      const bool root = me == a.root;
      if (!half) {
        ZP_CHECK(k.reduceWork((const char*)a.sendbuff, (char*)a.recvbuff, a.count, ring));
        if (root && a.op == zpAvg) finishAvg(a.recvbuff, a.count, k.wt, n);
        return zpSuccess;
      }
      float* w = (float*)scratch(kWork, a.count * sizeof(float) * 2);
      halfToFloat(w, a.sendbuff, a.count, a.dtype);
      float* out = w + a.count;
      ZP_CHECK(k.reduceWork((const char*)w, (char*)out, a.count, ring));
      if (root) {
        if (a.op == zpAvg) finishAvg(out, a.count, zpFloat32, n);
        floatToHalf(a.recvbuff, out, a.count, a.dtype);
      }
      return zpSuccess;
    }
  }
  return fail(zpInternalError, "unknown collective %d", (int)a.kind);
}

}  // namespace

const char* collectiveName(CollKind kind) { return collName(kind); }

zpResult_t commSplit(Comm* parent, int color, int key, zpResult_t localCheck, const Config& cfg,
                     std::unique_ptr<Comm>* child) {
  const int n = parent->nranks(), me = parent->rank();
  std::string localMsg = localCheck == zpSuccess ? "" : lastError();
  // Every rank's (color, key, whether its arguments were good), by an
  // all-gather: a rank that calls another collective meanwhile is caught by
  // the descriptor check like any other.
  int32_t mine[3] = {color, key, localCheck == zpSuccess ? 1 : 0};
  std::vector<int32_t> all(3 * (size_t)n);
  CollArgs a;
  a.kind = CollKind::kAllGather;
  a.sendbuff = mine;
  a.recvbuff = all.data();
  a.count = 3;
  a.dtype = zpInt32;
  ZP_CHECK(collective(parent, a));
  // Every rank takes the exchange's sequence number, also those that join no
  // child, so that the parent's numbering stays the same everywhere.
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
  // The child's secret: the parent's, this split's number and the color, so
  // that siblings and later splits never share a name in /dev/shm.
  uint8_t secret[16];
  // (splitmix64 steps over all of them: every output byte depends on each.)
  auto mix = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  uint64_t x = mix(seq ^ mix((uint64_t)(uint32_t)color));
  for (int i = 0; i < 16; i++) x = mix(x ^ parent->secret()[i]);
  uint64_t h[2] = {mix(x), mix(x ^ 0x5a5a5a5a5a5a5a5aull)};
  memcpy(secret, h, 16);
  // The transports' blob round, among the child's members over the parent:
  // the sizes, then the blobs (a UCX address has no fixed size).
  auto exchange = [&](const std::string& blob, std::vector<std::string>* out) -> zpResult_t {
    const int m = (int)members.size();
    out->assign(m, std::string());
    std::vector<uint64_t> sizes(m, 0);
    sizes[newRank] = blob.size();
    Steps st(parent, seq, 1);
    for (int i = 0; i < m; i++)
      if (i != newRank) {
        st.send(members[i], &sizes[newRank], sizeof(uint64_t), 1);
        st.recv(members[i], &sizes[i], sizeof(uint64_t), 1);
      }
    ZP_CHECK(st.run());
    for (int i = 0; i < m; i++) {
      if (sizes[i] > (1u << 20))
        return fail(zpInternalError, "rank %d: zpCommSplit: rank %d's transport address is %llu bytes", me,
                    members[i], (unsigned long long)sizes[i]);
      (*out)[i].resize(sizes[i]);
    }
    (*out)[newRank] = blob;
    for (int i = 0; i < m; i++)
      if (i != newRank) {
        st.send(members[i], blob.data(), blob.size(), 2);
        st.recv(members[i], &(*out)[i][0], sizes[i], 2);
      }
    return st.run();
  };
  return Comm::createChild(*parent, members, newRank, cfg, secret, exchange, child);
}

zpResult_t collective(Comm* c, const CollArgs& a) {
  const int n = c->nranks(), me = c->rank();
  // This rank's own arguments first; a rank with bad ones still takes part in
  // the descriptor exchange, so that the others fail at once instead of
  // waiting for it until the timeout.
  zpResult_t local = checkLocal(c, a);
  std::string localMsg = local == zpSuccess ? "" : lastError();
  uint64_t seq = c->nextCollSeq();
  Call call(c, a, seq);
  if (n > 1) {
    std::vector<Desc> d(n);
    d[me] = describe(c, a, local != zpSuccess);
    Steps ex(c, seq, 1);
    for (int i = 1; i < n; i++) {
      int to = mod(me + i, n), from = mod(me - i, n);
      ex.send(to, &d[me], sizeof(Desc), kDescTag);
      ex.recv(from, &d[from], sizeof(Desc), kDescTag);
    }
    ZP_CHECK(ex.run());
    if (local != zpSuccess) return fail(local, "rank %d: %s", me, localMsg.c_str());
    ZP_CHECK(verdict(c, a, d));
  } else if (local != zpSuccess) {
    return local;
  }
  return runData(call);
}

}  // namespace zp
