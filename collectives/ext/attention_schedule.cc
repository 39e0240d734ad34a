// The attention driver's schedule: this rank's groups and local sequences,
// built from the plan (attention.h).
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "collectives/ext/attention.h"

namespace zpx::attn {

zpResult_t buildSchedule(zpAttention* a, zpBatchPlan_t plan, int nranks, int me) {
  int nseqs = 0, causal = 0, nOrder = 0;
  const int64_t* lens = nullptr;
  const int64_t* order = nullptr;
  ZPX_CHECK(zpPlanGetInfo(plan, nullptr, &nseqs, &lens, &causal));
  ZPX_CHECK(zpPlanRingOrder(plan, &order, &nOrder));
  // Each sequence's place in the order (zpPlanSetRingOrder checked that it
  // names every sequence once; checked again, as it is read from outside).
  std::vector<int64_t> place(nseqs, -1);
  for (int i = 0; i < nOrder; i++)
    if (order[i] >= 0 && order[i] < nseqs) place[order[i]] = i;
  if (nOrder != nseqs || std::count(place.begin(), place.end(), int64_t{-1}))
    return zpSetLastError(a->comm, zpInternalError,
                          "zpAttentionCreate: the plan's order (%d entries) does not name each of its %d sequences once",
                          nOrder, nseqs);
  // Every rank's segments of every sequence, and where mine start in my buffers.
  std::map<std::pair<int, int64_t>, std::vector<zpSegment_t>> held;  // (rank, seq) -> segments
  std::map<std::pair<int64_t, int64_t>, int64_t> at;
  for (int r = 0; r < nranks; r++) {
    const zpSegment_t* segs = nullptr;
    size_t n = 0;
    ZPX_CHECK(zpPlanRankSegments(plan, zpAttentionLayout, r, &segs, &n));
    int64_t off = 0;
    for (size_t i = 0; i < n; i++) {
      held[{r, segs[i].seq}].push_back(segs[i]);
      if (r == me) at[{segs[i].seq, segs[i].start}] = off;
      off += segs[i].count;
    }
    if (r == me) a->T = off;
  }
  // Chunks are added by sequence id (forPairs needs each block's chunks
  // sorted by sequence); the order of groups and locals comes after.
  std::map<std::vector<int>, size_t> groupOf;
  std::vector<Group> all;
  for (int64_t seq = 0; seq < nseqs; seq++) {
    int cls = 0, G = 0;
    const int* ringRanks = nullptr;
    ZPX_CHECK(zpPlanSequence(plan, seq, &cls, &G, &ringRanks));
    std::vector<int> ranks(ringRanks, ringRanks + G);
    if (G == 1) {
      if (ranks[0] == me) a->locals.push_back({seq, at.at({seq, 0}), lens[seq]});
      continue;
    }
    auto it = groupOf.find(ranks);
    if (it == groupOf.end()) {
      it = groupOf.emplace(ranks, all.size()).first;
      Group g;
      g.ranks = ranks;
      g.first = seq;
      g.blocks.resize(G);
      g.tokens.assign(G, 0);
      all.push_back(std::move(g));
    }
    Group& g = all[it->second];
    if (place[seq] < place[g.first]) g.first = seq;
    for (int j = 0; j < G; j++)
      for (const zpSegment_t& seg : held[{ranks[j], seq}]) {
        Chunk ch;
        ch.seq = seq;
        ch.first = seg.start;
        ch.count = seg.count;
        ch.blockOff = g.tokens[j];
        g.tokens[j] += ch.count;
        if (ranks[j] == me) ch.userOff = at.at({seq, seg.start});
        g.blocks[j].push_back(ch);
      }
  }
  // Groups at the place of their first sequence in the plan's order, and
  // locals at theirs; every rank sorts alike.
  std::vector<size_t> idx(all.size());
  for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return place[all[x].first] < place[all[y].first]; });
  std::sort(a->locals.begin(), a->locals.end(),
            [&](const LocalSeq& x, const LocalSeq& y) { return place[x.seq] < place[y.seq]; });
  for (size_t i : idx) {
    Group& g = all[i];
    auto p = std::find(g.ranks.begin(), g.ranks.end(), me);
    if (p == g.ranks.end()) continue;
    g.pos = (int)(p - g.ranks.begin());
    const std::vector<Chunk>& mine = g.blocks[g.pos];
    g.ownAt = mine.empty() ? 0 : mine[0].userOff;
    for (const Chunk& c : mine)
      if (c.userOff != g.ownAt + c.blockOff) g.ownAt = -1;
    a->groups.push_back(std::move(g));
  }
  return zpSuccess;
}

}  // namespace zpx::attn
