#include "src/plan/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

namespace zp::plan {

namespace {

using Entry = std::pair<double, int>;  // (load or free time, rank or group)

// A min-heap of entries whose top is replaced by one sift down (not a pop and
// a push): placements take the least loaded and put it back heavier,
// thousands of times per candidate.
struct LoadHeap {
  std::vector<Entry> v;  // a heap as std::push_heap with std::greater keeps it
  const Entry& top() const { return v.front(); }
  void push(Entry e) {
    v.push_back(e);
    std::push_heap(v.begin(), v.end(), std::greater<Entry>());
  }
  void replaceTop(Entry e) {
    size_t at = 0;
    for (size_t child = 1; child < v.size(); child = 2 * at + 1) {
      if (child + 1 < v.size() && v[child + 1] < v[child]) ++child;
      if (!(v[child] < e)) break;
      v[at] = v[child];
      at = child;
    }
    v[at] = e;
  }
};

}  // namespace

// An idle interval a rank spends waiting for the other ranks of a ring.
struct Gap {
  int rank;
  double begin, end;
};

namespace {

// An inter-node ring of G ranks: the G / ranksPerNode nodes that are free
// soonest, whole, node by node so only that many hops of the ring cross the
// network. Writes the ring's ranks; returns when they are all free.
double placeAcrossNodes(const std::vector<double>& freeAt, const ClusterModel& c, int G, int* ring) {
  const int rpn = c.ranksPerNode;
  const int k = G / rpn;
  std::vector<Entry> nodes;
  for (int nd = 0; nd < c.nodes; ++nd)
    nodes.push_back({*std::max_element(freeAt.begin() + nd * rpn, freeAt.begin() + (nd + 1) * rpn), nd});
  std::stable_sort(nodes.begin(), nodes.end());
  std::vector<int> chosen;
  double at = 0;
  for (int j = 0; j < k; ++j) {
    chosen.push_back(nodes[j].second);
    at = std::max(at, nodes[j].first);
  }
  std::sort(chosen.begin(), chosen.end());
  int* next = ring;
  for (int nd : chosen)
    for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) *next++ = r;
  return at;
}

// The backward pass of a schedule: the same rings in reverse order, each
// starting when the last of its ranks is free (back: each sequence's
// backward seconds). Returns its makespan.
double backwardMakespan(const Schedule& out, const std::vector<double>& back, int n) {
  std::vector<double> freeAt(n, 0.0);
  for (auto it = out.order.rbegin(); it != out.order.rend(); ++it) {
    const size_t i = size_t(*it);
    double at = 0;
    for (const int* r = out.ringBegin(i); r != out.ringEnd(i); ++r) at = std::max(at, freeAt[*r]);
    for (const int* r = out.ringBegin(i); r != out.ringEnd(i); ++r) freeAt[*r] = at + back[i];
  }
  return *std::max_element(freeAt.begin(), freeAt.end());
}

}  // namespace

