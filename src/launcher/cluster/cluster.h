// An emulated multi-node cluster on one machine, for zprun --nodes: the
// library zp_cluster, a test fixture for multi-node runs. It depends on
// nothing of Zeppelin's but src/util.
//
// Each node is a network namespace; each NIC a veth pair whose node end
// (zpnic0 .. zpnic{K-1}) sits in the node's namespace and whose other end is
// a port of one Linux bridge per rail (rail k joins NIC k of every node). The
// bridges live in a namespace of their own, so nothing of a cluster is ever
// visible in the machine's own network namespace. With a rate, both ends of
// every veth get a tbf qdisc: the node end shapes what the node sends, the
// bridge end what it receives.
//
// Names (one run never collides with another, and --cleanup can tell whose
// leftovers it sees):
//   tag                 zp<zprun pid>-<4 random hex digits>, e.g. zp4242-9f3a
//   node namespace      <tag>-node<i>        (also the node's hostname)
//   bridge namespace    <tag>-rails
//   bridge of rail k    rail<k>              (inside <tag>-rails)
//   NIC k of node i     zpnic<k>             (inside <tag>-node<i>)
//   its bridge port     node<i>nic<k>        (inside <tag>-rails)
//   state directory     /run/zprun/<tag>/    lock (held by the live zprun),
//                                            node<i>.boot_id (fresh UUIDs),
//                                            hosts (the nodes' names and rail-0
//                                            addresses, an /etc/hosts for
//                                            zprun --mpirun)
// Addresses: NIC k of node i is 10.77.k.(i+1)/24, so rail k is the subnet
// 10.77.k.0/24 and nodes 0..249, rails 0..31 fit. Rails are separate layer-2
// networks: a NIC reaches the same rail of other nodes only (rail-only
// fabric). These addresses exist only inside the run's namespaces.
//
// The ip and tc commands (iproute2) do the work; they run with fork/exec,
// never through a shell, and each one is checked (iproute.h).
//
// The files: cluster.cc builds and removes a cluster, enter_node.cc puts a
// process into one of its nodes, cleanup.cc removes what dead runs left,
// namespaces.cc names, finds and deletes a run's namespaces and state, and
// iproute.cc runs ip and tc.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zpcluster {

// Exit codes (zprun's) that create() and cleanupStale() return: a cluster
// cannot be built (or removed) for lack of privileges or tools; other failures.
constexpr int kExitNoPrivilege = 3;
constexpr int kExitFailure = 1;

constexpr int kMaxNodes = 250;
constexpr int kMaxNicsPerNode = 32;
constexpr int kDefaultMtu = 1500;
constexpr int kRootPort = 29500;  // rank 0's bootstrap root, inside node 0's namespace

// One NIC of the cluster: NIC `nic` of node `node`.
struct NicId {
  int node = 0;
  int nic = 0;
  bool operator==(const NicId& o) const { return node == o.node && nic == o.nic; }
};

// A NIC whose rate differs from the others' (--nic-rate-of): a gray failure
// from the start, e.g. a port that negotiated a lower speed.
struct NicRate {
  NicId id;
  uint64_t rateBps = 0;  // bits per second in each direction, > 0
};

// A change to one NIC while the job runs (--nic-event): its rate becomes
// rateBps, or it goes down, or comes back up (with the rate it had).
struct NicEvent {
  enum class Kind { kRate, kDown, kUp };
  NicId id;
  double atSec = 0;  // after the ranks were started
  Kind kind = Kind::kRate;
  uint64_t rateBps = 0;  // kRate only
};

struct ClusterSpec {
  int nodes = 0;  // 0: no cluster (zprun runs the ranks here)
  int ranksPerNode = 1;
  int nicsPerNode = 1;
  uint64_t rateBps = 0;  // bits per second per NIC and direction; 0: not limited
  int mtu = kDefaultMtu;
  std::vector<NicRate> nicRates;    // NICs at a rate of their own; the last one given for a NIC counts
  std::vector<NicEvent> nicEvents;  // in the order given; run in time order

  // The rate NIC id starts at (its own, or rateBps); 0: not limited.
  uint64_t startRateOf(const NicId& id) const;
  // Whether any NIC is ever rate-limited (tc is needed).
  bool shapesAnyNic() const;
};

// The tbf qdisc parameters zprun uses for a rate: a bucket of 1 ms at the
// rate (at least 64 KiB plus an MTU, so a whole GSO packet fits and tbf does
// not have to split it), and a queue of the bucket plus 5 ms at the rate (at
// least 192 KiB), which lets one TCP flow keep the link busy.
struct TbfParams {
  uint64_t burstBytes;
  uint64_t limitBytes;
};
TbfParams tbfParams(uint64_t rateBps, int mtu);

std::string nicName(int nic);                  // zpnic<k>
std::string nicAddress(int node, int nic);     // 10.77.<nic>.<node+1>
int nicPrefixLength();                         // 24

