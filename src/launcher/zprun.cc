// zprun: starts the ranks of a Zeppelin job on this machine, like mpirun.
//
//   zprun -n 4 [options] [--] PROGRAM [ARGS...]
//   zprun --nodes 2 --ranks-per-node 4 --nics-per-node 2 --nic-rate 1gbit PROGRAM ...
//
// zprun hosts the job's rendezvous (zpGetUniqueId starts its root thread in
// this process), forks one process per rank with the job described in the
// environment (read by zpCommInitFromEnv), optionally prefixes the ranks'
// output with their rank, and supervises them: when one rank fails, the
// others get a grace period to notice the dead peer and exit with an error,
// then SIGTERM, then SIGKILL. No rank outlives zprun.
//
// With --nodes, zprun first builds an emulated cluster on this machine (a
// network namespace per node, veth NICs on one bridge per rail, tbf rate
// limits: cluster.h), runs each rank inside its node, and removes the cluster
// when the job ends, however it ends (but SIGKILL: then `zprun --cleanup`).
// The rendezvous then runs in rank 0, on node 0's first NIC, since ranks in
// node namespaces cannot reach zprun's loopback.
//
// With --mpirun, zprun runs Open MPI's mpirun in node 0 instead of the ranks,
// so that MPI programs can be measured on the same cluster. mpirun reads a
// hostfile of the nodes (in the state directory) and starts its daemons
// through its remote shell (plm_rsh_agent), which is zprun again, in a hidden
// mode: `zprun --mpirun-agent TAG HOST COMMAND...` enters node HOST of the
// cluster TAG as a rank would and runs COMMAND with the shell, like ssh. Its
// runtime and its TCP transport use the zpnic interfaces only.
//
// The command line is parsed into Options by options.cc; this file has two
// parts that do not know about each other's internals:
//   1. (options.h)
//   2. layout: Options turned into nodes and ranks (JobLayout): one node
//      here, or the nodes of an emulated cluster with the way to enter them;
//   3. the Job: spawning the ranks of a layout and supervising them.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/bootstrap.h"
#include "src/launcher/cluster/cluster.h"
#include "src/launcher/options.h"
#include "src/util/strings.h"

extern char** environ;

namespace {

using namespace zprun;  // options.h: Options, limits, exit codes

// Supervision.
// ... for mpirun, which first stops the ranks and daemons on every node.
constexpr double kMpirunTermToKillSec = 10.0;
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



// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
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

// Formats seconds the way the user wrote them in most cases: "10", "0.5".
std::string formatSec(double sec) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g", sec);
  return buf;
}

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

// ---------------------------------------------------------------------------
// 2. Layout: which ranks run where
// ---------------------------------------------------------------------------

// A node is a set of ranks that share memory. Without a cluster there is one
// node and the ranks simply run here; a node of an emulated cluster says how
// a rank enters it (its network namespace, hostname and boot id).
struct NodeSpec {
  int index = 0;
  std::string nodeId;  // empty: the library derives it (hostname + boot id)
  zprun::NodeEntry entry;  // entry.nsFd < 0: no namespace, run here
};

struct RankSpec {
  int rank = 0;
  int node = 0;  // index into JobLayout::nodes
  int localRank = 0;
  int localNranks = 0;
  int nic = -1;  // in a cluster: the node's NIC this rank uses
};

struct JobLayout {
  std::vector<NodeSpec> nodes;
  std::vector<RankSpec> ranks;  // indexed by rank
  const zprun::Cluster* cluster = nullptr;
  // --mpirun: the one "rank" is mpirun in node 0, which starts the real ones.
  bool mpirun = false;
};

