// The routing state of one communicator (src/core/routing.h's Routing): the
// routing setting, NIC health (nic_health.h) and the router's last plan
// (router.h), the node's NIC queues (nic_queues.h). The relay (transport/relay) and routed collectives reach it
// through the communicator, never by name.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/routing.h"
#include "src/route/nic_health.h"
#include "src/route/nic_queues.h"
#include "src/route/rail_rates.h"
#include "src/route/router.h"

namespace zp {

class RoutingState : public Routing {
 public:
  explicit RoutingState(const Comm& comm);

  uint64_t chunkBytes() const override { return params_.chunkBytes; }
  uint64_t directBelow() const override { return params_.directBelow; }
  const std::vector<int>& rails() const override { return comm_.rail(); }
  bool directAlive(int peer) const override { return health_.directAlive(peer); }
  bool pathUp(int a, int b) const override { return health_.pathUp(a, b); }
  bool reliesOnProxies(int r) const override { return health_.reliesOnProxies(r); }
  bool nodeCut(int node) const override { return health_.nodeCut(node); }
  void checkNic() override { health_.check(); }
  void heardNicDown(const std::string& text) override { health_.heard(text); }
  std::vector<NicDown> applyNicNews() override;
  std::string encodeNicDown(const NicDown& nic) const override { return NicHealth::encode(nic); }
  void addQueued(int64_t bytes) override { queues_.add(bytes); }
  void chunkQueued(int srcProxy, uint64_t bytes) override;
  void chunkAcked(int srcProxy, uint64_t bytes) override;
  void chunkDropped(int srcProxy, uint64_t bytes) override;
  RailView railView() const override { return rails_.ownView(); }
  void heardRailView(int src, int dst, const RailView& view) override;
  std::vector<std::pair<int, std::string>> tickRails() override;
  void heardRailNews(int from, const std::string& text) override;
  uint64_t railReport() const override { return rails_.report(); }
  std::vector<RailStatus> railStatus() const override;
  bool pickPath(int src, int dst, uint64_t bytes, const std::vector<uint64_t>& extraByRail,
                std::vector<RouteChunk>* chunks, std::string* why) override;
  void proxyLeft(int rank) override;
  zpResult_t plan(const std::vector<uint64_t>& key, const std::vector<std::vector<uint64_t>>& bytes,
                  const std::vector<uint64_t>& railReports, const std::vector<Transfer>** out,
                  std::string* why) override;

 private:
  // The cluster as the router sees it: NICs found down left out, and the
  // rates of slow rails scaled (by this rank's verdicts, on this node and
  // farNode, for a point-to-point path; by every rank's reports for a plan).
  ClusterTopology ratedForPath(int farNode) const;
  // The same without the ranks that left as NIC owners (proxyLeft), but
  // for those that stay for src or dst (proxyLeft).
  ClusterTopology withoutLeft(ClusterTopology topo, int src, int dst) const;
  ClusterTopology ratedByReports(const std::vector<uint64_t>& reports) const;
  // The rail whose counters a chunk leaving from srcProxy goes in (-1:
  // none: estimates off, no shared words, or a rail beyond those measured).
  int countedRail(int srcProxy) const;
  // The name of this node's NIC of that rail.
  std::string nicName(int rail) const;

  const Comm& comm_;
  RouteParams params_;
  NicHealth health_;
  NicQueues queues_;
  CarrierTransport* local_;  // the node's shared words (null: none)
  RailRates rails_;
  uint64_t railsReadUs_ = 0;
  RoutePlan plan_;  // the last plan, and the key it was made for
  std::vector<uint64_t> planKey_;
  std::vector<int> left_;  // ranks that came to destroy: no proxies any more
};

// Routes the communicator's traffic to other nodes when routing pays:
// routing is on (ZP_ROUTING), and there are several nodes and several rails
// to spread the traffic over. Then it gets a RoutingState, the relay is
// installed for the ranks of other nodes, and its progress thread starts.
void enableRouting(Comm* comm);

}  // namespace zp
