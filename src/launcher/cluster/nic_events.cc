// NIC events of the emulated cluster (zprun --nic-event): a NIC's rate
// changes, or it goes down and up, while the job runs; the gray failures
// that tests and benchmarks script. See cluster.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "src/launcher/cluster/cluster.h"
#include "src/launcher/cluster/iproute.h"

namespace zpcluster {
namespace {

void sleepUntil(double deadline) {
  for (double now = nowSec(); now < deadline; now = nowSec()) {
    double left = deadline - now;
    timespec ts;
    ts.tv_sec = static_cast<time_t>(left);
    ts.tv_nsec = static_cast<long>((left - static_cast<double>(ts.tv_sec)) * 1e9);
    nanosleep(&ts, nullptr);
  }
}

std::string describe(const NicEvent& e) {
  std::string what = e.kind == NicEvent::Kind::kDown ? "down"
                     : e.kind == NicEvent::Kind::kUp ? "up"
                                                     : "rate " + std::to_string(e.rateBps) + " bit/s";
  return "node " + std::to_string(e.id.node) + " " + nicName(e.id.nic) + ": " + what;
}

}  // namespace

std::vector<std::vector<std::string>> Cluster::eventCommands(const NicEvent& event) const {
  switch (event.kind) {
    case NicEvent::Kind::kRate:
      return shapeCommands(event.id, event.rateBps);
    case NicEvent::Kind::kDown:
    case NicEvent::Kind::kUp:
      break;
  }
  return {{"ip", "-n", nodeNamespace(event.id.node), "link", "set", nicName(event.id.nic),
           event.kind == NicEvent::Kind::kDown ? "down" : "up"}};
}

pid_t Cluster::startEvents() const {
  if (spec_.nicEvents.empty()) return 0;
  std::vector<NicEvent> events = spec_.nicEvents;
  std::stable_sort(events.begin(), events.end(),
                   [](const NicEvent& a, const NicEvent& b) { return a.atSec < b.atSec; });
  // The commands are built before fork: the child only runs them.
  std::vector<std::vector<std::vector<std::string>>> commands;
  for (const NicEvent& e : events) commands.push_back(eventCommands(e));
  double start = nowSec();
  pid_t pid = fork();
  if (pid != 0) return pid;  // the parent, or -1
  // The child: zprun's handlers are not ours; it ends with zprun.
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGHUP, SIG_DFL);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) _exit(0);
  int failed = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    sleepUntil(start + events[i].atSec);
    for (const auto& c : commands[i]) {
      CommandResult r = runCommand(c);
      if (!r.ok()) {
        fprintf(stderr, "zprun: NIC event at %.2f s (%s): `%s` %s\n", events[i].atSec, describe(events[i]).c_str(),
                joinCommand(c).c_str(), r.describe().c_str());
        ++failed;
      }
    }
    fprintf(stderr, "zprun: %.2f s: %s\n", nowSec() - start, describe(events[i]).c_str());
  }
  _exit(failed == 0 ? 0 : 1);
}

void Cluster::stopEvents(pid_t child) {
  if (child <= 0) return;
  kill(child, SIGTERM);
  while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace zpcluster