// cluster: the emulated cluster the ranks run in, or nullptr. Rank r runs on
// node r / R as local rank r % R and uses NIC (r % R) % K, so the ranks of a
// node spread evenly over its NICs.
JobLayout planLayout(const Options& opts, const zprun::Cluster* cluster) {
  JobLayout layout;
  layout.cluster = cluster;
  if (cluster == nullptr) {
    layout.nodes.push_back(NodeSpec{});
    for (int r = 0; r < opts.nranks; ++r) layout.ranks.push_back(RankSpec{r, 0, r, opts.nranks, -1});
    return layout;
  }
  const zprun::ClusterSpec& spec = cluster->spec();
  for (int i = 0; i < spec.nodes; ++i) {
    NodeSpec node;
    node.index = i;
    // mpirun and its daemons find the nodes by name.
    node.entry = cluster->nodeEntry(i, opts.mpirun);
    layout.nodes.push_back(node);
  }
  if (opts.mpirun) {
    layout.mpirun = true;
    layout.ranks.push_back(RankSpec{0, 0, 0, 1, 0});
    return layout;
  }
  for (int i = 0; i < spec.nodes; ++i)
    for (int local = 0; local < spec.ranksPerNode; ++local)
      layout.ranks.push_back(RankSpec{i * spec.ranksPerNode + local, i, local, spec.ranksPerNode,
                                      local % spec.nicsPerNode});
  return layout;
}

// The variables zprun sets for one rank.
std::vector<std::string> jobVariables(const JobLayout& layout, const RankSpec& spec,
                                      const std::string& idHex) {
  std::vector<std::string> set;
  const NodeSpec& node = layout.nodes[spec.node];
  set.push_back("ZP_RANK=" + std::to_string(spec.rank));
  set.push_back("ZP_NRANKS=" + std::to_string(layout.ranks.size()));
  set.push_back("ZP_LOCAL_RANK=" + std::to_string(spec.localRank));
  set.push_back("ZP_LOCAL_NRANKS=" + std::to_string(spec.localNranks));
  set.push_back("ZP_UNIQUE_ID=" + idHex);
  set.push_back("ZP_LAUNCHER=zprun");
  if (!node.nodeId.empty()) set.push_back("ZP_NODE_ID=" + node.nodeId);
  if (layout.cluster != nullptr) {
    const zprun::ClusterSpec& c = layout.cluster->spec();
    set.push_back("ZP_NODE_RANK=" + std::to_string(spec.node));
    set.push_back("ZP_NNODES=" + std::to_string(c.nodes));
    set.push_back("ZP_NICS_PER_NODE=" + std::to_string(c.nicsPerNode));
    set.push_back("ZP_NIC_RATE_BPS=" + std::to_string(c.rateBps));
  }
  return set;
}

// What zprun --mpirun tells every MPI rank about the cluster (through
// mpirun's -x): the same for all, unlike a rank's place.
std::vector<std::string> mpirunVariables(const zprun::ClusterSpec& c) {
  return {"ZP_LOCAL_NRANKS=" + std::to_string(c.ranksPerNode), "ZP_NNODES=" + std::to_string(c.nodes),
          "ZP_NICS_PER_NODE=" + std::to_string(c.nicsPerNode),
          "ZP_NIC_RATE_BPS=" + std::to_string(c.rateBps)};
}

// What zprun --mpirun sets for mpirun itself: the variables above (which -x
// then exports), and, when the cluster has more ranks than the machine has
// cores, Open MPI's idle yielding, as mpirun does by itself for more ranks
// than slots on one machine (the hostfile's slots hide that the emulated
// nodes share the machine's cores). Lower in precedence than --mca, so
// `--mpirun --mca mpi_yield_when_idle 0 --` turns it off.
std::vector<std::string> mpirunEnvironment(const zprun::ClusterSpec& c) {
  std::vector<std::string> set = mpirunVariables(c);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && static_cast<long>(c.nodes) * c.ranksPerNode > cores &&
      getenv("OMPI_MCA_mpi_yield_when_idle") == nullptr)
    set.push_back("OMPI_MCA_mpi_yield_when_idle=1");
  return set;
}

