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
  int localAsleep = 0;     // of them, those asleep on their doorbells when runnable was read
  bool singleCopy = false;  // this rank waits for a single-copy transfer
  int spinUs = 0;          // ZP_SHM_SPIN_US
  int spinBusyUs = 0;      // ZP_SHM_SPIN_BUSY_US
  uint64_t recentWaitUs = 0;  // this rank's recent waits' running mean
};

struct SpinPlan {
  int us;      // poll this long, then sleep
  bool yield;  // yield the core at each poll
};

// While a few tasks wait for a core, a poll may follow the recent waits up
// to this many times ZP_SHM_SPIN_BUSY_US.
constexpr int kBusySpinScale = 16;

SpinPlan planSpin(const SpinInputs& in);

// Whether at least one runnable task per core is not one of this node's
// ranks: planSpin's heavy load, where a waiter sleeps at once.
bool othersFillTheCores(const SpinInputs& in);

}  // namespace zp
