// The one clock of the library: a monotonic time in milliseconds (and in
// microseconds, for short spins), for timeouts, deadlines and "how long
// since". Its own header, so that code that needs a clock does not include
// the bootstrap's sockets for it.
#pragma once

#include <time.h>

#include <cstdint>

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

}  // namespace zp