// The full environment of one rank: zprun's own, then -x, then the job's
// variables (later entries replace earlier ones of the same name). For
// mpirun, which passes its environment on to the ranks here, zprun's own
// rank variables (from an outer launcher) are left out.
std::vector<std::string> rankEnvironment(const Options& opts, const JobLayout& layout,
                                         const RankSpec& spec, const std::string& idHex) {
  std::vector<std::string> set;
  if (layout.mpirun) {
    set = opts.extraEnv;
    for (std::string& v : mpirunEnvironment(layout.cluster->spec())) set.push_back(v);
  } else if (layout.cluster != nullptr) {
    // The rank's NIC; -x may name others (all of the node's, say).
    set.push_back("ZP_NET_DEVICES=" + zprun::nicName(spec.nic));
    set.push_back("ZP_SOCKET_IFNAME=" + zprun::nicName(spec.nic));
  }
  if (!layout.mpirun) {
    set.insert(set.end(), opts.extraEnv.begin(), opts.extraEnv.end());
    for (std::string& v : jobVariables(layout, spec, idHex)) set.push_back(v);
  }

  auto nameOf = [](const std::string& entry) { return entry.substr(0, entry.find('=')); };
  auto overridden = [&](const std::string& name, size_t from) {
    for (size_t k = from; k < set.size(); ++k)
      if (nameOf(set[k]) == name) return true;
    return false;
  };

  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    // zprun's own ZP_NODE_ID would make all nodes of a cluster one.
    if (layout.cluster != nullptr && nameOf(*e) == "ZP_NODE_ID") continue;
    auto isNamed = [&](const char* v) { return nameOf(*e) == v; };
    if (layout.mpirun && (std::any_of(std::begin(kReservedVars), std::end(kReservedVars), isNamed) ||
                          std::any_of(std::begin(kReservedClusterVars),
                                      std::end(kReservedClusterVars), isNamed)))
      continue;
    if (!overridden(nameOf(*e), 0)) env.push_back(*e);
  }
  for (size_t k = 0; k < set.size(); ++k)
    if (!overridden(nameOf(set[k]), k + 1)) env.push_back(set[k]);
  return env;
}

// ---------------------------------------------------------------------------
// Signals: handlers only write the signal number to a self-pipe, which the
// supervision loop polls along with the ranks' output.
// ---------------------------------------------------------------------------

int g_signalPipe[2] = {-1, -1};
volatile sig_atomic_t g_stopRequested = 0;  // INT/TERM/HUP seen: start no more ranks
volatile sig_atomic_t g_firstStopSignal = 0;  // which one came first

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

const int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

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
  // stopping zprun (see the stdin forwarding below).
  signal(SIGTTIN, SIG_IGN);
  return true;
}

// ---------------------------------------------------------------------------
// 3. The job: spawning and supervising the ranks
// ---------------------------------------------------------------------------

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
  zprun::NodeEntry node;  // node.nsFd >= 0: enter this node of the cluster first
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
    if (!zprun::enterNode(s.node, &step)) childFail(s.reportFd, kStageSetup, step);
  }
#ifdef SYS_close_range
  // Descriptors zprun got from its own parent or the library must not leak
  // into the ranks. Best effort: older kernels lack close_range.
  syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
