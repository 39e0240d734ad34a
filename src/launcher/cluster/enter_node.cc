// Entering a node of a cluster: a rank's child process between fork and exec
// (zprun), or mpirun's remote shell in a node of a running cluster (zprun
// --mpirun-agent). See cluster.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "src/launcher/cluster/cluster.h"
#include "src/launcher/cluster/namespaces.h"

namespace zpcluster {
namespace {

constexpr const char* kBootIdFile = "/proc/sys/kernel/random/boot_id";
constexpr const char* kHostsFile = "/etc/hosts";

// Writes n as decimal into buf (async-signal-safe); returns buf.
char* formatInt(long n, char* buf, size_t size) {
  char tmp[24];
  int len = 0;
  bool neg = n < 0;
  unsigned long v = neg ? static_cast<unsigned long>(-n) : static_cast<unsigned long>(n);
  do {
    tmp[len++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && len < 22);
  size_t pos = 0;
  if (neg && pos + 1 < size) buf[pos++] = '-';
  while (len > 0 && pos + 1 < size) buf[pos++] = tmp[--len];
  buf[pos] = '\0';
  return buf;
}

}  // namespace

bool enterNode(const NodeEntry& e, const char** step) {
  *step = "join the node's network namespace (setns)";
  if (setns(e.nsFd, CLONE_NEWNET) != 0) return false;
  *step = "unshare the UTS and mount namespaces";
  if (unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0) return false;
  *step = "make the mounts private";
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  *step = "set the hostname";
  if (sethostname(e.hostname, strlen(e.hostname)) != 0) return false;
  *step = "bind-mount the node's boot id over /proc/sys/kernel/random/boot_id";
  if (mount(e.bootIdPath, kBootIdFile, nullptr, MS_BIND, nullptr) != 0) return false;
  // Read-only, as the real one; best effort.
  mount(nullptr, kBootIdFile, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr);
  if (e.hostsPath != nullptr && e.hostsPath[0] != '\0') {
    *step = "bind-mount the cluster's hosts file over /etc/hosts";
    if (mount(e.hostsPath, kHostsFile, nullptr, MS_BIND, nullptr) != 0) return false;
  }

  // A sysfs mounted from inside the node's namespace shows the node's network
  // devices. It goes on top of the old /sys; the cgroup tree under it is
  // bound back (tools like hwloc read cgroup limits there).
  int cgroupFd = open("/sys/fs/cgroup", O_PATH | O_DIRECTORY | O_CLOEXEC);
  struct statvfs sys;
  unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  if (statvfs("/sys", &sys) == 0 && (sys.f_flag & ST_RDONLY)) flags |= MS_RDONLY;
  *step = "mount the node's sysfs on /sys";
  if (mount("sysfs", "/sys", "sysfs", flags, nullptr) != 0) {
    int saved = errno;
    if (cgroupFd >= 0) close(cgroupFd);
    errno = saved;
    return false;
  }
  if (cgroupFd >= 0) {
    char path[64] = "/proc/self/fd/";
    formatInt(cgroupFd, path + strlen(path), sizeof path - strlen(path));
    mount(path, "/sys/fs/cgroup", nullptr, MS_BIND | MS_REC, nullptr);
    close(cgroupFd);
  }
  return true;
}

bool openLiveNode(const std::string& tag, const std::string& host, LiveNode* node, std::string* error) {
  std::string hostTag;
  pid_t pid;
  if (!parseTag(host, &hostTag, &pid) || hostTag != tag || host.compare(tag.size(), 5, "-node") != 0) {
    *error = "'" + host + "' is not a node of cluster " + tag;
    return false;
  }
  if (!runIsAlive(tag, pid)) {
    *error = "cluster " + tag + " is not running";
    return false;
  }
  const std::string dir = std::string(kStateRoot) + "/" + tag;
  node->hostname = host;
  node->bootIdPath = dir + "/" + host.substr(tag.size() + 1) + ".boot_id";
  node->hostsPath = dir + "/hosts";
  for (const std::string& p : {node->bootIdPath, node->hostsPath}) {
    if (!pathExists(p)) {
      *error = "'" + host + "' is not a node of cluster " + tag + " (no " + p + ")";
      return false;
    }
  }
  const std::string ns = std::string(kNetnsDir) + "/" + host;
  node->nsFd = open(ns.c_str(), O_RDONLY | O_CLOEXEC);
  if (node->nsFd < 0) {
    *error = "cannot open " + ns + ": " + strerror(errno);
    return false;
  }
  return true;
}

}  // namespace zpcluster
