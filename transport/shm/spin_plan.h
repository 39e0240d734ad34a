// How a rank that waits for its local peers polls before it sleeps, decided
// from what it can see of the machine (shm_wait.cc gathers the inputs; the
// reasons are beside each case in spin_plan.cc).
#pragma once

#include <cstdint>

namespace zp {

struct SpinInputs {
  int runnable = -1;       // the machine's runnable tasks, this one included (-1: unknown)
  int cores = 1;           // the cores this process may run on
  int localRanks = 1;      // this node's ranks, this one included
  int hostRanks = 0;       // the job's ranks on this machine (ZP_HOST_RANKS; 0: unknown, this node's)
  int localAsleep = 0;     // of this node's ranks, those asleep on their doorbells when runnable was read
  bool singleCopy = false;  // this rank waits for a single-copy transfer
  int spinUs = 0;          // ZP_SHM_SPIN_US
  int spinBusyUs = 0;      // ZP_SHM_SPIN_BUSY_US
  uint64_t recentWaitUs = 0;  // this rank's recent waits' running mean
  bool loadedPolls = false;   // where other tasks fill the cores: poll first (no peer seen on this rank's CPU)
};

// A CPU affinity mask in 64-bit words (CPU i at bit i % 64 of word i / 64):
// 1,024 CPUs, as glibc's cpu_set_t.
constexpr int kCpuMaskWords = 16;

// The cores a node's ranks may run on together: the CPUs in any of their
// masks. Not one rank's own mask: a launcher that binds each rank to a core
// of its own (Slurm's --cpu-bind, mpirun's binding, numactl) leaves every
// rank a mask of one CPU, and 2 ranks bound to 2 cores are not 2 ranks on
// 1 core (each poll then yielded: 8-byte send/recv 0.50 us against 0.30
// unbound; beside busy loops 100 us against 1-12).
int coresOfMasks(const uint64_t* const* masks, int n);

struct SpinPlan {
  int us;      // poll this long, then sleep
  bool yield;  // yield the core at each poll
};

// While a few tasks wait for a core, a poll may follow the recent waits up
// to this many times ZP_SHM_SPIN_BUSY_US.
constexpr int kBusySpinScale = 16;

SpinPlan planSpin(const SpinInputs& in);

// Whether at least one runnable task per core is not one of the job's
// ranks on this machine: planSpin's heavy load, where a waiter polls only
// while its peers are on other CPUs (SpinInputs::loadedPolls).
bool othersFillTheCores(const SpinInputs& in);
// There, whether a waiter may poll at all: only where neither the node's
// ranks nor the job's ranks on the machine outnumber the cores (planSpin
// says why; moveNow's short poll follows the same rule).
bool mayPollAmongOthers(const SpinInputs& in);

// One look at the machine (ShmTransport::sampleLoad): its runnable tasks
// (-1: unreadable) and this node's ranks asleep on their doorbells then.
struct LoadReading {
  int runnable = -1;
  int asleep = 0;
};

// The reading planSpin goes by, of this rank's last two (taken at least
// 10 ms apart): the one that saw fewer tasks beyond the job's awake ranks.
// The runnable count is an instant's: a kernel worker or a shell that ran
// for a moment made 4 ranks on 2 cores look crowded by others, and every
// wait of the next 10 ms slept at once (a wake-up per message). Load that
// lasts shows in both readings.
LoadReading steadierReading(const SpinInputs& in, const LoadReading& last, const LoadReading& now);

}  // namespace zp
