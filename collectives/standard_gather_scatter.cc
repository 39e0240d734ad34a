// Reduce-scatter(v) and all-gather(v) on host buffers: rings, direct
// exchange, and the hierarchical ones across nodes (a node's round, then a
// ring over every rail).
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"
#include "src/route/routing_setting.h"

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

// Direct all-gather in buf (element size es) over blocks b: this rank's
// block (at `first` if given, else in buf) to every other rank, theirs
// from them, in one round. hasAll as in ringAllGather.
zpResult_t Call::allGatherDirect(char* buf, size_t es, const Blocks& b, const char* first, int hasAll) {
  allGatherDirectRound(buf, es, b, first, hasAll);
  return step.run(4000);
}
void Call::allGatherDirectRound(char* buf, size_t es, const Blocks& b, const char* first, int hasAll) {
  const char* from = first ? first : buf + b.off[me] * es;
  for (int i = 1; i < n; i++) {
    const int to = mod(me + i, n), src = mod(me - i, n);
    if (to != hasAll) step.send(to, from, b.cnt[me] * es, es);
    if (me != hasAll) step.recv(src, buf + b.off[src] * es, b.cnt[src] * es, es);
  }
}

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
  const size_t directBelow = c->cfg().routeDirectBelow;
  size_t slices = 1;
  if (routingOn(c->cfg()) && directBelow > es && b.maxCnt) {
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

// ---- All-gather over blocks b (the user's type, user displacements) ----
zpResult_t Call::allGather(const char* sendbuff, char* recvbuff, const Blocks& b) {
  char* mine = recvbuff + b.off[me] * ts;
  const Family f = n > 1 ? family(b.total * ts / n) : Family::kLatency;
  std::vector<int> local, rail;
  std::vector<std::vector<int>> grid;
  if (n > 1 && f == Family::kRing && nodeGrid(&local, &rail, &grid))
    ZP_CHECK(allGatherNodes(sendbuff, recvbuff, b, local, rail, grid));
  else if (n > 1 && f == Family::kRing)
    ZP_CHECK(ringAllGather(recvbuff, ts, b, 0, sendbuff));
  else if (n > 1)
    ZP_CHECK(allGatherDirect(recvbuff, ts, b, sendbuff));
  if (sendbuff != mine && b.cnt[me]) memmove(mine, sendbuff, b.cnt[me] * ts);
  return zpSuccess;
}

}  // namespace detail
}  // namespace zp
