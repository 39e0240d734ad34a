// Multi-process test harness: every rank is a real process (fork), as in a
// real job. The parent makes the unique id (its rendezvous thread serves the
// children), forks nranks children that each run the body, and collects how
// each ended. A child reports failed expectations through its exit code.
//
// Also here: shared memory for coordinating ranks (Shared<T>), error
// expectations (ZP_EXPECT_ERROR), environment helpers for children, and
// GoogleTest wrappers around the data checks of tests/checks.h.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/log.h"  // zp::clearLastError: each error check sees only its own message
#include "tests/checks.h"

// In an ASan build a rank's leaks are checked before it leaves (_exit skips
// LeakSanitizer's check at exit).
// In a child forked from a process with threads, ThreadSanitizer checks
// nothing, and LeakSanitizer reports what the parent's other threads held
// (they do not exist in the child): in sanitizer builds the ranks' bootstrap
// root runs in rank 0 rather than in a thread of the parent, and a rank's
// leaks are checked only if its parent had no other thread when it forked.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/lsan_interface.h>
#define ZP_TEST_LEAK_CHECK 1
#define ZP_TEST_ROOT_IN_RANK0 1
#endif
#if __has_feature(thread_sanitizer)
#define ZP_TEST_ROOT_IN_RANK0 1
#endif
#endif
#include <arpa/inet.h>

#include "src/core/bootstrap.h"

namespace zptest {

// How one rank process ended.
struct RankExit {
  bool exited = false;  // normal exit (else killed by a signal)
  int code = -1;        // exit code or signal number
  bool ok() const { return exited && code == 0; }
};

using RankBody = std::function<void(int rank, int nranks, const zpUniqueId& id)>;

struct RunOptions {
  int timeoutSec = 120;  // then every rank still running is killed and the test fails
  // Runs in the parent once every rank has been started (the ranks run on).
  std::function<void()> afterFork;
};

// The ids of this process's threads other than the caller.
inline std::vector<std::string> otherThreads() {
  std::vector<std::string> tids;
  std::string self = std::to_string(gettid());
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.' && self != e->d_name) tids.push_back(e->d_name);
    closedir(d);
  }
  return tids;
}

// The one-letter state of a thread (R running, S sleeping, ...), from /proc.
inline char threadState(const std::string& dir) {
  std::string stat;
  if (FILE* f = fopen((dir + "/stat").c_str(), "r")) {
    char buf[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    stat.assign(buf, n);
  }
  size_t paren = stat.rfind(')');  // the name in parentheses may hold spaces
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : '?';
}

// A child forked while another thread holds a lock (the allocator's, a
// sanitizer's) inherits the lock held forever and can hang on it much later.
// Where the parent has other threads (a test's own bootstrap root), the fork
// waits, up to a second, until none of them is running.
inline void waitForQuietThreads() {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  for (;;) {
    bool quiet = true;
    for (const std::string& t : otherThreads()) quiet = quiet && threadState("/proc/self/task/" + t) != 'R';
    if (quiet || std::chrono::steady_clock::now() > end) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Prints where a hung rank's threads wait, before it is killed: gdb's
// backtraces where gdb is installed, else each thread's kernel wait channel.
inline void printHungRank(int rank, pid_t pid) {
  fprintf(stderr, "---- rank %d (pid %d) is still running; its threads:\n", rank, (int)pid);
  if (access("/usr/bin/gdb", X_OK) == 0) {
    std::string cmd = "/usr/bin/gdb -p " + std::to_string(pid) +
                      " -batch -nx -ex 'thread apply all bt 30' 2>&1 | grep -E '^(Thread|#)' | head -300 >&2";
    if (system(cmd.c_str()) == 0) return;
  }
  std::string task = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(task.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::string dir = task + "/" + e->d_name;
      auto first = [&](const char* file) {
        std::string line;
        if (FILE* f = fopen((dir + "/" + file).c_str(), "r")) {
          char buf[256] = {0};
          if (fgets(buf, sizeof(buf), f)) line = buf;
          fclose(f);
        }
        while (!line.empty() && line.back() == '\n') line.pop_back();
        return line;
      };
      std::string call = first("syscall");
      fprintf(stderr, "  thread %s (%s): state %c, waiting in %s, system call %s\n", e->d_name, first("comm").c_str(),
              threadState(dir), first("wchan").c_str(), call.substr(0, call.find(' ')).c_str());
    }
    closedir(d);
  }
}

// Runs body(rank, nranks, id) in nranks processes with the given id; returns their exits.
inline std::vector<RankExit> runRanksWithId(const zpUniqueId& id, int nranks, const RankBody& body,
                                            const RunOptions& opts = RunOptions()) {
  fflush(stdout);
  fflush(stderr);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opts.timeoutSec);
  std::vector<pid_t> pids(nranks, -1);
  const bool threaded = !otherThreads().empty();
#ifdef ZP_TEST_LEAK_CHECK
  const bool checkLeaks = !threaded;
#endif
  for (int r = 0; r < nranks; r++) {
    if (threaded) waitForQuietThreads();
    pid_t pid = fork();
    if (pid == 0) {
      body(r, nranks, id);
      fflush(stdout);
      fflush(stderr);
      int leaked = 0;
#ifdef ZP_TEST_LEAK_CHECK
      if (checkLeaks) leaked = __lsan_do_recoverable_leak_check();
#endif
      _exit(::testing::Test::HasFailure() ? 1 : leaked ? 23 : 0);
    }
    pids[r] = pid;
  }
  if (opts.afterFork) opts.afterFork();
  std::vector<RankExit> exits(nranks);
  int left = nranks;
  while (left > 0) {
    for (int r = 0; r < nranks; r++) {
      if (pids[r] < 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        exits[r].exited = WIFEXITED(st);
        exits[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st);
        pids[r] = -1;
        left--;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "ranks still running after " << opts.timeoutSec << " s: killing them (a hang)";
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) printHungRank(r, pids[r]);
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return exits;
}

// Runs fn in one child process (so that a crash, an environment change or a
// leak stays there); returns how it ended.
inline RankExit runInChild(const std::function<void()>& fn, int timeoutSec = 120) {
  zpUniqueId unused;
  memset(&unused, 0, sizeof(unused));
  RunOptions opts;
  opts.timeoutSec = timeoutSec;
  return runRanksWithId(unused, 1, [&](int, int, const zpUniqueId&) { fn(); }, opts)[0];
}

// An id whose rendezvous rank 0 hosts (torchrun style) on a loopback port
// free now: the root lives and dies with the job, not in this process.
inline zpUniqueId rank0Id() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  EXPECT_EQ(bind(fd, (sockaddr*)&a, sizeof(a)), 0);
  getsockname(fd, (sockaddr*)&a, &len);
  close(fd);
  int port = ntohs(a.sin_port);
  zpUniqueId id;
  EXPECT_EQ(zp::makeRank0Id("127.0.0.1", port, "zptest:" + std::to_string(getpid()) + ":" + std::to_string(port), &id),
            zpSuccess);
  return id;
}

// /dev/shm entries named after the id's secret (shared memory's segments
// had such names; none may be left, or made).
inline std::vector<std::string> shmEntriesOf(const zpUniqueId& id) {
  zp::IdLayout layout;
  if (!zp::decodeId(id, &layout)) return {};
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "zp-%02x%02x%02x%02x%02x%02x%02x%02x", layout.secret[0], layout.secret[1],
           layout.secret[2], layout.secret[3], layout.secret[4], layout.secret[5], layout.secret[6], layout.secret[7]);
  std::vector<std::string> found;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) found.push_back(e->d_name);
    closedir(d);
  }
  return found;
}

