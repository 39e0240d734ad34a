// Topology: what one node has (NUMA nodes, NICs, GPUs), which NIC each local
// rank uses, and the topology file that describes a whole cluster instead.
//
// Everything here is plain data and pure functions (discovery aside, which
// only reads hwloc and /sys), so it can be tested without moving a byte.
//
// ---- Discovery (discoverNode) ----
// The node's network interfaces are those of /sys/class/net in this process's
// network namespace, less the loopback and interfaces that are
// administratively down. If any of them is backed by a device (a PCI NIC, a
// virtio NIC, an SR-IOV function), only those are kept and virtual ones
// (veth, bridge, bond, tun, ifb, ...) are dropped; if none is, the virtual ones
// are the node's NICs (an emulated node's zpnic0..zpnicK-1 are veths). Speed
// comes from /sys/class/net/IF/speed when positive (else 0: unknown); NUMA
// node and PCI bus id from hwloc (I/O discovery on), else from sysfs.
// ZP_NIC_RATE_BPS (bits/s, or a rate with a unit as in the file format below;
// 0 or unset: none) caps every NIC's speed: NICs of unknown speed take it. It
// is how the emulated cluster tells ranks the rate its tc qdiscs impose.
// GPUs are PCI devices of class 3D controller (0x0302), or display/VGA
// controllers (0x0300, 0x0380) made by NVIDIA or AMD; for each, the hops
// through hwloc's PCI tree to each NIC that hwloc sees, and its nearest NIC
// (nearestNic). NICs are sorted by name, digits compared as numbers (zpnic2
// before zpnic10).
// Where hwloc cannot load (or ZP_SYSFS_ROOT points elsewhere than /sys, as
// the tests' fixtures do), sysfs alone: GPUs from bus/pci/devices/*/class,
// vendor and numa_node, hops counted along the devices' paths under
// devices/ (each PCI bridge one hop up, one down), NUMA nodes from
// devices/system/node.
// InfiniBand: a NIC whose device has an HCA (class/infiniband/HCA/device/net
// lists the interface; its port is dev_port + 1) takes the port's rate from
// class/infiniband/HCA/ports/P/rate ("200 Gb/sec (4X HDR)") over the
// interface's speed (IPoIB reports none or a nominal one). A rate file that
// cannot be read as one is ignored with a warning naming it.
//
// ---- Affinity (pickNic) ----
// Local rank i of R on a node with G GPUs and N NUMA nodes sits at GPU i % G
// (rank i drives GPU i) if G > 0, else at NUMA node i*N/R (ranks fill NUMA
// nodes in blocks, as with consecutive core binding), else nowhere in
// particular. The candidates are the node's NICs, or with ZP_NET_DEVICES the
// NICs it names, in its order (every name must be a NIC of the node). The
// distance from a place to a NIC is (1 if the NIC is on another NUMA node than
// the place, both known, else 0; then the PCI hops from the GPU, unknown hops
// counting as farther than any known), compared in that order. Each rank
// takes the set S of candidates closest to its place; ranks with the same set
// share it round robin: the j-th such rank (counting in local rank order) gets
// S[j % |S|]. When every NIC is
// equally close (no NUMA or GPU information, as in an emulated cluster) this is
// rank i -> candidate i % K, which is also what zprun's ZP_NET_DEVICES sets
// and keeps rank i of every node on rail i % K; each NIC then serves
// floor(R/K) or ceil(R/K) ranks. If ZP_NET_DEVICES names one NIC, every rank
// uses it.
//
// ---- Topology file (ZP_TOPO_FILE) ----
// A JSON document (RFC 8259, read strictly: no comments, no trailing commas,
// no duplicate or unknown keys) that describes a cluster and replaces
// discovery. It may describe clusters that do not exist (the simulator and
// tests use 64 nodes x 8 ranks x 8 NICs). The smallest useful file:
//
//   {"nodes": 2, "ranksPerNode": 4,
//    "nics": [{"name": "zpnic0", "bandwidth": "1gbit"},
//             {"name": "zpnic1", "bandwidth": "1gbit"}]}
//
// Top level (an object):
//   "nodes"         required: a count (all nodes alike, made from the keys
//                   below), or an array of node objects.
//   "ranksPerNode"  positive integer: ranks of each node that does not say.
//   "nics"          array of NIC objects: NICs of each node that does not say.
//   "numaNodes"     positive integer, default 1.
//   "gpus"          integer >= 0 (a count), or an array of GPU objects;
//                   default 0.
//   "affinity"      the NIC of each local rank (below); default: the pickNic
//                   rule with no ZP_NET_DEVICES.
//   "version"       optional, must be 1.
//   "comment"       ignored: a string or an array of strings. Allowed in every
//                   object of the file, to document it.
// Node object (in "nodes": [...]):
//   "name"          string, default "node<i>".
//   "ranks"         a count, or the node's global ranks in local rank order.
//                   With counts, ranks are numbered node after node (node 0
//                   has 0..R0-1, node 1 the next R1, ...); with lists, every
//                   rank 0..N-1 appears exactly once over all nodes. All nodes
//                   use one form (a node without "ranks" counts
//                   "ranksPerNode").
//   "nics", "numaNodes", "gpus", "affinity": as at the top level, for this
//                   node only.
// NIC object:
//   "name"          required, non-empty, unique within its node.
//   "bandwidth"     required, bits/s per direction: a number (1e9), a string
//                   with a unit as tc writes rates ("100mbit", "1gbit",
//                   "2.5Gbit", "400gbit", "1gibit"; "...bps" is bytes/s:
//                   "25gbps" = 200 Gbit/s), or null for unknown.
//   "numa"          integer in [-1, numaNodes), default -1 (unknown).
//   "pci"           string, PCI bus id ("0000:17:00.0"), default none.
//   "hca"           string, the InfiniBand HCA port behind it ("mlx5_0:1"),
//                   default none (informational).
// GPU object (in "gpus": [...]), every key optional:
//   "pci"           PCI bus id; "numa": integer in [-1, numaNodes);
//   "nic"           its nearest NIC, a name or an index into the node's
//                   "nics". A rank on that GPU (local rank i drives GPU i % G)
//                   takes it unless "affinity" says otherwise.
// Affinity: an array with one entry per local rank of the node, each a NIC
// name or a NIC index into the node's "nics". The file's affinity (given or
// by the rule) is final: ZP_NET_DEVICES does not apply to a topology file.
// Limits: 65536 nodes, 65536 ranks per node and 2^22 in all, 1024 NICs per
// node and 2^20 in all, 1024 NUMA nodes and 1024 GPUs per node; the file at
// most 16 MiB and 2^20 JSON values (its parse then stays under about 250 MB).
// tests/data/topo_2x4x4.json is a documented example.
//
// Errors (a bad file, a bad ZP_NIC_RATE_BPS) are zpInvalidArgument with a
// message from fail() that names the file, line and column and what was
// expected, as is a file that cannot be opened or read.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/util/strings.h"

