#include "transport/shm/spin_plan.h"

namespace zp {

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
  // Tasks wait for a core, but no more than this node's own ranks account
  // for (ranks outnumber cores and little else runs): the tasks that must
  // answer are among those waiting, each poll yields to them, and a poller
  // runs again after a task switch. Sleeping instead costs a wake-up per
  // message (docs/benchmarks.md: 4 ranks on 2 cores).
  if (oversubscribed && in.runnable - in.localRanks < in.cores) return {in.spinUs, true};
  // Tasks wait for a core. A poller stays on the run queue and takes its
  // share of the cores from them (the peers whose answer it waits for among
  // them), and a yield hands its core to any of them for a whole time slice
  // while the answer waits. A sleeper uses no core, and is run soon after its
  // doorbell rings (a woken task goes ahead of ones that kept running). So
  // it polls ZP_SHM_SPIN_BUSY_US, or as long as this rank's recent waits
  // took (twice their running mean) where that is up to kBusySpinScale
  // times as long: a peer answering from another core right now, or just
  // woken, is then caught without a sleep and a wake-up, while longer waits
  // (a relay's chunks, a peer that is not running) get the short poll.
  // Measured: docs/reliability.md, "Under a busy CPU".
  const uint64_t recent = 2 * in.recentWaitUs, most = (uint64_t)kBusySpinScale * in.spinBusyUs;
  return {recent > (uint64_t)in.spinBusyUs && recent <= most ? (int)recent : in.spinBusyUs, false};
}

}  // namespace zp
