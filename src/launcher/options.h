// zprun's command line, read into Options with CLI11 (src/util/cli.h), and
// its help.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "src/launcher/cluster/cluster.h"
#include "src/launcher/zprun.h"

namespace zprun {

struct Options {
  int nranks = 0;
  bool prefix = false;
  std::vector<std::string> extraEnv;  // "VAR=VALUE", in command-line order
  double timeoutSec = 0;              // 0: no timeout
  double graceSec = kDefaultGraceSec;
  bool stacks = false;  // --stacks: gdb backtraces of the ranks still running at the timeout
  std::vector<std::string> command;  // PROGRAM ARGS...

  // The emulated cluster (--nodes); cluster.nodes == 0 without one.
  zpcluster::ClusterSpec cluster;
  std::string rateText;  // --nic-rate as given
  bool clusterOptionSeen = false;  // one of the options below --nodes was given
  bool dryRun = false;
  bool cleanup = false;
  // --mpirun: run Open MPI's mpirun in node 0, with these extra arguments.
  bool mpirun = false;
  std::vector<std::string> mpirunArgs;
};

enum class ParseResult { kRun, kHelp, kError };

// Parses argv into *opts; on kError, *error says what is wrong. Options end at
// "--" or at the first argument that is not an option (PROGRAM), so PROGRAM's
// own options are never zprun's; after --mpirun, everything up to "--" is
// mpirun's.
ParseResult parseOptions(int argc, char** argv, Options* opts, std::string* error);

// The help: usage, options, the emulated cluster, exit statuses.
std::string usage();

}  // namespace zprun
