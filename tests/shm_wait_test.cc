// How a rank waits for its local peers when the machine's cores are all
// taken: with other tasks filling the cores it never polls for
// ZP_SHM_SPIN_US, and polls briefly only while its peers are on other CPUs,
// so that it takes no core from the tasks that have work (its peers among
// them); the plan it follows in each regime (transport/shm/spin_plan.h).
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "tests/harness.h"
#include "transport/shm/shm_transport.h"
#include "transport/shm/spin_plan.h"

namespace {

// Seconds this thread has been runnable: on a core, or waiting in the run
// queue for one (/proc/thread-self/schedstat's first two fields); -1 if the
// kernel does not say. A poller is runnable all the time it waits, whatever
// share of the cores it gets; a sleeper is not.
double threadRunnableSeconds() {
  unsigned long long onCpu = 0, queued = 0;
  FILE* f = fopen("/proc/thread-self/schedstat", "r");
  if (!f) return -1;
  const int n = fscanf(f, "%llu %llu", &onCpu, &queued);
  fclose(f);
  return n == 2 ? (onCpu + queued) * 1e-9 : -1;
}

// Busy processes, two more than the cores, for the life of this object.
struct Hogs {
  std::vector<pid_t> pids;
  Hogs() {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < cores + 2; i++) {
      pid_t pid = fork();
      if (pid == 0)
        for (volatile unsigned long n = 0;; n++) {
        }
      pids.push_back(pid);
    }
  }
  ~Hogs() {
    for (pid_t p : pids) kill(p, SIGKILL);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
  }
};

// The first two CPUs this process may run on (fewer if it may run on fewer).
std::vector<int> twoAllowedCpus() {
  cpu_set_t allowed;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return cpus;
  for (int i = 0; i < CPU_SETSIZE && cpus.size() < 2; i++)
    if (CPU_ISSET(i, &allowed)) cpus.push_back(i);
  return cpus;
}

// Binds the calling process to one CPU.
void bindTo(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
}

// A waiting rank polls for up to 10 s while a core is free (ZP_SHM_SPIN_US);
// with every core taken it must sleep at once (ZP_SHM_SPIN_BUSY_US=0): in
// 0.4 s of waiting for a peer it is then runnable only after each of its
// timed wake-ups (every 100 ms), queued behind the loops, where a poller
// would be runnable (on a core or queued for one, taking its share of the
// cores from the others) for all 0.4 s. The limit is half of that: with
// another test's ranks beside the loops (ctest -j2) a sleeper's queueing
// after its wake-ups came to 0.108 s.
TEST(ShmWait, WithEveryCoreTakenAWaiterSleepsInsteadOfPolling) {
  Hogs hogs;
  usleep(100 * 1000);  // the hogs are running
  auto exits = zptest::runRanks(2, [](int rank, int nranks, const zpUniqueId& id) {
    setenv("ZP_SHM_SPIN_US", "10000000", 1);
    setenv("ZP_SHM_SPIN_BUSY_US", "0", 1);
    zpComm_t comm;
    ASSERT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpSuccess);
    ASSERT_EQ(zpBarrier(comm, nullptr), zpSuccess);
    uint64_t word = 42;
    if (rank == 1) {
      usleep(400 * 1000);
      ASSERT_EQ(zpSend(&word, 1, zpUint64, 0, comm, nullptr), zpSuccess);
    } else {
      word = 0;
      const double before = threadRunnableSeconds();
      if (before < 0) {
        printf("SKIP: /proc/thread-self/schedstat cannot be read\n");
        return;
      }
      ASSERT_EQ(zpRecv(&word, 1, zpUint64, 1, comm, nullptr), zpSuccess);
      const double runnable = threadRunnableSeconds() - before;
      EXPECT_EQ(word, 42u);
      EXPECT_LT(runnable, 0.2) << "rank 0 was runnable for " << runnable
                               << " s of the 0.4 s it waited for rank 1 with every core taken";
    }
    ASSERT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

// The node's cores are what its ranks' CPU masks cover together, not one
// rank's own mask: a launcher that binds each rank to a core of its own
// (Slurm's --cpu-bind, mpirun's binding) must not make 2 ranks on 2 cores
// look like 2 ranks on 1 (every poll then yielded). Ranks bound to one
// shared core are more ranks than cores.
TEST(ShmWait, RanksBoundToACoreEachCountTheCoresOfTheirMasksTogether) {
  uint64_t a[zp::kCpuMaskWords] = {1}, b[zp::kCpuMaskWords] = {2}, high[zp::kCpuMaskWords] = {};
  high[3] = 1ull << 63;  // CPU 255
  const uint64_t* ab[] = {a, b};
  const uint64_t* aa[] = {a, a};
  const uint64_t* abHigh[] = {a, b, high};
  EXPECT_EQ(zp::coresOfMasks(ab, 2), 2);
  EXPECT_EQ(zp::coresOfMasks(aa, 2), 1);
  EXPECT_EQ(zp::coresOfMasks(abHigh, 3), 3);
  const std::vector<int> cpus = twoAllowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "this process may run on one CPU only";
  for (bool shareOne : {false, true}) {
    auto exits = zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
      bindTo(cpus[shareOne ? 0 : rank]);
      zpComm_t comm;
      ASSERT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpSuccess);
      EXPECT_EQ(zp::ShmTransport::nodeCoresCounted(), shareOne ? 1 : 2)
          << (shareOne ? "both ranks bound to CPU " : "each rank bound to a CPU of its own, CPUs ") << cpus[0]
          << (shareOne ? "" : " and " + std::to_string(cpus[1]));
      uint64_t word = rank == 0 ? 42 : 0;
      if (rank == 0)
        ASSERT_EQ(zpSend(&word, 1, zpUint64, 1, comm, nullptr), zpSuccess);
      else
        ASSERT_EQ(zpRecv(&word, 1, zpUint64, 0, comm, nullptr), zpSuccess);
      EXPECT_EQ(word, 42u);
      ASSERT_EQ(zpCommDestroy(comm), zpSuccess);
    });
    zptest::expectAllOk(exits);
  }
}