// List scheduling of one candidate (the splits a cap gives): rings go, largest
// first, where they can start soonest, and a ring starts when the last of its
// ranks is free, so all its ranks finish together at start + its time (the
// executor runs it that way). The ranks a ring leaves waiting keep that idle
// time as gaps, which whole sequences fill before they go to the least loaded
// rank. The order is every sequence by planned start, so running the plan in
// that order reproduces the schedule; the backward pass runs it reversed.
//
// byLength: the sequences longest first, ties in index order.
Schedule schedule(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
                  const std::vector<Split>& splits, const std::vector<double>& piece, const std::vector<double>& back,
                  const std::vector<size_t>& byLength) {
  const int n = c.ranks();
  const int rpn = c.ranksPerNode;
  const size_t m = lens.size();
  Schedule out;
  out.first.assign(m + 1, 0);
  for (size_t i = 0; i < m; ++i) out.first[i + 1] = out.first[i] + size_t(splits[i].G);
  out.ranks.resize(out.first[m]);
  // Rings first, then whole sequences; larger pieces first. The guess: the
  // rings (few) sorted, then the whole sequences longest first, as a whole
  // sequence's time grows with its length.
  auto before = [&](size_t a, size_t b) {
    if (splits[a].cls != splits[b].cls) return splits[a].cls > splits[b].cls;
    return piece[a] > piece[b];
  };
  std::vector<size_t> order;
  order.reserve(m);
  for (size_t i = 0; i < m; ++i)
    if (splits[i].cls != SeqClass::Local) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), before);
  for (size_t i : byLength)
    if (splits[i].cls == SeqClass::Local) order.push_back(i);
  stableSortFromGuess(order, before);
  std::vector<double> freeAt(n, 0.0), start(m, 0.0);
  // Idle gaps by length, so a whole sequence takes the smallest one it fits.
  std::multimap<double, Gap> gaps;
  const double eps = 1e-12;
  auto occupy = [&](size_t i, double s) {
    start[i] = s;
    for (const int* it = out.ringBegin(i); it != out.ringEnd(i); ++it) {
      const int r = *it;
      if (s > freeAt[r] + eps) gaps.insert({s - freeAt[r], {r, freeAt[r], s}});
      freeAt[r] = s + piece[i];
    }
  };
  LoadHeap heap;
  std::vector<LoadHeap> nodeHeaps;  // per node, with node-level token balance
  std::vector<Entry> nodeOrder;    // (least load of the node, node), sorted
  std::vector<double> nodeTokens(c.nodes, 0.0);
  const bool balanceNodes = opt.nodeTokenBalance && c.nodes > 1;
  const double nodeQuota = std::accumulate(lens.begin(), lens.end(), 0.0) / c.nodes * (1 + 1e-9) + 1;
  auto hasRoom = [&](int nd, int64_t len) { return !balanceNodes || nodeTokens[nd] + len <= nodeQuota; };
  std::vector<Entry> rs;
  std::vector<double> nodeFree(rpn);
  for (size_t i : order) {
    const Split& s = splits[i];
    int* const ring = out.ranks.data() + out.first[i];  // s.G ranks
    if (s.cls == SeqClass::InterNode) {
      occupy(i, placeAcrossNodes(freeAt, c, s.G, ring));
    } else if (s.cls == SeqClass::IntraNode) {
      // The node where G ranks are free soonest; of its ranks free by then,
      // the G that are free latest, so the ring leaves the least idle and the
      // ranks free earlier stay for shorter work.
      double at = 0;
      int bestNode = -1;
      for (int nd = 0; nd < c.nodes; ++nd) {
        std::copy(freeAt.begin() + nd * rpn, freeAt.begin() + (nd + 1) * rpn, nodeFree.begin());
        std::nth_element(nodeFree.begin(), nodeFree.begin() + (s.G - 1), nodeFree.end());
        if (bestNode < 0 || nodeFree[s.G - 1] < at) at = nodeFree[s.G - 1], bestNode = nd;
      }
      rs.clear();
      for (int r = bestNode * rpn; r < (bestNode + 1) * rpn; ++r)
        if (freeAt[r] <= at) rs.push_back({-freeAt[r], r});
      std::stable_sort(rs.begin(), rs.end());
      for (int j = 0; j < s.G; ++j) ring[j] = rs[j].second;
      std::sort(ring, ring + s.G);
      occupy(i, at);
    } else {
      // A whole sequence: the smallest idle gap it fits (on a node with room
      // for its tokens), else the least loaded rank. Rings are all placed by
      // now, so loads change only through these heaps.
      bool placed = false;
      int tries = 0;
      for (auto it = gaps.lower_bound(piece[i] - eps); it != gaps.end() && tries < 4; ++it, ++tries) {
        Gap g = it->second;
        if (!hasRoom(g.rank / rpn, lens[i])) continue;
        gaps.erase(it);
        ring[0] = g.rank;
        start[i] = g.begin;
        if (g.end - g.begin - piece[i] > eps) gaps.insert({g.end - g.begin - piece[i], {g.rank, g.begin + piece[i], g.end}});
        placed = true;
        break;
      }
      if (!placed && !balanceNodes) {
        if (heap.v.empty())
          for (int r = 0; r < n; ++r) heap.push({freeAt[r], r});
        const int r = heap.top().second;
        heap.replaceTop({freeAt[r] + piece[i], r});
        ring[0] = r;
        occupy(i, freeAt[r]);
      } else if (!placed) {
        // Node-level token balance: the least loaded rank among nodes that
        // still have room for the sequence's tokens under the node's share of
        // the batch, so the remap to the token-balanced linear layout stays
        // inside nodes (NVLink) instead of crossing NICs.
        if (nodeHeaps.empty()) {
          nodeHeaps.resize(c.nodes);
          for (int r = 0; r < n; ++r) nodeHeaps[r / rpn].push({freeAt[r], r});
          for (int nd = 0; nd < c.nodes; ++nd) nodeOrder.push_back({nodeHeaps[nd].top().first, nd});
          std::sort(nodeOrder.begin(), nodeOrder.end());
        }
        int nd = nodeOrder.begin()->second;  // when no node has room: the least loaded
        for (const Entry& e : nodeOrder)
          if (hasRoom(e.second, lens[i])) {
            nd = e.second;
            break;
          }
        const int r = nodeHeaps[nd].top().second;
        auto at = std::lower_bound(nodeOrder.begin(), nodeOrder.end(), Entry{nodeHeaps[nd].top().first, nd});
        nodeHeaps[nd].replaceTop({freeAt[r] + piece[i], r});
        // The node's least load only grows: its entry moves right, in place.
        at->first = nodeHeaps[nd].top().first;
        for (auto next = at + 1; next != nodeOrder.end() && *next < *at; ++at, ++next) std::swap(*at, *next);
        ring[0] = r;
        occupy(i, freeAt[r]);
      }
    }
    for (int j = 0; j < s.G; ++j) nodeTokens[ring[j] / rpn] += double(lens[i]) / s.G;
  }
  out.forward = *std::max_element(freeAt.begin(), freeAt.end());
  out.order.assign(order.begin(), order.end());
  std::stable_sort(out.order.begin(), out.order.end(), [&](int64_t a, int64_t b) { return start[a] < start[b]; });
  out.backward = backwardMakespan(out, back, n);
  return out;
}