namespace zp {

struct Nic {
  std::string name;        // interface name: eth0, ib0, zpnic3
  double bitsPerSec = 0;   // link rate per direction; 0: unknown
  int numa = -1;           // NUMA node (hwloc logical index) it hangs off; -1: unknown
  std::string pciBusId;    // "0000:17:00.0"; empty if not a PCI device (veth, ...)
  bool isVirtual = false;  // no device behind it (veth, bridge, ...): discovery only
  bool down = false;       // found not working while running: the router leaves it out
  std::string hca;         // the InfiniBand HCA port behind it, "mlx5_0:1"; empty if none

  bool operator==(const Nic& o) const {
    return name == o.name && bitsPerSec == o.bitsPerSec && numa == o.numa &&
           pciBusId == o.pciBusId && isVirtual == o.isVirtual && down == o.down && hca == o.hca;
  }
};

struct Gpu {
  std::string pciBusId;       // empty if unknown (topology files give a count only)
  int numa = -1;              // -1: unknown
  std::vector<int> nicHops;   // by NIC index: hops through the PCI tree, -1: unknown
                              // (empty: all unknown)
  int nic = -1;               // the nearest NIC (index), by nearestNic; -1: unknown
  bool operator==(const Gpu& o) const {
    return pciBusId == o.pciBusId && numa == o.numa && nicHops == o.nicHops && nic == o.nic;
  }
};

struct NodeTopology {
  std::string name;       // hostname, or the file's node name
  int numaNodes = 1;
  std::vector<Nic> nics;  // in name order (discovery) or file order
  std::vector<Gpu> gpus;

  bool operator==(const NodeTopology& o) const {
    return name == o.name && numaNodes == o.numaNodes && nics == o.nics && gpus == o.gpus;
  }
};

struct ClusterTopology {
  std::vector<NodeTopology> node;           // by node index
  std::vector<std::vector<int>> nodeRanks;  // by node, then local rank: the global rank
  // By global rank: its node, its local rank, and its NIC (an index into
  // node[rankNode[r]].nics; -1 if that node has no NICs).
  std::vector<int> rankNode, rankLocal, rankNic;