// The plan a waiter follows, on the inputs it reads. 4 ranks on 2 cores
// with nothing else running is the normal state of a small test or a
// laptop: the tasks waiting for a core are the node's own ranks, so a
// waiter polls (yielding to them) instead of sleeping and paying a wake-up
// per message. With two busy processes per core beside them it sleeps at
// once (the next test says why).
TEST(ShmWait, AWaiterPollsWhileOnlyItsOwnRanksWaitForACore) {
  zp::SpinInputs in;
  in.cores = 2;
  in.localRanks = 4;
  in.spinUs = 1000;
  in.spinBusyUs = 50;
  for (int runnable : {2, 4, 5}) {
    in.runnable = runnable;
    const zp::SpinPlan plan = zp::planSpin(in);
    EXPECT_EQ(plan.us, 1000) << runnable << " runnable";
    EXPECT_TRUE(plan.yield) << runnable << " runnable";
  }
  in.runnable = 8;  // the 4 ranks and 4 busy loops
  EXPECT_EQ(zp::planSpin(in).us, 0);
  EXPECT_FALSE(zp::planSpin(in).yield);
  // 2 ranks, 2 cores, 4 busy loops: tasks that are not this node's wait too.
  in.localRanks = 2;
  in.runnable = 6;
  EXPECT_EQ(zp::planSpin(in).us, 0);
  // Every runnable task has a core: a long poll that does not yield.
  in.runnable = 2;
  EXPECT_EQ(zp::planSpin(in).us, 1000);
  EXPECT_FALSE(zp::planSpin(in).yield);
}

