// zprun's signals: see signals.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/signals.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace zprun {

int g_signalPipe[2] = {-1, -1};
volatile sig_atomic_t g_stopRequested = 0;
volatile sig_atomic_t g_firstStopSignal = 0;

namespace {

void onSignal(int sig) {
  int savedErrno = errno;
  if (sig != SIGCHLD) {
    if (g_firstStopSignal == 0) g_firstStopSignal = sig;
    g_stopRequested = 1;
  }
  unsigned char byte = static_cast<unsigned char>(sig);
  // Non-blocking: if the pipe is full, a wakeup is already pending.
  ssize_t ignored = write(g_signalPipe[1], &byte, 1);
  (void)ignored;
  errno = savedErrno;
}

}  // namespace

bool installSignalHandlers() {
  if (pipe2(g_signalPipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  // SA_RESTART so blocking calls elsewhere (pipe reads, writes to stdout) are
  // not cut short; poll() still wakes up through the self-pipe.
  sa.sa_flags = SA_RESTART;
  for (int sig : kForwardedSignals) {
    // A signal ignored from the start stays ignored (nohup zprun ..., or a
    // background job of a non-interactive shell), as for any other program.
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sig, &sa, nullptr);
  }
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, nullptr);
  // A closed stdout (zprun ... | head) must not kill the supervisor and leave
  // ranks unattended: writes fail with EPIPE instead.
  signal(SIGPIPE, SIG_IGN);
  // Reading a terminal from a background job then fails with EIO instead of
  // stopping zprun (see the stdin forwarding in job.cc).
  signal(SIGTTIN, SIG_IGN);
  return true;
}

std::string signalName(int sig) {
  // Our own table: strsignal gives prose ("Killed"), and sigabbrev_np is
  // glibc-only and recent.
  static const struct {
    int sig;
    const char* name;
  } kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGSYS, "SIGSYS"},
  };
  for (const auto& n : kNames)
    if (n.sig == sig) return n.name;
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
  return "signal " + std::to_string(sig);
}

}  // namespace zprun
