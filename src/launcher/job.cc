// zprun's job: see job.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/job.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "src/launcher/signals.h"
#include "src/util/strings.h"

namespace zprun {
namespace {

// After the last rank exited, how long to keep reading its output pipes. They
// normally close at once; a descendant that left the rank's process group could
// hold them open forever.
constexpr double kDrainSec = 2.0;
// A line longer than this is emitted in pieces, so one rank printing without
// newlines cannot make zprun buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;
// Ranks failing on their own are reported one by one up to this many; the
// rest are counted, so a 1024-rank job that loses one peer does not print
// a thousand lines.
constexpr int kMaxFailureReports = 8;

double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Formats seconds the way the user wrote them in most cases: "10", "0.5".
std::string formatSec(double sec) { return zp::strprintf("%g", sec); }

// Writes all of data; false if the fd is gone (EPIPE, closed).
bool writeAll(int fd, const char* data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n > 0) {
      data += n;
      len -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Our stdout may be a non-blocking fd we inherited; wait until it drains.
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, -1);
    } else {
      return false;
    }
  }
  return true;
}

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Everything the child needs between fork and exec, prepared by the parent:
// zprun has threads (the rendezvous root), so the child may only make
// async-signal-safe calls: no allocation, no locks, no stdio.
struct ChildSetup {
  pid_t parentPid;
  int stdinFd;   // dup2'ed to 0 unless it is 0
  int stdoutFd;  // dup2'ed to 1, or -1 to inherit
  int stderrFd;  // dup2'ed to 2, or -1 to inherit
  int reportFd;  // close-on-exec pipe: receives an ExecReport if exec fails
  const char* file;
  char* const* argv;
  char* const* envp;
  bool restoreNofile;
  rlimit nofile;  // the descriptor limit zprun started with
  zpcluster::NodeEntry node;  // node.nsFd >= 0: enter this node of the cluster first
};

// What a child sends back when it cannot run PROGRAM.
struct ExecReport {
  int stage;  // kStageSetup or kStageExec
  int error;  // errno
  char step[160];  // kStageSetup: what failed, if known
};
constexpr int kStageSetup = 1;
constexpr int kStageExec = 2;

[[noreturn]] void childFail(int reportFd, int stage, const char* step = nullptr) {
  ExecReport report;
  memset(&report, 0, sizeof report);
  report.stage = stage;
  report.error = errno;
  for (size_t k = 0; step != nullptr && step[k] != '\0' && k + 1 < sizeof report.step; ++k)
    report.step[k] = step[k];
  ssize_t ignored = write(reportFd, &report, sizeof report);  // one write: atomic on a pipe
  (void)ignored;
  _exit(kExitCannotExec);
}

[[noreturn]] void runChild(const ChildSetup& s) {
  // Our own process group: a Ctrl-C at the terminal reaches only zprun, which
  // forwards it, so every rank sees exactly one signal whatever the shell
  // does; and zprun can signal a rank together with its own children.
  setpgid(0, 0);
  // If zprun dies (even by SIGKILL), the rank dies too. getppid() closes the
  // race with a parent that died before prctl.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != s.parentPid) _exit(kExitLaunchError);

  // Ignored dispositions and the signal mask survive exec; give PROGRAM the
  // defaults it expects, not zprun's choices.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  const int kReset[] = {SIGPIPE, SIGTTIN, SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  for (int sig : kReset) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (s.restoreNofile) setrlimit(RLIMIT_NOFILE, &s.nofile);

  if (s.stdinFd != 0 && dup2(s.stdinFd, 0) < 0) childFail(s.reportFd, kStageSetup);
  if (s.stdoutFd >= 0 && dup2(s.stdoutFd, 1) < 0) childFail(s.reportFd, kStageSetup);
  if (s.stderrFd >= 0 && dup2(s.stderrFd, 2) < 0) childFail(s.reportFd, kStageSetup);
  if (s.node.nsFd >= 0) {
    const char* step = nullptr;
    if (!zpcluster::enterNode(s.node, &step)) childFail(s.reportFd, kStageSetup, step);
  }
#ifdef SYS_close_range
  // Descriptors zprun got from its own parent or the library must not leak
  // into the ranks. Best effort: older kernels lack close_range.
  syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
  execvpe(s.file, s.argv, s.envp);
  childFail(s.reportFd, kStageExec);
}

}  // namespace

std::string Job::nameOf(const Rank& rank) const {
  return layout_.mpirun ? "mpirun" : "rank " + std::to_string(rank.spec.rank);
}

