// The standard collectives, with NCCL's semantics, on host buffers: a
// check that every rank called the same thing, then rings.
//
// Every call starts with each rank's header (which collective, count,
// datatype, op, root) sent to every other rank: a rank that differs makes
// the call zpInvalidUsage on every rank, naming it, before any data moves.
// The exchange is also zpBarrier. Then:
//   reduce-scatter  a ring of n-1 steps: each rank sends a partial chunk to
//                   the next and adds the previous rank's into its own; rank
//                   r ends with chunk r fully reduced;
//   all-reduce      reduce-scatter, then an all-gather ring of n-1 steps;
//   all-gather      the ring of n-1 steps;
//   reduce          reduce-scatter, then every rank's chunk to the root;
//   broadcast       the root sends to every rank.
// float16 and bfloat16 travel and add in float32 and are rounded once at
// the end, as the API promises (twice the bytes on the wire for them).
// Across nodes the rings' steps go through the relay like any collective's
// messages. A hierarchical algorithm (reduce-scatter in the node, one rail
// per shard across nodes) and a latency algorithm for small counts are not
// here yet.
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
// a step number from bit 40 (0 the header check, 1.. the ring's steps, and
// two of their own for the broadcast and the reduce's gather), the sequence.
constexpr uint64_t kCollectiveXfer = 1ull << 61;
constexpr uint64_t kStepBroadcast = 0xFFFF, kStepGather = 0xFFFE, kStepSplit = 0xFFF0;
uint64_t xferId(uint64_t seq, uint64_t step) { return kCollectiveXfer | step << 40 | (seq & ((1ull << 40) - 1)); }

const char* kindName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "allreduce";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kReduce: return "reduce";
    case CollKind::kAllGather: return "allgather";
    case CollKind::kReduceScatter: return "reducescatter";
    case CollKind::kBarrier: return "barrier";
  }
  return "collective";
}

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

// Runs the ops, routing those to other nodes through the relay under id.
zpResult_t run(Comm* c, std::vector<Op>& ops, uint64_t id) {
  RoutedXfer xfer;
  xfer.id = id;
  std::vector<Op*> ptrs;
  for (Op& op : ops) {
    if (!c->isLocal(op.peer)) op.routed = &xfer;
    ptrs.push_back(&op);
  }
  return c->runOps(ptrs);
}

// ---- The header check ----
struct Header {
  uint64_t kind, count, dtype, op, root;
  bool operator==(const Header& o) const {
    return kind == o.kind && count == o.count && dtype == o.dtype && op == o.op && root == o.root;
  }
};

std::string describe(const Header& h) {
  CollKind k = (CollKind)h.kind;
  std::string s = kindName(k);
  if (k == CollKind::kBarrier) return s;
  s += " of " + std::to_string(h.count) + " " + typeName((zpDataType_t)h.dtype);
  if (k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter)
    s += std::string(" (") + opName((zpRedOp_t)h.op) + ")";
  if (k == CollKind::kBroadcast || k == CollKind::kReduce) s += " to root " + std::to_string(h.root);
  return s;
}

zpResult_t checkHeaders(Comm* c, uint64_t seq, const Header& mine) {
  const int n = c->nranks(), me = c->rank();
  std::vector<Header> all(n);
  all[me] = mine;
  std::vector<Op> ops;
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

template <class T>
void reduceInto(T* acc, const T* in, size_t n, zpRedOp_t op) {
  switch (op) {
    case zpSum:
    case zpAvg:
      for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] + in[i]);
      break;
    case zpProd:
      for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] * in[i]);
      break;
    case zpMax:
      for (size_t i = 0; i < n; i++) acc[i] = std::max(acc[i], in[i]);
      break;
    case zpMin:
      for (size_t i = 0; i < n; i++) acc[i] = std::min(acc[i], in[i]);
      break;
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

void reduceBytes(void* acc, const void* in, size_t elems, zpDataType_t wt, zpRedOp_t op) {
  dispatch(wt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduceInto((T*)acc, (const T*)in, elems, op);
  });
}

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

// ---- Rings ----
// Chunk c of a buffer of `count` elements cut into n: [first(c), first(c+1)).
struct Chunks {
  size_t count;
  int n;
  size_t first(int c) const { return count * (size_t)c / (size_t)n; }
  size_t size(int c) const { return first(c + 1) - first(c); }
};

struct Ring {
  Comm* c;
  uint64_t seq;
  int step = 0;  // numbers the steps, so that every step has its own relay id
  int next() const { return (c->rank() + 1) % c->nranks(); }
  int prev() const { return (c->rank() + c->nranks() - 1) % c->nranks(); }
  // Sends [s, s + sbytes) to the next rank, receives rbytes from the previous into r.
  zpResult_t exchange(const void* s, size_t sbytes, void* r, size_t rbytes, size_t ts) {
    std::vector<Op> ops;
    ops.push_back(makeOp(OpKind::kCollective, true, next(), (void*)s, sbytes, ts));
    ops.push_back(makeOp(OpKind::kCollective, false, prev(), r, rbytes, ts));
    return run(c, ops, xferId(seq, (uint64_t)++step));
  }
};

// Reduce-scatter in place on work (count elements of wt in n chunks): rank r
// ends with chunk r holding every rank's chunk r reduced.
zpResult_t reduceScatterRing(Ring& ring, char* work, const Chunks& ch, zpDataType_t wt, zpRedOp_t op) {
  const int n = ring.c->nranks(), me = ring.c->rank();
  const size_t ts = zpTypeSize(wt);
  std::unique_ptr<char[]> incoming(new char[(ch.count / n + 1) * ts]);
  for (int s = 0; s < n - 1; s++) {
    const int sendChunk = ((me - s - 1) % n + n) % n, recvChunk = ((me - s - 2) % n + n) % n;
    ZP_CHECK(ring.exchange(work + ch.first(sendChunk) * ts, ch.size(sendChunk) * ts, incoming.get(),
                           ch.size(recvChunk) * ts, ts));
    reduceBytes(work + ch.first(recvChunk) * ts, incoming.get(), ch.size(recvChunk), wt, op);
  }
  return zpSuccess;
}

