#include "src/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string>

namespace zp::plan {
namespace {

struct Split {
  int G = 1;
  SeqClass cls = SeqClass::Local;
};

// The ring for a sequence: the least communication that keeps the time one
// rank spends on it (ringSeconds: compute, plus any transfer the compute does
// not hide) within cap. Candidates go from cheap to costly links: whole on
// one rank, rings of 2..ranksPerNode ranks in one node, then rings over 2, 3,
// ... whole nodes. So a sequence leaves its rank, and then its node, only
// when it must for balance, and a ring whose hops its compute cannot hide is
// taken only when it still lowers the time. When no candidate fits, the
// fastest one.
Split chooseSplit(int64_t len, bool causal, double cap, const AttnShape& shape,
                  const ClusterModel& c, const PlanOptions& opt, double* seconds) {
  // Below one token per chunk a larger ring adds hops and no work per rank.
  const int64_t maxG = std::max<int64_t>(1, causal ? len / 2 : len);
  // Rounding must not split a sequence whose time equals the cap.
  cap *= 1 + 1e-9;
  Split best;
  double bestT = ringSeconds(len, causal, 1, Link::Intra, shape, c);
  *seconds = bestT;
  if (bestT <= cap) return best;
  auto consider = [&](int G, SeqClass cls) {
    double t = ringSeconds(len, causal, G, cls == SeqClass::InterNode ? zeppelinInterLink(c) : Link::Intra,
                           shape, c);
    if (t < bestT * (1 - 1e-9)) {
      bestT = t;
      best = {G, cls};
    }
    return t <= cap;
  };
  for (int G = 2; G <= c.ranksPerNode && G <= maxG; ++G)
    if (consider(G, SeqClass::IntraNode)) break;
  const int maxNodes = opt.maxRingNodes > 0 ? std::min(opt.maxRingNodes, c.nodes) : c.nodes;
  if (bestT > cap)
    for (int k = 2; k <= maxNodes && int64_t(k) * c.ranksPerNode <= maxG; ++k)
      if (consider(k * c.ranksPerNode, SeqClass::InterNode)) break;
  *seconds = bestT;
  return best;
}

// One attempt at the attention placement for a given cap; returns the ranks of
// each sequence and the per-rank modelled seconds.
std::vector<std::vector<int>> place(const std::vector<int64_t>& lens, bool causal,
                                    const AttnShape& shape, const ClusterModel& c, const PlanOptions& opt,
                                    double cap, std::vector<double>& load) {
  const int n = c.ranks();
  const int rpn = c.ranksPerNode;
  std::vector<std::vector<int>> ranks(lens.size());
  std::vector<Split> splits(lens.size());
  std::vector<double> piece(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    splits[i] = chooseSplit(lens[i], causal, cap, shape, c, opt, &piece[i]);
  }
  // Largest first (longest-processing-time): inter-node rings, then
  // intra-node rings, then whole sequences, each onto the least loaded place;
  // ties go to the lower index so the plan is deterministic.
  std::vector<size_t> order(lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (splits[a].cls != splits[b].cls) return splits[a].cls > splits[b].cls;
    return piece[a] > piece[b];
  });
  load.assign(n, 0.0);
  // Least loaded first, lower rank on ties.
  using Entry = std::pair<double, int>;
  using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  MinHeap heap;
  std::vector<MinHeap> nodeHeaps;  // per node, with node-level token balance
  std::vector<double> nodeTokens(c.nodes, 0.0);
  const double nodeQuota =
      std::accumulate(lens.begin(), lens.end(), 0.0) / c.nodes * (1 + 1e-9) + 1;
  for (size_t i : order) {
    const Split& s = splits[i];
    if (s.cls == SeqClass::InterNode) {
      int k = s.G / rpn;
      std::vector<std::pair<double, int>> nodes;
      for (int nd = 0; nd < c.nodes; ++nd) {
        double m = 0;
        for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) m = std::max(m, load[r]);
        nodes.push_back({m, nd});
      }
      std::stable_sort(nodes.begin(), nodes.end());
      std::vector<int> chosen;
      for (int j = 0; j < k; ++j) chosen.push_back(nodes[j].second);
      // Node by node, so only k hops of the ring cross the network.
      std::sort(chosen.begin(), chosen.end());
      for (int nd : chosen)
        for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) ranks[i].push_back(r);
    } else if (s.cls == SeqClass::IntraNode) {
      double best = 0;
      std::vector<int> bestRanks;
      for (int nd = 0; nd < c.nodes; ++nd) {
        std::vector<std::pair<double, int>> rs;
        for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) rs.push_back({load[r], r});
        std::stable_sort(rs.begin(), rs.end());
        double worst = rs[s.G - 1].first;  // the ring finishes with its busiest rank
        if (bestRanks.empty() || worst < best) {
          best = worst;
          bestRanks.clear();
          for (int j = 0; j < s.G; ++j) bestRanks.push_back(rs[j].second);
        }
      }
      std::sort(bestRanks.begin(), bestRanks.end());
      ranks[i] = bestRanks;
    } else if (!opt.nodeTokenBalance || c.nodes == 1) {
      // Rings are placed; loads change only through this heap from here on.
      if (heap.empty())
        for (int r = 0; r < n; ++r) heap.push({load[r], r});
      int r = heap.top().second;
      heap.pop();
      heap.push({load[r] + piece[i], r});
      ranks[i] = {r};
    } else {
      // Node-level token balance: the least loaded rank among nodes that
      // still have room for the sequence's tokens under the node's share of
      // the batch, so the remap to the token-balanced linear layout stays
      // inside nodes (NVLink) instead of crossing NICs. Whole sequences come
      // last and shortest last, so the short ones even the nodes' tokens out
      // while the time balance is kept by choosing the least loaded rank.
      if (nodeHeaps.empty()) {
        nodeHeaps.resize(c.nodes);
        for (int r = 0; r < n; ++r) nodeHeaps[r / rpn].push({load[r], r});
      }
      int bestNode = -1, anyNode = 0;
      for (int nd = 0; nd < c.nodes; ++nd) {
        double top = nodeHeaps[nd].top().first;
        if (top < nodeHeaps[anyNode].top().first) anyNode = nd;
        if (nodeTokens[nd] + lens[i] > nodeQuota) continue;
        if (bestNode < 0 || top < nodeHeaps[bestNode].top().first) bestNode = nd;
      }
      const int nd = bestNode >= 0 ? bestNode : anyNode;
      int r = nodeHeaps[nd].top().second;
      nodeHeaps[nd].pop();
      nodeHeaps[nd].push({load[r] + piece[i], r});
      ranks[i] = {r};
    }
    for (int r : ranks[i]) {
      load[r] += piece[i];
      nodeTokens[r / rpn] += double(lens[i]) / ranks[i].size();
    }
  }
  return ranks;
}

