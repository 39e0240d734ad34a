// The relay schedule (src/route/route_schedule.h) that the host relay and the
// device routed alltoallv both execute: on the router's plans of random
// demands, every byte of every transfer is in exactly one chunk, each chunk
// is at most one chunk size and carried by the proxies of the piece it comes
// from, chunk k of every piece is in round k, and the schedule runs round by
// round. (Whether the executors deliver every byte along it is checked by
// the multinode tests: host routed alltoallv and send/recv, and
// RoutedDeviceAlltoallvOnTheDouble.)
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "src/route/route_schedule.h"
#include "src/route/router.h"

namespace zp {
namespace {

ClusterTopology cluster(int nodes, int ranks, int nics) {
  ClusterTopology t;
  for (int n = 0, r = 0; n < nodes; n++) {
    NodeTopology node;
    node.name = "node" + std::to_string(n);
    for (int k = 0; k < nics; k++) {
      Nic nic;
      nic.name = "zpnic" + std::to_string(k);
      nic.bitsPerSec = 1e9 * (1 + (n + k) % 3);  // uneven rails: pieces of different lengths
      node.nics.push_back(nic);
    }
    t.node.push_back(node);
    t.nodeRanks.push_back({});
    for (int i = 0; i < ranks; i++, r++) {
      t.nodeRanks.back().push_back(r);
      t.rankNode.push_back(n);
      t.rankLocal.push_back(i);
      t.rankNic.push_back(i % nics);
    }
  }
  return t;
}

// "" if chunks are a schedule of t's pieces with chunk size C.
std::string scheduleError(const Transfer& t, const std::vector<RouteChunk>& chunks, uint64_t C) {
  std::vector<RouteChunk> byOffset = chunks;
  std::sort(byOffset.begin(), byOffset.end(),
            [](const RouteChunk& a, const RouteChunk& b) { return a.offset < b.offset; });
  uint64_t at = 0;
  for (const RouteChunk& c : byOffset) {
    if (c.offset != at) return "a gap or overlap at byte " + std::to_string(at);
    if (c.bytes == 0 || c.bytes > C) return "a chunk of " + std::to_string(c.bytes) + " bytes";
    const Piece* from = nullptr;
    for (const Piece& p : t.pieces)
      if (c.offset >= p.offset && c.offset + c.bytes <= p.offset + p.bytes) from = &p;
    if (!from) return "a chunk at " + std::to_string(c.offset) + " outside every piece";
    if (c.srcProxy != from->srcProxy || c.dstProxy != from->dstProxy) return "a chunk with another piece's proxies";
    if ((uint64_t)c.round != (c.offset - from->offset) / C || (c.offset - from->offset) % C)
      return "chunk at " + std::to_string(c.offset) + " in round " + std::to_string(c.round);
    at += c.bytes;
  }
  if (at != t.bytes) return "the chunks cover " + std::to_string(at) + " of " + std::to_string(t.bytes) + " bytes";
  for (size_t i = 1; i < chunks.size(); i++)
    if (chunks[i].round < chunks[i - 1].round) return "round " + std::to_string(chunks[i].round) + " after a later one";
  return "";
}

TEST(RouteSchedule, EveryByteOnceInChunksOfItsPieceRoundByRound) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 40; trial++) {
    const int nodes = 2 + trial % 3, ranks = 1 + trial % 4, nics = 1 + (trial / 3) % 4;
    const ClusterTopology topo = cluster(nodes, ranks, nics);
    RouteParams params;
    params.mode = trial % 5 == 0 ? RouteMode::kRail : RouteMode::kBalanced;
    params.chunkBytes = 1 + rng() % (64 << 10);
    params.directBelow = rng() % 2 ? 0 : params.chunkBytes * 3;
    const int n = nodes * ranks;
    std::vector<std::vector<uint64_t>> bytes(n, std::vector<uint64_t>(n, 0));
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (topo.rankNode[s] != topo.rankNode[d] && rng() % 3) bytes[s][d] = rng() % (params.chunkBytes * 40);
    RoutePlan plan;
    std::string why;
    ASSERT_EQ(planRoutes(topo, bytes, params, &plan, &why), zpSuccess) << why;
    scheduleTransfers(&plan.transfers, params.chunkBytes);
    for (const Transfer& t : plan.transfers) {
      const std::string err = scheduleError(t, t.chunks, params.chunkBytes);
      ASSERT_EQ(err, "") << "trial " << trial << ", transfer " << t.src << " -> " << t.dst << " of " << t.bytes
                         << " bytes, chunk " << params.chunkBytes;
    }
  }
}

TEST(RouteSchedule, RoundsInterleaveThePiecesAndAnEmptyPieceHasNoChunk) {
  // Three pieces of 2.5, 1 and 0 chunks (C = 100): round 0 holds each
  // non-empty piece's first chunk, round 1 the first piece's second, round 2
  // its short third.
  std::vector<Piece> pieces(3);
  pieces[0] = {0, 250, 0, 0, 4, 0};
  pieces[1] = {250, 100, 1, 1, 5, 1};
  pieces[2] = {350, 0, 2, 2, 6, 2};
  const std::vector<RouteChunk> chunks = scheduleChunks(pieces, 100);
  ASSERT_EQ(chunks.size(), 4u);
  const uint64_t offsets[4] = {0, 250, 100, 200}, sizes[4] = {100, 100, 100, 50};
  const int rounds[4] = {0, 0, 1, 2}, proxies[4] = {0, 1, 0, 0};
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(chunks[i].offset, offsets[i]) << i;
    EXPECT_EQ(chunks[i].bytes, sizes[i]) << i;
    EXPECT_EQ(chunks[i].round, rounds[i]) << i;
    EXPECT_EQ(chunks[i].srcProxy, proxies[i]) << i;
    EXPECT_EQ(chunks[i].dstProxy, proxies[i] + 4) << i;
  }
}

}  // namespace
}  // namespace zp
