// zprun's signals: the handlers only write the signal number to a self-pipe,
// which the supervision loop (job.cc) polls along with the ranks' output.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <signal.h>

#include <string>

namespace zprun {

// Forwarded to the ranks; the first one also stops the launch.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

extern int g_signalPipe[2];                     // [0]: the read end, non-blocking
extern volatile sig_atomic_t g_stopRequested;   // INT/TERM/HUP seen: start no more ranks
extern volatile sig_atomic_t g_firstStopSignal;  // which one came first

// Installs the handlers (and ignores SIGPIPE and SIGTTIN); false if the pipe
// cannot be made.
bool installSignalHandlers();

// "SIGKILL", for messages.
std::string signalName(int sig);

}  // namespace zprun
