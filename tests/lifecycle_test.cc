// Communicator lifecycle: several communicators at once, init/destroy in a
// loop without leaking file descriptors, threads or shared memory, the
// single-rank communicator, zpCommCount / zpCommUserRank, and
// zpCommInitFromEnv with zprun-, torchrun- and mpirun-style environments.
#include <arpa/inet.h>
#include <dirent.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "src/core/bootstrap.h"
#include "src/core/log.h"  // zp::clearLastError
#include "src/util/strings.h"
#include "tests/harness.h"

namespace {

using zptest::checkedAlltoallv;
using zptest::randomCounts;

void expectCountAndRank(zpComm_t comm, int nranks, int rank) {
  int count = -1, me = -1;
  ZP_EXPECT_OK(zpCommCount(comm, &count));
  ZP_EXPECT_OK(zpCommUserRank(comm, &me));
  EXPECT_EQ(count, nranks);
  EXPECT_EQ(me, rank);
}

TEST(Lifecycle, CountAndUserRankMatchInit) {
  for (int n : {1, 3, 8}) {
    auto exits = zptest::runRanks(n, [](int rank, int nranks, const zpUniqueId& id) {
      zpComm_t comm = zptest::initComm(rank, nranks, id);
      expectCountAndRank(comm, nranks, rank);
      zptest::AlltoallvRun sync(rank, zptest::uniformCounts(nranks, 1), zpInt8, 1);  // nobody leaves early
      ZP_EXPECT_OK(sync.run(comm));
      ZP_EXPECT_OK(zpCommDestroy(comm));
    });
    zptest::expectAllOk(exits);
  }
}

// A rank may leave as soon as its zpCommInitRank returned (destroy, exit):
// ranks whose init is still finishing must not take that for a death.
TEST(Lifecycle, RanksLeavingRightAfterInitDoNotFailSlowerRanks) {
  for (int round = 0; round < 5; round++) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto exits = zptest::runRanks(8, [](int rank, int nranks, const zpUniqueId& id) {
      zpComm_t comm = zptest::initComm(rank, nranks, id);
      ZP_EXPECT_OK(zpCommDestroy(comm));
    });
    zptest::expectAllOk(exits);
  }
}

TEST(Lifecycle, SingleRankCommunicatorTalksToItself) {
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(1, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (size_t maxCount : {(size_t)10, (size_t)100000})
      checkedAlltoallv(comm, rank, randomCounts(1, seed + maxCount, maxCount, 0), zpFloat64, seed + maxCount);
    zptest::GuardedBuffer send(70000, 1), recv(70000, 2);
    send.fill(seed, 0, 0);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send.data(), 70000, zpUint8, 0, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(recv.data(), 70000, zpUint8, 0, comm, nullptr));
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(recv.wrongBytes(seed, 0, 0), 0u);
    EXPECT_EQ(recv.guardBytesWritten(), 0u);
    // Alone, an ungrouped send to self has no receive to meet.
    EXPECT_NE(zpSend(send.data(), 10, zpUint8, 0, comm, nullptr), zpSuccess);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// A destroyed communicator's handle is refused at once in every thread,
// also in one that resolved it before (lookups are cached per thread) and
// while something still holds the communicator: here a send queued in this
// thread's open group, while another thread destroys it.
TEST(Lifecycle, AHandleDestroyedByAnotherThreadIsRefusedAtOnce) {
  auto exits = zptest::runRanks(1, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int count = 0;
    ZP_ASSERT_OK(zpCommCount(comm, &count));  // resolved in this thread
    char byte = 1;
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(&byte, 1, zpUint8, 0, comm, nullptr));  // the queued send holds the communicator
    zpResult_t destroyed = zpInternalError;
    std::thread([&] { destroyed = zpCommDestroy(comm); }).join();
    ZP_EXPECT_OK(destroyed);
    zp::clearLastError();
    EXPECT_EQ(zpCommCount(comm, &count), zpInvalidArgument);
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("destroyed"), std::string::npos) << zpGetLastError(nullptr);
    EXPECT_NE(zpGroupEnd(), zpSuccess);  // its communicator is gone
  });
  zptest::expectAllOk(exits);
}