// Lengths and their sum are bounded so that no token count, offset or cost
// the planner computes can overflow (a sum of int64 lengths can).
constexpr int64_t kMaxSeqTokens = int64_t(1) << 40;
constexpr int64_t kMaxBatchTokens = int64_t(1) << 48;
// Ranks of a planned cluster (as many as a topology file may describe).
constexpr int64_t kMaxPlanRanks = int64_t(1) << 22;

void validateLengths(const std::vector<int64_t>& lens, const char* fn) {
  int64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    if (lens[i] < 1 || lens[i] > kMaxSeqTokens)
      throw std::invalid_argument(std::string(fn) + ": sequence " + std::to_string(i) + " has length " +
                                  std::to_string(lens[i]) + " (must be from 1 to 2^40)");
    total += lens[i];  // cannot overflow: each term is at most 2^40 and the sum stops at 2^48
    if (total > kMaxBatchTokens)
      throw std::invalid_argument(std::string(fn) + ": the batch has more than 2^48 tokens");
  }
}

void validate(const std::vector<int64_t>& lens, const AttnShape& shape, const ClusterModel& c) {
  if (lens.empty()) throw std::invalid_argument("planBatch: empty batch (no sequences)");
  validateLengths(lens, "planBatch");
  if (c.nodes < 1 || c.ranksPerNode < 1 || int64_t(c.nodes) * c.ranksPerNode > kMaxPlanRanks)
    throw std::invalid_argument("planBatch: cluster has " + std::to_string(c.nodes) + " nodes of " +
                                std::to_string(c.ranksPerNode) +
                                " ranks (both must be at least 1, and at most 2^22 ranks in all)");
  if (c.nodes > 1 && (c.nicsPerNode < 1 || !(c.nicGbps > 0)))
    throw std::invalid_argument("planBatch: a multi-node cluster needs nicsPerNode >= 1 and nicGbps > 0");
  if (!(c.intraNodeGBps > 0) || !(c.tflops > 0) || !(c.efficiency > 0) || c.efficiency > 1)
    throw std::invalid_argument(
        "planBatch: intraNodeGBps and tflops must be > 0 and efficiency in (0, 1]");
  for (size_t i = 0; i < c.attnEfficiency.size(); ++i) {
    const auto& [len, eff] = c.attnEfficiency[i];
    if (!(len >= 1) || !(eff > 0) || eff > 1 || (i > 0 && !(len > c.attnEfficiency[i - 1].first)))
      throw std::invalid_argument("planBatch: attention efficiency point " + std::to_string(i) +
                                  " needs a length >= 1 above the previous point's and an efficiency in (0, 1]");
  }
  if (!(c.intraLatency >= 0) || !(c.interLatency >= 0) || !(c.routeEfficiency >= 0) || c.routeEfficiency > 1)
    throw std::invalid_argument("planBatch: latencies must be >= 0 and routeEfficiency in [0, 1]");
  if (shape.qHeads < 1 || shape.kvHeads < 1 || shape.headDim < 1 || shape.elemBytes < 1)
    throw std::invalid_argument("planBatch: attention shape fields must all be at least 1");
  if (shape.qHeads % shape.kvHeads)
    throw std::invalid_argument("planBatch: " + std::to_string(shape.kvHeads) +
                                " key/value heads do not divide " + std::to_string(shape.qHeads) + " query heads");
}