// Runs body(rank, nranks, id) in nranks processes; returns their exits.
// Kills every rank still running after opts.timeoutSec (the test then fails).
inline std::vector<RankExit> runRanks(int nranks, const RankBody& body, const RunOptions& opts) {
  zpUniqueId id;
#ifdef ZP_TEST_ROOT_IN_RANK0
  id = rank0Id();
#else
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
#endif
  return runRanksWithId(id, nranks, body, opts);
}
inline std::vector<RankExit> runRanks(int nranks, const RankBody& body, int timeoutSec = 120) {
  RunOptions opts;
  opts.timeoutSec = timeoutSec;
  return runRanks(nranks, body, opts);
}

// Expects every rank to have exited 0.
inline void expectAllOk(const std::vector<RankExit>& exits) {
  for (size_t r = 0; r < exits.size(); r++)
    EXPECT_TRUE(exits[r].ok()) << "rank " << r << (exits[r].exited ? " exited with code " : " killed by signal ")
                               << exits[r].code;
}

// Initializes a communicator in a child; ends the child on failure.
inline zpComm_t initComm(int rank, int nranks, const zpUniqueId& id) {
  zpComm_t comm = nullptr;
  zpResult_t r = zpCommInitRank(&comm, nranks, id, rank);
  if (r != zpSuccess) {
    ADD_FAILURE() << "rank " << rank << ": zpCommInitRank: " << zpGetErrorString(r) << ": " << zpGetLastError(nullptr);
    fflush(stdout);
    _exit(1);
  }
  return comm;
}

// Rank 0 makes `count` new ids and sends them to every rank over `base`; then
// every rank initializes one communicator per id, in order.
inline std::vector<zpComm_t> makeMoreComms(zpComm_t base, int rank, int nranks, int count) {
  std::vector<zpUniqueId> ids(count);
  if (rank == 0) {
    for (auto& id : ids) EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  }
  EXPECT_EQ(zpGroupStart(), zpSuccess);
  if (rank == 0) {
    for (int p = 1; p < nranks; p++)
      for (auto& id : ids) EXPECT_EQ(zpSend(&id, sizeof(id), zpUint8, p, base, nullptr), zpSuccess);
  } else {
    for (auto& id : ids) EXPECT_EQ(zpRecv(&id, sizeof(id), zpUint8, 0, base, nullptr), zpSuccess);
  }
  zpResult_t r = zpGroupEnd();
  if (r != zpSuccess) {
    ADD_FAILURE() << "rank " << rank << ": sharing ids failed: " << zpGetLastError(nullptr);
    fflush(stdout);
    _exit(1);
  }
  std::vector<zpComm_t> comms;
  for (auto& id : ids) comms.push_back(initComm(rank, nranks, id));
  return comms;
}