// Rank 0 makes three more ids and hands them out over the first
// communicator; all four communicators work side by side, calls interleaved.
TEST(Lifecycle, FourCommunicatorsAtOnceInterleaved) {
  uint64_t seed = zptest::testCaseSeed();
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
      zpComm_t first = zptest::initComm(rank, nranks, id);
      std::vector<zpComm_t> comms = zptest::makeMoreComms(first, rank, nranks, 3);
      comms.insert(comms.begin(), first);
      for (zpComm_t c : comms) expectCountAndRank(c, nranks, rank);
      std::mt19937_64 rng(seed + n);  // the same order on every rank
      std::vector<int> order = {0, 1, 2, 3};
      for (int it = 0; it < 4; it++) {
        std::shuffle(order.begin(), order.end(), rng);
        for (int k : order) {
          uint64_t s = rng();
          checkedAlltoallv(comms[k], rank, randomCounts(nranks, s, it % 2 ? 40000 : 300, 0.2), zpInt32, s);
        }
      }
      // One group with a ring exchange on each communicator.
      int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
      std::vector<std::unique_ptr<zptest::GuardedBuffer>> sends, recvs;
      ZP_ASSERT_OK(zpGroupStart());
      for (size_t k = 0; k < comms.size(); k++) {
        sends.emplace_back(new zptest::GuardedBuffer(1000 + 20000 * k, k));
        recvs.emplace_back(new zptest::GuardedBuffer(1000 + 20000 * k, k + 1));
        sends[k]->fill(seed + k, rank, next);
        ZP_EXPECT_OK(zpSend(sends[k]->data(), sends[k]->size(), zpUint8, next, comms[k], nullptr));
        ZP_EXPECT_OK(zpRecv(recvs[k]->data(), recvs[k]->size(), zpUint8, prev, comms[k], nullptr));
      }
      ZP_ASSERT_OK(zpGroupEnd());
      for (size_t k = 0; k < comms.size(); k++) EXPECT_EQ(recvs[k]->wrongBytes(seed + k, prev, rank), 0u) << k;
      // Destroyed in another order than made; the rest keep working.
      ZP_EXPECT_OK(zpCommDestroy(comms[2]));
      ZP_EXPECT_OK(zpCommDestroy(comms[0]));
      checkedAlltoallv(comms[3], rank, randomCounts(nranks, seed, 1000, 0.1), zpInt8, seed);
      ZP_EXPECT_OK(zpCommDestroy(comms[3]));
      checkedAlltoallv(comms[1], rank, randomCounts(nranks, seed, 1000, 0.1), zpInt8, seed);
      ZP_EXPECT_OK(zpCommDestroy(comms[1]));
    });
    zptest::expectAllOk(exits);
  }
}

// Two threads per process, each with its own communicator (as NCCL allows):
// they initialize and run at the same time, and each thread's
// zpGetLastError is its own.
TEST(Lifecycle, TwoThreadsEachWithItsOwnCommunicator) {
  uint64_t seed = zptest::testCaseSeed();
  zpUniqueId second;
  ASSERT_EQ(zpGetUniqueId(&second), zpSuccess);
  auto exits = zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& first) {
    std::atomic<int> erred{0};
    auto work = [&](int k) {
      zpComm_t comm = zptest::initComm(rank, nranks, k == 0 ? first : second);
      for (int it = 0; it < 10; it++) {
        uint64_t s = seed + 100 * k + it;
        checkedAlltoallv(comm, rank, randomCounts(nranks, s, it % 2 ? 50000 : 500, 0.2), zpInt32, s);
      }
      if (k == 1) {
        float x = 0;
        EXPECT_EQ(zpSend(&x, 1, (zpDataType_t)42, 0, comm, nullptr), zpInvalidArgument);
        erred = 1;
      } else {
        zptest::waitFor([&] { return erred == 1; }, 60);
        EXPECT_STREQ(zpGetLastError(nullptr), "") << "thread 0 sees thread 1's error";
      }
      ZP_EXPECT_OK(zpCommDestroy(comm));
    };
    zp::clearLastError();
    std::thread t1(work, 1);
    work(0);
    t1.join();
  });
  zptest::expectAllOk(exits);
}