// Tokens per rank: every rank within one token of the mean. Each rank keeps
// the front of its attention tokens up to its quota, so those do not move;
// the surplus fills the ranks that are short, from their own node first (a
// remap then crosses the network only for what a node cannot balance
// itself), in rank order.
Layout linearLayout(const Layout& attn, int n, int ranksPerNode) {
  int64_t total = std::accumulate(attn.seqLens.begin(), attn.seqLens.end(), int64_t{0});
  std::vector<int64_t> quota(n);
  for (int r = 0; r < n; ++r) quota[r] = total / n + (r < total % n ? 1 : 0);
  Layout lin;
  lin.seqLens = attn.seqLens;
  lin.ranks.resize(n);
  const int nodes = (n + ranksPerNode - 1) / ranksPerNode;
  std::vector<std::vector<Segment>> surplus(nodes);
  std::vector<int64_t> have(n, 0);
  for (int r = 0; r < n; ++r) {
    for (const Segment& s : attn.ranks[r]) {
      int64_t keep = std::min(s.count, quota[r] - have[r]);
      if (keep > 0) {
        lin.ranks[r].push_back({s.seq, s.start, keep});
        have[r] += keep;
      }
      if (keep < s.count) surplus[r / ranksPerNode].push_back({s.seq, s.start + keep, s.count - keep});
    }
  }
  std::vector<size_t> next(nodes, 0);
  auto fill = [&](int r, int nd) {
    while (have[r] < quota[r] && next[nd] < surplus[nd].size()) {
      Segment& s = surplus[nd][next[nd]];
      int64_t take = std::min(s.count, quota[r] - have[r]);
      lin.ranks[r].push_back({s.seq, s.start, take});
      have[r] += take;
      s.start += take;
      s.count -= take;
      if (s.count == 0) ++next[nd];
    }
  };
  for (int r = 0; r < n; ++r) fill(r, r / ranksPerNode);
  for (int r = 0; r < n; ++r)
    for (int nd = 0; nd < nodes && have[r] < quota[r]; ++nd) fill(r, nd);
  return lin;
}

}  // namespace

BatchPlan planBatch(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape,
                    const ClusterModel& c, const PlanOptions& opt) {
  validate(lens, shape, c);
  const int n = c.ranks();
  double total = 0;
  for (int64_t s : lens) total += attnComputeSeconds(attnFlops(s, causal, shape), double(s), c);
  const double mean = total / n;

  // Smaller pieces balance better but communicate more: start coarse and
  // halve the cap until the modelled imbalance is within 2%, keeping the best.
  std::vector<std::vector<int>> best;
  double bestImb = 0;
  double cap = mean;
  for (int attempt = 0; attempt < 7; ++attempt, cap /= 2) {
    std::vector<double> load;
    auto ranks = place(lens, causal, shape, c, opt, cap, load);
    double imb = imbalance(load);
    if (best.empty() || imb < bestImb - 1e-12) {
      best = std::move(ranks);
      bestImb = imb;
    }
    if (bestImb <= 1.02) break;
  }

  return planFromRings(lens, causal, best, n, c.ranksPerNode);
}

