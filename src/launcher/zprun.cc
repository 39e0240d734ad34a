// zprun: starts the ranks of a Zeppelin job on this machine, like mpirun.
//
//   zprun -n 4 [options] [--] PROGRAM [ARGS...]
//   zprun --nodes 2 --ranks-per-node 4 --nics-per-node 2 --nic-rate 1gbit PROGRAM ...
//
// zprun hosts the job's rendezvous (zpGetUniqueId starts its root thread in
// this process), forks one process per rank with the job described in the
// environment (read by zpCommInitFromEnv), optionally prefixes the ranks'
// output with their rank, and supervises them (job.h).
//
// With --nodes, zprun first builds an emulated cluster on this machine (a
// network namespace per node, veth NICs on one bridge per rail, tbf rate
// limits: cluster/cluster.h), runs each rank inside its node, and removes the
// cluster when the job ends, however it ends (but SIGKILL: then `zprun
// --cleanup`). The rendezvous then runs in rank 0, on node 0's first NIC,
// since ranks in node namespaces cannot reach zprun's loopback. With --mpirun,
// mpirun runs in node 0 instead of the ranks (mpirun.h).
//
// This file is main: the modes, and the run in a cluster. The other parts are
// listed in zprun.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/bootstrap.h"
#include "src/launcher/cluster/cluster.h"
#include "src/launcher/job.h"
#include "src/launcher/layout.h"
#include "src/launcher/mpirun.h"
#include "src/launcher/options.h"
#include "src/launcher/signals.h"
#include "src/launcher/zprun.h"

namespace zprun {
namespace {

// Processes started without 0, 1 or 2 open would see our pipes land there.
void ensureStandardFds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) {
      int nullFd = open("/dev/null", O_RDWR);
      if (nullFd >= 0 && nullFd != fd) close(nullFd);  // fd was taken meanwhile
    }
  }
}

// zprun --dry-run: what a cluster run would do, without doing it.
void printDryRun(const Options& opts, const zpcluster::Cluster& cluster, const JobLayout& layout,
                 const std::string& idHex) {
  auto print = [](const std::vector<std::vector<std::string>>& cmds) {
    for (const auto& c : cmds) printf("  %s\n", zpcluster::joinCommand(c).c_str());
  };
  const zpcluster::ClusterSpec& spec = cluster.spec();
  printf("# cluster %s: %d node%s x %d rank%s, %d NIC%s per node, rate %s, MTU %d\n",
         cluster.tag().c_str(), spec.nodes, spec.nodes == 1 ? "" : "s", spec.ranksPerNode,
         spec.ranksPerNode == 1 ? "" : "s", spec.nicsPerNode, spec.nicsPerNode == 1 ? "" : "s",
         spec.rateBps > 0 ? (std::to_string(spec.rateBps) + " bit/s").c_str() : "not limited",
         spec.mtu);
  printf("# build (state in %s: lock, node<i>.boot_id, hosts%s)\n", cluster.stateDir().c_str(),
         layout.mpirun ? ", hostfile" : "");
  print(cluster.setupCommands());
  for (const zpcluster::NicEvent& e : spec.nicEvents) {
    printf("# at %.3f s after the ranks start\n", e.atSec);
    print(cluster.eventCommands(e));
  }
  if (layout.mpirun) {
    std::string command = zpcluster::joinCommand(opts.command), vars;
    for (const std::string& v : mpirunEnvironment(spec)) vars += v + " ";
    printf("# mpirun: in node %s, entered as a rank would be, and /etc/hosts\n"
           "# from %s (the nodes at their rail-0 addresses); the hostfile\n"
           "# gives each node %d slot%s; mpirun's daemons enter the other nodes the same way\n",
           cluster.nodeNamespace(0).c_str(), cluster.hostsPath().c_str(), spec.ranksPerNode,
           spec.ranksPerNode == 1 ? "" : "s");
    printf("  %s%s\n", vars.c_str(), command.c_str());
  } else {
    printf("# ranks: each joins its node's namespace (setns), unshares UTS and mount\n"
           "# namespaces, sets the hostname, bind-mounts the node's boot id, mounts sysfs\n");
    std::string command = " " + zpcluster::joinCommand(opts.command);
    for (const RankSpec& r : layout.ranks) {
      std::string vars;
      for (const std::string& v : jobVariables(layout, r, idHex))
        if (v.compare(0, 13, "ZP_UNIQUE_ID=") != 0 && v.compare(0, 12, "ZP_LAUNCHER=") != 0)
          vars += " " + v;
      printf("  rank %d: node %s, hostname %s, ZP_NET_DEVICES=%s ZP_SOCKET_IFNAME=%s%s%s\n", r.rank,
             cluster.nodeNamespace(r.node).c_str(), cluster.hostname(r.node).c_str(),
             zpcluster::nicName(r.nic).c_str(), zpcluster::nicName(r.nic).c_str(), vars.c_str(),
             command.c_str());
    }
    printf("# rendezvous: rank 0 hosts it on %s:%d\n", zpcluster::nicAddress(0, 0).c_str(),
           zpcluster::kRootPort);
  }
  printf("# remove (after ending what still runs in the node namespaces)\n");
  print(cluster.teardownCommands());
}