// ---- Leaks ----

size_t dirEntries(const char* path) {
  size_t n = 0;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
  }
  return n;
}
size_t openFds() { return dirEntries("/proc/self/fd"); }
size_t threads() { return dirEntries("/proc/self/task"); }

// One new communicator from an id rank 0 makes and sends over `base`.
zpComm_t freshComm(zpComm_t base, int rank, int nranks, zpUniqueId* idOut) {
  zpUniqueId id;
  if (rank == 0) {
    EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  }
  EXPECT_EQ(zpGroupStart(), zpSuccess);
  for (int p = 1; p < nranks && rank == 0; p++) ZP_EXPECT_OK(zpSend(&id, sizeof(id), zpUint8, p, base, nullptr));
  if (rank != 0) ZP_EXPECT_OK(zpRecv(&id, sizeof(id), zpUint8, 0, base, nullptr));
  EXPECT_EQ(zpGroupEnd(), zpSuccess);
  *idOut = id;
  return zptest::initComm(rank, nranks, id);
}

TEST(Lifecycle, InitDestroyLoopLeaksNoFdsThreadsOrSharedMemory) {
  const int kIterations = 50;
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t base = zptest::initComm(rank, nranks, id);
    zpUniqueId each;
    // One round first, so that whatever is made once per process exists.
    zpComm_t warm = freshComm(base, rank, nranks, &each);
    ZP_EXPECT_OK(zpCommDestroy(warm));
    auto settled = [&](size_t fds, size_t thr) {
      return zptest::waitFor([&] { return openFds() <= fds && threads() <= thr; }, 10);
    };
    // Gives the warm-up's rendezvous thread (on rank 0) time to end.
    zptest::waitFor([&] { return threads() <= 1; }, 10);
    size_t fds0 = openFds(), threads0 = threads();
    std::vector<zpUniqueId> ids;
    for (int it = 0; it < kIterations; it++) {
      zpComm_t c = freshComm(base, rank, nranks, &each);
      ids.push_back(each);
      size_t maxCount = it % 10 == 9 ? 100000 : 100;
      checkedAlltoallv(c, rank, randomCounts(nranks, seed + it, maxCount, 0.2), zpUint8, seed + it);
      ZP_EXPECT_OK(zpCommDestroy(c));
      if (::testing::Test::HasFailure()) break;
    }
    // Rendezvous threads end, and fds close, shortly after the last init.
    EXPECT_TRUE(settled(fds0, threads0)) << "rank " << rank << ": " << openFds() << " fds open (" << fds0
                                         << " before), " << threads() << " threads (" << threads0 << " before)";
    for (const zpUniqueId& i : ids) {
      std::vector<std::string> left = zptest::shmEntriesOf(i);
      EXPECT_TRUE(left.empty()) << "left in /dev/shm: " << left[0];
    }
    ZP_EXPECT_OK(zpCommDestroy(base));
  });
  zptest::expectAllOk(exits);
}

// malloc's bytes in use in this process (every arena, and mmapped chunks):
// exact to the byte, where RSS moves by pages.
size_t heapInUse() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