BatchPlan planFromRings(const std::vector<int64_t>& lens, bool causal, const std::vector<std::vector<int>>& rings,
                        int n, int ranksPerNode) {
  if (rings.size() != lens.size()) throw std::invalid_argument("planFromRings: one ring per sequence");
  if (n < 1 || n > kMaxPlanRanks) throw std::invalid_argument("planFromRings: " + std::to_string(n) + " ranks (1 to 2^22)");
  validateLengths(lens, "planFromRings");
  if (ranksPerNode < 1) ranksPerNode = n;
  BatchPlan plan;
  plan.causal = causal;
  plan.attention.seqLens = lens;
  plan.attention.ranks.resize(n);
  plan.seqs.resize(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    const std::string where = "sequence " + std::to_string(i) + ": ";
    if (lens[i] < 1) throw std::invalid_argument(where + "length " + std::to_string(lens[i]) + " is below 1");
    if (rings[i].empty()) throw std::invalid_argument(where + "a ring of no ranks");
    std::vector<bool> seen(n, false);
    for (int r : rings[i]) {
      if (r < 0 || r >= n)
        throw std::invalid_argument(where + "rank " + std::to_string(r) + " is outside [0, " + std::to_string(n) + ")");
      if (seen[r]) throw std::invalid_argument(where + "rank " + std::to_string(r) + " is twice in its ring");
      seen[r] = true;
    }
    SeqPlacement& p = plan.seqs[i];
    p.seq = static_cast<int64_t>(i);
    p.len = lens[i];
    p.ranks = rings[i];
    const int G = static_cast<int>(p.ranks.size());
    p.cls = SeqClass::Local;
    if (G > 1) {
      p.cls = SeqClass::IntraNode;
      for (int r : p.ranks)
        if (r / ranksPerNode != p.ranks.front() / ranksPerNode) p.cls = SeqClass::InterNode;
    }
    for (int j = 0; j < G; ++j)
      for (const ChunkSpan& c : ringChunks(lens[i], G, causal, j))
        if (c.end > c.begin) plan.attention.ranks[p.ranks[j]].push_back({p.seq, c.begin, c.end - c.begin});
  }
  // Inter-node rings, then intra-node rings, then local sequences, each in
  // sequence order: the order the driver ran before plans carried one.
  plan.order.resize(lens.size());
  std::iota(plan.order.begin(), plan.order.end(), int64_t{0});
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](int64_t a, int64_t b) { return plan.seqs[a].cls > plan.seqs[b].cls; });
  plan.linear = linearLayout(plan.attention, n, ranksPerNode);
  return plan;
}

void setOrder(BatchPlan* plan, const std::vector<int64_t>& order) {
  const size_t n = plan->seqs.size();
  if (order.size() != n)
    throw std::invalid_argument("the order names " + std::to_string(order.size()) + " sequences, the plan has " +
                                std::to_string(n));
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (order[i] < 0 || order[i] >= int64_t(n))
      throw std::invalid_argument("order[" + std::to_string(i) + "] = " + std::to_string(order[i]) +
                                  " is not a sequence of the plan");
    if (seen[order[i]])
      throw std::invalid_argument("order[" + std::to_string(i) + "]: sequence " + std::to_string(order[i]) +
                                  " is named twice");
    seen[order[i]] = true;
  }
  plan->order = order;
}

std::vector<double> rankAttnSeconds(const BatchPlan& plan, const AttnShape& shape,
                                    const ClusterModel& c) {
  std::vector<double> load(c.ranks(), 0.0);
  for (const SeqPlacement& p : plan.seqs) {
    int G = static_cast<int>(p.ranks.size());
    Link link = p.cls == SeqClass::InterNode ? zeppelinInterLink(c) : Link::Intra;
    double t = ringSeconds(p.len, plan.causal, G, link, shape, c);
    for (int r : p.ranks) load[r] += t;
  }
  return load;
}

double imbalance(const std::vector<double>& v) {
  if (v.empty()) return 1.0;
  double mx = *std::max_element(v.begin(), v.end());
  double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return mean > 0 ? mx / mean : 1.0;
}

std::vector<int64_t> rankTokens(const Layout& layout) {
  std::vector<int64_t> t;
  for (const auto& segs : layout.ranks) {
    int64_t n = 0;
    for (const Segment& s : segs) n += s.count;
    t.push_back(n);
  }
  return t;
}

}  // namespace zp::plan