int Job::runningCount() const {
  int n = 0;
  for (const Rank& r : ranks_) n += r.running;
  return n;
}

bool Job::setUpStdin() {
  devNull_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devNull_ < 0) {
    fprintf(stderr, "zprun: cannot open /dev/null: %s\n", strerror(errno));
    return false;
  }
  if (!isatty(0)) return true;  // a file or pipe: rank 0 reads it directly
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    fprintf(stderr, "zprun: pipe: %s\n", strerror(errno));
    return false;
  }
  rank0Stdin_ = fds[0];
  stdinWriteFd_ = fds[1];
  setNonBlocking(stdinWriteFd_);
  forwardStdin_ = true;
  return true;
}

bool Job::spawn(Rank& rank) {
  const int r = rank.spec.rank;
  int report[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  // O_CLOEXEC everywhere: each child must hold only its own pipe ends, or a
  // rank's output pipe would stay open (no EOF) as long as any rank lives.
  bool ok = pipe2(report, O_CLOEXEC) == 0;
  if (ok && opts_.prefix) ok = pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0;
  if (!ok) {
    fprintf(stderr, "zprun: cannot create pipes for rank %d: %s%s\n", r, strerror(errno),
            errno == EMFILE ? " (raise the limit with ulimit -n)" : "");
    for (int fd : {report[0], report[1], out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
    launchFailed_ = true;
    return false;
  }

  // Built before fork: the child may not allocate.
  std::vector<std::string> env = rankEnvironment(opts_, layout_, rank.spec, idHex_);
  std::vector<char*> envp, argv;
  for (std::string& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  std::vector<std::string> command = opts_.command;
  for (std::string& a : command) argv.push_back(&a[0]);
  argv.push_back(nullptr);

  ChildSetup setup{getpid(),      r == 0 ? rank0Stdin_ : devNull_,
                   out[1],        err[1],
                   report[1],     command[0].c_str(),
                   argv.data(),   envp.data(),
                   nofileRaised_, originalNofile_,
                   layout_.nodes[rank.spec.node].entry};

  pid_t pid = fork();
  if (pid == 0) runChild(setup);
  int forkErrno = errno;
  for (int fd : {report[1], out[1], err[1]})
    if (fd >= 0) close(fd);
  if (pid < 0) {
    fprintf(stderr, "zprun: cannot start rank %d: fork: %s\n", r, strerror(forkErrno));
    for (int fd : {report[0], out[0], err[0]})
      if (fd >= 0) close(fd);
    launchFailed_ = true;
    return false;
  }
  // Also here, so the group exists before we might signal it (the child may
  // not have run yet). Fails harmlessly once the child has exec'd.
  setpgid(pid, pid);
  rank.pid = pid;
  rank.running = true;
  if (opts_.prefix) {
    rank.out.fd = out[0];
    rank.out.target = 1;
    rank.err.fd = err[0];
    rank.err.target = 2;
    setNonBlocking(out[0]);
    setNonBlocking(err[0]);
  }

  // Wait for exec: the report pipe closes on success, or carries the reason.
  ExecReport rep{};
  ssize_t n;
  do {
    n = read(report[0], &rep, sizeof rep);
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n != static_cast<ssize_t>(sizeof rep)) return true;

  // The child exits 127 by itself; it is reaped by the supervision loop.
  if (rep.stage == kStageExec)
    fprintf(stderr, "zprun: cannot execute %s: %s\n", opts_.command[0].c_str(),
            strerror(rep.error));
  else if (rep.step[0] != '\0')
    fprintf(stderr, "zprun: cannot set up %s: %s: %s\n", nameOf(rank).c_str(), rep.step,
            strerror(rep.error));
  else
    fprintf(stderr, "zprun: cannot set up %s: %s\n", nameOf(rank).c_str(), strerror(rep.error));
  execFailed_ = true;
  return false;
}

int Job::run() {
  // A rank count near 1024 needs more descriptors than the usual soft limit of
  // 1024: the rendezvous root in this process holds one socket per rank and
  // --prefix two pipes per rank. Ranks get the original limit back.
  if (getrlimit(RLIMIT_NOFILE, &originalNofile_) == 0 &&
      originalNofile_.rlim_cur < originalNofile_.rlim_max) {
    rlimit raised = originalNofile_;
    raised.rlim_cur = raised.rlim_max;
    nofileRaised_ = setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }

  if (!setUpStdin()) return kExitLaunchError;
  if (opts_.timeoutSec > 0) timeoutAt_ = nowSec() + opts_.timeoutSec;

  ranks_.resize(layout_.ranks.size());
  for (size_t i = 0; i < ranks_.size(); ++i) ranks_[i].spec = layout_.ranks[i];
  for (size_t i = 0; i < ranks_.size(); ++i) {
    // A signal during start-up stops the launch; the supervision loop
    // forwards it to the ranks already running.
    if (g_stopRequested) break;
    if (!spawn(ranks_[i])) {
      // The ranks already started cannot complete without the missing one:
      // no grace, terminate them now.
      if (runningCount() > 0) {
        intervened_ = true;
        signalRanks(SIGTERM);
        phase_ = Phase::kTerminating;
        killAt_ = nowSec() + termToKillSec();
      }
      break;
    }
  }
  if (rank0Stdin_ > 0) close(rank0Stdin_);  // rank 0 has its copy
  if (!forwardStdin_ || !ranks_[0].running) closeStdinForwarding();

  supervise();

  if (unreportedFailures_ > 0)
    fprintf(stderr, "zprun: %d more rank%s failed\n", unreportedFailures_,
            unreportedFailures_ == 1 ? "" : "s");
  return exitCode();
}

int Job::exitCode() const {
  if (execFailed_) return kExitCannotExec;
  if (launchFailed_) return kExitLaunchError;
  // A rank that failed by itself is the root cause, even if a timeout or a
  // signal came later.
  if (firstOwnFailure_ != 0) return firstOwnFailure_;
  if (timedOut_) return kExitTimeout;
  if (firstAnyFailure_ != 0) return firstAnyFailure_;
  // Interrupted, but every rank handled the signal and exited 0: still not a
  // successful run.
  if (firstUserSignal_ != 0) return 128 + firstUserSignal_;
  return 0;
}

void Job::supervise() {
  std::vector<pollfd> fds;
  // What each pollfd entry is: a rank's stream, or one of the fixed fds.
  std::vector<OutputStream*> streams;
  std::vector<Rank*> owners;
  bool drainStarted = false;

  for (;;) {
    handleSignalPipe();  // non-blocking: also catches signals from before the loop
    reapChildren();
    checkDeadlines();

    bool anyOpen = false;
    for (const Rank& r : ranks_) anyOpen |= r.out.fd >= 0 || r.err.fd >= 0;
    if (runningCount() == 0) {
      closeStdinForwarding();
      if (!anyOpen) break;
      if (!drainStarted) {
        drainStarted = true;
        drainUntil_ = nowSec() + kDrainSec;
      } else if (nowSec() >= drainUntil_) {
        break;
      }
    }

    fds.clear();
    streams.clear();
    owners.clear();
    fds.push_back({g_signalPipe[0], POLLIN, 0});  // read at the top of the loop
    int stdinIn = -1, stdinOut = -1;
    if (stdinWriteFd_ >= 0) {
      if (stdinBuffer_.empty()) {
        stdinIn = static_cast<int>(fds.size());
        fds.push_back({0, POLLIN, 0});
      } else {
        stdinOut = static_cast<int>(fds.size());
        fds.push_back({stdinWriteFd_, POLLOUT, 0});
      }
    }
    const size_t firstStream = fds.size();
    for (Rank& r : ranks_) {
      for (OutputStream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
        owners.push_back(&r);
      }
    }

    // Sleep until the next deadline at most.
    double now = nowSec(), next = 0;
    auto consider = [&](double t) {
      if (t > 0 && (next == 0 || t < next)) next = t;
    };
    if (phase_ == Phase::kRunning || phase_ == Phase::kGrace) consider(timeoutAt_);
    if (phase_ == Phase::kGrace) consider(termAt_);
    if (phase_ == Phase::kTerminating) consider(killAt_);
    if (drainStarted) consider(drainUntil_);
    int timeoutMs = -1;
    if (next > 0) timeoutMs = static_cast<int>(std::ceil(std::min(std::max(next - now, 0.0), 3600.0) * 1000));

    int n = poll(fds.data(), fds.size(), timeoutMs);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "zprun: poll: %s\n", strerror(errno));
      // Cannot supervise any more: do not leave the ranks behind.
      signalRanks(SIGKILL);
      phase_ = Phase::kKilled;
      launchFailed_ = true;
      for (Rank& r : ranks_) {
        if (r.running) waitpid(r.pid, nullptr, 0);
        r.running = false;
      }
      return;
    }
    if (stdinIn >= 0 || stdinOut >= 0)
      pumpStdin(stdinIn >= 0 ? fds[stdinIn].revents : 0, stdinOut >= 0 ? fds[stdinOut].revents : 0);
    for (size_t k = firstStream; k < fds.size(); ++k)
      if (fds[k].revents) readOutput(*owners[k - firstStream], *streams[k - firstStream]);
  }

  // Pipes a stray descendant still holds: flush what we have and let go.
  for (Rank& r : ranks_) {
    for (OutputStream* s : {&r.out, &r.err}) {
      if (s->fd < 0) continue;
      emit(r, *s, nullptr, 0, true);
      close(s->fd);
      s->fd = -1;
    }
  }
}

void Job::handleSignalPipe() {
  unsigned char buf[64];
  ssize_t n;
  while ((n = read(g_signalPipe[0], buf, sizeof buf)) > 0) {
    for (ssize_t k = 0; k < n; ++k) {
      int sig = buf[k];
      if (sig == SIGCHLD) continue;  // the loop reaps on every wakeup
      // Recorded even with no rank running (a signal during start-up): an
      // interrupted job never exits 0.
      if (firstUserSignal_ == 0) firstUserSignal_ = sig;
      if (runningCount() == 0) continue;
      ++userSignals_;
      intervened_ = true;
      if (userSignals_ == 1) {
        fprintf(stderr, "zprun: received %s, forwarding it to %d rank%s\n",
                signalName(sig).c_str(), runningCount(), runningCount() == 1 ? "" : "s");
        signalRanks(sig);
        startGrace();
      } else if (phase_ != Phase::kKilled) {
        // The user insists: no more waiting.
        fprintf(stderr, "zprun: received %s again, killing %d rank%s\n",
                signalName(sig).c_str(), runningCount(), runningCount() == 1 ? "" : "s");
        signalRanks(SIGKILL);
        phase_ = Phase::kKilled;
      }
    }
  }
}

void Job::reapChildren() {
  for (;;) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    // WNOWAIT: look before reaping. While the rank's zombie exists its process
    // group id cannot be reused, so killing the group (leftover children of
    // the rank, e.g. background jobs of a shell) cannot hit a stranger.
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return;
    pid_t pid = info.si_pid;
    Rank* rank = nullptr;
    for (Rank& r : ranks_)
      if (r.running && r.pid == pid) rank = &r;
    if (rank != nullptr) kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (rank != nullptr) onRankExit(*rank, status);
  }
}

void Job::onRankExit(Rank& rank, int status) {
  rank.running = false;
  if (rank.spec.rank == 0) closeStdinForwarding();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;

  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (firstAnyFailure_ == 0) firstAnyFailure_ = code;
  // After zprun signalled the ranks, their deaths are its own doing, and an
  // exec failure was already reported: report only failures of the ranks'
  // own making.
  if (intervened_ || execFailed_ || launchFailed_) return;
  if (firstOwnFailure_ == 0) firstOwnFailure_ = code;

  if (failureReports_ < kMaxFailureReports) {
    ++failureReports_;
    if (WIFEXITED(status))
      fprintf(stderr, "zprun: %s exited with code %d\n", nameOf(rank).c_str(), code);
    else
      fprintf(stderr, "zprun: %s killed by signal %s%s\n", nameOf(rank).c_str(),
              signalName(WTERMSIG(status)).c_str(), WCOREDUMP(status) ? " (core dumped)" : "");
  } else {
    ++unreportedFailures_;
  }
  if (phase_ == Phase::kRunning) {
    int others = runningCount();
    if (others > 0)
      fprintf(stderr, "zprun: waiting up to %s s for the other %d rank%s to exit\n",
              formatSec(opts_.graceSec).c_str(), others, others == 1 ? "" : "s");
    startGrace();
  }
}

void Job::startGrace() {
  if (phase_ != Phase::kRunning) return;
  phase_ = Phase::kGrace;
  termAt_ = nowSec() + opts_.graceSec;
}

void Job::checkDeadlines() {
  if (runningCount() == 0) return;
  double now = nowSec();
  if (timeoutAt_ > 0 && now >= timeoutAt_ &&
      (phase_ == Phase::kRunning || phase_ == Phase::kGrace)) {
    timedOut_ = true;
    intervened_ = true;
    fprintf(stderr, "zprun: timeout: job still running after %s s, terminating %d rank%s\n",
            formatSec(opts_.timeoutSec).c_str(), runningCount(), runningCount() == 1 ? "" : "s");
    if (opts_.stacks) printStacks();
    signalRanks(SIGTERM);
    phase_ = Phase::kTerminating;
    killAt_ = now + termToKillSec();
  }
  if (phase_ == Phase::kGrace && now >= termAt_) {
    intervened_ = true;
    fprintf(stderr, "zprun: sending SIGTERM to %d rank%s still running after the grace period\n",
            runningCount(), runningCount() == 1 ? "" : "s");
    signalRanks(SIGTERM);
    phase_ = Phase::kTerminating;
    killAt_ = now + termToKillSec();
  }
  if (phase_ == Phase::kTerminating && now >= killAt_) {
    fprintf(stderr, "zprun: sending SIGKILL to %d rank%s still running after SIGTERM\n",
            runningCount(), runningCount() == 1 ? "" : "s");
    signalRanks(SIGKILL);
    phase_ = Phase::kKilled;
  }
}

void Job::printStacks() {
  if (access("/usr/bin/gdb", X_OK) != 0) {
    fprintf(stderr, "zprun: --stacks: no /usr/bin/gdb\n");
    return;
  }
  for (const Rank& r : ranks_) {
    if (!r.running) continue;
    fprintf(stderr, "zprun: ---- %s (pid %d), still running:\n", nameOf(r).c_str(), (int)r.pid);
    fflush(stderr);
    std::string cmd = "/usr/bin/gdb -p " + std::to_string(r.pid) +
                      " -batch -nx -ex 'thread apply all bt 30' 2>&1 | grep -E '^(Thread|#)' >&2";
    if (system(cmd.c_str()) != 0) fprintf(stderr, "zprun: gdb could not read pid %d\n", (int)r.pid);
  }
}

void Job::signalRanks(int sig) {
  for (const Rank& r : ranks_) {
    if (!r.running) continue;
    // The whole group, like a terminal would: a rank that is a shell script
    // takes its children with it.
    if (kill(-r.pid, sig) != 0) kill(r.pid, sig);
  }
}

void Job::readOutput(Rank& rank, OutputStream& stream) {
  char buf[65536];
  for (;;) {
    ssize_t n = read(stream.fd, buf, sizeof buf);
    if (n > 0) {
      // One read per wakeup, so a rank that floods its output cannot starve
      // the others or the signal pipe.
      emit(rank, stream, buf, static_cast<size_t>(n), false);
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // EOF (the rank and all its children closed it) or an error: done.
    emit(rank, stream, nullptr, 0, true);
    close(stream.fd);
    stream.fd = -1;
    return;
  }
}

// Appends data to the stream's partial line and writes every complete line,
// prefixed, in one write. At EOF a partial last line is completed with a
// newline so the next rank's prefix starts a line of its own.
void Job::emit(const Rank& rank, OutputStream& stream, const char* data, size_t len, bool atEof) {
  const std::string prefix = "[" + std::to_string(rank.spec.rank) + "] ";
  std::string outText;
  stream.partial.append(data != nullptr ? data : "", len);
  size_t start = 0;
  for (;;) {
    size_t nl = stream.partial.find('\n', start);
    if (nl == std::string::npos) break;
    outText += prefix;
    outText.append(stream.partial, start, nl + 1 - start);
    start = nl + 1;
  }
  stream.partial.erase(0, start);
  while (stream.partial.size() >= kMaxLineBytes) {
    outText += prefix;
    outText.append(stream.partial, 0, kMaxLineBytes);
    outText += '\n';
    stream.partial.erase(0, kMaxLineBytes);
  }
  if (atEof && !stream.partial.empty()) {
    outText += prefix + stream.partial + "\n";
    stream.partial.clear();
  }
  // A failed write (a closed stdout) drops the output; the ranks still run to
  // completion and zprun still reports their status.
  if (!outText.empty()) writeAll(stream.target, outText.data(), outText.size());
}

void Job::pumpStdin(short inEvents, short outEvents) {
  if (inEvents != 0) {
    char buf[4096];
    ssize_t n = read(0, buf, sizeof buf);
    if (n > 0) {
      stdinBuffer_.assign(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      // EOF, or EIO from a terminal we may not read (zprun in the background):
      // rank 0 sees end of input.
      closeStdinForwarding();
      return;
    }
  }
  if (outEvents != 0 || !stdinBuffer_.empty()) {
    ssize_t n = write(stdinWriteFd_, stdinBuffer_.data(), stdinBuffer_.size());
    if (n > 0) {
      stdinBuffer_.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      closeStdinForwarding();  // rank 0 closed its stdin
    }
  }
}

void Job::closeStdinForwarding() {
  if (stdinWriteFd_ >= 0) close(stdinWriteFd_);
  stdinWriteFd_ = -1;
  stdinBuffer_.clear();
}

}  // namespace zprun
