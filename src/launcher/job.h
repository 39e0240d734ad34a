// zprun's job: starting the ranks of a layout and supervising them. When one
// rank fails, the others get a grace period to notice the dead peer and exit
// with an error, then SIGTERM, then SIGKILL. No rank outlives zprun.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "src/launcher/layout.h"
#include "src/launcher/options.h"

namespace zprun {

// One output pipe of a rank in --prefix mode.
struct OutputStream {
  int fd = -1;      // our read end, or -1 when closed
  int target = -1;  // 1 or 2
  std::string partial;  // bytes after the last newline
};

struct Rank {
  RankSpec spec;
  pid_t pid = -1;
  bool running = false;
  OutputStream out, err;
};

class Job {
 public:
  Job(const Options& opts, JobLayout layout, std::string idHex)
      : opts_(opts), layout_(std::move(layout)), idHex_(std::move(idHex)) {}

  // Starts every rank and supervises them until all have exited; returns
  // zprun's exit code.
  int run();

 private:
  enum class Phase {
    kRunning,      // all well, or ranks exiting normally
    kGrace,        // a rank failed or we forwarded a signal: others may exit on their own
    kTerminating,  // SIGTERM sent; SIGKILL at killAt_
    kKilled,       // SIGKILL sent; waiting for the exits
  };

  bool setUpStdin();
  bool spawn(Rank& rank);
  void supervise();
  void handleSignalPipe();
  void reapChildren();
  void onRankExit(Rank& rank, int status);
  void checkDeadlines();
  void startGrace();
  void signalRanks(int sig);
  void printStacks();  // --stacks
  int runningCount() const;
  void readOutput(Rank& rank, OutputStream& stream);
  void emit(const Rank& rank, OutputStream& stream, const char* data, size_t len, bool atEof);
  void pumpStdin(short inEvents, short outEvents);
  void closeStdinForwarding();
  int exitCode() const;
  std::string nameOf(const Rank& rank) const;  // "rank 3", or "mpirun"
  double termToKillSec() const { return layout_.mpirun ? kMpirunTermToKillSec : kTermToKillSec; }

  const Options& opts_;
  JobLayout layout_;
  std::string idHex_;
  std::vector<Rank> ranks_;
  rlimit originalNofile_{};
  bool nofileRaised_ = false;

  int devNull_ = -1;
  int rank0Stdin_ = 0;  // what rank 0 gets as stdin

  // When stdin is a terminal, rank 0 (in its own process group) could not read
  // it without being stopped by SIGTTIN, so zprun reads it and forwards it
  // through a pipe, as mpirun does.
  bool forwardStdin_ = false;
  int stdinWriteFd_ = -1;
  std::string stdinBuffer_;

  Phase phase_ = Phase::kRunning;
  double timeoutAt_ = 0;  // 0: none
  double termAt_ = 0;     // phase kGrace: when to send SIGTERM
  double killAt_ = 0;     // phase kTerminating: when to send SIGKILL
  double drainUntil_ = 0;
  bool intervened_ = false;  // zprun has signalled the ranks
  int userSignals_ = 0;
  int firstUserSignal_ = 0;
  bool timedOut_ = false;
  bool launchFailed_ = false;  // fork/pipe failure
  bool execFailed_ = false;
  int firstOwnFailure_ = 0;  // exit code of the first rank that failed before we intervened
  int firstAnyFailure_ = 0;  // exit code of the first rank that failed at all
  int failureReports_ = 0;
  int unreportedFailures_ = 0;
};

}  // namespace zprun