// The unique id of a cluster job: rank 0 hosts the root on node 0's first
// NIC. The secret comes from a random seed, so no one can guess it.
bool makeClusterId(std::string* idHex) {
  unsigned char seed[32];
  size_t got = 0;
  while (got < sizeof seed) {
    ssize_t n = getrandom(seed + got, sizeof seed - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fprintf(stderr, "zprun: getrandom: %s\n", strerror(errno));
      return false;
    }
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string seedText;
  for (unsigned char c : seed) {
    seedText += kHex[c >> 4];
    seedText += kHex[c & 15];
  }
  zpUniqueId id;
  zpResult_t res = zp::makeRank0Id(zpcluster::nicAddress(0, 0), zpcluster::kRootPort, seedText, &id);
  if (res != zpSuccess) {
    fprintf(stderr, "zprun: cannot make the unique id: %s (%s)\n", zpGetErrorString(res),
            zpGetLastError(nullptr));
    return false;
  }
  *idHex = zp::idToHex(id);
  return true;
}

// Runs the job in an emulated cluster; returns zprun's exit code. The cluster
// is removed before this returns, whatever happened.
int runInCluster(const Options& opts) {
  zpcluster::Cluster cluster(opts.cluster, getpid());
  std::string idHex;
  if (!makeClusterId(&idHex)) return kExitLaunchError;
  // With --mpirun, the one process zprun starts is mpirun.
  Options launch = opts;
  if (opts.mpirun && !mpirunCommand(opts, cluster, &launch.command)) return kExitLaunchError;
  if (opts.dryRun) {
    printDryRun(launch, cluster, planLayout(launch, &cluster), idHex);
    return 0;
  }
  if (!zpcluster::checkClusterPrerequisites(opts.cluster.shapesAnyNic())) return zpcluster::kExitNoPrivilege;

  int code = cluster.create(&g_stopRequested);
  if (code != 0) return g_firstStopSignal != 0 ? 128 + g_firstStopSignal : code;
  if (opts.mpirun && !writeHostfile(cluster)) {
    code = kExitLaunchError;
  } else {
    Job job(launch, planLayout(launch, &cluster), idHex);
    pid_t events = cluster.startEvents();
    if (events < 0) {
      fprintf(stderr, "zprun: cannot start the NIC events: fork: %s\n", strerror(errno));
      code = kExitLaunchError;
    } else {
      code = job.run();
      zpcluster::Cluster::stopEvents(events);
    }
  }
  // Signals from here on (a second Ctrl-C) are recorded, not obeyed: the
  // cluster must go. ip and tc run in their own process groups, so a Ctrl-C
  // at the terminal does not reach them.
  if (!cluster.destroy() && code == 0) code = kExitLaunchError;
  return code;
}

// Runs the job's ranks on this machine, with the rendezvous in a thread of
// zprun; returns zprun's exit code.
int runHere(const Options& opts) {
  // The rendezvous root thread inherits the signal mask of the thread that
  // creates it. Blocking our signals meanwhile keeps them on the main thread,
  // so the library's blocking calls never see EINTR from zprun's handlers.
  sigset_t ours, previous;
  sigemptyset(&ours);
  for (int sig : kForwardedSignals) sigaddset(&ours, sig);
  sigaddset(&ours, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &ours, &previous);
  zpUniqueId id;
  zpResult_t res = zpGetUniqueId(&id);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (res != zpSuccess) {
    fprintf(stderr, "zprun: cannot start the rendezvous: %s (%s)\n", zpGetErrorString(res),
            zpGetLastError(nullptr));
    return kExitLaunchError;
  }

  Job job(opts, planLayout(opts, nullptr), zp::idToHex(id));
  return job.run();
}

}  // namespace
}  // namespace zprun

int main(int argc, char** argv) {
  using namespace zprun;
  ensureStandardFds();
  if (argc > 1 && strcmp(argv[1], "--mpirun-agent") == 0) return runMpirunAgent(argc, argv);

  Options opts;
  std::string error;
  switch (parseOptions(argc, argv, &opts, &error)) {
    case ParseResult::kHelp:
      fputs(usage().c_str(), stdout);
      return 0;
    case ParseResult::kError:
      fprintf(stderr, "zprun: %s\n\n%s", error.c_str(), usage().c_str());
      return kExitUsage;
    case ParseResult::kRun:
      break;
  }

  if (!installSignalHandlers()) {
    fprintf(stderr, "zprun: cannot create signal pipe: %s\n", strerror(errno));
    return kExitLaunchError;
  }

  if (opts.cleanup) {
    int code = zpcluster::cleanupStale();
    fflush(stdout);
    return code;
  }
  if (opts.cluster.nodes > 0) {
    // No thread in this mode: the rendezvous runs in rank 0.
    int code = runInCluster(opts);
    fflush(stdout);
    fflush(stderr);
    _exit(code);
  }

  int code = runHere(opts);
  fflush(stdout);
  fflush(stderr);
  // _exit, not exit: the rendezvous thread may still be blocked in accept()
  // (ranks that died before joining), and running static destructors under it
  // would be a race for nothing.
  _exit(code);
}
