// Reduce on host buffers: a binomial tree toward the root, or
// reduce-scatter then every block to the root.
#include <cstring>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {
namespace detail {

// ---- Reduce: src count elements of the work type; out (the root's) as many ----
zpResult_t Call::reduce(const char* src, char* out, size_t count) {
  const int root = a.root;
  const size_t bytes = count * wts;
  if (n == 1) {
    if (out != src) memmove(out, src, bytes);
    return zpSuccess;
  }
  if (family(bytes) != Family::kLatency) {
    // Reduce-scatter (rank r ends with block r), then every block to the root.
    Blocks b = Blocks::even(count, n);
    char* mine = me == root ? out + b.off[me] * wts : scratch(kScratchMine, b.maxCnt * wts);
    ZP_CHECK(reduceScatter(src, mine, b));
    if (me == root) {
      for (int p = 0; p < n; p++)
        if (p != root && b.cnt[p]) step.recv(p, out + b.off[p] * wts, b.cnt[p] * wts, wts);
    } else if (b.cnt[me]) {
      step.send(root, mine, b.cnt[me] * wts, wts);
    }
    return step.run(kStepGather);
  }
  // Binomial tree toward the root; inner ranks add their children's
  // partials into scratch (the root into out).
  const int vr = mod(me - root, n);
  char* acc = me == root ? out : scratch(kScratchAcc1, bytes);
  const char* cur = src;  // what this rank holds so far
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      step.sendToReduce(mod(vr - mask + root, n), cur, bytes, wts);
      return step.run(6000 + (uint64_t)mask);
    }
    if (vr + mask < n) {
      step.recvReduce(mod(vr + mask + root, n), acc, cur, bytes, wt, a.op);
      ZP_CHECK(step.run(6000 + (uint64_t)mask));
      cur = acc;
    }
  }
  return zpSuccess;
}

}  // namespace detail
}  // namespace zp