// With at least one task per core that is not one of the node's ranks (two
// busy loops per core), a waiter with a peer on its CPU (loadedPolls false)
// sleeps at once, however long its recent
// waits were, and whether its peers are runnable or asleep on their
// doorbells: a sleeping rank is not in the machine's runnable count, so the
// node's sleeping ranks are taken off the ranks before the rest of the
// count is taken for other tasks. With fewer other tasks than cores, the
// polls are what they were.
TEST(ShmWait, AWaiterAmongOtherTasksFillingTheCoresSleepsAtOnce) {
  zp::SpinInputs in;
  in.cores = 2;
  in.spinUs = 1000;
  in.spinBusyUs = 50;
  in.recentWaitUs = 300;  // a poll of 600 us where recent waits are followed
  for (int ranks : {2, 4, 8})
    for (int loops : {2, 4})
      for (int asleep = 0; asleep < ranks; asleep++) {
        in.localRanks = ranks;
        in.localAsleep = asleep;
        in.runnable = loops + ranks - asleep;
        EXPECT_TRUE(zp::othersFillTheCores(in)) << ranks << " ranks, " << asleep << " asleep, " << loops << " loops";
        EXPECT_EQ(zp::planSpin(in).us, 0) << ranks << " ranks, " << asleep << " asleep, " << loops << " loops";
      }
  // One other task on 2 cores: 2 ranks follow their recent waits, 4 poll
  // and yield, asleep or not.
  in.localRanks = 2;
  in.localAsleep = 1;
  in.runnable = 2;
  EXPECT_EQ(zp::planSpin(in).us, 1000);  // every runnable task has a core
  in.localAsleep = 0;
  in.runnable = 3;
  EXPECT_FALSE(zp::othersFillTheCores(in));
  EXPECT_EQ(zp::planSpin(in).us, 600);
  in.localRanks = 4;
  in.localAsleep = 2;
  in.runnable = 3;
  EXPECT_EQ(zp::planSpin(in).us, 1000);
  EXPECT_TRUE(zp::planSpin(in).yield);
}

// The runnable count is read at an instant: a task that runs for a moment
// (a kernel worker, a shell) must not make a node's own polling ranks look
// crowded by others, so planSpin goes by the quieter of the last two
// readings; load that lasts is in both.
TEST(ShmWait, ARunnableSpikeInOneReadingIsNotOthersFillingTheCores) {
  zp::SpinInputs in;
  in.cores = 2;
  in.localRanks = 4;  // 4 ranks on 2 cores, polling and yielding
  const zp::LoadReading quiet{4, 0}, spike{6, 0}, loaded{8, 0}, loadedOneAsleep{7, 1};
  auto fill = [&in](const zp::LoadReading& r) {
    zp::SpinInputs at = in;
    at.runnable = r.runnable;
    at.localAsleep = r.asleep;
    return zp::othersFillTheCores(at);
  };
  ASSERT_TRUE(fill(spike));  // the spike alone would make the ranks sleep at once
  EXPECT_FALSE(fill(zp::steadierReading(in, quiet, spike)));
  EXPECT_FALSE(fill(zp::steadierReading(in, spike, quiet)));
  EXPECT_TRUE(fill(zp::steadierReading(in, loaded, spike)));
  EXPECT_TRUE(fill(zp::steadierReading(in, loaded, loadedOneAsleep)));
  // A rank asleep is not runnable: 7 runnable with one of the ranks asleep
  // are one other task more than 7 with every rank awake.
  EXPECT_EQ(zp::steadierReading(in, loadedOneAsleep, zp::LoadReading{7, 0}).asleep, 0);
  EXPECT_EQ(zp::steadierReading(in, zp::LoadReading{7, 0}, loadedOneAsleep).asleep, 0);
  // Nothing to compare with (the first reading, or an unreadable one).
  EXPECT_EQ(zp::steadierReading(in, zp::LoadReading{}, spike).runnable, 6);
  EXPECT_EQ(zp::steadierReading(in, quiet, zp::LoadReading{}).runnable, -1);
}

// Where other tasks fill the cores, a waiter whose peers are on other CPUs
// polls kBusySpinScale x ZP_SHM_SPIN_BUSY_US without yielding; one whose
// peer is on its CPU does not poll.
TEST(ShmWait, WithOtherTasksFillingTheCoresTheChoiceIsAShortPollOrNone) {
  zp::SpinInputs in;
  in.cores = 2;
  in.localRanks = 2;
  in.runnable = 6;  // 2 ranks, 4 busy loops
  in.spinUs = 1000;
  in.spinBusyUs = 50;
  in.recentWaitUs = 300;
  EXPECT_EQ(zp::planSpin(in).us, 0);  // a peer on its CPU
  in.loadedPolls = true;              // its peers on other CPUs
  EXPECT_EQ(zp::planSpin(in).us, zp::kBusySpinScale * 50);
  EXPECT_FALSE(zp::planSpin(in).yield);
  in.runnable = 2;  // a core each: the plan of every runnable task on a core
  EXPECT_EQ(zp::planSpin(in).us, 1000);
  // Ranks outnumbering the cores (4 on 2, or an emulated cluster's 8):
  // a poller would take the core from a peer with work, so it sleeps.
  in.runnable = 8;
  in.localRanks = 4;
  EXPECT_EQ(zp::planSpin(in).us, 0);
  in.localRanks = 2;
  in.hostRanks = 8;
  in.runnable = 12;
  EXPECT_EQ(zp::planSpin(in).us, 0);
}