// A baseline's placement as a candidate (DP x CP, as Transformer Engine's
// packed rings run it): n / g groups of g consecutive ranks, every sequence
// of a group on the group's ring (the driver runs them as one group).
// Sequences go largest first to the group with the least load: attention at
// the group's chunk length, plus the linear layers' time of their tokens when
// the caller gave its rate (WLB-LLM's assignment, as the simulator's dp_cp).
//
// byLength: the sequences longest first, ties in index order (planBatch sorts
// them once for every group size).
Schedule groupSchedule(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
                       const PlanOptions& opt, int g, bool withRanks, const std::vector<size_t>& byLength) {
  const int groups = c.ranks() / g;
  const Link link = g > c.ranksPerNode ? zeppelinInterLink(c) : Link::Intra;
  std::vector<double> cost(lens.size()), fwd(lens.size()), bwd(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    const int G = int(std::min<int64_t>(g, std::max<int64_t>(1, causal ? lens[i] / 2 : lens[i])));
    cost[i] = attnComputeSeconds(attnFlops(lens[i], causal, shape), double(lens[i]) / g, c) +
              opt.linearSecondsPerToken * double(lens[i]);
    const RingSeconds t = ringBothSeconds(lens[i], causal, G, link, shape, c);
    fwd[i] = t.forward;
    bwd[i] = t.backward;
  }
  // Largest cost first. The cost grows with the length for any efficiency
  // table that does not fall with the chunk length, so byLength is the guess.
  std::vector<size_t> order = byLength;
  stableSortFromGuess(order, [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  // (load, group): in index order to begin with (all zero, already a heap).
  LoadHeap heap;
  for (int k = 0; k < groups; ++k) heap.v.push_back({0.0, k});
  std::vector<int> groupOf(lens.size());
  std::vector<double> attn(groups, 0.0), back(groups, 0.0), tokens(groups, 0.0);
  for (size_t i : order) {
    const auto [load, k] = heap.top();
    heap.replaceTop({load + cost[i], k});
    groupOf[i] = k;
    attn[k] += fwd[i];
    back[k] += bwd[i];
    tokens[k] += double(lens[i]) / g;
  }
  Schedule out;
  if (withRanks) out.first.assign(1, 0);
  for (size_t i = 0; i < lens.size() && withRanks; ++i) {
    const int64_t maxG = std::max<int64_t>(1, causal ? lens[i] / 2 : lens[i]);
    // A sequence too short for the whole ring runs on its first ranks.
    for (int r = groupOf[i] * g; r < groupOf[i] * g + std::min<int64_t>(g, maxG); ++r) out.ranks.push_back(r);
    out.first.push_back(out.ranks.size());
    out.order.push_back(int64_t(i));
  }
  if (withRanks)
    std::stable_sort(out.order.begin(), out.order.end(), [&](int64_t a, int64_t b) { return groupOf[a] < groupOf[b]; });
  out.forward = *std::max_element(attn.begin(), attn.end());
  out.backward = *std::max_element(back.begin(), back.end());
  const double meanTokens = std::accumulate(tokens.begin(), tokens.end(), 0.0) / groups;
  out.linearExcess = (opt.forwardPasses + 2) * opt.linearSecondsPerToken *
                     (*std::max_element(tokens.begin(), tokens.end()) - meanTokens);
  return out;
}

}  // namespace zp::plan
