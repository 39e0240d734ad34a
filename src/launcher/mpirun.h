// zprun --mpirun: instead of the ranks, zprun runs Open MPI's mpirun in node 0
// of the emulated cluster, so that MPI programs can be measured on the same
// cluster. mpirun reads a hostfile of the nodes (in the state directory) and
// starts its daemons through its remote shell (plm_rsh_agent), which is zprun
// again, in a hidden mode: `zprun --mpirun-agent TAG HOST COMMAND...` enters
// node HOST of the cluster TAG as a rank would and runs COMMAND with the
// shell, like ssh. Its runtime and its TCP transport use the zpnic interfaces
// only.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

#include "src/launcher/cluster/cluster.h"
#include "src/launcher/options.h"

namespace zprun {

// The mpirun command line of zprun --mpirun; false (after saying why) if
// mpirun could not call zprun back.
bool mpirunCommand(const Options& opts, const zpcluster::Cluster& cluster, std::vector<std::string>* cmd);

// Writes the hostfile mpirun reads: every node with R slots.
bool writeHostfile(const zpcluster::Cluster& cluster);

// zprun --mpirun-agent TAG HOST COMMAND... (argv as main got it); returns the
// exit code if it cannot exec the shell.
int runMpirunAgent(int argc, char** argv);

}  // namespace zprun
