// zprun --cleanup: removing what runs that died left behind. See cluster.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <sys/types.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "src/launcher/cluster/cluster.h"
#include "src/launcher/cluster/namespaces.h"

namespace zpcluster {

int cleanupStale() {
  if (!checkClusterPrerequisites(false, true)) return kExitNoPrivilege;
  std::map<std::string, std::vector<std::string>> namespaces;  // tag -> its namespaces
  std::map<std::string, pid_t> pids;
  for (const std::string& n : listDir(kNetnsDir)) {
    std::string tag;
    pid_t pid;
    if (parseTag(n, &tag, &pid) && n != tag) {
      namespaces[tag].push_back(n);
      pids[tag] = pid;
    }
  }
  for (const std::string& n : listDir(kStateRoot)) {
    std::string tag;
    pid_t pid;
    if (parseTag(n, &tag, &pid) && n == tag) pids[tag] = pid;
  }
  int removed = 0, live = 0;
  bool ok = true;
  for (const auto& entry : pids) {
    const std::string& tag = entry.first;
    if (runIsAlive(tag, entry.second)) {
      ++live;
      continue;
    }
    std::string error;
    bool tagOk = true;
    for (const std::string& ns : namespaces[tag]) {
      if (deleteNamespace(ns, &error)) {
        printf("zprun: removed network namespace %s (its zprun, pid %d, is gone)\n", ns.c_str(),
               static_cast<int>(entry.second));
        ++removed;
      } else {
        fprintf(stderr, "zprun: cannot remove %s: %s\n", ns.c_str(), error.c_str());
        tagOk = false;
      }
    }
    if (tagOk) {
      std::string dir = std::string(kStateRoot) + "/" + tag;
      if (pathExists(dir)) {
        if (removeStateDir(dir, &error)) {
          printf("zprun: removed %s\n", dir.c_str());
        } else {
          fprintf(stderr, "zprun: %s\n", error.c_str());
          tagOk = false;
        }
      }
    }
    ok = ok && tagOk;
  }
  if (removed == 0 && ok) printf("zprun: no stale cluster found\n");
  if (live > 0)
    printf("zprun: left %d cluster%s of running zprun processes alone\n", live, live == 1 ? "" : "s");
  return ok ? 0 : kExitFailure;
}

}  // namespace zpcluster