  int nodes() const { return (int)node.size(); }
  int nranks() const { return (int)rankNode.size(); }
  // The number of ranks of every node if all have the same, else -1.
  int ranksPerNode() const;

  bool operator==(const ClusterTopology& o) const {
    return node == o.node && nodeRanks == o.nodeRanks && rankNode == o.rankNode &&
           rankLocal == o.rankLocal && rankNic == o.rankNic;
  }
};

// Finds this node's NUMA nodes, NICs and GPUs (see the top of this file).
// zpInvalidArgument for a bad ZP_NIC_RATE_BPS, zpSystemError if
// /sys/class/net cannot be read. A node with no NICs is not an error.
zpResult_t discoverNode(NodeTopology* out);

// The NIC rank (localRank of its node's localRanks, of nranks) sends
// through: from ZP_TOPO_FILE if given, else found on the node (hwloc, sysfs)
// and picked by locality (pickNic), restricted to ZP_NET_DEVICES
// (cfg.netDevices); with none found, the bootstrap's interface or UCX's
// choice. *rail is its index among the node's NICs (NIC k of every node
// forms rail k), *bitsPerSec its rate (0: unknown), and *nodeNics (if
// given) gets the names of all the node's NICs, by rail. topology_rank.cc.
struct Config;
zpResult_t chooseNic(const Config& cfg, int rank, int nranks, int localRank, int localRanks, std::string* nic,
                     int* rail, double* bitsPerSec, std::vector<std::string>* nodeNics = nullptr);
// The cluster as its ranks reported it: nnodes nodes in order of first
// rank; rank r on node nodeOf[r] (its index there localIndex[r]) with NIC
// rail[r], NIC k of a node at the rate its owners (the ranks on rail k)
// reported (rates[r], 0: unknown).
ClusterTopology clusterOf(int nnodes, const std::vector<int>& nodeOf, const std::vector<int>& localIndex,
                                 const std::vector<int>& rail, const std::vector<double>& rates);

// The NIC (index into node.nics) of localRank out of localRanks, by the rule
// at the top of this file; netDevices is ZP_NET_DEVICES' value (a comma
// separated list of names; empty: all NICs). -1 if there is none to pick (no
// NICs, a name not on this node, bad ranks), with the reason in *why if given.
int pickNic(const NodeTopology& node, int localRank, int localRanks,
            const std::string& netDevices, std::string* why = nullptr);

// Every local rank's NIC at once (pickNic for each of 0..localRanks-1, in
// one pass); empty if there is none to pick, with the reason in *why.
std::vector<int> pickNics(const NodeTopology& node, int localRanks, const std::string& netDevices,
                          std::string* why = nullptr);

// The NIC (index) nearest GPU g of node: on the GPU's NUMA node before any
// other, then the fewest PCI hops; the first such NIC in node order. -1 if
// the node has no NICs or nothing tells them apart (no NUMA node or hops
// known). A GPU whose `nic` is already set (a topology file) keeps it.
int nearestNic(const NodeTopology& node, size_t g);

// An InfiniBand port's rate file (/sys/class/infiniband/HCA/ports/P/rate,
// "200 Gb/sec (4X HDR)", "2.5 Gb/sec (1X SDR)") in bits/s; false if the text
// is not a positive rate in Gb/sec.
bool parseIbRate(const std::string& text, double* bitsPerSec);

// Reads a topology file (see the format above). On error, *out is untouched.
zpResult_t loadTopoFile(const std::string& path, ClusterTopology* out);
// The same from text; source names it in error messages.
zpResult_t parseTopo(const std::string& text, const std::string& source, ClusterTopology* out);

// The file format back: loading toJson(t) gives t again, except for what the
// format does not carry (GPUs' hops to each NIC; isVirtual).
std::string toJson(const ClusterTopology& topo);
// One node as a node object of the file format (its "ranks": localRanks,
// "affinity": the NICs of nicOfRank when given, one per local rank).
std::string toJson(const NodeTopology& node, int localRanks = 1,
                   const std::vector<int>& nicOfRank = {});

// Shared by discovery and the topology file (topo_file.cc):
// every local rank's NIC among cand (indexes into node.nics; -1 for all if
// cand is empty), spread by locality;
std::vector<int> assignNics(const NodeTopology& node, int localRanks, const std::vector<int>& cand);
// a PCI bus id, dddd:bb:dd.f;
bool isPciBusId(const std::string& s);
// the node's NIC names, comma-separated, for messages.
std::string nicList(const NodeTopology& node);

// Human-readable, several lines, each ending in '\n'.
std::string describe(const NodeTopology& node);
std::string describe(const ClusterTopology& topo);

}  // namespace zp
