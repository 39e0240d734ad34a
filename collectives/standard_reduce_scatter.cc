// Reduce-scatter(v) on host buffers, on one node or flat: the ring or
// direct exchange (the hierarchical one across nodes: standard_nodes.cc).
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {
namespace detail {

// ---- Reduce-scatter over blocks b: src the whole input in the work type, out this rank's block ----
zpResult_t Call::reduceScatter(const char* src, char* out, const Blocks& b) {
  const Family f = family(b.total * wts / n);
  std::vector<int> local, rail;
  std::vector<std::vector<int>> grid;
  if (f == Family::kRing && nodeGrid(&local, &rail, &grid)) return reduceScatterNodes(src, out, b, local, rail, grid);
  return reduceScatter(src, out, b, f);
}
zpResult_t Call::reduceScatter(const char* src, char* out, const Blocks& b, Family f) {
  const size_t mine = b.cnt[me] * wts;
  if (n == 1) {
    if (src != out && mine) memmove(out, src, mine);
    return zpSuccess;
  }
  if (f == Family::kRing) {
    // Partials alternate between two scratch blocks; the last round (it
    // brings this rank's own block) reduces into out.
    char* acc[2] = {scratch(kScratchAcc0, b.maxCnt * wts), scratch(kScratchAcc1, b.maxCnt * wts)};
    return ringReduceScatter(src, b, -1, [&](int s, int) { return s == n - 2 ? out : acc[s % 2]; });
  }
  char* in = scratch(kScratchAcc0, mine * n);
  const bool grouped = reduceScatterDirectRound(src, b, in, out);
  ZP_CHECK(step.run(3000));
  reduceScatterDirectFinish(src, out, b, in, grouped);
  return zpSuccess;
}
// Direct: every rank sends each block to its owner (added to the step, not
// run), which reduces the others' into out: where the transport can, as
// one reduce group read from the senders' memory (nothing in between;
// returns true), else received into `in` (b.cnt[me] * n elements)...
bool Call::reduceScatterDirectRound(const char* src, const Blocks& b, char* in, char* out) {
  const size_t mine = b.cnt[me] * wts;
  std::vector<int> from;
  for (int i = 1; i < n; i++) from.push_back(mod(me - i, n));
  const OpReduceGroup* g = nullptr;
  if (step.canGroup(from, mine))  // the same order as reduceScatterDirectFinish's: the same bits
    g = &groups.emplace_back(OpReduceGroup{out, src + b.off[me] * wts, mine,
                                           &kReducers[(size_t)wt * zpNumOps + (size_t)a.op], n - 1});
  for (int i = 1; i < n; i++) {
    const int to = mod(me + i, n), f = from[i - 1];
    step.sendToReduce(to, src + b.off[to] * wts, b.cnt[to] * wts, wts);
    if (g)
      step.recvInGroup(f, g, f < me ? f : f - 1, wts);
    else
      step.recv(f, in + mine * f, mine, wts);
  }
  return g != nullptr;
}
// ...and, once the round has run, reduces the n it has in one pass: its
// own first (so that in place, where out is its own block, each element is
// read before it is written), then the others' in rank order (a fixed
// order, the same bits on every run). Nothing if the round was a group.
void Call::reduceScatterDirectFinish(const char* src, char* out, const Blocks& b, const char* in, bool grouped) {
  const size_t mine = b.cnt[me] * wts;
  if (!mine || grouped) return;
  if (n == 1) {
    if (src != out) memmove(out, src + b.off[me] * wts, mine);
    return;
  }
  std::vector<const char*> blocks(1, src + b.off[me] * wts);
  for (int r = 0; r < n; r++)
    if (r != me) blocks.push_back(in + mine * r);
  reduceMany(out, blocks, b.cnt[me], wt, a.op);
}

}  // namespace detail
}  // namespace zp
