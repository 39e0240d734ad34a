// The shared-memory transport's setup when the system cannot give it what it
// needs (issue 28): a small /dev/shm, no file descriptors left, ranks of one
// node configured differently. Every rank must get an error from init, at
// once, saying why: never a crash later, never a wait for the timeout.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "tests/harness.h"

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// zpCommInitRankConfig with a timeout, and what came of it.
struct Init {
  zpResult_t result;
  std::string msg;  // zpGetLastError
  double seconds;   // how long init took
  zpComm_t comm = nullptr;
};
Init timedInit(int rank, int nranks, const zpUniqueId& id, int timeoutMs) {
  zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  Init out;
  const auto start = std::chrono::steady_clock::now();
  out.result = zpCommInitRankConfig(&out.comm, nranks, id, rank, &cfg);
  out.msg = zpGetLastError(nullptr);
  out.seconds = zptest::secondsSince(start);
  return out;
}

// In a child of the test (its mount namespace is its own): a fresh tmpfs of
// `size` on /dev/shm, as a container with --shm-size=size has. "" if done,
// else why not (the test is skipped).
std::string privateDevShm(const char* size) {
  if (unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS): " + std::string(strerror(errno));
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return "making / private: " + std::string(strerror(errno));
  const std::string opts = std::string("size=") + size + ",mode=1777";
  if (mount("zpshmtest", "/dev/shm", "tmpfs", 0, opts.c_str()) != 0)
    return "mounting a tmpfs on /dev/shm: " + std::string(strerror(errno));
  return "";
}

std::vector<std::string> devShmEntries() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// Runs 6 ranks on one node with 64 KiB rings (the node needs about 7 MiB of
// /dev/shm) in a private /dev/shm of `size`, of which `filler` bytes are
// taken by another file. Init must fail on every rank with zpSystemError and
// a message naming /dev/shm; a rank whose init succeeded anyway moves data
// through every ring, which used to kill it with SIGBUS.
void runWithSmallDevShm(const char* size, off_t filler) {
  zptest::RankExit child = zptest::runInChild([&] {
    const std::string why = privateDevShm(size);
    if (!why.empty()) {
      printf("SKIP: %s\n", why.c_str());
      return;
    }
    if (filler) {
      int fd = open("/dev/shm/filler", O_CREAT | O_RDWR, 0600);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(posix_fallocate(fd, 0, filler), 0);
      close(fd);
    }
    setenv("ZP_SHM_RING_BYTES", "64K", 1);
    zptest::setShmProto("copy");  // every byte through the rings
    const int n = 6;
    auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
      const Init init = timedInit(rank, nranks, id, 20000);
      const zpResult_t r = init.result;
      const std::string& msg = init.msg;
      zpComm_t comm = init.comm;
      EXPECT_LT(init.seconds, 10.0) << "init waited for the timeout";
      EXPECT_EQ(r, zpSystemError) << "rank " << rank << ": " << msg;
      EXPECT_TRUE(contains(msg, "/dev/shm") && contains(msg, "ZP_SHM_RING_BYTES")) << "rank " << rank << ": " << msg;
      if (rank == 0) printf("rank 0: %s\n", msg.c_str());
      if (r == zpSuccess) {
        zptest::AlltoallvRun run(rank, zptest::uniformCounts(nranks, 64 << 10), zpFloat32, 1);
        run.run(comm);
        zpCommDestroy(comm);
      }
    });
    for (int r = 0; r < n; r++)
      EXPECT_TRUE(exits[r].exited) << "rank " << r << " was killed by signal " << exits[r].code;
    zptest::expectAllOk(exits);
    // Nothing left behind but the filler.
    for (const std::string& e : devShmEntries())
      EXPECT_TRUE(e == "filler") << "left in /dev/shm: " << e;
  });
  EXPECT_TRUE(child.ok()) << (child.exited ? "exit code " : "signal ") << child.code;
}

}  // namespace

// /dev/shm smaller than the node needs: every rank finds out from statfs.
TEST(ShmSpace, DevShmSmallerThanTheNodeNeedsFailsInitOnEveryRank) { runWithSmallDevShm("1m", 0); }

// /dev/shm large enough but mostly taken: the ranks whose segments do not
// fit find out when they reserve them, and the others from the bootstrap.
TEST(ShmSpace, DevShmWithTooLittleFreeSpaceFailsInitOnEveryRank) { runWithSmallDevShm("16m", 15 << 20); }

// A container's default /dev/shm (64 MiB) at 4 ranks, with the default 2 MiB
// rings that need 65 MiB: init shrinks the rings to 1 MiB with one warning
// (on the node's first rank) naming the size, data moves through them (copy
// protocol, every byte checked), and nothing is left in /dev/shm.
TEST(ShmSpace, ContainerSizedDevShmGetsSmallerRingsWithOneWarning) {
  zptest::RankExit child = zptest::runInChild([&] {
    const std::string why = privateDevShm("64m");
    if (!why.empty()) {
      printf("SKIP: %s\n", why.c_str());
      return;
    }
    unsetenv("ZP_SHM_RING_BYTES");
    zptest::setShmProto("copy");
    const uint64_t seed = zptest::testCaseSeed();
    auto exits = zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
      // This rank's warnings, in a file of its own.
      char path[] = "/tmp/zp-shmwarn-XXXXXX";
      int fd = mkstemp(path);
      ASSERT_GE(fd, 0);
      unlink(path);
      fflush(stderr);
      const int saved = dup(2);
      dup2(fd, 2);
      const Init init = timedInit(rank, nranks, id, 20000);
      fflush(stderr);
      dup2(saved, 2);
      close(saved);
      std::string log(4096, '\0');
      log.resize(std::max<ssize_t>(0, pread(fd, &log[0], log.size(), 0)));
      close(fd);
      ASSERT_EQ(init.result, zpSuccess) << "rank " << rank << ": " << init.msg;
      size_t warnings = 0;
      for (size_t pos = 0; (pos = log.find("using 1048576-byte rings", pos)) != std::string::npos; pos++) warnings++;
      EXPECT_EQ(warnings, rank == 0 ? 1u : 0u) << "rank " << rank << ": " << log;
      for (int it = 0; it < 3; it++)
        EXPECT_EQ(zptest::alltoallvError(init.comm, rank, zptest::randomCounts(nranks, seed + it, 400000, 0.1),
                                         zpFloat32, seed + it),
                  "");
      ZP_EXPECT_OK(zpCommDestroy(init.comm));
    });
    zptest::expectAllOk(exits);
    for (const std::string& e : devShmEntries()) ADD_FAILURE() << "left in /dev/shm: " << e;
  });
  EXPECT_TRUE(child.ok()) << (child.exited ? "exit code " : "signal ") << child.code;
}

