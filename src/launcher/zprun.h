// What the parts of zprun share: its exit codes, limits and timings (the help
// quotes them). The parts: options.cc reads the command line, layout.cc places
// the ranks and writes their environment, job.cc starts and supervises them,
// signals.cc catches zprun's signals, mpirun.cc runs Open MPI's mpirun in an
// emulated cluster (cluster/, the library zp_cluster), zprun.cc is main.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

namespace zprun {

constexpr int kMaxRanks = 1024;
constexpr double kDefaultGraceSec = 10.0;
constexpr double kTermToKillSec = 2.0;  // SIGTERM, then SIGKILL this much later
// ... for mpirun, which first stops the ranks and daemons on every node.
constexpr double kMpirunTermToKillSec = 10.0;

// Exit codes of zprun's own (the ranks' codes pass through), and
// zpcluster::kExitNoPrivilege (3) when a cluster cannot be built.
constexpr int kExitLaunchError = 1;  // fork / pipe / rendezvous failed
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;     // as timeout(1)
constexpr int kExitCannotExec = 127;  // as the shell

}  // namespace zprun
