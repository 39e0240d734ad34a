// The one clock of the library: a monotonic time in milliseconds, for
// timeouts, deadlines and "how long since". Its own header, so that code
// that needs a clock does not include the bootstrap's sockets for it.
#pragma once

#include <time.h>

#include <cstdint>

namespace zp {

inline uint64_t nowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace zp
