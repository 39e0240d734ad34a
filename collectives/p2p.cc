// Point-to-point calls and groups. Outside a group each call runs at once;
// inside, calls queue until the outermost zpGroupEnd, where all sends and
// receives of the group progress together (so exchanges cannot deadlock) and
// then the group's collectives run in call order.
#include <algorithm>
#include <memory>
#include <mutex>

#include "collectives/collectives.h"
#include "src/core/log.h"
#include "src/util/per_thread.h"

namespace zp {

namespace {

struct Group {
  int depth = 0;
  // The communicators the group's sends and receives use, each held once:
  // one destroyed by another thread while this group is open stays alive
  // (and says so) until the group ends. Their calls' ops point at them.
  std::vector<std::shared_ptr<Comm>> held;
  std::vector<std::pair<Comm*, Op>> p2p;
  std::vector<std::pair<std::shared_ptr<Comm>, std::function<zpResult_t()>>> collectives;
  // groupEnd's storage, kept from group to group.
  std::vector<std::shared_ptr<Comm>> heldRunning;
  std::vector<std::pair<Comm*, Op>> running;
  std::vector<Op*> ops;
  std::vector<Op*> single;  // a call outside a group: its one op
};
Group& tlsGroup() { return PerThread<Group>::get(); }

}  // namespace

bool groupOpen() { return tlsGroup().depth > 0; }

bool groupUses(Comm* comm) {
  for (auto& e : tlsGroup().p2p)
    if (e.first == comm) return true;
  for (auto& e : tlsGroup().collectives)
    if (e.first.get() == comm) return true;
  return false;
}

zpResult_t groupStart() {
  tlsGroup().depth++;
  return zpSuccess;
}

zpResult_t groupEnd(bool* ended) {
  Group& g = tlsGroup();
  if (g.depth == 0) return fail(zpInvalidUsage, "zpGroupEnd called without a matching zpGroupStart");
  if (--g.depth > 0) return zpSuccess;
  if (ended) *ended = true;
  // The group's calls move out (a call made while they run starts a new
  // group), into storage kept from group to group: a send/recv group per
  // step allocates nothing here.
  std::vector<std::pair<Comm*, Op>>& p2p = g.running;
  std::vector<std::shared_ptr<Comm>>& held = g.heldRunning;
  std::vector<std::pair<std::shared_ptr<Comm>, std::function<zpResult_t()>>> colls;
  p2p.clear();
  held.clear();
  p2p.swap(g.p2p);
  held.swap(g.held);
  colls.swap(g.collectives);
  struct Clear {  // leaves no Comm alive past this group
    std::vector<std::pair<Comm*, Op>>& q;
    std::vector<std::shared_ptr<Comm>>& held;
    ~Clear() {
      q.clear();
      held.clear();
    }
  } clearAtEnd{p2p, held};

  zpResult_t res = zpSuccess;
  // One pass sorts the calls: the host ones into `ops`, and whether they
  // are all on one communicator (the common case, run without the general
  // case's lists); device ones are gathered only if there are any.
  std::vector<Op*>& ops = g.ops;
  ops.clear();
  Comm* only = nullptr;
  bool single = true, anyDevice = false;
  for (auto& e : p2p) {
    if (e.second.stream) {
      anyDevice = true;
      continue;
    }
    if (only && only != e.first) single = false;
    only = e.first;
    ops.push_back(&e.second);
  }
  // Device calls go on their streams first (enqueued, one NCCL group per
  // communicator); then the host calls run to completion.
  if (anyDevice) {
    std::vector<std::pair<Comm*, std::vector<Op*>>> device;
    for (auto& e : p2p) {
      if (!e.second.stream) continue;
      auto it = std::find_if(device.begin(), device.end(), [&](const auto& d) { return d.first == e.first; });
      if (it == device.end()) it = device.insert(device.end(), {e.first, {}});
      it->second.push_back(&e.second);
    }
    for (auto& d : device) {
      Comm::Call call(d.first, "zpGroupEnd");
      zpResult_t r = call.status() == zpSuccess ? d.first->enqueueOnStreams(d.second) : call.status();
      if (res == zpSuccess) res = r;
    }
  }
  if (only && single) {
    Comm::Call call(only, "zpGroupEnd");
    zpResult_t r = call.status() == zpSuccess ? only->runOps(ops) : call.status();
    if (call.status() == zpSuccess) recordArrivals(only, ops, r);
    if (res == zpSuccess) res = r;
  } else if (only) {
    std::vector<Comm::Work> work;
    for (auto& e : p2p) {
      if (e.second.stream) continue;
      auto it = std::find_if(work.begin(), work.end(), [&](const Comm::Work& w) { return w.comm == e.first; });
      if (it == work.end()) {
        work.push_back({e.first, {}});
        it = work.end() - 1;
      }
      it->ops.push_back(&e.second);
    }
    // Held in address order so that two threads' groups cannot deadlock.
    std::vector<Comm*> comms;
    for (auto& w : work) comms.push_back(w.comm);
    std::sort(comms.begin(), comms.end());
    std::vector<std::unique_ptr<Comm::Call>> calls;
    zpResult_t r = zpSuccess;
    for (Comm* c : comms) {
      calls.push_back(std::make_unique<Comm::Call>(c, "zpGroupEnd"));
      if (r == zpSuccess) r = calls.back()->status();
    }
    const bool ran = r == zpSuccess;
    if (ran && !work.empty()) r = Comm::runOps(work);
    for (size_t k = 0; k < work.size() && ran; k++) recordArrivals(work[k].comm, work[k].ops, r);
    calls.clear();
    if (res == zpSuccess) res = r;
  }
  for (auto& e : colls) {
    Comm::Call call(e.first.get(), "zpGroupEnd");
    zpResult_t r = call.status() == zpSuccess ? e.second() : call.status();
    if (res == zpSuccess) res = r;
  }
  return res;
}

zpResult_t enqueueP2P(Comm* comm, std::shared_ptr<Comm> hold, bool isSend, void* buf, size_t count,
                      zpDataType_t dtype, int peer, void* stream, int* source) {
  const size_t ts = typeSize(dtype);
  const char* fn = isSend ? "zpSend" : "zpRecv";
  const bool any = !isSend && peer == kAnySource;
  if (!any && (peer < 0 || peer >= comm->nranks()))
    return fail(zpInvalidArgument, "%s: peer %d is not a rank of this communicator (0..%d%s)", fn, peer,
                comm->nranks() - 1, isSend ? "" : ", or ZP_ANY_SOURCE");
  if (source) *source = any ? kAnySource : peer;
  if (count > maxElements(ts))
    return fail(zpInvalidArgument, "%s: count %zu is too large (a negative value cast to size_t?)", fn, count);
  if (count > 0 && !buf) return fail(zpInvalidArgument, "%s: buffer is NULL with count %zu", fn, count);
  Group& g = tlsGroup();
  if (g.depth > 0) {
    if (hold) g.held.push_back(std::move(hold));
    g.p2p.emplace_back();  // made in place: an Op is a few cache lines
    g.p2p.back().first = comm;
    Op& op = g.p2p.back().second;
    op.isSend = isSend;
    op.peer = peer;
    op.buf = buf;
    op.bytes = count * ts;
    op.typeSize = ts;
    op.stream = stream;
    op.source = any ? source : nullptr;
    op.stampsArrival = stampsArrival(comm, op);
    return zpSuccess;
  }
  Op op(OpKind::kP2P, isSend, peer, buf, count * ts, ts);
  op.stream = stream;
  op.source = any ? source : nullptr;
  op.stampsArrival = stampsArrival(comm, op);
  Comm::Call call(comm, fn);
  ZP_CHECK(call.status());
  std::vector<Op*>& ops = g.single;
  ops.assign(1, &op);
  // On a stream, as in NCCL: a send alone waits (on the device) for its
  // receive, so two ranks that both send first deadlock; use a group.
  if (stream) return comm->enqueueOnStreams(ops);
  const zpResult_t res = comm->runOps(ops);
  recordArrivals(comm, ops, res);
  return res;
}

void recordWaited(Comm* c, const std::vector<Op*>& ops, uint64_t entered, zpResult_t res,
                  const std::vector<uint64_t>* outside, bool endsCall) {
  WaitStats& stats = c->waitStats();
  const int me = c->rank();
  // Every op small: its receives' arrivals were noted as they finished
  // (Op::kArrivalAtFinishMax), so the last of them and the entry bound the
  // call's end within a small message's copy, with no clock read (a read
  // is a tenth of a small send/recv).
  bool small = true;
  // A peer's first message of the call is its earliest stamp (a larger
  // message whose start no transport saw has none). Most calls that wait
  // hear from one peer: its stamp is kept here, not in a slot per rank.
  int one = -1;
  bool several = false;
  uint64_t first = 0;
  for (const Op* op : ops) {
    small &= op->bytes <= Op::kArrivalAtFinishMax;
    if (!op->stampsArrival) continue;
    if (one >= 0 && op->peer != one) several = true;
    one = op->peer;
    if (op->arrivedUs && (!first || op->arrivedUs < first)) first = op->arrivedUs;
  }
  uint64_t end = std::max(entered, first);
  if (!several) {
    // A receive's (no time outside to keep) waits in a batch.
    if (res == zpSuccess && outside)
      recordWait(stats, me, one, first, entered, outside);
    else if (res == zpSuccess)
      stats.recordLater(one, first, entered);
  } else {
    std::vector<uint64_t>& at = stats.callArrivals();
    std::vector<int>& peers = stats.callPeers();
    peers.clear();
    for (const Op* op : ops) {
      if (!op->stampsArrival) continue;
      peers.push_back(op->peer);
      uint64_t& slot = at[op->peer];
      if (op->arrivedUs && (!slot || op->arrivedUs < slot)) slot = op->arrivedUs;
    }
    at[me] = entered;
    if (res == zpSuccess) recordWaits(stats, me, at, peers, outside);
    for (int p : peers) end = std::max(end, at[p]);
    at[me] = 0;
    for (int p : peers) at[p] = 0;
  }
  if (endsCall) stats.callEnded(small ? end : stampUs());
}

void queueCollective(const std::shared_ptr<Comm>& comm, std::function<zpResult_t()> run) {
  tlsGroup().collectives.emplace_back(comm, std::move(run));
}

}  // namespace zp
