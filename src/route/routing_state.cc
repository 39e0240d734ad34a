#include "src/route/routing_state.h"

#include <algorithm>
#include <cstring>

#include "src/core/log.h"
#include "src/util/clock.h"
#include "src/route/route_schedule.h"
#include "src/route/routing_setting.h"
#include "transport/relay/relay.h"

namespace zp {

namespace {
RouteParams paramsOf(const Config& cfg) {
  RouteParams p;
  p.mode = (RouteMode)cfg.routing;
  p.chunkBytes = cfg.routeChunkBytes;
  p.directBelow = cfg.routeDirectBelow;
  return p;
}
}  // namespace

bool routingOn(const Config& cfg) { return cfg.routing != zpRoutingOff; }

size_t routedEagerBytes(const Config& cfg) { return routingOn(cfg) ? cfg.routeChunkBytes : 0; }

RoutingState::RoutingState(const Comm& comm)
    : comm_(comm),
      params_(paramsOf(comm.cfg())),
      health_(comm),
      queues_(comm.carrierFor(comm.rank()), comm.rail(), comm.nodeOf(), comm.nodeOf()[comm.rank()]),
      local_(comm.carrierFor(comm.rank())),
      rails_(comm.cfg().railSlowPct / 100.0) {}

// The rail counters' shared words, after the NIC queue's (nic_queues.h):
// per rail, the bytes on it and the bytes acknowledged so far.
namespace {
constexpr int kRailWords = 1 + kNicQueueWord;
int onRailWord(int rail) { return kRailWords + rail; }
int ackedWord(int rail) { return kRailWords + RailRates::kRails + rail; }
static_assert(kRailWords + 2 * RailRates::kRails <= CarrierTransport::kSharedWords, "not enough shared words");
}  // namespace

int RoutingState::countedRail(int srcProxy) const {
  int k = comm_.rail()[srcProxy];
  return local_ && rails_.on() && k >= 0 && k < RailRates::kRails ? k : -1;
}

void RoutingState::chunkQueued(int srcProxy, uint64_t bytes) {
  int k = countedRail(srcProxy);
  if (k >= 0) local_->addSharedWord(onRailWord(k), (int64_t)bytes);
}

void RoutingState::chunkAcked(int srcProxy, uint64_t bytes) {
  int k = countedRail(srcProxy);
  if (k < 0) return;
  local_->addSharedWord(onRailWord(k), -(int64_t)bytes);
  local_->addSharedWord(ackedWord(k), (int64_t)bytes);
}

void RoutingState::chunkDropped(int srcProxy, uint64_t bytes) {
  int k = countedRail(srcProxy);
  if (k >= 0) local_->addSharedWord(onRailWord(k), -(int64_t)bytes);
}

void RoutingState::heardRailView(int src, int /*dst*/, const RailView& view) {
  // Only a view from another node is news: this node measures its own.
  int from = comm_.nodeOf()[src];
  if (from != comm_.nodeOf()[comm_.rank()]) rails_.heard(from, view, nowUs());
}

std::vector<std::pair<int, std::string>> RoutingState::tickRails() {
  std::vector<std::pair<int, std::string>> out;
  const uint64_t now = nowUs();
  if (!local_ || !rails_.on() || now < railsReadUs_ + RailRates::kTickUs) return out;
  railsReadUs_ = now;
  const int me = comm_.rank(), myNode = comm_.nodeOf()[me];
  const ClusterTopology& topo = health_.topology();
  const std::vector<int>& mine = topo.nodeRanks[myNode];
  for (int k = 0; k < RailRates::kRails && k < (int)topo.node[myNode].nics.size(); k++) {
    uint64_t onRail = 0, acked = 0;
    for (int r : mine) {
      onRail += local_->sharedWord(r, onRailWord(k));
      acked += local_->sharedWord(r, ackedWord(k));
    }
    rails_.observe(k, onRail, acked, now);
  }
  for (const RailRates::Change& c : rails_.takeChanges()) {
    std::string nic = nicName(c.rail);
    std::string how = c.farNode >= 0 ? " (as node " + std::to_string(c.farNode) + " measured it)" : "";
    if (c.slow)
      ZP_WARN(kSubNet,
              "rank %d: NIC %s (rail %d of node %d) moves %.0f Mbit/s, its rail peers %.0f Mbit/s%s: routing around "
              "it%s",
              me, nic.c_str(), c.rail, myNode, c.bitsPerSec / 1e6, c.othersBitsPerSec / 1e6, how.c_str(),
              comm_.nnodes() == 2 ? " (the path to the other node: with two nodes either end may be the slow one)"
                                  : "");
    else
      ZP_WARN(kSubNet, "rank %d: NIC %s (rail %d of node %d) moves %.0f Mbit/s again, its rail peers %.0f Mbit/s%s: "
              "back to its full share",
              me, nic.c_str(), c.rail, myNode, c.bitsPerSec / 1e6, c.othersBitsPerSec / 1e6, how.c_str());
  }
  if (rails_.takeNews()) {
    // To this rank's counterpart (the same local index) on every other node.
    RailView view = rails_.ownView();
    std::string text((const char*)&view, sizeof(view));
    int local = topo.rankLocal[me];
    for (int n = 0; n < topo.nodes(); n++)
      if (n != myNode && !topo.nodeRanks[n].empty())
        out.emplace_back(topo.nodeRanks[n][local % topo.nodeRanks[n].size()], text);
  }
  return out;
}

void RoutingState::heardRailNews(int from, const std::string& text) {
  RailView view;
  if (text.size() != sizeof(view) || from < 0 || from >= comm_.nranks()) return;
  memcpy(&view, text.data(), sizeof(view));
  rails_.heard(comm_.nodeOf()[from], view, nowUs());
}

std::string RoutingState::nicName(int rail) const {
  const std::vector<std::string>& names = comm_.nodeNicNames();
  return rail < (int)names.size() ? names[rail] : "rail" + std::to_string(rail);
}

std::vector<RailStatus> RoutingState::railStatus() const {
  const int myNode = comm_.nodeOf()[comm_.rank()];
  std::vector<RailStatus> out;
  const std::vector<Nic>& nics = health_.topology().node[myNode].nics;
  for (int k = 0; k < (int)nics.size(); k++) {
    RailStatus s;
    s.rail = k;
    s.nic = nicName(k);
    s.nominalBitsPerSec = nics[k].bitsPerSec;
    RailRates::RailState st = rails_.railState(k);
    s.bitsPerSec = st.bitsPerSec;
    s.slow = st.slow;
    s.changes = st.changes;
    out.push_back(s);
  }
  return out;
}

ClusterTopology RoutingState::ratedForPath(int farNode) const {
  ClusterTopology topo = health_.topology();
  const int myNode = comm_.nodeOf()[comm_.rank()];
  for (int node : {myNode, farNode}) {
    std::vector<Nic>& nics = topo.node[node].nics;
    for (int k = 0; k < (int)nics.size(); k++) nics[k].bitsPerSec *= rails_.factor(k);
  }
  return topo;
}

ClusterTopology RoutingState::ratedByReports(const std::vector<uint64_t>& reports) const {
  ClusterTopology topo = health_.topology();
  if (reports.size() != (size_t)comm_.nranks()) return topo;
  // A NIC's factor is the median of what its node's ranks report (they
  // judge the same counters at slightly different times; the median leaves
  // out one that has not caught up). Every rank reads the same rows, so
  // every rank computes the same rates.
  for (int node = 0; node < topo.nodes(); node++) {
    std::vector<Nic>& nics = topo.node[node].nics;
    for (int k = 0; k < (int)nics.size(); k++) {
      std::vector<double> f;
      for (int r : topo.nodeRanks[node]) f.push_back(RailRates::reportFactor(reports[r], k));
      if (f.empty()) continue;
      std::sort(f.begin(), f.end());
      nics[k].bitsPerSec *= f[f.size() / 2];
    }
  }
  return topo;
}

std::vector<NicDown> RoutingState::applyNicNews() {
  std::vector<NicDown> fresh = health_.apply();
  if (!fresh.empty()) planKey_.clear();  // plans made with the NIC are void
  return fresh;
}

bool RoutingState::pickPath(int src, int dst, uint64_t bytes, const std::vector<uint64_t>& extraByRail,
                            std::vector<RouteChunk>* chunks, std::string* why) {
  std::vector<uint64_t> queued = extraByRail;
  queues_.addTo(&queued);
  // The cluster is copied only to scale a slow rail or to leave out ranks
  // that left: otherwise the plan is made on the cluster as it is.
  std::vector<Piece> pieces;
  zpResult_t res;
  if (!rails_.anySlow() && left_.empty()) {
    res = zp::pickPath(health_.topology(), src, dst, bytes, queued, params_, &pieces, why);
  } else {
    const ClusterTopology topo = rails_.anySlow() ? ratedForPath(comm_.nodeOf()[dst]) : health_.topology();
    res = zp::pickPath(withoutLeft(topo, src, dst), src, dst, bytes, queued, params_, &pieces, why);
  }
  if (res != zpSuccess) return false;
  *chunks = scheduleChunks(pieces, params_.chunkBytes);
  return true;
}

void RoutingState::proxyLeft(int rank) {
  if (std::find(left_.begin(), left_.end(), rank) == left_.end()) left_.push_back(rank);
}

ClusterTopology RoutingState::withoutLeft(ClusterTopology topo, int src, int dst) const {
  // A rank with no NIC owns none: the router's proxies are owners of NICs.
  // A leaving rank stays in destroy for a rank of its node that relies on
  // proxies until that rank comes to destroy too (Relay::stayFor), so a
  // path from or to such a rank may use it: it may be the only one left.
  const std::vector<int>& node = comm_.nodeOf();
  const bool keepSrcNode = health_.reliesOnProxies(src), keepDstNode = health_.reliesOnProxies(dst);
  for (int r : left_)
    if (!(keepSrcNode && node[r] == node[src]) && !(keepDstNode && node[r] == node[dst])) topo.rankNic[r] = -1;
  return topo;
}

zpResult_t RoutingState::plan(const std::vector<uint64_t>& key, const std::vector<std::vector<uint64_t>>& bytes,
                              const std::vector<uint64_t>& railReports, const std::vector<Transfer>** out,
                              std::string* why) {
  if (key != planKey_) {
    planKey_.clear();
    ZP_CHECK(planRoutes(ratedByReports(railReports), bytes, params_, &plan_, why));
    scheduleTransfers(&plan_.transfers, params_.chunkBytes);
    planKey_ = key;
    ZP_TRACE(kSubColl, "rank %d: %s", comm_.rank(), zp::describe(plan_, 4).c_str());
  }
  *out = &plan_.transfers;
  return zpSuccess;
}

void enableRouting(Comm* c) {
  if (!routingOn(c->cfg()) || c->nnodes() < 2) return;
  bool severalRails = false;
  for (int r = 1; r < c->nranks(); r++) severalRails |= c->rail()[r] != c->rail()[0];
  if (!severalRails) return;
  std::vector<int> remote;
  for (int r = 0; r < c->nranks(); r++)
    if (!c->isLocal(r)) remote.push_back(r);
  c->setRouting(std::make_unique<RoutingState>(*c));
  c->installTransport(
      std::make_unique<Relay>(c->transportContext(), c->carrierFor(c->rank()), c->carrierFor(remote[0]), c->routing()),
      remote);
  c->startProgressThread();
}

}  // namespace zp
