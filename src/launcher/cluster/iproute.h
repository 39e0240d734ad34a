// Running iproute2's ip and tc for the cluster: each found on PATH or in the
// sbin directories, run with fork/exec (never through a shell), in a process
// group of its own, with a time limit, its output collected for messages.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/wait.h>

#include <string>
#include <vector>

namespace zpcluster {

// CLOCK_MONOTONIC in seconds.
double nowSec();

// The path of an iproute2 program (ip, tc), or "" if it is not installed.
const std::string& toolPath(const std::string& name);

struct CommandResult {
  bool started = false;  // false: fork or exec failed (see output)
  int status = 0;        // from waitpid
  std::string output;    // stdout and stderr together
  bool ok() const { return started && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // "exited with code 2: <its output>", for messages.
  std::string describe() const;
};

// Runs argv (argv[0] a tool name: ip or tc) and collects its output. The
// command gets a process group of its own, so a Ctrl-C at the terminal reaches
// only zprun, which then finishes (or undoes) the step in order.
CommandResult runCommand(const std::vector<std::string>& argv);

}  // namespace zpcluster
