// A sequence's split options (schedule.h): the rings it may run on, with
// the time one rank spends on it under each, stored up to where no cap can
// pick a later one, and the rest made on demand (OptionTail).
#include "src/plan/schedule.h"

#include <algorithm>

namespace zp::plan {

// A sequence on a ring of this split, with the times the executor runs it in.
SplitOption splitOption(int64_t len, bool causal, Split split, const AttnShape& shape, const ClusterModel& c) {
  const RingSeconds t = ringBothSeconds(len, causal, split.G, linkOf(split.cls, c), shape, c);
  return SplitOption{split, t.forward, t.backward};
}

// A lower bound of the seconds one rank spends on a sequence on any ring of
// G or more ranks across nodes (Zeppelin's inter-node link), non-decreasing
// in G: each of a ring's G - 1 later steps waits at least for its hop, the
// latency and then the K and V of len / G tokens (ringStep's transfer, its
// chunk rounded up). Slack for rounding.
double acrossFloor(int64_t len, int G, const AttnShape& shape, const ClusterModel& c) {
  const Link link = zeppelinInterLink(c);
  const double hops = G - 1;
  return hops * (linkLatency(link, c) + kvBytes(1, shape) * double(len) / G / linkBytesPerSec(link, c)) * (1 - 1e-12);
}

// The rings a sequence may run on, from cheap to costly links: whole on one
// rank, rings of 2..ranksPerNode ranks in one node, then rings over 2, 3, ...
// whole nodes; with the time one rank spends on the sequence under each
// (ringSeconds: compute, plus any transfer the compute does not hide).
// Below one token per chunk a larger ring adds hops and no work per rank.
// Options past the first that runs within minCap are never picked (no cap
// asked for is smaller), so they are not computed. Nor, with `more`, those
// past where every later one is slower than the fastest so far (pickSplit
// never takes one): *more says whether the full list goes on
// (scheduleToTarget makes the rest if it may take them, OptionTail).
std::vector<SplitOption> splitOptions(int64_t len, bool causal, const AttnShape& shape, const ClusterModel& c,
                                      double minCap, bool* more) {
  const int64_t maxG = std::max<int64_t>(1, causal ? len / 2 : len);
  auto option = [&](int G, SeqClass cls) { return splitOption(len, causal, {G, cls}, shape, c); };
  std::vector<SplitOption> out = {option(1, SeqClass::Local)};
  minCap *= 1 + 1e-9;
  for (int G = 2; G <= c.ranksPerNode && G <= maxG && out.back().seconds > minCap; ++G)
    out.push_back(option(G, SeqClass::IntraNode));
  double fastest = out[0].seconds;
  for (const SplitOption& o : out) fastest = std::min(fastest, o.seconds);
  if (more) *more = false;
  for (int k = 2; k <= c.nodes && int64_t(k) * c.ranksPerNode <= maxG && out.back().seconds > minCap; ++k) {
    if (more && acrossFloor(len, k * c.ranksPerNode, shape, c) >= fastest) {
      *more = true;
      break;
    }
    out.push_back(option(k * c.ranksPerNode, SeqClass::InterNode));
    fastest = std::min(fastest, out.back().seconds);
  }
  return out;
}

OptionTail optionTail(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
                      double minCap, std::vector<std::vector<SplitOption>>* options) {
  OptionTail tail;
  tail.more.resize(lens.size());
  options->resize(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    bool more = false;
    (*options)[i] = splitOptions(lens[i], causal, shape, c, minCap, &more);
    tail.more[i] = more;
  }
  const int rpn = c.ranksPerNode;
  tail.option = [&lens, causal, &shape, &c, minCap, rpn](size_t i, int G, SplitOption* out) {
    // As splitOptions goes on: a ring over one more node while the one
    // before it takes longer than minCap (and within the nodes and the
    // sequence's tokens).
    const int64_t maxG = std::max<int64_t>(1, causal ? lens[i] / 2 : lens[i]);
    if (G / rpn > c.nodes || G > maxG) return false;
    const Split before{G - rpn, G - rpn > rpn ? SeqClass::InterNode : SeqClass::IntraNode};
    if (!(splitOption(lens[i], causal, before, shape, c).seconds > minCap * (1 + 1e-9))) return false;
    *out = splitOption(lens[i], causal, {G, SeqClass::InterNode}, shape, c);
    return true;
  };
  tail.floor = [&lens, &shape, &c](size_t i, int G) { return acrossFloor(lens[i], G, shape, c); };
  return tail;
}

}  // namespace zp::plan