// What a rank's child process needs to enter its node; filled by the parent,
// used between fork and exec (async-signal-safe calls only).
struct NodeEntry {
  int nsFd = -1;  // the node's network namespace (open on /run/netns/NAME)
  const char* hostname = nullptr;
  const char* bootIdPath = nullptr;  // bind-mounted over /proc/sys/kernel/random/boot_id
  const char* hostsPath = nullptr;   // if set, bind-mounted over /etc/hosts
};

// Enters the node in the calling (child) process: joins its network
// namespace, unshares the UTS and mount namespaces, makes mounts private,
// sets the hostname, bind-mounts the node's boot id, and mounts a sysfs of the
// node's namespace on /sys (as `ip netns exec` does, so /sys/class/net lists
// the node's NICs; /sys/fs/cgroup is kept), and with entry.hostsPath, puts
// that file over /etc/hosts. On failure returns false with errno set and
// *step naming what failed.
bool enterNode(const NodeEntry& entry, const char** step);

// A node of a cluster that another zprun process owns, for zprun
// --mpirun-agent (mpirun's remote shell, started by mpirun inside node 0):
// opened by its hostname, <tag>-node<i>, while that zprun still runs.
struct LiveNode {
  int nsFd = -1;
  std::string hostname, bootIdPath, hostsPath;
  NodeEntry entry() const {
    return NodeEntry{nsFd, hostname.c_str(), bootIdPath.c_str(), hostsPath.c_str()};
  }
};
// False with *error saying why if host is not a node of the live cluster tag.
bool openLiveNode(const std::string& tag, const std::string& host, LiveNode* node, std::string* error);

class Cluster {
 public:
  Cluster(const ClusterSpec& spec, pid_t owner);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const ClusterSpec& spec() const { return spec_; }
  const std::string& tag() const { return tag_; }
  std::string nodeNamespace(int node) const;
  std::string railsNamespace() const;
  std::string hostname(int node) const { return nodeNamespace(node); }
  std::string stateDir() const;
  // <stateDir>/hosts: localhost and "10.77.0.<i+1> <hostname of node i>" lines.
  const std::string& hostsPath() const { return hostsPath_; }

  // The ip / tc commands that build the cluster and those that remove it, in
  // order (for --dry-run; create() runs the same ones).
  std::vector<std::vector<std::string>> setupCommands() const;
  std::vector<std::vector<std::string>> teardownCommands() const;
  // The ip / tc commands that carry out one NIC event: a rate shapes both
  // ends of the NIC's veth (what the node sends and what it receives); down
  // and up set the node's end (as a failing port would, the bridge end stays).
  std::vector<std::vector<std::string>> eventCommands(const NicEvent& event) const;

  // Runs spec().nicEvents in time order, each at its time after this call, in
  // a child process of its own, which it returns (-1 if it could not fork;
  // 0 if there are no events). Each event is reported on stderr when done
  // ("zprun: 3.00 s: node 1 zpnic2: rate 250000000 bit/s"). The caller ends
  // the child with stopEvents() when the job ends.
  pid_t startEvents() const;
  static void stopEvents(pid_t child);

  // Builds the cluster. Checks every step; on failure (or when *stop becomes
  // non-zero: a signal arrived) removes whatever it made, prints why, and
  // returns zprun's exit code: kExitNoPrivilege when the machine does not let
  // us make namespaces, 1 for other failures, 128+signal when stopped.
  // Returns 0 on success.
  int create(const volatile sig_atomic_t* stop);

  // Removes the cluster: ends stray processes still inside the node
  // namespaces, deletes the namespaces (with them every veth and bridge) and
  // the state directory. Safe to call more than once. False (after printing
  // why) if something could not be removed.
  bool destroy();

  // withHosts: the node's processes also get hostsPath() as /etc/hosts.
  NodeEntry nodeEntry(int node, bool withHosts = false) const;

 private:
  // tc commands giving both ends of NIC id's veth a tbf at rateBps.
  std::vector<std::vector<std::string>> shapeCommands(const NicId& id, uint64_t rateBps) const;

  ClusterSpec spec_;
  std::string tag_;
  bool created_ = false;  // something may exist that destroy() must remove
  int lockFd_ = -1;
  std::vector<int> nodeFds_;
  std::vector<std::string> hostnames_, bootIdPaths_;
  std::string hostsPath_;
};

// zprun --cleanup: removes namespaces and state directories that zprun runs
// left behind when they died without cleaning up (SIGKILL, a crash). A run is
// dead when nobody holds its lock file, or, without one, when its pid is gone.
// Returns zprun's exit code.
int cleanupStale();

// Checks that this process may build (or, forCleanup, remove) a cluster:
// CAP_SYS_ADMIN and CAP_NET_ADMIN, the ip command, and tc when needTc. Prints
// what is missing and returns false otherwise.
bool checkClusterPrerequisites(bool needTc, bool forCleanup = false);

// Shell-style quoting of one argument, and of a command, for printing
// commands.
std::string quoteArg(const std::string& arg);
std::string joinCommand(const std::vector<std::string>& argv);

}  // namespace zpcluster
