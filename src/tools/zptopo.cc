// zptopo: prints what a rank on this machine sees of the topology: its node,
// local rank, NIC, the node's NICs, NUMA nodes and GPUs, or with ZP_TOPO_FILE
// the file's cluster. It reads hwloc and /sys only: no communicator, no
// network traffic.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/topology.h"
#include "src/util/cli.h"
#include "src/util/strings.h"

namespace {

// Members in the order they are set, as the text output has them.
using Json = nlohmann::ordered_json;

constexpr int kExitError = 1;  // discovery failed, a bad topology file, a bad ZP_NET_DEVICES
constexpr int kExitUsage = 2;  // bad options or environment

// The command line: CLI11 (src/util/cli.h).
void defineOptions(CLI::App& app, bool* json) {
  zp::cli::configure(app, "usage: zptopo [--json] [-h|--help]\n", 14);
  app.description(
      "Prints what a Zeppelin rank on this machine sees: its node id, local rank,\n"
      "the NIC it would use, and the node's NICs (bandwidth, NUMA node, PCI bus id),\n"
      "NUMA nodes and GPUs, as found by hwloc and /sys/class/net. With ZP_TOPO_FILE\n"
      "set, prints the cluster that file describes instead (and with ZP_RANK set,\n"
      "that rank's place in it). Sends nothing over any network.");
  zp::cli::addFlag(app, "--json", json,
                   "machine-readable output (one JSON object; its \"node\" or\n"
                   "\"cluster\" member is in the topology file format)");
  app.footer(
      "Environment:\n"
      "  ZP_NODE_ID                the node id (default: hostname + boot id)\n"
      "  ZP_LOCAL_RANK, ZP_LOCAL_NRANKS\n"
      "                            this rank among the node's ranks (default 0 of 1)\n"
      "  ZP_NET_DEVICES            comma-separated NICs the ranks may use, in order\n"
      "  ZP_NIC_RATE_BPS           caps every NIC's rate (bits/s; zprun sets it)\n"
      "  ZP_TOPO_FILE              a topology file that replaces discovery\n"
      "  ZP_SYSFS_ROOT             where discovery reads sysfs (default /sys)\n"
      "  ZP_RANK                   with ZP_TOPO_FILE: the global rank to show\n"
      "\n"
      "Exit status: 0 fine, 1 discovery or the file failed or ZP_NET_DEVICES names\n"
      "a NIC the node does not have, 2 bad options or environment.");
}

// The range depends on the topology, so the value is read through the
// parameter table as text and checked here.
bool envInt(const char* name, long lo, long hi, long dflt, long* out) {
  const std::string v = zp::envString(name);
  if (v.empty()) {
    *out = dflt;
    return true;
  }
  long long x = 0;
  if (!zp::parseInt(v.c_str(), (long long)lo, (long long)hi, &x)) {
    fprintf(stderr, "zptopo: %s='%s' is not an integer in [%ld, %ld]\n", name, v.c_str(), lo, hi);
    return false;
  }
  *out = (long)x;
  return true;
}

// What --json prints on discovery: this rank's view and, as "node", the node
// in the topology file format.
Json nodeJson(const zp::NodeTopology& node, const std::string& nodeId, const char* nodeIdFrom, const std::string& host,
              long localRank, long localRanks, const std::string& netDevices, const std::vector<int>& all, int nic,
              const std::string& why) {
  auto nicName = [&](int k) { return k >= 0 ? Json(node.nics[(size_t)k].name) : Json(nullptr); };
  Json j = {{"nodeId", nodeId}, {"nodeIdFrom", nodeIdFrom}, {"hostname", host}};
  j["localRank"] = localRank;
  j["localRanks"] = localRanks;
  j["netDevices"] = netDevices.empty() ? Json(nullptr) : Json(netDevices);
  j["nic"] = nicName(nic);
  if (nic < 0) j["nicError"] = why;
  j["virtualNics"] = Json::array();
  for (const zp::Nic& n : node.nics)
    if (n.isVirtual) j["virtualNics"].push_back(n.name);
  j["gpus"] = Json::array();
  for (const zp::Gpu& gpu : node.gpus) {
    Json hops = Json::array();
    for (int h : gpu.nicHops) hops.push_back(h >= 0 ? Json(h) : Json(nullptr));
    j["gpus"].push_back({{"pci", gpu.pciBusId}, {"numa", gpu.numa}, {"nicHops", hops}, {"nic", nicName(gpu.nic)}});
  }
  // Each local rank: its GPU (rank i drives GPU i % G), its NIC, and the
  // rail it is a proxy for (every owner of a NIC relays for it).
  j["ranks"] = Json::array();
  for (long l = 0; l < localRanks; l++) {
    const int k = all.empty() ? -1 : all[(size_t)l];
    j["ranks"].push_back({{"localRank", l},
                          {"gpu", node.gpus.empty() ? Json(nullptr) : Json(l % (long)node.gpus.size())},
                          {"nic", nicName(k)},
                          {"proxyFor", nicName(k)}});
  }
  j["node"] = Json::parse(zp::toJson(node, (int)localRanks, all));
  return j;
}

std::string hostname() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

int main(int argc, char** argv) {
  // Errors are printed here once; unless the user asked for logs, keep the
  // library from also logging them as warnings.
  setenv("ZP_DEBUG", "NONE", 0);
  bool json = false;
  CLI::App app("", "zptopo");
  defineOptions(app, &json);
  int code = 0;
  if (!zp::cli::parseOptionsOnly(app, argc, argv, "unknown argument '%s'", &code)) return code;

  std::string envNodeId = zp::envString("ZP_NODE_ID");
  std::string nodeId = envNodeId.empty() ? zp::defaultNodeId() : envNodeId;
  const char* nodeIdFrom = envNodeId.empty() ? "hostname + boot id" : "ZP_NODE_ID";
  std::string host = hostname();

  // ---- A topology file: print its cluster. ----
  std::string topoFile = zp::envString("ZP_TOPO_FILE");
  if (!topoFile.empty()) {
    zp::ClusterTopology topo;
    if (zp::loadTopoFile(topoFile, &topo) != zpSuccess) {
      fprintf(stderr, "zptopo: %s\n", zp::lastError());
      return kExitError;
    }
    long rank = -1;
    if (!envInt("ZP_RANK", 0, topo.nranks() - 1, -1, &rank)) return kExitUsage;
    int node = rank >= 0 ? topo.rankNode[(size_t)rank] : -1;
    int nic = rank >= 0 ? topo.rankNic[(size_t)rank] : -1;
    std::string nicName = nic >= 0 ? topo.node[(size_t)node].nics[(size_t)nic].name : "";
    if (json) {
      Json j = {{"nodeId", nodeId}, {"nodeIdFrom", nodeIdFrom}, {"hostname", host}, {"topoFile", topoFile}};
      if (rank >= 0) {
        j["rank"] = rank;
        j["node"] = node;
        j["localRank"] = topo.rankLocal[(size_t)rank];
        j["localRanks"] = topo.nodeRanks[(size_t)node].size();
        j["nic"] = nic >= 0 ? Json(nicName) : Json(nullptr);
      } else {
        j["rank"] = nullptr;
      }
      j["cluster"] = Json::parse(zp::toJson(topo));
      printf("%s\n", j.dump(2, ' ', false, Json::error_handler_t::replace).c_str());
      return 0;
    }
    printf("node id:        %s (%s)\n", nodeId.c_str(), nodeIdFrom);
    printf("topology file:  %s (replaces discovery)\n", topoFile.c_str());
    if (rank >= 0)
      printf("%-16snode %d (%s), local rank %d of %zu, nic %s\n",
             ("rank " + std::to_string(rank) + ":").c_str(), node, topo.node[(size_t)node].name.c_str(),
             topo.rankLocal[(size_t)rank], topo.nodeRanks[(size_t)node].size(),
             nic >= 0 ? nicName.c_str() : "none");
    printf("%s", zp::describe(topo).c_str());
    return 0;
  }

  // ---- Discovery: this node as a rank sees it. ----
  long localRanks = 1, localRank = 0;
  if (!envInt("ZP_LOCAL_NRANKS", 1, 1 << 16, 1, &localRanks)) return kExitUsage;
  if (!envInt("ZP_LOCAL_RANK", 0, localRanks - 1, 0, &localRank)) return kExitUsage;
  std::string netDevices = zp::envString("ZP_NET_DEVICES");

  zp::NodeTopology node;
  if (zp::discoverNode(&node) != zpSuccess) {
    fprintf(stderr, "zptopo: %s\n", zp::lastError());
    return kExitError;
  }
  std::string why;
  std::vector<int> all = zp::pickNics(node, (int)localRanks, netDevices, &why);  // every local rank's NIC
  int nic = all.empty() ? -1 : all[(size_t)localRank];
  int status = (nic < 0 && !netDevices.empty()) ? kExitError : 0;

  if (json) {
    printf("%s\n", nodeJson(node, nodeId, nodeIdFrom, host, localRank, localRanks, netDevices, all, nic, why)
                           .dump(2, ' ', false, Json::error_handler_t::replace)
                           .c_str());
    if (status) fprintf(stderr, "zptopo: %s\n", why.c_str());
    return status;
  }

  printf("node id:     %s (%s)\n", nodeId.c_str(), nodeIdFrom);
  printf("hostname:    %s\n", host.c_str());
  printf("local rank:  %ld of %ld%s\n", localRank, localRanks,
         zp::envString("ZP_LOCAL_RANK").empty() ? " (ZP_LOCAL_RANK / ZP_LOCAL_NRANKS unset)" : "");
  if (!netDevices.empty()) printf("net devices: %s (ZP_NET_DEVICES)\n", netDevices.c_str());
  if (nic >= 0) {
    const zp::Nic& n = node.nics[(size_t)nic];
    printf("NIC:         %s (%s)\n", n.name.c_str(),
           n.bitsPerSec > 0 ? zp::formatBitsPerSec(n.bitsPerSec).c_str() : "rate unknown");
  } else {
    printf("NIC:         none: %s\n", why.c_str());
  }
  if (localRanks > 1 && nic >= 0) {
    printf("all ranks:  ");
    for (int l = 0; l < localRanks; l++) printf(" %d:%s", l, node.nics[(size_t)all[(size_t)l]].name.c_str());
    printf("\n");
  }
  if (!node.gpus.empty() && !all.empty()) {
    // Rank i drives GPU i % G; its NIC is the one it relays for as a proxy.
    printf("ranks on GPUs (each a proxy for its NIC's rail):\n");
    for (long l = 0; l < localRanks; l++) {
      const size_t g = (size_t)(l % (long)node.gpus.size());
      const zp::Nic& n = node.nics[(size_t)all[(size_t)l]];
      const int near = node.gpus[g].nic;
      printf("  local rank %ld: gpu %zu (%s) -> nic %s (%s)%s\n", l, g,
             node.gpus[g].pciBusId.empty() ? "?" : node.gpus[g].pciBusId.c_str(), n.name.c_str(),
             n.bitsPerSec > 0 ? zp::formatBitsPerSec(n.bitsPerSec).c_str() : "rate unknown",
             near >= 0 && node.nics[(size_t)near].name == n.name ? ", the GPU's nearest" : "");
    }
  }
  printf("%s", zp::describe(node).c_str());
  if (node.gpus.empty()) printf("  (no GPUs)\n");
  if (status) fprintf(stderr, "zptopo: %s\n", why.c_str());
  return status;
}