#endif
  execvpe(s.file, s.argv, s.envp);
  childFail(s.reportFd, kStageExec);
}

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
void printDryRun(const Options& opts, const zprun::Cluster& cluster, const JobLayout& layout,
                 const std::string& idHex) {
  auto print = [](const std::vector<std::vector<std::string>>& cmds) {
    for (const auto& c : cmds) {
      std::string line;
      for (const std::string& a : c) line += (line.empty() ? "" : " ") + zprun::quoteArg(a);
      printf("  %s\n", line.c_str());
    }
  };
  const zprun::ClusterSpec& spec = cluster.spec();
  printf("# cluster %s: %d node%s x %d rank%s, %d NIC%s per node, rate %s, MTU %d\n",
         cluster.tag().c_str(), spec.nodes, spec.nodes == 1 ? "" : "s", spec.ranksPerNode,
         spec.ranksPerNode == 1 ? "" : "s", spec.nicsPerNode, spec.nicsPerNode == 1 ? "" : "s",
         spec.rateBps > 0 ? (std::to_string(spec.rateBps) + " bit/s").c_str() : "not limited",
         spec.mtu);
  printf("# build (state in %s: lock, node<i>.boot_id, hosts%s)\n", cluster.stateDir().c_str(),
         layout.mpirun ? ", hostfile" : "");
  print(cluster.setupCommands());
  if (layout.mpirun) {
    std::string command, vars;
    for (const std::string& a : opts.command)
      command += (command.empty() ? "" : " ") + zprun::quoteArg(a);
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
    std::string command;
    for (const std::string& a : opts.command) command += " " + zprun::quoteArg(a);
    for (const RankSpec& r : layout.ranks) {
      std::string vars;
      for (const std::string& v : jobVariables(layout, r, idHex))
        if (v.compare(0, 13, "ZP_UNIQUE_ID=") != 0 && v.compare(0, 12, "ZP_LAUNCHER=") != 0)
          vars += " " + v;
      printf("  rank %d: node %s, hostname %s, ZP_NET_DEVICES=%s ZP_SOCKET_IFNAME=%s%s%s\n", r.rank,
             cluster.nodeNamespace(r.node).c_str(), cluster.hostname(r.node).c_str(),
             zprun::nicName(r.nic).c_str(), zprun::nicName(r.nic).c_str(), vars.c_str(),
             command.c_str());
    }
    printf("# rendezvous: rank 0 hosts it on %s:%d\n", zprun::nicAddress(0, 0).c_str(),
           zprun::kRootPort);
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
  zpResult_t res = zp::makeRank0Id(zprun::nicAddress(0, 0), zprun::kRootPort, seedText, &id);
  if (res != zpSuccess) {
    fprintf(stderr, "zprun: cannot make the unique id: %s (%s)\n", zpGetErrorString(res),
            zpGetLastError(nullptr));
    return false;
  }
  *idHex = zp::idToHex(id);
  return true;
}

// ---------------------------------------------------------------------------
// --mpirun
// ---------------------------------------------------------------------------

std::string hostfilePath(const zprun::Cluster& cluster) { return cluster.stateDir() + "/hostfile"; }

// The mpirun command line of zprun --mpirun: every node of the cluster with R
// slots, ranks node by node (as zprun places them), daemons started through
// zprun --mpirun-agent, the runtime on zpnic0 and the tcp BTL on all the
// node's NICs, the cluster's variables exported to the ranks; then the
// user's mpirun arguments and the program. False (after saying why) if
// mpirun could not call zprun back.
bool mpirunCommand(const Options& opts, const zprun::Cluster& cluster, std::vector<std::string>* cmd) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    fprintf(stderr, "zprun: cannot find zprun's own path for mpirun: %s\n", strerror(errno));
    return false;
  }
  self[n] = '\0';
  // mpirun splits its agent at spaces, and a list of agents at ':'.
  if (strpbrk(self, " \t\n:") != nullptr) {
    fprintf(stderr, "zprun: --mpirun: zprun's path '%s' has a space or ':', which mpirun's "
            "plm_rsh_agent cannot take\n", self);
    return false;
  }
  const zprun::ClusterSpec& spec = cluster.spec();
  std::string nics;
  for (int k = 0; k < spec.nicsPerNode; ++k) nics += (k ? "," : "") + zprun::nicName(k);
  *cmd = {"mpirun", "--allow-run-as-root", "--oversubscribe",
          "-np", std::to_string(spec.nodes * spec.ranksPerNode),
          "--hostfile", hostfilePath(cluster),
          "--map-by", "slot", "--rank-by", "slot", "--bind-to", "none",
          "--mca", "plm", "rsh",
          "--mca", "plm_rsh_agent", std::string(self) + " --mpirun-agent " + cluster.tag(),
          "--mca", "plm_rsh_no_tree_spawn", "1",
          // Session directories in the state directory go with the cluster.
          "--mca", "orte_tmpdir_base", cluster.stateDir(),
          "--mca", "oob_tcp_if_include", zprun::nicName(0),
          "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
          "--mca", "btl_tcp_if_include", nics};
  for (const std::string& v : mpirunVariables(spec)) cmd->insert(cmd->end(), {"-x", v});
  for (const std::string& v : opts.extraEnv) cmd->insert(cmd->end(), {"-x", v});
  cmd->insert(cmd->end(), opts.mpirunArgs.begin(), opts.mpirunArgs.end());
  cmd->insert(cmd->end(), opts.command.begin(), opts.command.end());
  return true;
}

bool writeHostfile(const zprun::Cluster& cluster) {
  const std::string path = hostfilePath(cluster);
  FILE* f = fopen(path.c_str(), "we");
  bool ok = f != nullptr;
  for (int i = 0; ok && i < cluster.spec().nodes; ++i)
    ok = fprintf(f, "%s slots=%d\n", cluster.hostname(i).c_str(), cluster.spec().ranksPerNode) > 0;
  if (f != nullptr) ok = fclose(f) == 0 && ok;
  if (!ok) fprintf(stderr, "zprun: cannot write %s: %s\n", path.c_str(), strerror(errno));
  return ok;
}