// Init/destroy cycles must not grow the heap of any rank, the one that hosts
// the bootstrap root included (rank 0 makes every id here): whatever a
// communicator allocates goes with it, and nothing is kept per destroyed
// communicator (its handle included). Issue 16 measured 150-160 B per cycle
// on every rank: a destroyed communicator's handle, kept so that a late call
// gets an error.
TEST(Lifecycle, InitDestroyCyclesDoNotGrowTheHeap) {
  const int kWarmCycles = 30, kCycles = 300;
  // Measured: 0.5-3.8 KB in 300 cycles, 3.3 KB in 1000, 3.8 KB in 3000 (the
  // base communicator's queues and malloc's caches settling, not a cost per
  // cycle), and once 9.0 KB on rank 0 in 300 under a CI run's load; 150 B per
  // cycle would be 45 KB. The bound is 40 B per cycle, under issue 16's 50.
  const size_t kMaxGrowthBytes = 12288;
  auto exits = zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t base = zptest::initComm(rank, nranks, id);
    zpUniqueId each;
    size_t start = 0;
    // Rank 0's rendezvous thread of the last init may still be ending (and
    // holding its buffers) when the loop does: each count is taken once no
    // thread but this one is left.
    auto quiet = [&] { return zptest::waitFor([&] { return threads() <= 1; }, 10); };
    for (int c = 0; c < kWarmCycles + kCycles; c++) {
      if (c == kWarmCycles) {
        EXPECT_TRUE(quiet()) << "rank " << rank << ": " << threads() << " threads";
        start = heapInUse();
      }
      ZP_EXPECT_OK(zpCommDestroy(freshComm(base, rank, nranks, &each)));
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_TRUE(quiet()) << "rank " << rank << ": " << threads() << " threads";
    size_t end = heapInUse();
    printf("rank %d: heap %+ld bytes over %d cycles\n", rank, (long)(end - start), kCycles);
    EXPECT_LE(end, start + kMaxGrowthBytes) << "rank " << rank << ": the heap grew by " << (long)(end - start)
                                            << " bytes in " << kCycles << " init/destroy cycles ("
                                            << double(end - start) / kCycles << " per cycle)";
    ZP_EXPECT_OK(zpCommDestroy(base));
  });
  zptest::expectAllOk(exits);
}

// ---- zpCommInitFromEnv ----

// Runs a small checked job on a communicator made by zpCommInitFromEnv after
// setEnv(rank, nranks) has described the job in the environment.
void jobFromEnv(int nranks, const std::function<void(int rank, int nranks)>& setEnv, uint64_t seed,
                int timeoutSec = 120) {
  zpUniqueId unused;
  memset(&unused, 0, sizeof(unused));
  zptest::RunOptions opts;
  opts.timeoutSec = timeoutSec;
  auto exits = zptest::runRanksWithId(unused, nranks, [&](int rank, int n, const zpUniqueId&) {
    zptest::clearLauncherEnv();
    setEnv(rank, n);
    zpComm_t comm = nullptr;
    ZP_ASSERT_OK(zpCommInitFromEnv(&comm, nullptr));
    expectCountAndRank(comm, n, rank);
    checkedAlltoallv(comm, rank, randomCounts(n, seed, 50000, 0.2), zpFloat16, seed);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }, opts);
  zptest::expectAllOk(exits);
}

TEST(InitFromEnv, ZprunVariables) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::string hex = zp::idToHex(id);
  jobFromEnv(3, [&](int rank, int n) {
    setenv("ZP_RANK", std::to_string(rank).c_str(), 1);
    setenv("ZP_NRANKS", std::to_string(n).c_str(), 1);
    setenv("ZP_UNIQUE_ID", hex.c_str(), 1);
  }, zptest::testCaseSeed());
}

// A loopback port that is free now, with the next one free too (the library
// listens on MASTER_PORT + 1, leaving MASTER_PORT to torchrun's own store).
int freePortPair() {
  for (int attempt = 0; attempt < 100; attempt++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, (sockaddr*)&a, sizeof(a)) != 0 || getsockname(fd, (sockaddr*)&a, &len) != 0) {
      close(fd);
      continue;
    }
    int port = ntohs(a.sin_port);
    int fd2 = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in b = a;
    b.sin_port = htons(port + 1);
    bool nextFree = port < 65535 && bind(fd2, (sockaddr*)&b, sizeof(b)) == 0;
    close(fd2);
    close(fd);
    if (nextFree) return port;
  }
  return -1;
}

TEST(InitFromEnv, TorchrunVariablesTwiceOnOnePort) {
  int port = freePortPair();
  ASSERT_GT(port, 0) << "no free loopback port pair";
  // The second job reuses the address right after the first (a restart).
  for (int job = 0; job < 2; job++) {
    SCOPED_TRACE("job " + std::to_string(job));
    jobFromEnv(3, [&](int rank, int n) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    }, zptest::testCaseSeed() + job);
  }
}

