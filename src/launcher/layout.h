// Where zprun's ranks run and with which environment: one node here, or the
// nodes of an emulated cluster with the way to enter them.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "src/launcher/cluster/cluster.h"
#include "src/launcher/options.h"

namespace zprun {

// Variables zprun sets for every rank; -x may not override them, since a rank
// with a wrong ZP_RANK would join the job in another rank's place.
inline const char* const kReservedVars[] = {"ZP_RANK",         "ZP_NRANKS",     "ZP_LOCAL_RANK", "ZP_LOCAL_NRANKS",
                                            "ZP_HOST_RANKS",   "ZP_UNIQUE_ID",  "ZP_LAUNCHER"};
// And in an emulated cluster (ZP_NET_DEVICES and ZP_SOCKET_IFNAME are set too,
// but -x may choose other NICs of the node).
inline const char* const kReservedClusterVars[] = {"ZP_NODE_RANK", "ZP_NNODES", "ZP_NIC_RATE_BPS",
                                                   "ZP_NICS_PER_NODE", "ZP_NODE_ID"};

// A node is a set of ranks that share memory. Without a cluster there is one
// node and the ranks simply run here; a node of an emulated cluster says how
// a rank enters it (its network namespace, hostname and boot id).
struct NodeSpec {
  int index = 0;
  std::string nodeId;  // empty: the library derives it (hostname + boot id)
  zpcluster::NodeEntry entry;  // entry.nsFd < 0: no namespace, run here
};

struct RankSpec {
  int rank = 0;
  int node = 0;  // index into JobLayout::nodes
  int localRank = 0;
  int localNranks = 0;
  int nic = -1;  // in a cluster: the node's NIC this rank uses
};

struct JobLayout {
  std::vector<NodeSpec> nodes;
  std::vector<RankSpec> ranks;  // indexed by rank
  const zpcluster::Cluster* cluster = nullptr;
  // --mpirun: the one "rank" is mpirun in node 0, which starts the real ones.
  bool mpirun = false;
};

// cluster: the emulated cluster the ranks run in, or nullptr. Rank r runs on
// node r / R as local rank r % R and uses NIC (r % R) % K, so the ranks of a
// node spread evenly over its NICs.
JobLayout planLayout(const Options& opts, const zpcluster::Cluster* cluster);

// The variables zprun sets for one rank.
std::vector<std::string> jobVariables(const JobLayout& layout, const RankSpec& spec, const std::string& idHex);

// What zprun --mpirun sets for mpirun itself (and exports to every rank).
std::vector<std::string> mpirunEnvironment(const zpcluster::ClusterSpec& c);
// ... of which these are the same for every MPI rank, unlike a rank's place.
std::vector<std::string> mpirunVariables(const zpcluster::ClusterSpec& c);

// The full environment of one rank.
std::vector<std::string> rankEnvironment(const Options& opts, const JobLayout& layout, const RankSpec& spec,
                                         const std::string& idHex);

}  // namespace zprun
