// Where zprun's ranks run and with which environment: see layout.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/layout.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

extern char** environ;

namespace zprun {

JobLayout planLayout(const Options& opts, const zpcluster::Cluster* cluster) {
  JobLayout layout;
  layout.cluster = cluster;
  if (cluster == nullptr) {
    layout.nodes.push_back(NodeSpec{});
    for (int r = 0; r < opts.nranks; ++r) layout.ranks.push_back(RankSpec{r, 0, r, opts.nranks, -1});
    return layout;
  }
  const zpcluster::ClusterSpec& spec = cluster->spec();
  for (int i = 0; i < spec.nodes; ++i) {
    NodeSpec node;
    node.index = i;
    // mpirun and its daemons find the nodes by name.
    node.entry = cluster->nodeEntry(i, opts.mpirun);
    layout.nodes.push_back(node);
  }
  if (opts.mpirun) {
    layout.mpirun = true;
    layout.ranks.push_back(RankSpec{0, 0, 0, 1, 0});
    return layout;
  }
  for (int i = 0; i < spec.nodes; ++i)
    for (int local = 0; local < spec.ranksPerNode; ++local)
      layout.ranks.push_back(RankSpec{i * spec.ranksPerNode + local, i, local, spec.ranksPerNode,
                                      local % spec.nicsPerNode});
  return layout;
}

std::vector<std::string> jobVariables(const JobLayout& layout, const RankSpec& spec,
                                      const std::string& idHex) {
  std::vector<std::string> set;
  const NodeSpec& node = layout.nodes[spec.node];
  set.push_back("ZP_RANK=" + std::to_string(spec.rank));
  set.push_back("ZP_NRANKS=" + std::to_string(layout.ranks.size()));
  set.push_back("ZP_LOCAL_RANK=" + std::to_string(spec.localRank));
  set.push_back("ZP_LOCAL_NRANKS=" + std::to_string(spec.localNranks));
  // Every rank zprun starts runs on this machine: an emulated cluster's
  // other nodes share its cores (shared memory's waiting counts them as the
  // job's, not as other load).
  set.push_back("ZP_HOST_RANKS=" + std::to_string(layout.ranks.size()));
  set.push_back("ZP_UNIQUE_ID=" + idHex);
  set.push_back("ZP_LAUNCHER=zprun");
  if (!node.nodeId.empty()) set.push_back("ZP_NODE_ID=" + node.nodeId);
  if (layout.cluster != nullptr) {
    const zpcluster::ClusterSpec& c = layout.cluster->spec();
    set.push_back("ZP_NODE_RANK=" + std::to_string(spec.node));
    set.push_back("ZP_NNODES=" + std::to_string(c.nodes));
    set.push_back("ZP_NICS_PER_NODE=" + std::to_string(c.nicsPerNode));
    set.push_back("ZP_NIC_RATE_BPS=" + std::to_string(c.rateBps));
  }
  return set;
}

// What zprun --mpirun tells every MPI rank about the cluster (through
// mpirun's -x): the same for all, unlike a rank's place.
std::vector<std::string> mpirunVariables(const zpcluster::ClusterSpec& c) {
  return {"ZP_LOCAL_NRANKS=" + std::to_string(c.ranksPerNode),
          "ZP_HOST_RANKS=" + std::to_string(c.nodes * c.ranksPerNode), "ZP_NNODES=" + std::to_string(c.nodes),
          "ZP_NICS_PER_NODE=" + std::to_string(c.nicsPerNode),
          "ZP_NIC_RATE_BPS=" + std::to_string(c.rateBps)};
}

// What zprun --mpirun sets for mpirun itself: the variables above (which -x
// then exports), and, when the cluster has more ranks than the machine has
// cores, Open MPI's idle yielding, as mpirun does by itself for more ranks
// than slots on one machine (the hostfile's slots hide that the emulated
// nodes share the machine's cores). Lower in precedence than --mca, so
// `--mpirun --mca mpi_yield_when_idle 0 --` turns it off.
std::vector<std::string> mpirunEnvironment(const zpcluster::ClusterSpec& c) {
  std::vector<std::string> set = mpirunVariables(c);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && static_cast<long>(c.nodes) * c.ranksPerNode > cores &&
      getenv("OMPI_MCA_mpi_yield_when_idle") == nullptr)
    set.push_back("OMPI_MCA_mpi_yield_when_idle=1");
  return set;
}

// The full environment of one rank: zprun's own, then -x, then the job's
// variables (later entries replace earlier ones of the same name). For
// mpirun, which passes its environment on to the ranks here, zprun's own
// rank variables (from an outer launcher) are left out.
std::vector<std::string> rankEnvironment(const Options& opts, const JobLayout& layout,
                                         const RankSpec& spec, const std::string& idHex) {
  std::vector<std::string> set;
  if (layout.mpirun) {
    set = opts.extraEnv;
    for (std::string& v : mpirunEnvironment(layout.cluster->spec())) set.push_back(v);
  } else if (layout.cluster != nullptr) {
    // The rank's NIC; -x may name others (all of the node's, say).
    set.push_back("ZP_NET_DEVICES=" + zpcluster::nicName(spec.nic));
    set.push_back("ZP_SOCKET_IFNAME=" + zpcluster::nicName(spec.nic));
  }
  if (!layout.mpirun) {
    set.insert(set.end(), opts.extraEnv.begin(), opts.extraEnv.end());
    for (std::string& v : jobVariables(layout, spec, idHex)) set.push_back(v);
  }

  auto nameOf = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  auto overridden = [&](const std::string& name, size_t from) {
    for (size_t k = from; k < set.size(); ++k)
      if (nameOf(set[k]) == name) return true;
    return false;
  };

  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    // zprun's own ZP_NODE_ID would make all nodes of a cluster one.
    if (layout.cluster != nullptr && nameOf(*e) == "ZP_NODE_ID") continue;
    auto isNamed = [&](const char* v) { return nameOf(*e) == v; };
    if (layout.mpirun && (std::any_of(std::begin(kReservedVars), std::end(kReservedVars), isNamed) ||
                          std::any_of(std::begin(kReservedClusterVars),
                                      std::end(kReservedClusterVars), isNamed)))
      continue;
    if (!overridden(nameOf(*e), 0)) env.push_back(*e);
  }
  for (size_t k = 0; k < set.size(); ++k)
    if (!overridden(nameOf(set[k]), k + 1)) env.push_back(set[k]);
  return env;
}

}  // namespace zprun
