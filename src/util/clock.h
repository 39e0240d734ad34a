// The one clock of the library: a monotonic time in milliseconds (and in
// microseconds, for short spins), for timeouts, deadlines and "how long
// since". Its own header, so that code that needs a clock does not include
// the bootstrap's sockets for it.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace zp {

inline uint64_t nowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// The same in microseconds, for spins of a few microseconds.
inline uint64_t nowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

// And in nanoseconds (stampUs measures its rate with it).
inline uint64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000 + (uint64_t)ts.tv_nsec;
}

// Time stamps for the hot path, in microseconds: the wait statistics stamp
// each call's entry and each message's arrival, and clock_gettime was a
// tenth of a 2-rank small send/recv. Where the kernel keeps its own time
// with the CPU's time-stamp counter (clocksource "tsc": a constant rate, in
// step across cores), the counter scaled by a rate measured once per
// process (about 8 ns a read here against 19); else nowUs(). Only
// differences of stampUs() values mean anything: never mix them with
// nowUs()'s.
namespace detail {
struct StampClock {
  std::atomic<int> state{0};  // 0: not set up yet; 1: the counter; 2: nowUs()
  uint64_t tsc0 = 0, us0 = 0;
  uint64_t usPerTick32 = 0;  // microseconds per tick, times 2^32
};
extern StampClock gStampClock;
uint64_t stampUsSlow();  // sets the clock up on first use (a 2 ms measurement)
}  // namespace detail

inline uint64_t stampUs() {
#if defined(__x86_64__)
  const detail::StampClock& c = detail::gStampClock;
  if (c.state.load(std::memory_order_acquire) == 1)
    return c.us0 + (uint64_t)(((unsigned __int128)(__rdtsc() - c.tsc0) * c.usPerTick32) >> 32);
#endif
  return detail::stampUsSlow();
}

}  // namespace zp