// All-gather in place on buf: rank r holds chunk r; every rank ends with all.
zpResult_t allGatherRing(Ring& ring, char* buf, const Chunks& ch, size_t ts) {
  const int n = ring.c->nranks(), me = ring.c->rank();
  for (int s = 0; s < n - 1; s++) {
    const int sendChunk = ((me - s) % n + n) % n, recvChunk = ((me - s - 1) % n + n) % n;
    ZP_CHECK(ring.exchange(buf + ch.first(sendChunk) * ts, ch.size(sendChunk) * ts, buf + ch.first(recvChunk) * ts,
                           ch.size(recvChunk) * ts, ts));
  }
  return zpSuccess;
}

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

zpResult_t commSplit(Comm* parent, int color, int key, zpResult_t localCheck, const Config& cfg,
                     std::unique_ptr<Comm>* child) {
  const int n = parent->nranks(), me = parent->rank();
  const std::string localMsg = localCheck == zpSuccess ? "" : lastError();
  // Every rank's (color, key, whether its own arguments were good), by an
  // all-gather: a rank calling something else meanwhile is caught by the
  // collective's header check like any other.
  int32_t mine[3] = {color, key, localCheck == zpSuccess ? 1 : 0};
  std::vector<int32_t> all(3 * (size_t)n);
  ZP_CHECK(collective(parent, CollArgs{CollKind::kAllGather, mine, all.data(), 3, zpInt32, zpSum, 0}, nullptr));
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
  const Header mine{(uint64_t)a.kind, a.count, (uint64_t)a.dtype, (uint64_t)a.op, (uint64_t)a.root};
  // The check runs on the host even for device buffers (it blocks on the
  // network, never on the GPU): a mismatch fails on every rank before
  // anything is enqueued, instead of hanging the device.
  ZP_CHECK(checkHeaders(c, seq, mine));
  if (a.kind == CollKind::kBarrier || a.count == 0) return zpSuccess;
  if (stream) return c->enqueueCollectiveOnStream(a, stream);

  const size_t ts = zpTypeSize(a.dtype);
  const zpDataType_t wt = workType(a.dtype);
  const size_t wts = zpTypeSize(wt);
  Ring ring{c, seq};
  const char* send = (const char*)a.send;
  char* recv = (char*)a.recv;

  switch (a.kind) {
    case CollKind::kAllGather: {
      // Every rank's block travels as it is: no arithmetic, no work type.
      const Chunks ch{a.count * (size_t)n, n};
      if (send != recv + (size_t)me * a.count * ts) memmove(recv + (size_t)me * a.count * ts, send, a.count * ts);
      return allGatherRing(ring, recv, ch, ts);
    }
    case CollKind::kBroadcast: {
      std::vector<Op> ops;
      if (me == a.root) {
        if (send != recv) memmove(recv, send, a.count * ts);
        for (int p = 0; p < n; p++)
          if (p != me) ops.push_back(makeOp(OpKind::kCollective, true, p, recv, a.count * ts, ts));
      } else {
        ops.push_back(makeOp(OpKind::kCollective, false, a.root, recv, a.count * ts, ts));
      }
      return run(c, ops, xferId(seq, kStepBroadcast));
    }
    case CollKind::kAllReduce:
    case CollKind::kReduce:
    case CollKind::kReduceScatter: {
      // The whole input in the work type, reduced chunk by chunk round the ring.
      const size_t total = a.kind == CollKind::kReduceScatter ? a.count * (size_t)n : a.count;
      const Chunks ch{total, n};
      std::unique_ptr<char[]> workBuf;  // not zero-filled: every byte is written first
      char* work;
      if (!isHalf(a.dtype) && a.kind == CollKind::kAllReduce) {
        work = recv;  // reduce in place in the output
        if (send != recv) memmove(recv, send, total * ts);
      } else {
        workBuf.reset(new char[total * wts]);
        work = workBuf.get();
        toWork(send, work, total, a.dtype);
      }
      ZP_CHECK(reduceScatterRing(ring, work, ch, wt, a.op));
      finishAvg(work + ch.first(me) * wts, ch.size(me), wt, a.op, n);
      if (a.kind == CollKind::kReduceScatter) {
        fromWork(work + ch.first(me) * wts, recv, ch.size(me), a.dtype);
        return zpSuccess;
      }
      if (a.kind == CollKind::kAllReduce) {
        ZP_CHECK(allGatherRing(ring, work, ch, wts));
        fromWork(work, recv, total, a.dtype);
        return zpSuccess;
      }
      // Reduce: every rank's reduced chunk to the root.
      std::vector<Op> ops;
      if (me == a.root) {
        for (int p = 0; p < n; p++)
          if (p != me && ch.size(p))
            ops.push_back(makeOp(OpKind::kCollective, false, p, work + ch.first(p) * wts, ch.size(p) * wts, wts));
      } else if (ch.size(me)) {
        ops.push_back(makeOp(OpKind::kCollective, true, a.root, work + ch.first(me) * wts, ch.size(me) * wts, wts));
      }
      ZP_CHECK(run(c, ops, xferId(seq, kStepGather)));
      if (me == a.root) fromWork(work, recv, total, a.dtype);
      return zpSuccess;
    }
    case CollKind::kBarrier:
      break;
  }
  return zpSuccess;
}

}  // namespace zp