// Returns once every rank of comm has called it (an alltoallv of one byte
// each): so that no rank leaves while others still need it.
inline void barrier(zpComm_t comm, int nranks) {
  std::vector<uint8_t> send(nranks), recv(nranks);
  std::vector<size_t> counts(nranks, 1), displs(nranks);
  for (int p = 0; p < nranks; p++) displs[p] = p;
  zpResult_t r = zpAlltoallv(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data(),
                             zpUint8, comm, nullptr);
  EXPECT_EQ(r, zpSuccess) << "barrier: " << zpGetLastError(comm);
}

// A fresh seed per run, printed so that a failure can be replayed with ZP_TEST_SEED.
inline uint64_t testSeed() {
  static uint64_t seed = [] {
    const char* s = getenv("ZP_TEST_SEED");
    uint64_t v = s ? strtoull(s, nullptr, 0) : std::random_device{}() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    printf("[ seed ] ZP_TEST_SEED=%llu\n", (unsigned long long)v);
    return v;
  }();
  return seed;
}

// A seed for one test: the run's seed mixed with the test's name, so tests
// differ from each other and a replay with ZP_TEST_SEED gives the same inputs.
inline uint64_t testCaseSeed() {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  uint64_t h = testSeed();
  for (const char* s : {t->test_suite_name(), t->name()})
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

// One rank's checked alltoallv (see AlltoallvRun): fails the test unless it
// succeeds with every byte right and nothing outside the receive ranges written.
inline void checkedAlltoallv(zpComm_t comm, int rank, const CountMatrix& counts, zpDataType_t dt, uint64_t seed) {
  EXPECT_EQ(alltoallvError(comm, rank, counts, dt, seed), "");
}

// An object in memory shared by the parent and every rank forked after it
// was made: for flags and counters that coordinate ranks (use atomics).
template <class T>
class Shared {
 public:
  Shared() {
    void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    obj_ = new (p) T();
  }
  ~Shared() {
    obj_->~T();
    munmap(obj_, sizeof(T));
  }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;
  T* operator->() { return obj_; }
  T& operator*() { return *obj_; }

 private:
  T* obj_;
};

// Polls pred until it holds (true) or timeoutSec pass (false).
inline bool waitFor(const std::function<bool()>& pred, double timeoutSec) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSec);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// ---- Environment of a rank (call in the child, before init) ----

inline void setTimeoutSeconds(double seconds) { setenv("ZP_TIMEOUT", std::to_string(seconds).c_str(), 1); }
// ZP_SHM_PROTO: "auto" (single copy above the eager size where allowed) or "copy".
inline void setShmProto(const char* proto) { setenv("ZP_SHM_PROTO", proto, 1); }
// Removes every variable by which a launcher describes a job.
inline void clearLauncherEnv() {
  for (const char* v : {"ZP_RANK", "ZP_NRANKS", "ZP_UNIQUE_ID", "ZP_LOCAL_RANK", "ZP_LOCAL_NRANKS", "ZP_LAUNCHER",
                        "ZP_MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_PROCID", "SLURM_NTASKS",
                        "SLURM_LOCALID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID",
                        "SLURM_STEP_ID", "ZP_SECRET"})
    unsetenv(v);
}

}  // namespace zptest

// Expects `call` to return `code` and to explain itself in zpGetLastError.
#define ZP_EXPECT_ERROR(code, call)                                                           \
  do {                                                                                        \
    ::zp::clearLastError();                                                                   \
    zpResult_t zp_got_ = (call);                                                              \
    EXPECT_EQ(zp_got_, (code)) << #call << ": " << zpGetLastError(nullptr);                   \
    EXPECT_STRNE(zpGetLastError(nullptr), "") << #call << " left no message in zpGetLastError"; \
  } while (0)

#define ZP_EXPECT_OK(call)                                                                        \
  do {                                                                                            \
    zpResult_t zp_got_ = (call);                                                                  \
    EXPECT_EQ(zp_got_, zpSuccess) << #call << ": " << zpGetErrorString(zp_got_) << ": "           \
                                  << zpGetLastError(nullptr);                                     \
  } while (0)

#define ZP_ASSERT_OK(call)                                                                        \
  do {                                                                                            \
    zpResult_t zp_got_ = (call);                                                                  \
    ASSERT_EQ(zp_got_, zpSuccess) << #call << ": " << zpGetErrorString(zp_got_) << ": "           \
                                  << zpGetLastError(nullptr);                                     \
  } while (0)
