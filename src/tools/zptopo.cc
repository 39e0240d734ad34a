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

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/topology.h"
#include "src/util/cli.h"
#include "src/util/strings.h"

namespace {

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

bool envInt(const char* name, long lo, long hi, long dflt, long* out) {
  const char* v = getenv(name);
  if (!v || !*v) {
    *out = dflt;
    return true;
  }
  long long x = 0;
  if (!zp::parseInt(v, (long long)lo, (long long)hi, &x)) {
    fprintf(stderr, "zptopo: %s='%s' is not an integer in [%ld, %ld]\n", name, v, lo, hi);
    return false;
  }
  *out = (long)x;
  return true;
}

std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += (char)c;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      o += buf;
    } else {
      o += (char)c;
    }
  }
  return o + "\"";
}

// A multi-line JSON value placed as a member at one level of indent.
std::string nest(std::string json) {
  while (!json.empty() && json.back() == '\n') json.pop_back();
  std::string o;
  for (char c : json) {
    o += c;
    if (c == '\n') o += "  ";
  }
  return o;
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
      printf("{\n  \"nodeId\": %s,\n  \"nodeIdFrom\": %s,\n  \"hostname\": %s,\n  \"topoFile\": %s,\n",
             jstr(nodeId).c_str(), jstr(nodeIdFrom).c_str(), jstr(host).c_str(), jstr(topoFile).c_str());
      if (rank >= 0) {
        printf("  \"rank\": %ld,\n  \"node\": %d,\n", rank, node);
        printf("  \"localRank\": %d,\n  \"localRanks\": %zu,\n", topo.rankLocal[(size_t)rank],
               topo.nodeRanks[(size_t)node].size());
        printf("  \"nic\": %s,\n", nic >= 0 ? jstr(nicName).c_str() : "null");
      } else {
        printf("  \"rank\": null,\n");
      }
      printf("  \"cluster\": %s\n}\n", nest(zp::toJson(topo)).c_str());
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
    printf("{\n  \"nodeId\": %s,\n  \"nodeIdFrom\": %s,\n  \"hostname\": %s,\n", jstr(nodeId).c_str(),
           jstr(nodeIdFrom).c_str(), jstr(host).c_str());
    printf("  \"localRank\": %ld,\n  \"localRanks\": %ld,\n  \"netDevices\": %s,\n", localRank, localRanks,
           netDevices.empty() ? "null" : jstr(netDevices).c_str());
    if (nic >= 0)
      printf("  \"nic\": %s,\n", jstr(node.nics[(size_t)nic].name).c_str());
    else
      printf("  \"nic\": null,\n  \"nicError\": %s,\n", jstr(why).c_str());
    std::string virt;
    for (const zp::Nic& n : node.nics)
      if (n.isVirtual) virt += (virt.empty() ? "" : ", ") + jstr(n.name);
    printf("  \"virtualNics\": [%s],\n", virt.c_str());
    printf("  \"gpus\": [");
    for (size_t g = 0; g < node.gpus.size(); g++) {
      const zp::Gpu& gpu = node.gpus[g];
      std::string hops;
      for (int h : gpu.nicHops) hops += (hops.empty() ? "" : ", ") + (h >= 0 ? std::to_string(h) : "null");
      printf("%s\n    {\"pci\": %s, \"numa\": %d, \"nicHops\": [%s], \"nic\": %s}", g ? "," : "",
             jstr(gpu.pciBusId).c_str(), gpu.numa, hops.c_str(),
             gpu.nic >= 0 ? jstr(node.nics[(size_t)gpu.nic].name).c_str() : "null");
    }
    printf("%s],\n", node.gpus.empty() ? "" : "\n  ");
    // Each local rank: its GPU (rank i drives GPU i % G), its NIC, and the
    // rail it is a proxy for (every owner of a NIC relays for it).
    printf("  \"ranks\": [");
    for (long l = 0; l < localRanks; l++) {
      const int k = all.empty() ? -1 : all[(size_t)l];
      printf("%s\n    {\"localRank\": %ld, \"gpu\": %s, \"nic\": %s, \"proxyFor\": %s}", l ? "," : "", l,
             node.gpus.empty() ? "null" : std::to_string(l % (long)node.gpus.size()).c_str(),
             k >= 0 ? jstr(node.nics[(size_t)k].name).c_str() : "null",
             k >= 0 ? jstr(node.nics[(size_t)k].name).c_str() : "null");
    }
    printf("\n  ],\n");
    printf("  \"node\": %s\n}\n", nest(zp::toJson(node, (int)localRanks, all)).c_str());
    if (status) fprintf(stderr, "zptopo: %s\n", why.c_str());
    return status;
  }

  printf("node id:     %s (%s)\n", nodeId.c_str(), nodeIdFrom);
  printf("hostname:    %s\n", host.c_str());
  printf("local rank:  %ld of %ld%s\n", localRank, localRanks,
         getenv("ZP_LOCAL_RANK") ? "" : " (ZP_LOCAL_RANK / ZP_LOCAL_NRANKS unset)");
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
