// This rank's place among the NICs (topology.h's chooseNic and clusterOf):
// which NIC it sends through, and the cluster as the ranks reported theirs.
#include <net/if.h>

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/topology.h"

namespace zp {

zpResult_t chooseNic(const Config& cfg, int rank, int nranks, int localRank, int localRanks, std::string* nic,
                     int* rail, double* bitsPerSec, std::vector<std::string>* nodeNics) {
  *rail = 0;
  *bitsPerSec = 0;
  std::string file = envString("ZP_TOPO_FILE");
  if (!file.empty()) {
    ClusterTopology topo;
    if (zpResult_t r = loadTopoFile(file, &topo)) {
      const std::string why = lastError();  // fail() writes where lastError() points
      return fail(r, "ZP_TOPO_FILE=%s: %s", file.c_str(), why.c_str());
    }
    if (topo.nranks() != nranks)
      return fail(zpInvalidArgument, "ZP_TOPO_FILE=%s describes %d ranks, but the communicator has %d", file.c_str(),
                  topo.nranks(), nranks);
    int idx = topo.rankNic[rank];
    if (nodeNics)
      for (const Nic& n : topo.node[topo.rankNode[rank]].nics) nodeNics->push_back(n.name);
    if (idx >= 0) {
      *nic = topo.node[topo.rankNode[rank]].nics[idx].name;
      *bitsPerSec = topo.node[topo.rankNode[rank]].nics[idx].bitsPerSec;
      *rail = idx;
    }
  } else {
    NodeTopology node;
    if (zpResult_t r = discoverNode(&node)) {
      const std::string root = envString("ZP_SYSFS_ROOT"), why = lastError();
      return root.empty() ? r : fail(zpInvalidArgument, "ZP_SYSFS_ROOT=%s: %s", root.c_str(), why.c_str());
    }
    std::string why;
    int idx = pickNic(node, localRank, localRanks, cfg.netDevices, &why);
    if (nodeNics)
      for (const Nic& n : node.nics) nodeNics->push_back(n.name);
    if (idx >= 0) {
      *nic = node.nics[idx].name;
      *bitsPerSec = node.nics[idx].bitsPerSec;
      *rail = idx;
    } else if (cfg.netDevices.find(',') == std::string::npos && if_nametoindex(cfg.netDevices.c_str())) {
      *nic = cfg.netDevices;  // named outright, though discovery passes it over (lo, a bridge)
    } else if (!cfg.netDevices.empty()) {
      return fail(zpInvalidArgument, "rank %d: ZP_NET_DEVICES=%s: %s", rank, cfg.netDevices.c_str(), why.c_str());
    } else {
      *nic = cfg.socketIfname;  // no NIC found: the bootstrap's interface, or UCX's choice
    }
  }
  ZP_INFO(kSubNet | kSubInit, "rank %d (local rank %d of %d): NIC %s", rank, localRank, localRanks,
          nic->empty() ? "chosen by UCX" : nic->c_str());
  return zpSuccess;
}

ClusterTopology clusterOf(int nnodes, const std::vector<int>& nodeOf, const std::vector<int>& localIndex,
                          const std::vector<int>& rail, const std::vector<double>& rates) {
  ClusterTopology t;
  const int nranks = (int)nodeOf.size();
  t.node.assign(nnodes, NodeTopology());
  t.nodeRanks.assign(nnodes, {});
  t.rankNode = nodeOf;
  t.rankLocal = localIndex;
  t.rankNic = rail;
  for (int r = 0; r < nranks; r++) {
    NodeTopology& n = t.node[nodeOf[r]];
    t.nodeRanks[nodeOf[r]].push_back(r);
    if ((int)n.nics.size() <= rail[r]) n.nics.resize(rail[r] + 1);
    Nic& nic = n.nics[rail[r]];
    nic.name = "rail" + std::to_string(rail[r]);
    if (rates[r] > 0) nic.bitsPerSec = rates[r];
  }
  return t;
}

}  // namespace zp
