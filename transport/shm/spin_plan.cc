#include "transport/shm/spin_plan.h"

namespace zp {

namespace {

// The job's ranks on this machine that are not asleep on a doorbell: this
// node's, seen, and under zprun's emulated cluster the other nodes' too,
// which share the cores. Whether those sleep is not seen from here: they
// are taken to sleep in the same share as this node's. (Counting them all
// as runnable, a node whose own ranks slept took busy loops for the other
// node's ranks and polled, yielding, among them: the routed pair fell from
// 3.9x to 1.4x routing off under four busy loops.)
int jobRanksAwake(const SpinInputs& in) {
  const int awake = in.localRanks - in.localAsleep;
  if (in.hostRanks <= in.localRanks) return awake;
  return awake + (in.hostRanks - in.localRanks) * awake / in.localRanks;
}

}  // namespace

int coresOfMasks(const uint64_t* const* masks, int n) {
  int cores = 0;
  for (int w = 0; w < kCpuMaskWords; w++) {
    uint64_t any = 0;
    for (int i = 0; i < n; i++) any |= masks[i][w];
    cores += __builtin_popcountll(any);
  }
  return cores;
}

bool othersFillTheCores(const SpinInputs& in) {
  return in.runnable > in.cores && in.runnable - jobRanksAwake(in) >= in.cores;
}

bool mayPollAmongOthers(const SpinInputs& in) { return in.localRanks <= in.cores && in.hostRanks <= in.cores; }

LoadReading steadierReading(const SpinInputs& in, const LoadReading& last, const LoadReading& now) {
  if (last.runnable < 0 || now.runnable < 0) return now;
  auto others = [&in](const LoadReading& r) {
    SpinInputs at = in;
    at.runnable = r.runnable;
    at.localAsleep = r.asleep;
    return r.runnable - jobRanksAwake(at);
  };
  return others(last) < others(now) ? last : now;
}

SpinPlan planSpin(const SpinInputs& in) {
  const bool oversubscribed = in.localRanks > in.cores;
  // When it cannot tell, as before the load was looked at: polls, yielding
  // the core where ranks outnumber cores (but sleeps at once during a
  // single-copy transfer there, the safe choice).
  if (in.runnable < 0) return {oversubscribed && in.singleCopy ? 0 : in.spinUs, oversubscribed};
  // A single-copy transfer where ranks outnumber cores and more tasks are
  // runnable than the node has ranks: a poller would take its share of the
  // cores from the peer doing the copy, while a sleeper is off the run queue
  // until it is woken. Measured: docs/collectives.md, "Polling or sleeping
  // while a peer copies".
  if (oversubscribed && in.runnable > in.localRanks && in.singleCopy) return {0, false};
  // Every runnable task has a core (this one included): polling takes no
  // one's time, and an answer is seen within a cache line's move. Where
  // ranks outnumber cores a poll still yields, so that a peer that becomes
  // runnable meanwhile gets the core at once.
  if (in.runnable <= in.cores) return {in.spinUs, oversubscribed};
  // At least one task per core that is not one of the job's ranks wants a
  // core (two busy loops per core beside the ranks, a build, a data
  // loader). A message needs both ranks on a core at once: a waiter whose
  // peer last waited on another CPU polls, without yielding, for
  // kBusySpinScale times ZP_SHM_SPIN_BUSY_US (the peer may be running
  // there, and its answer is then seen within a cache line's move), and
  // one whose peer is on its own CPU sleeps at once (polling would only
  // keep the peer off the core it needs). A yielding poll is never right
  // here: a yield hands the core to a busy task for its whole time slice
  // (50 us yielding took 6,237 us per 8-byte ring shift beside four busy
  // loops). The node's ranks asleep on their doorbells are not runnable,
  // so they are taken off the job's ranks here: otherwise a node whose
  // ranks mostly sleep would count the other tasks short. Measured:
  // docs/reliability.md, "Under a busy CPU".
  // Only where the job's ranks on the machine do not outnumber the cores:
  // otherwise a poller takes the core from a peer that has work (on a 2 x
  // 4-rank emulated cluster, relays that polled made the routed pair under
  // four busy loops 1.4-1.6x routing off, against 2.8-3.9x sleeping).
  if (othersFillTheCores(in))
    return {in.loadedPolls && mayPollAmongOthers(in) ? kBusySpinScale * in.spinBusyUs : 0, false};
  // Tasks wait for a core, most of them the job's ranks (ranks outnumber
  // cores and little else runs): the tasks that must answer are among
  // those waiting, each poll yields to them, and a poller runs again after
  // a task switch. Sleeping instead costs a wake-up per message
  // (docs/benchmarks.md: 4 ranks on 2 cores).
  if (oversubscribed) return {in.spinUs, true};
  // A core for every rank, and fewer other tasks than cores: a rank shares
  // its core now and then. It polls ZP_SHM_SPIN_BUSY_US, or as long as
  // this rank's recent waits took (twice their running mean) where that is
  // up to kBusySpinScale times as long: a peer answering from another core
  // right now, or just woken, is then caught without a sleep and a wake-up,
  // while longer waits (a relay's chunks, a peer that is not running) get
  // the short poll.
  const uint64_t recent = 2 * in.recentWaitUs, most = (uint64_t)kBusySpinScale * in.spinBusyUs;
  return {recent > (uint64_t)in.spinBusyUs && recent <= most ? (int)recent : in.spinBusyUs, false};
}

}  // namespace zp
