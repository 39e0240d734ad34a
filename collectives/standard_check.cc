// The header check: every rank's call (which collective, count, datatype,
// op, root, a v call's recvcounts, whether it refused its arguments) sent to
// every other rank and compared exactly, before any data moves; and the
// names of datatypes and ops for its messages.
#include <cstring>
#include <string>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"
#include "src/util/per_thread.h"

namespace zp {
namespace detail {

namespace {

static_assert(sizeof(size_t) == sizeof(uint64_t), "recvcounts travel as 64-bit words");

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

// The API call a header's kind stands for, as a refusing rank's messages name it.
const char* apiName(const Header& h) {
  if (h.split) return "zpCommSplit";
  switch ((CollKind)h.kind) {
    case CollKind::kAllReduce: return "zpAllReduce";
    case CollKind::kBroadcast: return "zpBroadcast";
    case CollKind::kReduce: return "zpReduce";
    case CollKind::kAllGather: return "zpAllGather";
    case CollKind::kReduceScatter: return "zpReduceScatter";
    case CollKind::kBarrier: return "zpBarrier";
    case CollKind::kAllGatherv: return "zpAllGatherv";
    case CollKind::kReduceScatterv: return "zpReduceScatterv";
  }
  return "a collective";
}

bool reduces(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduce || k == CollKind::kReduceScatter ||
         k == CollKind::kReduceScatterv;
}

std::string describe(const Header& h) {
  if (h.split) return "zpCommSplit";
  CollKind k = (CollKind)h.kind;
  std::string s = kindName(k);
  if (k == CollKind::kBarrier) return s;
  s += " of " + std::to_string(h.count) + " " + typeName((zpDataType_t)h.dtype);
  if (isV(k)) s += " in all, split by recvcounts";
  if (reduces(k)) s += std::string(" (") + opName((zpRedOp_t)h.op) + ")";
  if (k == CollKind::kBroadcast || k == CollKind::kReduce) s += " to root " + std::to_string(h.root);
  return s;
}

// The second round's record: a rank's header and, if it refused its
// arguments, why (its own error message, cut to fit).
struct Verdict {
  Header h;
  char why[448];
};

bool came(const Header& h) { return h.magic == kHeaderMagic; }

// The error every rank returns once the second round has brought every
// rank's verdict: a refusing rank its own; the others the first refusing
// rank's reason; else the first call that differs from rank 0's (by its
// header, then by its recvcounts where round one brought them).
zpResult_t explain(int me, const std::vector<Verdict>& v, const HeaderSlots& s, zpResult_t refusedCode) {
  const int n = (int)v.size();
  if (v[me].h.refused) return fail(refusedCode, "%s", v[me].why);
  for (int r = 0; r < n; r++) {
    if (!came(v[r].h) || !v[r].h.refused) continue;
    std::string why = v[r].why;
    const std::string prefix = std::string(apiName(v[r].h)) + ": ";
    if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
    return fail(zpInvalidUsage, "rank %d: rank %d refused %s: %s", me, r, apiName(v[r].h), why.c_str());
  }
  // A rank whose record never came is in another call.
  auto name = [&](int r) { return came(v[r].h) ? describe(v[r].h) : std::string("another collective"); };
  for (int r = 1; r < n; r++)
    if (!came(v[r].h) || !came(v[0].h) || !v[r].h.sameCall(v[0].h))
      return fail(zpInvalidUsage, "rank %d: rank 0 calls %s but rank %d calls %s", me, name(0).c_str(), r,
                  name(r).c_str());
  const int ref = came(s.at(0)) ? 0 : me;  // rank 0's recvcounts, if they came here
  for (int r = 0; r < n; r++)
    for (uint64_t i = 0; came(s.at(r)) && v[r].h.hasCounts() && i < (uint64_t)n; i++)
      if (s.counts(r)[i] != s.counts(ref)[i])
        return fail(zpInvalidUsage, "rank %d: rank %d calls %s with recvcounts[%llu]=%llu but rank %d calls %s with "
                    "recvcounts[%llu]=%llu", me, ref, describe(v[0].h).c_str(), (unsigned long long)i,
                    (unsigned long long)s.counts(ref)[i], r, describe(v[0].h).c_str(), (unsigned long long)i,
                    (unsigned long long)s.counts(r)[i]);
  return fail(zpInvalidUsage, "rank %d: the ranks' calls differ (a rank called another operation)", me);
}

// Round one of a header check from this rank's header (and a v call's
// recvcounts, or zeros without them), then settleHeaders.
zpResult_t headerRound(Comm* c, uint64_t seq, const Header& mine, const size_t* counts, zpResult_t refusedCode,
                       const std::string& refusedWhy) {
  const size_t countWords = mine.hasCounts() ? (size_t)c->nranks() : 0;
  const size_t words = sizeof(Header) / sizeof(uint64_t) + countWords;
  std::vector<uint64_t>& buf = headerLists().slots;
  buf.resize(words * (size_t)c->nranks());
  const HeaderSlots s{(char*)buf.data(), words * sizeof(uint64_t)};
  s.at(c->rank()) = mine;
  uint64_t* mc = (uint64_t*)s.counts(c->rank());
  for (size_t i = 0; i < countWords; i++) mc[i] = counts ? counts[i] : 0;
  return settleHeaders(c, seq, s, runHeaderRound(c, headerOps(c, s), msgid::collectiveXfer(seq, 0)), refusedCode,
                       refusedWhy);
}

}  // namespace

bool isV(CollKind k) { return k == CollKind::kAllGatherv || k == CollKind::kReduceScatterv; }

HeaderLists& headerLists() { return PerThread<HeaderLists>::get(); }

std::vector<Op>& headerOps(Comm* c, const HeaderSlots& s) {
  const int n = c->nranks(), me = c->rank();
  std::vector<Op>& ops = headerLists().ops;
  ops.clear();
  for (int i = 1; i < n; i++) {
    const int to = (me + i) % n, from = (me - i + n) % n;
    s.at(from).magic = 0;  // a receive that is refused (another size) writes nothing
    ops.emplace_back(OpKind::kCollective, true, to, &s.at(me), s.stride, 1);
    ops.emplace_back(OpKind::kCollective, false, from, &s.at(from), s.stride, 1);
  }
  return ops;
}

zpResult_t checkHeaders(Comm* c, uint64_t seq, const Header& mine, const size_t* counts) {
  return headerRound(c, seq, mine, counts, zpSuccess, std::string());
}

zpResult_t runHeaderRound(Comm* c, std::vector<Op>& ops, uint64_t id) {
  for (Op& op : ops) op.stampsArrival = stampsArrival(c, op);
  const uint64_t entered = stampUs();  // this rank's entry
  const zpResult_t r = run(c, ops, id);
  std::vector<uint64_t>& arrived = headerLists().arrivedUs;
  arrived.assign(c->nranks(), 0);
  for (const Op& op : ops)
    if (!op.isSend) arrived[op.peer] = op.arrivedUs;
  arrived[c->rank()] = entered;
  if (r != zpSuccess) return r;
  recordWaits(c->waitStats(), c->rank(), arrived);
  return r;
}

zpResult_t settleHeaders(Comm* c, uint64_t seq, const HeaderSlots& s, zpResult_t moved, zpResult_t refusedCode,
                         const std::string& refusedWhy) {
  if (moved != zpSuccess && moved != zpInvalidUsage) return moved;
  const int n = c->nranks(), me = c->rank();
  // A message out of order (a send nobody received) broke the communicator:
  // that is the error, not the calls.
  if (c->asyncError() != zpSuccess)
    return fail(c->asyncError(), "rank %d: the communicator is broken: %s", me, c->asyncMessage().c_str());
  const Header& mine = s.at(me);
  bool agreed = !mine.refused;
  for (int r = 0; r < n && agreed; r++) {
    const Header& h = s.at(r);
    agreed = came(h) && !h.refused && h.sameCall(mine) &&
             (!mine.hasCounts() || memcmp(s.counts(r), s.counts(me), (size_t)n * sizeof(uint64_t)) == 0);
  }
  if (agreed) return moved;
  // The second round: every rank's header and reason, to name what differs.
  std::vector<Verdict> v(n);
  v[me].h = mine;
  snprintf(v[me].why, sizeof(v[me].why), "%s", refusedWhy.c_str());
  std::vector<Op> ops;
  for (int i = 1; i < n; i++) {
    const int to = (me + i) % n, from = (me - i + n) % n;
    v[from].h.magic = 0;
    ops.emplace_back(OpKind::kCollective, true, to, &v[me], sizeof(Verdict), 1);
    ops.emplace_back(OpKind::kCollective, false, from, &v[from], sizeof(Verdict), 1);
  }
  const zpResult_t verdicts = run(c, ops, msgid::collectiveXfer(seq, kStepHeaders));
  if (verdicts != zpSuccess && verdicts != zpInvalidUsage) return verdicts;
  for (Verdict& x : v) x.why[sizeof(x.why) - 1] = 0;  // a peer's text, ended here
  return explain(me, v, s, refusedCode);
}

}  // namespace detail

zpResult_t refuseCollective(Comm* c, CollKind kind, zpResult_t code, const std::string& why) {
  using namespace detail;
  const uint64_t seq = c->nextCollSeq();  // the same number as the peers' call
  if (c->nranks() == 1) return fail(code, "%s", why.c_str());
  Header mine;
  mine.kind = (uint8_t)kind;
  mine.refused = 1;
  return headerRound(c, seq, mine, nullptr, code, why);
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

}  // namespace zp