// ZP_SHM_RING_BYTES differs between the ranks of a node: every rank says so
// at once (it used to wait for the whole timeout, then report that a local
// rank never created its shared memory).
TEST(ShmSetup, RingSizesThatDifferFailInitAtOnce) {
  auto exits = zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    setenv("ZP_SHM_RING_BYTES", rank == 1 ? "128K" : "64K", 1);
    const Init init = timedInit(rank, nranks, id, 10000);
    const zpResult_t r = init.result;
    const std::string& msg = init.msg;
    EXPECT_LT(init.seconds, 5.0) << "init waited for the timeout";
    EXPECT_EQ(r, zpInvalidUsage) << msg;
    EXPECT_TRUE(contains(msg, "ZP_SHM_RING_BYTES") && contains(msg, "65536") && contains(msg, "131072"))
        << "rank " << rank << ": " << msg;
    if (rank == 0) printf("rank 0: %s\n", msg.c_str());
  });
  zptest::expectAllOk(exits);
}

// A rank out of file descriptors (its pidfds for the local peers take the
// last ones) cannot open its peers' segments: init fails at once with the
// reason; it used to count as "not created yet" and wait for the whole
// timeout. Its peers fail at once too: from the same cause, or because a
// local rank failed (whichever they meet first).
TEST(ShmSetup, NoFileDescriptorsLeftFailsInitAtOnce) {
  const int n = 10;
  zptest::Shared<std::atomic<int>> sawEmfile;
  auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    // Room for the bootstrap's socket and a few more, not for a pidfd per peer.
    int highest = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
      while (dirent* e = readdir(d)) highest = std::max(highest, atoi(e->d_name));
      closedir(d);
    }
    rlimit lim;
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = highest + 5;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lim), 0);
    for (;;) {  // fill the holes below: 4 free descriptors in all
      const int fd = open("/dev/null", O_RDONLY);
      ASSERT_GE(fd, 0);
      if (fd > highest) {
        close(fd);
        break;
      }
    }
    const Init init = timedInit(rank, nranks, id, 10000);
    const zpResult_t r = init.result;
    const std::string& msg = init.msg;
    EXPECT_LT(init.seconds, 5.0) << "init waited for the timeout";
    EXPECT_NE(r, zpSuccess);
    const bool emfile = contains(msg, strerror(EMFILE));
    // The others hear of it from the rank itself, or find it gone: a rank
    // whose init failed exits, and may do so before they look.
    EXPECT_TRUE(emfile || contains(msg, "local rank") || contains(msg, "died during init"))
        << "rank " << rank << ": " << msg;
    if (emfile) ++*sawEmfile;
    printf("rank %d: %s\n", rank, msg.c_str());
  });
  zptest::expectAllOk(exits);
  EXPECT_GT(sawEmfile->load(), 0) << "no rank said it ran out of file descriptors";
}

// A whole job killed with SIGKILL early in its init, at 20 moments from 0 to
// 190 ms after its ranks start (init takes about that long on a loaded
// machine): nothing of it may stay in /dev/shm. Its segments must never be
// there under a name nobody removes (they were, between their creation and
// the moment every local rank had mapped them: 6 runs of 20).
TEST(ShmSegments, AJobKilledEarlyInInitLeavesNothingInDevShm) {
  const int n = 4, rounds = 20;
  zptest::Shared<std::atomic<int>> ready;  // ranks whose init finished, over all rounds
  int leaky = 0;
  for (int round = 0; round < rounds; round++) {
    const int delayMs = round * 10;
    const zpUniqueId id = zptest::rank0Id();  // the root dies with the job
    std::vector<pid_t> pids;
    fflush(stdout);  // not printed again by the children
    fflush(stderr);
    for (int r = 0; r < n; r++) {
      const pid_t pid = fork();
      if (pid == 0) {
        zpComm_t comm = nullptr;
        zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
        cfg.timeoutMs = 10000;
        if (zpCommInitRankConfig(&comm, n, id, r, &cfg) == zpSuccess) ++*ready;
        for (;;) pause();  // until the kill
      }
      ASSERT_GT(pid, 0);
      pids.push_back(pid);
    }
    usleep(delayMs * 1000);
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
    const std::vector<std::string> left = zptest::shmEntriesOf(id);
    if (!left.empty()) leaky++;
    for (const std::string& e : left) {
      ADD_FAILURE() << "killed after " << delayMs << " ms: left in /dev/shm: " << e;
      shm_unlink(("/" + e).c_str());
    }
  }
  printf("%d of %d rounds left segments; %d of %d ranks had finished init when killed\n", leaky, rounds,
         ready->load(), n * rounds);
}
