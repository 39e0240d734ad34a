// The emulated cluster of zprun --nodes: see cluster.h for the layout and
// the names.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/cluster/cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "src/launcher/cluster/iproute.h"
#include "src/launcher/cluster/namespaces.h"

namespace zpcluster {
namespace {

std::string hexBytes(const unsigned char* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

bool randomBytes(void* buf, size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// A random (version 4) UUID in the form of /proc/sys/kernel/random/boot_id.
bool randomUuid(std::string* out) {
  unsigned char b[16];
  if (!randomBytes(b, sizeof b)) return false;
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  std::string h = hexBytes(b, sizeof b);
  *out = h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20, 12);
  return true;
}

bool writeFile(const std::string& path, const std::string& text, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = close(fd) == 0 && ok;
  return ok;
}

// The effective capability set of this process, from /proc/self/status.
uint64_t effectiveCapabilities() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 7, "CapEff:") == 0) return strtoull(line.c_str() + 7, nullptr, 16);
  }
  return 0;
}

constexpr int kCapNetAdmin = 12;
constexpr int kCapSysAdmin = 21;

bool isPrivilegeError(int err) { return err == EACCES || err == EPERM || err == EROFS; }

}  // namespace

// ---------------------------------------------------------------------------

TbfParams tbfParams(uint64_t rateBps, int mtu) {
  uint64_t bytesPerSec = rateBps / 8;
  uint64_t burst = std::max<uint64_t>(bytesPerSec / 1000, 65536 + 2 * static_cast<uint64_t>(mtu));
  uint64_t limit = burst + std::max<uint64_t>(bytesPerSec / 100, 3 * 65536);
  return {burst, limit};
}

std::string nicName(int nic) { return "zpnic" + std::to_string(nic); }

uint64_t ClusterSpec::startRateOf(const NicId& id) const {
  uint64_t rate = rateBps;
  for (const NicRate& r : nicRates)
    if (r.id == id) rate = r.rateBps;  // the last one given counts
  return rate;
}

bool ClusterSpec::shapesAnyNic() const {
  if (rateBps > 0 || !nicRates.empty()) return true;
  for (const NicEvent& e : nicEvents)
    if (e.kind == NicEvent::Kind::kRate) return true;
  return false;
}

std::string nicAddress(int node, int nic) {
  return "10.77." + std::to_string(nic) + "." + std::to_string(node + 1);
}

int nicPrefixLength() { return 24; }

// ---------------------------------------------------------------------------
// Cluster

Cluster::Cluster(const ClusterSpec& spec, pid_t owner) : spec_(spec) {
  unsigned char r[2] = {0, 0};
  if (!randomBytes(r, sizeof r)) {
    // Uniqueness comes from the pid already; the random part only guards
    // against a leftover of a dead process with the same pid.
    r[0] = static_cast<unsigned char>(time(nullptr));
    r[1] = static_cast<unsigned char>(time(nullptr) >> 8);
  }
  tag_ = "zp" + std::to_string(owner) + "-" + hexBytes(r, sizeof r);
  for (int i = 0; i < spec_.nodes; ++i) {
    hostnames_.push_back(hostname(i));
    bootIdPaths_.push_back(stateDir() + "/node" + std::to_string(i) + ".boot_id");
  }
  hostsPath_ = stateDir() + "/hosts";
  nodeFds_.assign(static_cast<size_t>(spec_.nodes), -1);
}

Cluster::~Cluster() { destroy(); }

std::string Cluster::nodeNamespace(int node) const { return tag_ + "-node" + std::to_string(node); }
std::string Cluster::railsNamespace() const { return tag_ + "-rails"; }
std::string Cluster::stateDir() const { return std::string(kStateRoot) + "/" + tag_; }