// Under torchrun's variables with ZP_SECRET, a process that has every public
// variable but not the secret cannot take a rank: it fails its init, and the
// job forms with the ranks that know the secret. A short secret is refused.
struct StrangerGate {
  std::atomic<int> strangerDone{0};
};
TEST(InitFromEnv, TorchrunVariablesWithZpSecretKeepAStrangerOut) {
  int port = freePortPair();
  ASSERT_GT(port, 0) << "no free loopback port pair";
  const uint64_t seed = zptest::testCaseSeed();
  zptest::Shared<StrangerGate> gate;
  zpUniqueId unused;
  memset(&unused, 0, sizeof(unused));
  // Processes: rank 0, the stranger (claims rank 1, no secret), rank 1.
  auto exits = zptest::runRanksWithId(unused, 3, [&](int proc, int, const zpUniqueId&) {
    zptest::clearLauncherEnv();
    const int rank = proc == 0 ? 0 : 1;
    setenv("RANK", std::to_string(rank).c_str(), 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    setenv("TORCHELASTIC_RUN_ID", "none", 1);
    zpComm_t comm = nullptr;
    if (proc == 1) {
      usleep(300 * 1000);  // rank 0 listens by now
      setenv("ZP_TIMEOUT", "3", 1);
      EXPECT_NE(zpCommInitFromEnv(&comm, nullptr), zpSuccess) << "a process without the secret joined the job";
      gate->strangerDone = 1;
      return;
    }
    setenv("ZP_SECRET", "0123456789abcde", 1);  // 15 characters
    EXPECT_EQ(zpCommInitFromEnv(&comm, nullptr), zpInvalidArgument);
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("ZP_SECRET"), std::string::npos) << zpGetLastError(nullptr);
    setenv("ZP_SECRET", "a job's own secret, not derivable", 1);
    if (proc == 2) ASSERT_TRUE(zptest::waitFor([&] { return gate->strangerDone == 1; }, 60));
    ZP_ASSERT_OK(zpCommInitFromEnv(&comm, nullptr));
    expectCountAndRank(comm, 2, rank);
    checkedAlltoallv(comm, rank, randomCounts(2, seed, 5000, 0.2), zpInt32, seed);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

TEST(InitFromEnv, MpirunVariablesOnOneNodeUseAFileThatIsRemovedAfterInit) {
  uint64_t seed = zptest::testCaseSeed();
  std::string job = "zptest" + std::to_string(getpid()) + "x" + std::to_string(seed % 1000000);
  jobFromEnv(3, [&](int rank, int n) {
    setenv("OMPI_COMM_WORLD_RANK", std::to_string(rank).c_str(), 1);
    setenv("OMPI_COMM_WORLD_SIZE", std::to_string(n).c_str(), 1);
    setenv("OMPI_MCA_ess_base_jobid", job.c_str(), 1);
  }, seed);
  size_t left = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) left += strstr(e->d_name, job.c_str()) != nullptr;
    closedir(d);
  }
  EXPECT_EQ(left, 0u) << "the rendezvous file of job " << job << " was left in /dev/shm";
}

// srun: SLURM_PROCID / SLURM_NTASKS, the master the first host of the step's
// compressed node list (here 127.0.0.[1-4]: 127.0.0.1), the port after MASTER_PORT.
TEST(InitFromEnv, SlurmVariablesWithTheMasterFromTheNodeList) {
  int port = freePortPair();
  ASSERT_GT(port, 0) << "no free loopback port pair";
  jobFromEnv(4, [&](int rank, int n) {
    setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_NTASKS", std::to_string(n).c_str(), 1);
    setenv("SLURM_LOCALID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_STEP_NODELIST", "127.0.0.[1-4],zpnosuchhost[01-02]", 1);
    setenv("SLURM_JOB_NODELIST", "zpnosuchhost[01-02]", 1);  // the step's list wins
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  }, zptest::testCaseSeed());
}

// MASTER_ADDR overrides the node list (whose hosts do not resolve here), and
// without any port the tasks agree on one derived from the job and step ids.
TEST(InitFromEnv, SlurmVariablesWithMasterAddrAndNoPort) {
  uint64_t seed = zptest::testCaseSeed();
  std::string job = std::to_string(1000 + seed % 100000), step = std::to_string(getpid() % 1000);
  jobFromEnv(2, [&](int rank, int n) {
    setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
    setenv("SLURM_NTASKS", std::to_string(n).c_str(), 1);
    setenv("SLURM_STEP_NODELIST", "zpnosuchhost[07,09]", 1);
    setenv("SLURM_JOB_ID", job.c_str(), 1);
    setenv("SLURM_STEP_ID", step.c_str(), 1);
    setenv("MASTER_ADDR", "localhost", 1);
  }, seed);
}

TEST(InitFromEnv, FirstHostOfASlurmHostList) {
  struct Case {
    const char* list;
    const char* first;  // nullptr: refused
  } cases[] = {
      {"node01", "node01"},
      {"node[01-04,07]", "node01"},
      {"node[07,01-04]", "node07"},
      {"gpu[3]", "gpu3"},
      {"a,b[1-2]", "a"},
      {"node[001-100],login1", "node001"},
      {"rack[2-3]-n[05-06].ib", "rack2-n05.ib"},
      {"127.0.0.[1-4]", "127.0.0.1"},
      {"", nullptr},
      {",node1", nullptr},
      {"node[", nullptr},
      {"node[]", nullptr},
      {"node[a-b]", nullptr},
      {"node]1", nullptr},
      {"node[1[2]]", nullptr},
  };
  for (const Case& c : cases) {
    std::string host = "unchanged";
    bool ok = zp::firstHostOfList(c.list, &host);
    if (c.first) {
      EXPECT_TRUE(ok) << c.list;
      EXPECT_EQ(host, c.first) << c.list;
    } else {
      EXPECT_FALSE(ok) << c.list << " gave " << host;
      EXPECT_EQ(host, "unchanged") << c.list;
    }
  }
}

TEST(InitFromEnv, MissingOrBadEnvironmentIsRefused) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::string hex = zp::idToHex(id);
  struct Case {
    std::vector<std::pair<const char*, std::string>> env;
    zpResult_t expected;
  };
  const std::vector<Case> cases = {
      {{}, zpInvalidUsage},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, zpInvalidUsage},  // no MASTER_ADDR / MASTER_PORT
      {{{"ZP_RANK", "0"}, {"ZP_NRANKS", "2"}, {"ZP_UNIQUE_ID", "not-hex"}}, zpInvalidArgument},
      {{{"ZP_RANK", "0"}, {"ZP_NRANKS", "2"}, {"ZP_UNIQUE_ID", hex.substr(2)}}, zpInvalidArgument},
      {{{"ZP_RANK", "2"}, {"ZP_NRANKS", "2"}, {"ZP_UNIQUE_ID", hex}}, zpInvalidArgument},
      {{{"ZP_RANK", "-1"}, {"ZP_NRANKS", "2"}, {"ZP_UNIQUE_ID", hex}}, zpInvalidArgument},
      {{{"ZP_RANK", "0"}, {"ZP_NRANKS", "zero"}, {"ZP_UNIQUE_ID", hex}}, zpInvalidArgument},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "http"}},
       zpInvalidArgument},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "70000"}},
       zpInvalidArgument},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "x"}}, zpInvalidArgument},
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"MASTER_ADDR", "127.0.0.1"}}, zpInvalidArgument},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "four"}, {"MASTER_ADDR", "127.0.0.1"}}, zpInvalidArgument},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "2"}, {"MASTER_ADDR", "127.0.0.1"}},
       zpInvalidArgument},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, zpInvalidUsage},  // no master at all
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_NODELIST", "node[01-"}}, zpInvalidUsage},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"ZP_MASTER_PORT", "0"}},
       zpInvalidArgument},
  };
  for (const Case& c : cases) {
    std::string desc;
    for (auto& kv : c.env) desc += std::string(kv.first) + "=" + kv.second + " ";
    SCOPED_TRACE("environment: " + (desc.empty() ? std::string("(none)") : desc));
    zptest::expectAllOk({zptest::runInChild([&] {
      zptest::clearLauncherEnv();
      zptest::setTimeoutSeconds(10);  // an init that wrongly goes ahead fails instead of hanging
      for (auto& kv : c.env) setenv(kv.first, kv.second.c_str(), 1);
      zpComm_t comm = nullptr;
      ZP_EXPECT_ERROR(c.expected, zpCommInitFromEnv(&comm, nullptr));
    })});
  }
  zptest::expectAllOk({zptest::runInChild([] { ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitFromEnv(nullptr, nullptr)); })});
}

