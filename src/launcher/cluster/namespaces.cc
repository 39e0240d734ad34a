// A run's namespaces and state directory: see namespaces.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/cluster/namespaces.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "src/launcher/cluster/iproute.h"

namespace zpcluster {
namespace {

// SIGKILLs every process whose network namespace is the one bound at nsPath,
// until none is left (or a few seconds passed). Returns how many it signalled.
int killNamespaceMembers(const std::string& nsPath) {
  struct stat ns;
  if (stat(nsPath.c_str(), &ns) != 0) return 0;
  int signalled = 0;
  double deadline = nowSec() + 5;
  for (;;) {
    bool found = false;
    DIR* proc = opendir("/proc");
    if (proc == nullptr) return signalled;
    while (dirent* e = readdir(proc)) {
      if (!isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
      pid_t pid = static_cast<pid_t>(atol(e->d_name));
      if (pid == getpid()) continue;
      struct stat st;
      std::string p = std::string("/proc/") + e->d_name + "/ns/net";
      if (stat(p.c_str(), &st) != 0) continue;  // gone, or a zombie
      if (st.st_ino != ns.st_ino || st.st_dev != ns.st_dev) continue;
      found = true;
      if (kill(pid, SIGKILL) == 0) ++signalled;
    }
    closedir(proc);
    if (!found || nowSec() > deadline) return signalled;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

// The names in dir but . and .., in directory order; false with errno set if
// dir cannot be opened.
bool readDir(const std::string& dir, std::vector<std::string>* names) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names->push_back(n);
  }
  closedir(d);
  return true;
}

}  // namespace

bool pathExists(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

std::vector<std::string> listDir(const char* dir) {
  std::vector<std::string> names;
  readDir(dir, &names);
  std::sort(names.begin(), names.end());
  return names;
}

bool deleteNamespace(const std::string& name, std::string* error) {
  std::string path = std::string(kNetnsDir) + "/" + name;
  if (!pathExists(path)) return true;
  killNamespaceMembers(path);
  CommandResult r = runCommand({"ip", "netns", "delete", name});
  if (r.ok() && !pathExists(path)) return true;
  *error = "ip netns delete " + name + " " + r.describe();
  return false;
}

bool removeStateDir(const std::string& dir, std::string* error) {
  std::vector<std::string> names;
  if (!readDir(dir, &names)) {
    if (errno == ENOENT) return true;
    *error = dir + ": " + strerror(errno);
    return false;
  }
  for (const std::string& n : names) {
    const std::string path = dir + "/" + n;
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::string ignored;  // the rmdir below reports what is left
      removeStateDir(path, &ignored);
    } else {
      unlink(path.c_str());
    }
  }
  if (rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    *error = "cannot remove " + dir + ": " + strerror(errno);
    return false;
  }
  return true;
}

bool parseTag(const std::string& name, std::string* tag, pid_t* pid) {
  if (name.compare(0, 2, "zp") != 0) return false;
  size_t p = 2;
  while (p < name.size() && isdigit(static_cast<unsigned char>(name[p]))) ++p;
  if (p == 2 || p - 2 > 9 || p >= name.size() || name[p] != '-') return false;
  long v = atol(name.substr(2, p - 2).c_str());
  if (name.size() < p + 5) return false;
  for (size_t k = p + 1; k < p + 5; ++k)
    if (!isxdigit(static_cast<unsigned char>(name[k]))) return false;
  std::string rest = name.substr(p + 5);
  if (!(rest.empty() || rest == "-rails" ||
        (rest.compare(0, 5, "-node") == 0 && rest.size() > 5 &&
         rest.find_first_not_of("0123456789", 5) == std::string::npos)))
    return false;
  *tag = name.substr(0, p + 5);
  *pid = static_cast<pid_t>(v);
  return true;
}

bool runIsAlive(const std::string& tag, pid_t pid) {
  std::string lock = std::string(kStateRoot) + "/" + tag + "/lock";
  int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    bool held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);  // releases the lock if we got it
    return held;
  }
  // No lock (removed by hand, or the run is just being created): the pid decides.
  return kill(pid, 0) == 0 || errno == EPERM;
}

}  // namespace zpcluster
