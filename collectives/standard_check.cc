// The header check: every rank's call (which collective, count, datatype,
// op, root, settings) sent to every other rank and compared, before any data
// moves; and the names of datatypes and ops for its messages.
#include <string>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"
#include "src/util/per_thread.h"

namespace zp {
namespace detail {

namespace {

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

bool reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter ||
         k == CollKind::kReduceScatterv;
}

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

// zpInvalidUsage naming the first rank whose call differs from rank 0's, if any.
zpResult_t compareHeaders(int me, const std::vector<Header>& all) {
  // A rank whose header never came sent a message of another size: it is
  // in another call.
  auto name = [&](size_t r) { return all[r].kind == kNoHeader ? std::string("another collective") : describe(all[r]); };
  for (size_t r = 1; r < all.size(); r++)
    if (!(all[r] == all[0]))
      return fail(zpInvalidUsage, "rank %d: rank 0 calls %s but rank %zu calls %s", me, name(0).c_str(), r,
                  name(r).c_str());
  for (size_t r = 1; r < all.size(); r++)
    if (all[r].settings != all[0].settings)
      return fail(zpInvalidUsage, "rank %d: ranks 0 and %zu choose collective algorithms differently (ZP_COLL_ALGO, "
                  "ZP_COLL_RING_ABOVE, ZP_COLL_SLICE, ZP_ROUTING, ZP_ROUTE_DIRECT_BELOW must be the same on every rank)",
                  me, r);
  return zpSuccess;
}

}  // namespace

bool isV(CollKind k) { return k == CollKind::kAllGatherv || k == CollKind::kReduceScatterv; }

uint64_t hashCounts(const size_t* counts, int n) {  // FNV-1a over the counts' bytes
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) h = (h ^ (((uint64_t)counts[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  return h;
}

HeaderLists& headerLists() { return PerThread<HeaderLists>::get(); }

uint64_t digestOf(const Header& h) {
  uint64_t d = 0;
  for (uint64_t v : {h.kind, h.count, h.dtype, h.op, h.root, h.countsHash, h.settings}) d = hashStep(d, v);
  return d == kNoDigest ? 1 : d;
}

zpResult_t checkHeaders(Comm* c, uint64_t seq, const Header& mine) {
  const int n = c->nranks(), me = c->rank();
  std::vector<uint64_t>& digests = startDigests(c, mine);
  std::vector<Op>& ops = headerLists().ops;
  ops.clear();
  for (int i = 1; i < n; i++) {
    const int to = (me + i) % n, from = (me - i + n) % n;
    ops.emplace_back(OpKind::kCollective, true, to, &digests[me], sizeof(uint64_t), 1);
    ops.emplace_back(OpKind::kCollective, false, from, &digests[from], sizeof(uint64_t), 1);
  }
  // A peer in a fused all-reduce (one node) sends its digest as meta, which
  // this receive does not take: its place stays kNoDigest, or the data of
  // the one size that fits is taken for a digest; either way it differs, on
  // both sides, and the second round names the calls. A message of another
  // size is refused here (zpInvalidUsage), and explained the same way.
  return settleHeaders(c, seq, mine, digests, runHeaderRound(c, ops, msgid::collectiveXfer(seq, 0)));
}

zpResult_t runHeaderRound(Comm* c, std::vector<Op>& ops, uint64_t id) {
  std::vector<uint64_t>& arrived = headerLists().arrivedUs;
  arrived.assign(c->nranks(), 0);
  for (Op& op : ops)
    if (!op.isSend) op.arrivedUs = &arrived[op.peer];
  arrived[c->rank()] = nowUs();  // this rank's entry
  const zpResult_t r = run(c, ops, id);
  if (r != zpSuccess) return r;
  const int lagging = c->waitStats().record(arrived);
  if (lagging >= 0) {
    int calls = 0;
    for (const WaitStats::Entry& e : c->waitStats().report(&calls))
      if (e.rank == lagging)
        ZP_WARN(kSubColl,
                "rank %d: rank %d came last in %d of the last %d collectives, %.1f ms after the others on average: "
                "it lags (zpCommGetWaitReport; ZP_STRAGGLER_MS)",
                c->rank(), lagging, e.callsLast, calls, e.totalUs / 1000.0 / e.callsLast);
  }
  return r;
}

std::vector<uint64_t>& startDigests(Comm* c, const Header& mine) {
  std::vector<uint64_t>& digests = headerLists().digests;
  digests.assign(c->nranks(), kNoDigest);
  digests[c->rank()] = digestOf(mine);
  return digests;
}

zpResult_t settleHeaders(Comm* c, uint64_t seq, const Header& mine, const std::vector<uint64_t>& digests,
                         zpResult_t moved) {
  if (moved != zpSuccess && moved != zpInvalidUsage) return moved;
  const int n = c->nranks(), me = c->rank();
  bool same = true;
  for (uint64_t d : digests) same &= d == digests[me];
  if (same) return moved;
  // The second round: every rank's full header, to name what differs.
  HeaderLists& l = headerLists();
  std::vector<Header>& all = l.all;
  all.assign(n, Header{});
  for (Header& h : all) h.kind = kNoHeader;
  all[me] = mine;
  std::vector<Op> ops;
  for (int i = 1; i < n; i++) {
    const int to = (me + i) % n, from = (me - i + n) % n;
    ops.emplace_back(OpKind::kCollective, true, to, &all[me], sizeof(Header), 1);
    ops.emplace_back(OpKind::kCollective, false, from, &all[from], sizeof(Header), 1);
  }
  const zpResult_t headers = run(c, ops, msgid::collectiveXfer(seq, kStepHeaders));
  if (headers != zpSuccess && headers != zpInvalidUsage) return headers;
  ZP_CHECK(compareHeaders(me, all));
  // Digests that differ while the headers agree: a header that never came.
  return fail(zpInvalidUsage, "rank %d: the ranks' calls differ (a rank called another operation)", me);
}

}  // namespace detail

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

}  // namespace zp