// zprun's emulated cluster runs every node's ranks on this machine's cores:
// 2 nodes of 4 ranks on 2 cores with little else running are the job's own
// tasks waiting for a core, and a waiter polls (yielding) as it does for 4
// ranks on one node, instead of taking the other node's ranks for other load
// (ZP_HOST_RANKS). With busy loops beside them, the loops fill the cores.
TEST(ShmWait, TheOtherEmulatedNodesRanksAreTheJobsOwnTasks) {
  zp::SpinInputs in;
  in.cores = 2;
  in.localRanks = 4;
  in.spinUs = 1000;
  in.spinBusyUs = 50;
  in.runnable = 8;
  EXPECT_EQ(zp::planSpin(in).us, 0) << "without ZP_HOST_RANKS the other node's ranks are other tasks";
  in.hostRanks = 8;
  EXPECT_FALSE(zp::othersFillTheCores(in));
  EXPECT_EQ(zp::planSpin(in).us, 1000);
  EXPECT_TRUE(zp::planSpin(in).yield);
  in.runnable = 12;  // and four busy loops
  EXPECT_TRUE(zp::othersFillTheCores(in));
  EXPECT_EQ(zp::planSpin(in).us, 0);
  // Three of this node's four ranks asleep, one awake, and four busy loops:
  // the other node's ranks, not seen, are taken to sleep alike (one awake),
  // so the loops are other load. Counted all runnable, they hid the loops,
  // and the waiter polled for ZP_SHM_SPIN_US, yielding, among them.
  in.localAsleep = 3;
  in.runnable = 6;
  EXPECT_TRUE(zp::othersFillTheCores(in));
  EXPECT_EQ(zp::planSpin(in).us, 0);
}

// Beside busy loops filling the cores, a message needs both ranks on a core
// at once: a waiter polls while its peer last waited on another CPU (it may
// be running there) and sleeps at once when the peer is on its own CPU
// (polling would only keep the peer off the core). Two ranks bound to CPUs
// of their own never sleep for a peer on their CPU; bound to one CPU
// together after init (so that the node still counts two cores and may
// poll), they do.
// Where ranks outnumber cores and only they want the cores, a small
// message's receive polls in shared memory's shortcut (moveNow), yielding
// the core at each poll, rather than through the executor's general wait:
// the peer that must answer may be waiting for this core, and the general
// path's passes cost a rank's share of the cores each call. Two ranks bound
// to one CPU exchange 8 bytes 300 times; each exchange has one rank whose
// record was not there at once: it takes the peer's record after yielding,
// unless the wait plan says other tasks fill the cores (ctest -j2 beside
// it), where the shortcut leaves the receive to the general wait.
TEST(ShmWait, RanksOutnumberingTheCoresPollForSmallMessagesInTheShortcutYielding) {
  const std::vector<int> cpus = twoAllowedCpus();
  ASSERT_FALSE(cpus.empty());
  auto exits = zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    bindTo(cpus[0]);
    zpComm_t comm;
    ASSERT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpSuccess);
    ASSERT_EQ(zp::ShmTransport::nodeCoresCounted(), 1);
    const long taken = zp::ShmTransport::receivesTakenYielding();
    const long declined = zp::ShmTransport::yieldingPollsDeclined();
    const int kCalls = 300;
    for (int i = 0; i < kCalls; i++) {
      uint64_t out = 1000 * uint64_t(i) + uint64_t(rank), in = ~uint64_t(0);
      ASSERT_EQ(zpGroupStart(), zpSuccess);
      ASSERT_EQ(zpSend(&out, 1, zpUint64, 1 - rank, comm, nullptr), zpSuccess);
      ASSERT_EQ(zpRecv(&in, 1, zpUint64, 1 - rank, comm, nullptr), zpSuccess);
      ASSERT_EQ(zpGroupEnd(), zpSuccess);
      ASSERT_EQ(in, 1000 * uint64_t(i) + uint64_t(1 - rank));
    }
    uint64_t counts[2] = {uint64_t(zp::ShmTransport::receivesTakenYielding() - taken),
                          uint64_t(zp::ShmTransport::yieldingPollsDeclined() - declined)};
    ASSERT_EQ(zpAllReduce(counts, counts, 2, zpUint64, zpSum, comm, nullptr), zpSuccess);
    EXPECT_GE(counts[0] + counts[1], uint64_t(kCalls / 2))
        << counts[0] << " receives taken after yielding, " << counts[1] << " left to the general wait by its plan";
    ASSERT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