// zprun --mpirun-agent TAG HOST COMMAND...: mpirun's remote shell. Like ssh,
// runs COMMAND (its words joined by spaces) with the user's login shell, but
// in node HOST of the running cluster TAG, entered as zprun's ranks enter it.
// Exit status: the shell's, or 255 if the node cannot be entered (as ssh).
int runMpirunAgent(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "zprun: usage: zprun --mpirun-agent TAG HOST COMMAND... (used by zprun --mpirun)\n");
    return kExitUsage;
  }
  zprun::LiveNode node;
  std::string error;
  if (!zprun::openLiveNode(argv[2], argv[3], &node, &error)) {
    fprintf(stderr, "zprun --mpirun-agent: %s\n", error.c_str());
    return 255;
  }
  std::string command;
  for (int i = 4; i < argc; ++i) command += (i > 4 ? " " : "") + std::string(argv[i]);
  const passwd* pw = getpwuid(getuid());
  std::string shell = "/bin/sh";
  if (pw != nullptr && pw->pw_shell != nullptr && pw->pw_shell[0] == '/') shell = pw->pw_shell;
  const char* step = nullptr;
  if (!zprun::enterNode(node.entry(), &step)) {
    fprintf(stderr, "zprun --mpirun-agent: cannot enter %s: %s: %s\n", argv[3], step, strerror(errno));
    return 255;
  }
  execl(shell.c_str(), shell.c_str(), "-c", command.c_str(), static_cast<char*>(nullptr));
  fprintf(stderr, "zprun --mpirun-agent: cannot execute %s: %s\n", shell.c_str(), strerror(errno));
  return kExitCannotExec;
}

// Runs the job in an emulated cluster; returns zprun's exit code. The cluster
// is removed before this returns, whatever happened.
int runInCluster(const Options& opts) {
  zprun::Cluster cluster(opts.cluster, getpid());
  std::string idHex;
  if (!makeClusterId(&idHex)) return kExitLaunchError;
  // With --mpirun, the one process zprun starts is mpirun.
  Options launch = opts;
  if (opts.mpirun && !mpirunCommand(opts, cluster, &launch.command)) return kExitLaunchError;
  if (opts.dryRun) {
    printDryRun(launch, cluster, planLayout(launch, &cluster), idHex);
    return 0;
  }
  if (!zprun::checkClusterPrerequisites(opts.cluster.rateBps > 0)) return zprun::kExitNoPrivilege;

  int code = cluster.create(&g_stopRequested);
  if (code != 0) return g_firstStopSignal != 0 ? 128 + g_firstStopSignal : code;
  if (opts.mpirun && !writeHostfile(cluster)) {
    code = kExitLaunchError;
  } else {
    Job job(launch, planLayout(launch, &cluster), idHex);
    code = job.run();
  }
  // Signals from here on (a second Ctrl-C) are recorded, not obeyed: the
  // cluster must go. ip and tc run in their own process groups, so a Ctrl-C
  // at the terminal does not reach them.
  if (!cluster.destroy() && code == 0) code = kExitLaunchError;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  ensureStandardFds();
  if (argc > 1 && strcmp(argv[1], "--mpirun-agent") == 0) return runMpirunAgent(argc, argv);

  Options opts;
  std::string error;
  switch (parseOptions(argc, argv, &opts, &error)) {
    case ParseResult::kHelp:
      printUsage(stdout);
      return 0;
    case ParseResult::kError:
      fprintf(stderr, "zprun: %s\n\n", error.c_str());
      printUsage(stderr);
      return kExitUsage;
    case ParseResult::kRun:
      break;
  }

  if (!installSignalHandlers()) {
    fprintf(stderr, "zprun: cannot create signal pipe: %s\n", strerror(errno));
    return kExitLaunchError;
  }

  if (opts.cleanup) {
    int code = zprun::cleanupStale();
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
  int code = job.run();
  fflush(stdout);
  fflush(stderr);
  // _exit, not exit: the rendezvous thread may still be blocked in accept()
  // (ranks that died before joining), and running static destructors under it
  // would be a race for nothing.
  _exit(code);
}