std::vector<std::vector<std::string>> Cluster::setupCommands() const {
  std::vector<std::vector<std::string>> cmds;
  const std::string rails = railsNamespace();
  const std::string mtu = std::to_string(spec_.mtu);
  cmds.push_back({"ip", "netns", "add", rails});
  for (int i = 0; i < spec_.nodes; ++i) cmds.push_back({"ip", "netns", "add", nodeNamespace(i)});
  cmds.push_back({"ip", "-n", rails, "link", "set", "lo", "up"});
  for (int i = 0; i < spec_.nodes; ++i)
    cmds.push_back({"ip", "-n", nodeNamespace(i), "link", "set", "lo", "up"});
  for (int k = 0; k < spec_.nicsPerNode; ++k) {
    std::string bridge = "rail" + std::to_string(k);
    cmds.push_back({"ip", "-n", rails, "link", "add", bridge, "mtu", mtu, "type", "bridge"});
  }
  for (int i = 0; i < spec_.nodes; ++i) {
    const std::string node = nodeNamespace(i);
    for (int k = 0; k < spec_.nicsPerNode; ++k) {
      const std::string nic = nicName(k);
      const std::string port = "node" + std::to_string(i) + "nic" + std::to_string(k);
      const std::string bridge = "rail" + std::to_string(k);
      // Both ends are created directly in their namespaces: nothing ever
      // appears in the machine's own.
      cmds.push_back({"ip", "link", "add", nic, "netns", node, "mtu", mtu, "type", "veth", "peer",
                      "name", port, "netns", rails, "mtu", mtu});
      cmds.push_back({"ip", "-n", rails, "link", "set", port, "master", bridge, "up"});
      cmds.push_back({"ip", "-n", node, "addr", "add",
                      nicAddress(i, k) + "/" + std::to_string(nicPrefixLength()), "dev", nic});
      cmds.push_back({"ip", "-n", node, "link", "set", nic, "up"});
      uint64_t rate = spec_.startRateOf({i, k});
      if (rate > 0) {
        for (auto& c : shapeCommands({i, k}, rate)) cmds.push_back(c);
      }
    }
  }
  for (int k = 0; k < spec_.nicsPerNode; ++k)
    cmds.push_back({"ip", "-n", rails, "link", "set", "rail" + std::to_string(k), "up"});
  return cmds;
}

std::vector<std::vector<std::string>> Cluster::shapeCommands(const NicId& id, uint64_t rateBps) const {
  TbfParams p = tbfParams(rateBps, spec_.mtu);
  std::vector<std::string> tbf = {"root", "tbf", "rate", std::to_string(rateBps) + "bit", "burst",
                                  std::to_string(p.burstBytes), "limit", std::to_string(p.limitBytes)};
  std::vector<std::string> node = {"tc", "-n", nodeNamespace(id.node), "qdisc", "replace", "dev", nicName(id.nic)};
  std::vector<std::string> port = {"tc", "-n", railsNamespace(), "qdisc", "replace", "dev",
                                   "node" + std::to_string(id.node) + "nic" + std::to_string(id.nic)};
  node.insert(node.end(), tbf.begin(), tbf.end());
  port.insert(port.end(), tbf.begin(), tbf.end());
  return {node, port};
}

std::vector<std::vector<std::string>> Cluster::teardownCommands() const {
  std::vector<std::vector<std::string>> cmds;
  for (int i = 0; i < spec_.nodes; ++i) cmds.push_back({"ip", "netns", "delete", nodeNamespace(i)});
  cmds.push_back({"ip", "netns", "delete", railsNamespace()});
  return cmds;
}