// One unique id given to two jobs of 2 ranks started together (a file of
// ids shared by mistake): no communicator may hold ranks of both. Every
// rank of both fails init, saying that the id was used twice (a rank that
// did get a communicator all-gathers its job's number, which shows any
// mixing). The ranks join in the order that mixed them: job A's rank 0 and
// job B's rank 1 first, then the other two. With each job's launcher
// variables (here Slurm's job id) the root tells the jobs apart; without
// any, the rank number that joins twice does (job A's rank 0, then job B's).
struct TwoJobsCase {
  const char* name;
  bool launcherVars;
  std::vector<std::pair<int, int>> order;  // (job, rank) in the order they start
};

void runTwoJobsWithOneId(const TwoJobsCase& c) {
  SCOPED_TRACE(c.name);
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  zptest::Shared<std::atomic<int>> mixed, failedClearly, formed;
  std::vector<pid_t> pids;
  for (size_t i = 0; i < c.order.size(); i++) {
    if (i == 2) usleep(500 * 1000);  // the first two are at the root by now
    const int job = c.order[i].first, rank = c.order[i].second;
    zptest::waitForQuietThreads();
    fflush(stdout);  // not printed again by the child
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
      zptest::clearLauncherEnv();
      unsetenv("ZP_JOB_ID");
      if (c.launcherVars) setenv("SLURM_JOB_ID", job == 0 ? "1001" : "1002", 1);
      zpComm_t comm = nullptr;
      zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
      cfg.timeoutMs = 5000;
      if (zpCommInitRankConfig(&comm, 2, id, rank, &cfg) == zpSuccess) {
        ++*formed;
        int32_t mine = job, all[2] = {-1, -1};
        ZP_EXPECT_OK(zpAllGather(&mine, all, 1, zpInt32, comm, nullptr));
        if (all[0] != all[1]) {
          ++*mixed;
          printf("job %d rank %d: a communicator of jobs %d and %d\n", job, rank, all[0], all[1]);
        }
        zpCommDestroy(comm);
      } else {
        const std::string msg = zpGetLastError(nullptr);
        printf("job %d rank %d: %s\n", job, rank, msg.c_str());
        if (msg.find("two jobs use one unique id") != std::string::npos) ++*failedClearly;
      }
      fflush(stdout);
      _exit(0);
    }
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  const auto start = std::chrono::steady_clock::now();
  for (pid_t p : pids) waitpid(p, nullptr, 0);
  EXPECT_EQ(mixed->load(), 0) << "ranks of both jobs made one communicator";
  EXPECT_EQ(failedClearly->load(), 4) << "every rank of both jobs must fail saying why (" << formed->load()
                                      << " made a communicator)";
  EXPECT_LT(zptest::secondsSince(start), 4.5) << "a rank waited for its timeout";
}

TEST(Bootstrap, OneIdForTwoJobsFailsEveryRankOfBothInsteadOfMixingThem) {
  runTwoJobsWithOneId({"each job with its launcher's job id", true, {{0, 0}, {1, 1}, {0, 1}, {1, 0}}});
  runTwoJobsWithOneId({"without a launcher", false, {{0, 0}, {1, 0}, {0, 1}, {1, 1}}});
}

}  // namespace
