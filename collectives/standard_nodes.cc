// Reduce-scatter(v) and all-gather(v) across nodes, hierarchical: a
// node's round, then a ring over every rail.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {
namespace detail {

// ---- Hierarchical reduce-scatter(v) and all-gather(v) across nodes ----
// (local: my node's ranks, rail: the ranks at my place, grid[m][l]: the
// rank at place l of node m; L ranks per node, N nodes.) Block r of the
// user's buffer is rank r's, wherever its node is.
//
// Reduce-scatter: a direct reduce-scatter inside the node leaves local
// rank l with, for every node m, its node's partial of block grid[m][l]
// (N pieces, packed in node order); then the ranks at place l of every
// node reduce-scatter those N pieces by a ring over the network, so that
// the one on node m ends with piece m, its own block reduced over every
// rank. Every place at once, each over its own NIC (rail-aligned): a
// node sends (N-1)/N of the buffer across nodes, 1/L of it on each rank's
// NIC, where the flat ring sent it all through the one rank whose right
// neighbour is on the next node. Each element is reduced in a fixed order
// (the same bits every run): inside node i, P_i = its owner-place rank's
// own value first, then the node's others in place order
// (reduceScatterDirectFinish); then round the rail ring, ending at the
// owner's node m: P_m op (P_m-1 op (... op (P_m+2 op P_m+1))), node
// indices mod N.
zpResult_t Call::reduceScatterNodes(const char* src, char* out, const Blocks& b, const std::vector<int>& local,
                                    const std::vector<int>& rail, const std::vector<std::vector<int>>& grid) {
  const int L = (int)local.size(), N = (int)rail.size();
  const int place = (int)(std::find(local.begin(), local.end(), me) - local.begin());
  std::vector<size_t> pieceCnt(N);
  for (int m = 0; m < N; m++) pieceCnt[m] = b.cnt[grid[m][place]];
  const Blocks pieces = Blocks::of(pieceCnt.data(), nullptr, N);
  char* part = scratch(kScratchNodePart, pieces.total * wts);
  char* in = scratch(kScratchNodeIn, pieces.total * L * wts);  // piece m's from every local rank
  std::vector<Blocks> nodeBlocks;  // [m]: node m's blocks, block l of the rank at place l
  for (int m = 0; m < N; m++) nodeBlocks.push_back(nodeBlocksOf(b, grid[m]));
  ZP_CHECK(within(local, kStepHier, [&] {
    std::vector<char> grouped(N);  // piece m reduced by a group (reduceScatterDirectRound)
    for (int m = 0; m < N; m++)
      grouped[m] =
          reduceScatterDirectRound(src, nodeBlocks[m], in + pieces.off[m] * L * wts, part + pieces.off[m] * wts);
    ZP_CHECK(step.run(0));
    for (int m = 0; m < N; m++)
      reduceScatterDirectFinish(src, part + pieces.off[m] * wts, nodeBlocks[m], in + pieces.off[m] * L * wts,
                                grouped[m]);
    return zpSuccess;
  }));
  return within(rail, kStepHier, [&] {
    // Partials alternate between two scratch blocks; the last round (it
    // brings this rank's own piece) reduces into out.
    char* acc[2] = {scratch(kScratchAcc0, pieces.maxCnt * wts), scratch(kScratchAcc1, pieces.maxCnt * wts)};
    return railRing(pieces, wts, [&](int s, const Blocks& slice, const std::vector<size_t>& at) {
      ringReduceScatterRound(part, slice, -1, s,
                             [&](int t, int blk) { return (t == n - 2 ? out : acc[t % 2]) + at[blk] * wts; });
    });
  });
}
// All-gather, the mirror: a ring among the ranks at my place of every
// node brings each the blocks of the others at its place (each NIC
// carries (N-1)/N of 1/L of the gathered buffer, rail-aligned), then a
// direct all-gather inside the node, over shared memory, gives every
// local rank those N blocks of every other. No copies: blocks land at
// their place in recvbuff and are sent from there (my own from sendbuff).
zpResult_t Call::allGatherNodes(const char* sendbuff, char* recvbuff, const Blocks& b, const std::vector<int>& local,
                                const std::vector<int>& rail, const std::vector<std::vector<int>>& grid) {
  const int N = (int)rail.size();
  const int node = (int)(std::find(rail.begin(), rail.end(), me) - rail.begin());
  ZP_CHECK(within(rail, kStepHier, [&] {
    return railRing(nodeBlocksOf(b, rail), ts, [&](int s, const Blocks& slice, const std::vector<size_t>& at) {
      ringAllGatherRound(recvbuff, ts, slice, 0, s, sendbuff + at[me] * ts);
    });
  }));
  return within(local, kStepHier, [&] {
    for (int m = 0; m < N; m++)
      allGatherDirectRound(recvbuff, ts, nodeBlocksOf(b, grid[m]), m == node ? sendbuff : nullptr);
    return step.run(0);
  });
}
// The rail ring's n-1 rounds over blocks b (element size es): round(s,
// slice, at) adds round s of the ring over one slice of the blocks (at[p]:
// where block p's slice starts in it). With routing on, every message is
// cut into slices below ZP_ROUTE_DIRECT_BELOW, each on a lane of its own,
// so that they go direct: rail-aligned, every NIC carries its share
// already, and relaying them through other ranks' NICs only adds hops
// (measured: docs/collectives.md). With routing off, one slice.
template <class Round>
zpResult_t Call::railRing(const Blocks& b, size_t es, Round round) {
  const size_t directBelow = routedFrom(c);
  size_t slices = 1;
  if (directBelow > es && b.maxCnt) {
    const size_t perSlice = (directBelow - 1) / es;  // elements of a slice below directBelow
    slices = std::min({(b.maxCnt + perSlice - 1) / perSlice, kMaxSlices, (size_t)(kHierLanes / (n - 1))});
  }
  std::vector<Blocks> cut;  // cut[p]: block p in slices
  for (int p = 0; p < n; p++) cut.push_back(Blocks::even(b.cnt[p], (int)slices));
  std::vector<size_t> cnt(n), off(n), at(n);
  for (int s = 0; s < n - 1; s++) {
    for (size_t j = 0; j < slices; j++) {
      for (int p = 0; p < n; p++) {
        cnt[p] = cut[p].cnt[j];
        at[p] = cut[p].off[j];
        off[p] = b.off[p] + at[p];
      }
      step.lane(s * slices + j);
      round(s, Blocks::of(cnt.data(), off.data(), n), at);
    }
    ZP_CHECK(step.run(1));
  }
  return zpSuccess;
}
// Blocks b of the given ranks, in their order.
Blocks Call::nodeBlocksOf(const Blocks& b, const std::vector<int>& ranks) {
  std::vector<size_t> cnt, off;
  for (int r : ranks) {
    cnt.push_back(b.cnt[r]);
    off.push_back(b.off[r]);
  }
  return Blocks::of(cnt.data(), off.data(), (int)ranks.size());
}

}  // namespace detail
}  // namespace zp