TEST(ShmWait, AmongBusyLoopsAWaiterSleepsAtOnceOnlyForAPeerOnItsOwnCpu) {
  const std::vector<int> cpus = twoAllowedCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "this process may run on one CPU only";
  Hogs hogs;
  usleep(100 * 1000);  // the hogs are running
  auto exits = zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    bindTo(cpus[rank]);
    zpComm_t comm;
    ASSERT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpSuccess);
    auto exchange = [&](int calls) {
      for (int i = 0; i < calls; i++) {
        uint64_t out = (uint64_t)rank << 32 | (uint64_t)i, in = 0;
        ASSERT_EQ(zpGroupStart(), zpSuccess);
        ASSERT_EQ(zpSend(&out, 1, zpUint64, 1 - rank, comm, nullptr), zpSuccess);
        ASSERT_EQ(zpRecv(&in, 1, zpUint64, 1 - rank, comm, nullptr), zpSuccess);
        ASSERT_EQ(zpGroupEnd(), zpSuccess);
        ASSERT_EQ(in, (uint64_t)(1 - rank) << 32 | (uint64_t)i);
      }
    };
    exchange(3000);
    EXPECT_EQ(zp::ShmTransport::sleepsForAPeerOnTheCore(), 0) << "rank " << rank << " on CPU " << cpus[rank]
                                                              << ", its peer on CPU " << cpus[1 - rank];
    ASSERT_EQ(zpBarrier(comm, nullptr), zpSuccess);
    bindTo(cpus[0]);
    ASSERT_EQ(zpBarrier(comm, nullptr), zpSuccess);
    exchange(3000);
    EXPECT_GT(zp::ShmTransport::sleepsForAPeerOnTheCore(), 0) << "rank " << rank << ", both on CPU " << cpus[0];
    ASSERT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

// The same on a real node: rank 0 waits 0.4 s for rank 3 while two of its
// peers sleep on their doorbells and busy loops hold the cores. Counting
// those sleeping peers as runnable put the machine's count near the node's
// ranks, and rank 0 then polled, yielding, for its whole ZP_SHM_SPIN_US
// (runnable for all 0.4 s: on a core, or queued for one behind the loops).
TEST(ShmWait, AWaiterAmongBusyLoopsSleepsWhileItsPeersSleep) {
  Hogs hogs;
  usleep(100 * 1000);  // the hogs are running
  auto exits = zptest::runRanks(4, [](int rank, int nranks, const zpUniqueId& id) {
    setenv("ZP_SHM_SPIN_US", "10000000", 1);
    zpComm_t comm;
    ASSERT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpSuccess);
    ASSERT_EQ(zpBarrier(comm, nullptr), zpSuccess);
    uint64_t word = 0;
    if (rank == 3) {
      usleep(400 * 1000);
      word = 42;
      for (int peer = 0; peer < 3; peer++) ASSERT_EQ(zpSend(&word, 1, zpUint64, peer, comm, nullptr), zpSuccess);
    } else if (rank != 0) {
      ASSERT_EQ(zpRecv(&word, 1, zpUint64, 3, comm, nullptr), zpSuccess);
      EXPECT_EQ(word, 42u);
    } else {
      usleep(50 * 1000);  // ranks 1 and 2 wait (asleep) by now
      const double before = threadRunnableSeconds();
      ASSERT_EQ(zpRecv(&word, 1, zpUint64, 3, comm, nullptr), zpSuccess);
      const double runnable = threadRunnableSeconds() - before;
      EXPECT_EQ(word, 42u);
      if (before < 0)
        printf("SKIP: /proc/thread-self/schedstat cannot be read\n");
      else
        EXPECT_LT(runnable, 0.1) << "rank 0 was runnable for " << runnable
                                 << " s of the 0.35 s it waited for rank 3 among busy loops";
    }
    ASSERT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

}  // namespace
