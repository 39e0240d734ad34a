// zprun's command line: its options, their limits and exit codes, the help
// text, and the parser that turns argv into Options (zprun.cc runs them).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "src/launcher/cluster/cluster.h"

namespace zprun {

inline constexpr int kMaxRanks = 1024;
inline constexpr double kDefaultGraceSec = 10.0;
inline constexpr double kTermToKillSec = 2.0;  // SIGTERM, then SIGKILL this much later
inline constexpr int kExitLaunchError = 1;  // fork / pipe / rendezvous failed
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 124;  // as timeout(1)
inline constexpr int kExitCannotExec = 127;  // as the shell

// Variables zprun sets for every rank; -x may not override them, since a rank
// with a wrong ZP_RANK would join the job in another rank's place.
inline const char* const kReservedVars[] = {"ZP_RANK",         "ZP_NRANKS",    "ZP_LOCAL_RANK",
                                     "ZP_LOCAL_NRANKS", "ZP_UNIQUE_ID", "ZP_LAUNCHER"};
// And in an emulated cluster (ZP_NET_DEVICES and ZP_SOCKET_IFNAME are set too,
// but -x may choose other NICs of the node).
inline const char* const kReservedClusterVars[] = {"ZP_NODE_RANK", "ZP_NNODES", "ZP_NIC_RATE_BPS",
                                            "ZP_NICS_PER_NODE", "ZP_NODE_ID"};

struct Options {
  int nranks = 0;
  bool prefix = false;
  std::vector<std::string> extraEnv;  // "VAR=VALUE", in command-line order
  double timeoutSec = 0;              // 0: no timeout
  double graceSec = kDefaultGraceSec;
  std::vector<std::string> command;  // PROGRAM ARGS...

  // The emulated cluster (--nodes); cluster.nodes == 0 without one.
  ClusterSpec cluster;
  std::string rateText;  // --nic-rate as given
  bool clusterOptionSeen = false;  // one of the options below --nodes was given
  bool dryRun = false;
  bool cleanup = false;
  // --mpirun: run Open MPI's mpirun in node 0, with these extra arguments.
  bool mpirun = false;
  std::vector<std::string> mpirunArgs;
};

void printUsage(FILE* out);

enum class ParseResult { kRun, kHelp, kError };

// Parses argv into *opts. Options end at "--" or at the first argument that
// is not an option (PROGRAM), so PROGRAM's own options are never ours.
ParseResult parseOptions(int argc, char** argv, Options* opts, std::string* error);

}  // namespace zprun
