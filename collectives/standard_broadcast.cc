// Broadcast on host buffers: a binomial tree, direct exchange on one node,
// or scatter then all-gather.
#include <cstring>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {
namespace detail {

// ---- Broadcast ----
zpResult_t Call::broadcast() {
  const size_t bytes = a.count * ts;
  const int root = a.root;
  const char* sb = (const char*)a.send;
  char* rb = (char*)a.recv;
  const Family f = family(bytes / n);
  if (n > 1 && f == Family::kDirect && allLocal()) {
    // One node: every rank takes the whole buffer from the root at once.
    // By single copy each reads it straight from the root's memory, the
    // least any rank can move, in one round, while the root copies nothing.
    if (me == root) {
      for (int p = 0; p < n; p++)
        if (p != root) step.send(p, sb, bytes, ts);
    } else {
      step.recv(root, rb, bytes, ts);
    }
    ZP_CHECK(step.run(5002));
  } else if (n > 1 && f != Family::kLatency) {
    // Scatter from the root, then all-gather (the root takes nothing
    // back): the root sends the buffer once, not n-1 times.
    Blocks b = Blocks::even(a.count, n);
    if (me == root) {
      for (int p = 0; p < n; p++)
        if (p != root) step.send(p, sb + b.off[p] * ts, b.cnt[p] * ts, ts);
    } else {
      step.recv(root, rb + b.off[me] * ts, b.cnt[me] * ts, ts);
    }
    ZP_CHECK(step.run(5000));
    char* buf = me == root ? (char*)sb : rb;
    ZP_CHECK(f == Family::kRing ? ringAllGather(buf, ts, b, 0, nullptr, root)
                                : allGatherDirect(buf, ts, b, nullptr, root));
  } else if (n > 1) {
    // Binomial tree over ranks counted from the root: log2(n) rounds.
    const int vr = mod(me - root, n);
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        step.recv(mod(vr - mask + root, n), rb, bytes, ts);
        ZP_CHECK(step.run(5001));
        break;
      }
      mask <<= 1;
    }
    const char* from = me == root ? sb : rb;
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (vr + mask < n) step.send(mod(vr + mask + root, n), from, bytes, ts);
    ZP_CHECK(step.run(5001));
  }
  if (me == root && sb != rb) memmove(rb, sb, bytes);
  return zpSuccess;
}

}  // namespace detail
}  // namespace zp