int Cluster::create(const volatile sig_atomic_t* stop) {
  auto stopped = [&]() { return stop != nullptr && *stop != 0; };
  auto failWith = [&](int code, const std::string& message) {
    fprintf(stderr, "zprun: %s\n", message.c_str());
    destroy();
    return code;
  };
  const char* kNeedRoot =
      " (building a cluster needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN over the machine's own "
      "namespaces, not those of a user namespace)";

  // The state directory first: the lock in it tells --cleanup that this run
  // is alive before any namespace of it exists.
  if (mkdir(kStateRoot, 0755) != 0 && errno != EEXIST) {
    int e = errno;
    fprintf(stderr, "zprun: cannot create %s: %s%s\n", kStateRoot, strerror(e),
            isPrivilegeError(e) ? kNeedRoot : "");
    return isPrivilegeError(e) ? kExitNoPrivilege : kExitFailure;
  }
  if (mkdir(stateDir().c_str(), 0755) != 0) {
    int e = errno;
    fprintf(stderr, "zprun: cannot create %s: %s%s\n", stateDir().c_str(), strerror(e),
            isPrivilegeError(e) ? kNeedRoot : "");
    return isPrivilegeError(e) ? kExitNoPrivilege : kExitFailure;
  }
  created_ = true;
  // The lock file appears under its final name already locked, so --cleanup
  // never sees it unlocked while we live.
  std::string lockTmp = stateDir() + "/lock.tmp", lockPath = stateDir() + "/lock";
  lockFd_ = open(lockTmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (lockFd_ < 0 || flock(lockFd_, LOCK_EX | LOCK_NB) != 0 || rename(lockTmp.c_str(), lockPath.c_str()) != 0)
    return failWith(kExitFailure, "cannot create the lock " + lockPath + ": " + strerror(errno));
  for (int i = 0; i < spec_.nodes; ++i) {
    std::string uuid;
    if (!randomUuid(&uuid)) return failWith(kExitFailure, std::string("getrandom: ") + strerror(errno));
    if (!writeFile(bootIdPaths_[i], uuid + "\n", 0644))
      return failWith(kExitFailure, "cannot write " + bootIdPaths_[i] + ": " + strerror(errno));
  }
  // Names resolve inside the cluster from this file alone (never through the
  // machine's resolver), for the processes that get it over /etc/hosts.
  std::string hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
  for (int i = 0; i < spec_.nodes; ++i) hosts += nicAddress(i, 0) + "\t" + hostnames_[i] + "\n";
  if (!writeFile(hostsPath(), hosts, 0644))
    return failWith(kExitFailure, "cannot write " + hostsPath() + ": " + strerror(errno));

  auto cmds = setupCommands();
  for (size_t c = 0; c < cmds.size(); ++c) {
    if (stopped()) return failWith(kExitFailure, "interrupted while creating the cluster; removed it");
    CommandResult r = runCommand(cmds[c]);
    if (r.ok()) continue;
    std::string message = "cannot create the cluster: `" + joinCommand(cmds[c]) + "` " + r.describe();
    // The first namespace is where a machine that does not let us build
    // clusters says so.
    if (c == 0) {
      bool denied = r.output.find("not permitted") != std::string::npos ||
                    r.output.find("ermission denied") != std::string::npos ||
                    r.output.find("Read-only") != std::string::npos;
      return failWith(kExitNoPrivilege, message + (denied ? kNeedRoot : ""));
    }
    if (cmds[c][0] == "tc" && r.output.find("tbf") != std::string::npos)
      message += " (is the sch_tbf kernel module available?)";
    return failWith(kExitFailure, message);
  }
  for (int i = 0; i < spec_.nodes; ++i) {
    std::string path = std::string(kNetnsDir) + "/" + nodeNamespace(i);
    nodeFds_[i] = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (nodeFds_[i] < 0) return failWith(kExitFailure, "cannot open " + path + ": " + strerror(errno));
  }
  if (stopped()) return failWith(kExitFailure, "interrupted while creating the cluster; removed it");
  return 0;
}

bool Cluster::destroy() {
  if (!created_) return true;
  for (int& fd : nodeFds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  bool ok = true;
  std::string error;
  std::vector<std::string> names;
  for (int i = 0; i < spec_.nodes; ++i) names.push_back(nodeNamespace(i));
  names.push_back(railsNamespace());
  for (const std::string& n : names) {
    if (!deleteNamespace(n, &error)) {
      fprintf(stderr, "zprun: cannot remove the cluster: %s\n", error.c_str());
      ok = false;
    }
  }
  if (ok) {
    // The lock goes last: while a namespace of ours might remain, --cleanup
    // must be able to tell that it is ours.
    if (!removeStateDir(stateDir(), &error)) {
      fprintf(stderr, "zprun: %s\n", error.c_str());
      ok = false;
    }
  } else {
    fprintf(stderr, "zprun: run `zprun --cleanup` to remove what is left of %s\n", tag_.c_str());
  }
  if (lockFd_ >= 0) close(lockFd_);
  lockFd_ = -1;
  created_ = false;
  return ok;
}

NodeEntry Cluster::nodeEntry(int node, bool withHosts) const {
  NodeEntry e;
  e.nsFd = nodeFds_[node];
  e.hostname = hostnames_[node].c_str();
  e.bootIdPath = bootIdPaths_[node].c_str();
  if (withHosts) e.hostsPath = hostsPath_.c_str();
  return e;
}

// ---------------------------------------------------------------------------

bool checkClusterPrerequisites(bool needTc, bool forCleanup) {
  uint64_t caps = effectiveCapabilities();
  std::string missing;
  if (!(caps & (1ull << kCapSysAdmin))) missing += "CAP_SYS_ADMIN";
  if (!(caps & (1ull << kCapNetAdmin))) missing += std::string(missing.empty() ? "" : " and ") + "CAP_NET_ADMIN";
  if (!missing.empty()) {
    fprintf(stderr,
            "zprun: %s network namespaces, which needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); "
            "this process lacks %s. %s\n",
            forCleanup ? "--cleanup removes" : "--nodes builds", missing.c_str(),
            forCleanup ? "Run it as root." : "Run zprun as root, or without --nodes.");
    return false;
  }
  std::vector<std::string> tools = {"ip"};
  if (needTc) tools.push_back("tc");
  for (const std::string& t : tools) {
    if (toolPath(t).empty()) {
      fprintf(stderr, "zprun: --nodes needs the '%s' command (iproute2), which is not installed%s\n",
              t.c_str(), t == "tc" ? " (tc shapes the NIC rate)" : "");
      return false;
    }
  }
  return true;
}

}  // namespace zpcluster
