// NIC health for a routed communicator: which NICs of the cluster are down,
// and so which ranks this one still reaches over the network directly.
// Each rank watches its own NIC; news of a NIC found down (by this rank or
// heard from another) is applied once, after the transports' progress, by
// the relay (transport/relay/relay.h, through RoutingState), which routes
// around it and passes the news on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/routing.h"
#include "src/core/topology.h"

namespace zp {

class NicHealth {
 public:
  // Starts from the communicator's cluster with every NIC up.
  explicit NicHealth(const Comm& comm);
  ~NicHealth();
  NicHealth(const NicHealth&) = delete;
  NicHealth& operator=(const NicHealth&) = delete;

  // The cluster with the NICs found down marked so (the router plans on it).
  const ClusterTopology& topology() const { return topo_; }
  bool nicUp(int node, int rail) const;
  // The network path between this rank and peer works: no NIC it depends on
  // is down. In a rail-optimized network (the emulated cluster), packets to
  // a rank leave on the NIC of its rail, so both ends' rails on both nodes count.
  bool directAlive(int peer) const;
  // The same for the network path between ranks a and b of different nodes.
  bool pathUp(int a, int b) const;
  // Rank r has no direct network path to some rank of another node (a NIC
  // it depends on is down): it reaches that rank only through proxies.
  bool reliesOnProxies(int r) const;

  using Down = NicDown;
  // Looks at this rank's NIC (every few ms); down: the news is queued.
  void check();
  // News from a peer (a kSeqNicDown message's text); queued.
  void heard(const std::string& text);
  // Marks the queued news down; returns the NICs that were up until now.
  std::vector<Down> apply();
  // The text of a kSeqNicDown message.
  static std::string encode(const Down& d);
  // True if every NIC of the node is down.
  bool nodeCut(int node) const;

 private:
  const Comm& comm_;
  ClusterTopology topo_;
  int probeFd_ = -1;
  uint64_t checkedMs_ = 0;
  std::vector<Down> news_;  // heard, not yet acted on
  mutable std::vector<signed char> relies_;  // reliesOnProxies by rank (-1: to work out)
};

}  // namespace zp
