// The modelled cost of a plan's remap (planner.h, remapSeconds): the
// planner scores candidates by it and the simulator charges it.
#include <algorithm>
#include <utility>
#include <vector>

#include "src/plan/planner.h"

namespace zp::plan {

namespace {

// Calls piece(r, ar, tokens) for every piece of tokens linear rank r takes
// from attention rank ar != r: ranks r in order, each rank's pieces in the
// order of its linear segments (and inside one, of the attention segments
// it overlaps).
template <class Piece>
void forEachMovedPiece(const BatchPlan& p, int n, int ranksPerNode, const std::vector<int64_t>* attnTokens,
                       Piece piece) {
  if (p.linearOnAttention) return;  // the linear layers run where attention does: nothing moves
  if (p.linear.ranks.empty()) {
    // Not built: balancedLinear's pieces, each inside one attention segment
    // of another rank (what the search below finds for that layout).
    for (const BalancedMove& m : balancedMoves(p.attention, ranksPerNode, attnTokens)) piece(m.to, m.from, m.seg.count);
    return;
  }
  // A linear segment inside an attention segment of its own rank moves
  // nothing (a sequence's attention segments do not overlap, so no other
  // rank holds any of its tokens). The linear layout keeps each rank's first
  // attention tokens in place, in attention order, so walking a rank's two
  // lists together finds those segments without a search, and the index
  // below needs only the sequences of the others: with a segment per rank of
  // a ring, a DP x CP candidate has far more segments than moved pieces.
  // kept: whether linear segment s of rank r stays, j walking rank r's
  // attention segments.
  auto kept = [&](int r, const Segment& s, size_t& j) {
    if (size_t(r) >= p.attention.ranks.size()) return false;
    const std::vector<Segment>& attn = p.attention.ranks[r];
    if (j >= attn.size()) return false;
    const Segment& a = attn[j];
    if (a.seq != s.seq || s.start < a.start || s.start + s.count > a.start + a.count) return false;
    ++j;
    return true;
  };
  // The sequences with a linear segment that is not kept: only their
  // attention segments are indexed.
  std::vector<char> needed(p.attention.seqLens.size(), 0);
  for (int r = 0; r < n; ++r) {
    size_t j = 0;
    for (const Segment& s : p.linear.ranks[r])
      if (!kept(r, s, j)) needed[s.seq] = 1;
  }
  // Their attention segments by sequence and start, with their ranks.
  std::vector<size_t> first(p.attention.seqLens.size() + 1, 0);
  for (const auto& segs : p.attention.ranks)
    for (const Segment& s : segs)
      if (needed[s.seq]) ++first[s.seq + 1];
  for (size_t i = 1; i < first.size(); ++i) first[i] += first[i - 1];
  std::vector<std::pair<Segment, int>> owner(first.back());
  std::vector<size_t> fill(first.begin(), first.end() - 1);
  for (size_t r = 0; r < p.attention.ranks.size(); ++r)
    for (const Segment& s : p.attention.ranks[r])
      if (needed[s.seq]) owner[fill[s.seq]++] = {s, int(r)};
  for (size_t q = 0; q + 1 < first.size(); ++q)
    if (first[q + 1] - first[q] > 1)
      std::sort(owner.begin() + first[q], owner.begin() + first[q + 1],
                [](auto& a, auto& b) { return a.first.start < b.first.start; });
  for (int r = 0; r < n; ++r) {
    size_t j = 0;
    for (const Segment& s : p.linear.ranks[r]) {
      if (kept(r, s, j)) continue;
      auto begin = owner.begin() + first[s.seq], end = owner.begin() + first[s.seq + 1];
      // The first attention segment that may overlap.
      auto it = std::lower_bound(begin, end, s.start, [](const std::pair<Segment, int>& a, int64_t v) {
        return a.first.start + a.first.count <= v;
      });
      for (; it != end && it->first.start < s.start + s.count; ++it) {
        const auto& [a, ar] = *it;
        int64_t b = std::max(a.start, s.start), e = std::min(a.start + a.count, s.start + s.count);
        if (e <= b || ar == r) continue;
        piece(r, ar, e - b);
      }
    }
  }
}

}  // namespace

// The remap between a plan's linear and attention layouts: the busiest
// rank's seconds (its sends or its receives, whichever take longer;
// intra-node at the link rate, across nodes at its share of the node's NICs
// or, routed, as below; one message latency per peer).
RemapSeconds remapSeconds(const BatchPlan& p, const ClusterModel& c, double inBytesPerToken, double outBytesPerToken,
                          const std::vector<int64_t>* attnTokens) {
  const int n = c.ranks();
  // Seconds per byte a rank sends and receives, and the latency of its
  // distinct peers (seenBy: the last rank that counted a peer, by peer and
  // link).
  std::vector<double> out(n, 0), in(n, 0), lat(n, 0);
  // With routing, the remap's zpAlltoallv goes through the router, which
  // spreads what crosses nodes over all of a node's NICs where that beats
  // each rank's own NIC (router.h, "balanced"): a rank then takes its
  // intra-node part plus its node's crossing bytes at the routed rate, or
  // the direct time, whichever is less.
  const bool routed = c.routeEfficiency > 0 && c.nodes > 1;
  // (Every GPU of the node sends: the node's NICs, not one hop's NVLink.)
  const double nodeBytesPerSec = c.routeEfficiency * c.nicsPerNode * c.nicGbps * 1e9 / 8.0;
  const int nodes = (n + c.ranksPerNode - 1) / c.ranksPerNode;
  std::vector<double> nodeOut(routed ? nodes : 0, 0), nodeIn(routed ? nodes : 0, 0);
  std::vector<double> intraOut(routed ? n : 0, 0), intraIn(routed ? n : 0, 0);
  std::vector<int> seenBy(2 * size_t(n), -1);
  RemapSeconds res;
  double movedCross = 0, movedIntra = 0;
  auto piece = [&](int r, int ar, int64_t tokens) {
    const bool cross = ar / c.ranksPerNode != r / c.ranksPerNode;
    (cross ? movedCross : movedIntra) += double(tokens);
    double secs = double(tokens) / (cross ? nicShareBytesPerSec(c) : linkBytesPerSec(Link::Intra, c));
    out[r] += secs;
    in[ar] += secs;
    if (cross && routed) {
      nodeOut[r / c.ranksPerNode] += double(tokens) / nodeBytesPerSec;
      nodeIn[ar / c.ranksPerNode] += double(tokens) / nodeBytesPerSec;
    } else if (routed) {
      intraOut[r] += secs;
      intraIn[ar] += secs;
    }
    const size_t peer = size_t(ar) * 2 + (cross ? 1 : 0);
    if (seenBy[peer] != r) {
      seenBy[peer] = r;
      lat[r] += cross ? c.interLatency : c.intraLatency;
    }
  };
  forEachMovedPiece(p, n, c.ranksPerNode, attnTokens, piece);
  for (int r = 0; r < n; ++r) {
    // q, k, v go from the linear layout to attention, the output back: the
    // same pairs, the other way.
    double secs = std::max(out[r], in[r]);
    if (routed) {
      const int nd = r / c.ranksPerNode;
      secs = std::min(secs, std::max(intraOut[r] + nodeOut[nd], intraIn[r] + nodeIn[nd]));
    }
    res.in = std::max(res.in, secs * inBytesPerToken + lat[r]);
    res.out = std::max(res.out, secs * outBytesPerToken + lat[r]);
  }
  res.nicBytes = movedCross * (inBytesPerToken + outBytesPerToken);
  res.intraBytes = movedIntra * (inBytesPerToken + outBytesPerToken);
  return res;
}

}  // namespace zp::plan
