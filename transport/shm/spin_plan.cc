#include "transport/shm/spin_plan.h"

namespace zp {

bool othersFillTheCores(const SpinInputs& in) {
  return in.runnable > in.cores && in.runnable - (in.localRanks - in.localAsleep) >= in.cores;
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
  // At least one task per core that is not one of this node's ranks wants
  // a core (two busy loops per core beside the ranks, a build, a data
  // loader): sleep at once. A peer that is not on a core waits behind those
  // tasks; a poller stays on the run queue and takes its turn from them and
  // from that peer, a yielding one gets the core back only after them, a
  // time slice later, while a sleeper is woken by the answer and run ahead
  // of the tasks that kept running. Short polls first (5 or 20 us without
  // yielding, 50 us yielding) were slower than none both with the busy
  // loops and beside other agents' builds. The node's ranks asleep on their
  // doorbells are not runnable, so they are taken off the node's count
  // here: otherwise a node whose ranks mostly sleep would count the other
  // tasks short and poll among them. Measured: docs/reliability.md, "Under
  // a busy CPU".
  if (othersFillTheCores(in)) return {0, false};
  // Tasks wait for a core, most of them this node's ranks (ranks outnumber
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
