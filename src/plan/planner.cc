#include "src/plan/planner.h"
#include "src/plan/schedule.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace zp::plan {
namespace {

// The ring for a sequence: the least communication that keeps the time one
// rank spends on it within cap. So a sequence leaves its rank, and then its
// node, only when it must for balance, and a ring whose hops its compute
// cannot hide is taken only when it still lowers the time. When no option
// fits, the fastest one.
const SplitOption& pickSplit(const std::vector<SplitOption>& options, double cap, const ClusterModel& c,
                            const PlanOptions& opt) {
  // Rounding must not split a sequence whose time equals the cap.
  cap *= 1 + 1e-9;
  const int maxNodes = opt.maxRingNodes > 0 ? std::min(opt.maxRingNodes, c.nodes) : c.nodes;
  size_t best = 0;
  for (size_t i = 1; i < options.size() && options[best].seconds > cap; ++i) {
    const SplitOption& o = options[i];
    if (o.split.cls == SeqClass::InterNode && o.split.G / c.ranksPerNode > maxNodes) break;
    if (o.seconds < options[best].seconds * (1 - 1e-9)) best = i;
  }
  return options[best];
}

Split chooseSplit(int64_t len, bool causal, double cap, const AttnShape& shape, const ClusterModel& c,
                  const PlanOptions& opt, double* seconds) {
  const SplitOption o = pickSplit(splitOptions(len, causal, shape, c), cap, c, opt);
  *seconds = o.seconds;
  return o.split;
}

// The planner before idle-aware scheduling (PlanOptions::legacy): one
// attempt for a given cap that charges every rank of a ring its time as if
// the ring never waited for its other ranks; returns the ranks of each
// sequence and the per-rank summed seconds.
std::vector<std::vector<int>> placeBySummedLoad(const std::vector<int64_t>& lens, bool causal,
                                    const AttnShape& shape, const ClusterModel& c, const PlanOptions& opt,
                                    double cap, std::vector<double>& load) {
  const int n = c.ranks();
  const int rpn = c.ranksPerNode;
  std::vector<std::vector<int>> ranks(lens.size());
  std::vector<Split> splits(lens.size());
  std::vector<double> piece(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) splits[i] = chooseSplit(lens[i], causal, cap, shape, c, opt, &piece[i]);
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


// The legacy planner: halve the cap until the summed imbalance is within
// 2%, keeping the best; rings in the order the simulator used to run them.
BatchPlan planLegacy(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
                     const PlanOptions& opt, double mean) {
  const int n = c.ranks();
  std::vector<std::vector<int>> best;
  double bestImb = 0;
  double cap = mean;
  for (int attempt = 0; attempt < 7; ++attempt, cap /= 2) {
    std::vector<double> load;
    auto ranks = placeBySummedLoad(lens, causal, shape, c, opt, cap, load);
    double imb = imbalance(load);
    if (best.empty() || imb < bestImb - 1e-12) {
      best = std::move(ranks);
      bestImb = imb;
    }
    if (bestImb <= 1.02) break;
  }
  BatchPlan p = planFromRings(lens, causal, std::move(best), n, c.ranksPerNode);
  orderByClassAndSize(&p);
  return p;
}

// Consecutive ranks as a ring's [begin, end) (BestPlan::bounded reads a
// ring through such a pair).
struct RankCount {
  int rank;
  int operator*() const { return rank; }
  RankCount& operator++() { return ++rank, *this; }
  bool operator!=(RankCount o) const { return rank != o.rank; }
  int operator-(RankCount o) const { return rank - o.rank; }
};

// The best of planBatch's candidates so far. The planner's own model:
// attention's forward and backward makespans and the remaps;
// PlanOptions::score replaces it.
struct BestPlan {
  BestPlan(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
           const PlanOptions& opt)
      : lens(lens), causal(causal), shape(shape), c(c), opt(opt) {}

  const std::vector<int64_t>& lens;
  bool causal;
  const AttnShape& shape;
  const ClusterModel& c;
  const PlanOptions& opt;
  // Each whole sequence's compute on its rank (splitRingCompute of a ring
  // of one), made when first asked for: every candidate's bound asks for
  // its tens of thousands of whole sequences (bounded), < 0 until then.
  mutable std::vector<double> whole_;
  BatchPlan best;
  double bestScore = 0;
  bool bestFits = true;
  bool have = false;
  // Set before the late candidates (PlanOptions::lateCandidates) are
  // scored: until one of them is taken, one that ties the best so far wins
  // the tie, as it did when the caller's candidates were scored first (the
  // plan is the same whichever comes first).
  bool lateWinsTies = false;
  // The best plan keeps the linear layers on its attention layout (its
  // flat score won).
  bool bestFlat = false;

  // The plan returned: its linear layout built (the candidates' are not,
  // BatchPlan::linear), or, when its flat score won, the attention layout
  // (BatchPlan::linearOnAttention).
  BatchPlan finish() {
    if (best.linear.ranks.empty()) {
      if (bestFlat) best.linearOnAttention = true;
      else buildLinear(&best, c.ranksPerNode);
    }
    return std::move(best);
  }

  // The planner's own model: the planned makespans and the remaps.
  double modelled(const BatchPlan& p) const {
    const double q = double(shape.qHeads) * shape.headDim * shape.elemBytes;
    const double kv = double(shape.kvHeads) * shape.headDim * shape.elemBytes;
    const RemapSeconds rs = remapSeconds(p, c, q + 2 * kv, q);
    const double remap = rs.in + rs.out;
    return opt.forwardPasses * (p.plannedForward + remap) + p.plannedBackward + remap;
  }

  // Memory first (a plan that fits beats any that does not), then seconds.
  bool better(const PlanOptions::Score& s) const {
    if (!have || (s.fits && !bestFits)) return true;
    if (lateWinsTies) return s.fits == bestFits && s.seconds * (1 - 1e-9) <= bestScore;
    return s.fits == bestFits && s.seconds < bestScore * (1 - 1e-9);
  }
  void take(const PlanOptions::Score& s) {
    bestScore = s.seconds, bestFits = s.fits, have = true;
    lateWinsTies = false;  // among the late ones, the first of equals (as before)
  }

  // What consider() found: the candidate could not beat the best so far by
  // a bound (not built), or was scored and fits or does not (either way).
  enum class Seen { Bounded, Fits, Over };

  // With a step model and a best so far that fits: whether the lower bound
  // (PlanOptions::scoreBound) of a plan with these rings (ring(i): sequence
  // i's ranks as a [begin, end) pair) rules it out, so that it need not be
  // built. A ring that planFromRings would refuse (a rank outside the
  // cluster or twice in it, no ranks) is never ruled out: building it says
  // what is wrong. `split`: each sequence's head split, if the candidate
  // names them (else none); with `variants`, any the planner may try (the
  // least compute of them).
  template <class RingOf>
  bool bounded(RingOf ring, const std::vector<int>* split, bool variants) const {
    if (!(opt.score && opt.scoreBound && have && bestFits)) return false;
    const int n = c.ranks();
    std::vector<double> attn(n, 0.0), tokens(n, 0.0);
    std::vector<size_t> seenIn(size_t(n), lens.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      const auto [begin, end] = ring(i);
      const int G = int(end - begin);
      if (G < 1 || (split && ((*split)[i] < 1 || G % (*split)[i] != 0))) return false;
      double compute = 0;
      if (G == 1) {  // a whole sequence: no split divides its ring of one
        if (whole_.empty()) whole_.assign(lens.size(), -1.0);
        if (whole_[i] < 0) whole_[i] = splitRingCompute(lens[i], causal, 1, 1, shape, c);
        compute = whole_[i];
      } else {
        compute = splitRingCompute(lens[i], causal, G, split ? (*split)[i] : 1, shape, c);
        for (int u : opt.headSplits)
          if (variants && G % u == 0) compute = std::min(compute, splitRingCompute(lens[i], causal, G, u, shape, c));
      }
      // Every chunk has at least len / chunks tokens (integer division).
      const int64_t chunks = causal && G > 1 ? 2 * int64_t(G) : G;
      const double held = double(lens[i] / chunks * (chunks / G));
      for (auto r = begin; r != end; ++r) {
        if (*r < 0 || *r >= n || seenIn[size_t(*r)] == i) return false;
        seenIn[size_t(*r)] = i;
        attn[*r] += compute;
        tokens[*r] += held;
      }
    }
    return !better({opt.scoreBound(attn, tokens), true});
  }

  // bounded() for DP x CP groups of g ranks (groupRanks' rings, sequence i
  // on the first groupRing ranks of group groupOf[i]) without their ranks
  // made: a group names every one of its ranks for every sequence.
  bool boundedGroups(int g, const std::vector<int>& groupOf) const {
    return bounded(
        [&](size_t i) {
          const int first = groupOf[i] * g;
          return std::make_pair(RankCount{first}, RankCount{first + groupRing(lens[i], causal, g)});
        },
        nullptr, true);
  }

  // Scores a candidate fully, keeping it if it is the best so far. A plan is
  // moved, not copied, into `best`: the plan of a DP x CP candidate has a
  // segment on every rank of its group for every sequence.
  // boundChecked: the caller found that the lower bound does not rule it
  // out (boundedGroups).
  Seen consider(const Schedule& s, bool boundChecked = false) {
    const int n = c.ranks();
    // The planner's own model adds the remaps' non-negative seconds to the
    // makespans, so a candidate whose makespans alone are no better cannot
    // win, and its plan is not built.
    if (!opt.score && !better({opt.forwardPasses * s.forward + s.backward, true})) return Seen::Bounded;
    // Nor, with a step model, one that its lower bound rules out (only
    // against a best that fits: one over memory loses to any that fits).
    if (!boundChecked &&
        bounded([&](size_t i) { return std::make_pair(s.ringBegin(i), s.ringEnd(i)); }, nullptr, true))
      return Seen::Bounded;
    BatchPlan p = planFromRings(lens, causal, s.rings(), n, c.ranksPerNode, false);
    p.order = s.order;
    p.plannedForward = s.forward;
    p.plannedBackward = s.backward;
    return consider(std::move(p));
  }

  // A built plan (its planned makespans set). With the step model: as it is
  // and with the linear layers left on the attention layout (no remap) when
  // the remap costs more than the imbalance it removes; with `variants`, so
  // also each of its head-split variants (PlanOptions::headSplits), the
  // first of equals kept (the plan as it is before any variant).
  Seen consider(BatchPlan p, bool variants = true) {
    if (!opt.score) {
      const PlanOptions::Score own{modelled(p), true};
      if (better(own)) take(own), bestFlat = false, best = std::move(p);
      return Seen::Fits;
    }
    const size_t splits = variants ? opt.headSplits.size() : 0;
    const double plannedF = p.plannedForward, plannedB = p.plannedBackward;
    int won = -1;  // 0: the plan as it is; k > 0: split by headSplits[k - 1]
    bool flatWon = false, fits = false;
    std::vector<int> split;  // a variant's splits, for its bound
    auto ringOf = [&](size_t i) { return std::make_pair(p.seqs[i].ranks.begin(), p.seqs[i].ranks.end()); };
    for (size_t k = 0; k <= splits; ++k) {
      if (k > 0) {
        if (!splitHeadsBy(&p, opt.headSplits[k - 1], c.ranksPerNode)) continue;
        // Not scored when its lower bound cannot beat the best so far.
        split.resize(p.seqs.size());
        for (size_t i = 0; i < split.size(); ++i) split[i] = p.seqs[i].ulysses;
        if (bounded(ringOf, &split, false)) continue;
      }
      const auto [remapped, flat] = opt.score(p, k > 0);  // k = 0 is always scored first
      if (better(remapped)) take(remapped), won = int(k), flatWon = false;
      if (better(flat)) take(flat), won = int(k), flatWon = true;
      fits = fits || remapped.fits || flat.fits;
    }
    if (won >= 0) {
      if (splits > 0) splitHeadsBy(&p, won == 0 ? 1 : opt.headSplits[size_t(won) - 1], c.ranksPerNode);
      // The planner's makespans do not cost a head split (setHeadSplit).
      p.plannedForward = won == 0 ? plannedF : 0;
      p.plannedBackward = won == 0 ? plannedB : 0;
      // The linear layout is built once, for the plan returned (finish).
      bestFlat = flatWon;
      best = std::move(p);
    }
    return fits ? Seen::Fits : Seen::Over;
  }
};

// A candidate's rings for its plan: copied from the caller's options,
// moved out of the late candidates, which are the planner's own.
std::vector<std::vector<int>> ringsOf(const PlanOptions::Candidate& cand) { return cand.rings; }
std::vector<std::vector<int>> ringsOf(PlanOptions::Candidate& cand) { return std::move(cand.rings); }

// The caller's placements (PlanOptions::candidates, lateCandidates: the
// simulator's tuned baselines), scored in full whatever the screening says,
// so the plan is never slower than any of them. Cands: a vector of
// candidates, const or not (then each built one's rings are moved).
template <class Cands>
void scoreCallersCandidates(Cands& cands, BestPlan* best) {
  for (auto& cand : cands) {
    // Not built when the bound rules it out against the best so far (a
    // malformed candidate is built, and refused, whatever the bound says).
    const size_t m = best->lens.size();
    std::vector<char> named(m, 0);  // an order naming every sequence once
    bool valid = cand.rings.size() == m && cand.order.size() == m && (cand.ulysses.empty() || cand.ulysses.size() == m);
    for (size_t k = 0; k < m && valid; ++k)
      valid = cand.order[k] >= 0 && cand.order[k] < int64_t(m) && !named[size_t(cand.order[k])]++;
    auto ring = [&](size_t i) { return std::make_pair(cand.rings[i].begin(), cand.rings[i].end()); };
    // A caller's candidate is scored as it is, with the head splits it
    // names (the simulator's usp_cp placement names them; a split of
    // dp_cp's groups is a usp_cp setting, tuned there).
    const std::vector<int>* split = cand.ulysses.empty() ? nullptr : &cand.ulysses;
    if (valid && best->bounded(ring, split, false)) continue;
    BatchPlan p = planFromRings(best->lens, best->causal, ringsOf(cand), best->c.ranks(), best->c.ranksPerNode, false);
    setOrder(&p, cand.order);
    if (split) setHeadSplit(&p, *split, best->c.ranksPerNode, best->shape);
    if (!split || std::all_of(split->begin(), split->end(), [](int u) { return u == 1; })) {
      p.plannedForward = attnMakespan(p, best->shape, best->c);
      p.plannedBackward = attnMakespan(p, best->shape, best->c, true);
    }
    best->consider(std::move(p), false);
  }
}

// The caller's late candidates (PlanOptions::lateCandidates), asked for
// with the best score so far once the planner's own are scored.
void scoreLateCandidates(BestPlan* best) {
  if (!best->opt.lateCandidates) return;
  const double none = std::numeric_limits<double>::infinity();
  const PlanOptions::Score so =
      best->have ? PlanOptions::Score{best->bestScore, best->bestFits} : PlanOptions::Score{none, false};
  std::vector<PlanOptions::Candidate> late = best->opt.lateCandidates(so);
  best->lateWinsTies = true;
  scoreCallersCandidates(late, best);
}

// The last stage of planBatch: of the candidates screened (caps: a cap's
// splits scheduled, fits: rings sized to a target, groupSizes: DP x CP
// groups, each with its screening score), the finalists scored in full;
// scoreGroups(g) scores groups of g ranks (BestPlan::consider). Caps whose
// schedules were deferred (their entry's score a lower bound, its schedule
// empty: none of them can be a finalist, see planBatch) are scheduled by
// scheduleDeferredCaps, which sets their entries, if the memory rule needs
// the caps past the finalists.
void scoreFinalists(std::vector<std::pair<double, Schedule>>& caps, std::vector<std::pair<double, Schedule>>& fits,
                    std::vector<std::pair<double, Schedule>>& joints, std::vector<std::pair<double, int>>& groupSizes,
                    bool thorough, const std::function<BestPlan::Seen(int)>& scoreGroups,
                    const std::function<void()>& scheduleDeferredCaps, BestPlan* best) {
  BestPlan& bestPlan = *best;
  // The best of each kind and its runner-up (when not thorough, only within
  // 3%) are scored in full, the most promising first: the better the plan
  // found early, the more of the others the bound skips without building.
  struct Finalist {
    double quick;
    const Schedule* schedule;  // or, for a DP x CP group, null and its size
    int group;
    size_t kind;
    size_t made;  // its place among its kind's candidates as made (ties go to the first made)
  };
  auto byScore = [](const Finalist& a, const Finalist& b) { return a.quick < b.quick; };
  auto score = [&](const Finalist& f) {
    // (A deferred cap is never reached before it is scheduled; should one
    // be, it is scheduled then rather than scored empty.)
    if (f.schedule && f.schedule->first.empty() && scheduleDeferredCaps) scheduleDeferredCaps();
    return f.schedule ? bestPlan.consider(*f.schedule) : scoreGroups(f.group);
  };
  // Each kind's ranking: by score, ties in the order made.
  std::vector<std::vector<Finalist>> kinds(4);
  auto rank = [&](const auto& made, size_t kind) {
    for (const auto& e : made) {
      const size_t at = kinds[kind].size();
      if constexpr (std::is_same_v<std::decay_t<decltype(e.second)>, int>)
        kinds[kind].push_back({e.first, nullptr, e.second, kind, at});
      else
        kinds[kind].push_back({e.first, &e.second, 0, kind, at});
    }
    std::stable_sort(kinds[kind].begin(), kinds[kind].end(), byScore);
  };
  rank(caps, 0);
  rank(fits, 1);
  rank(joints, 2);
  rank(groupSizes, 3);
  std::vector<Finalist> finalists;
  std::vector<size_t> next(kinds.size(), 0);  // the first of each kind not nominated
  for (const auto& ranked : kinds)
    for (size_t i = 0; i < ranked.size() && i < 2; ++i)
      if (i == 0 || thorough || ranked[i].quick <= 1.03 * ranked[0].quick) {
        finalists.push_back(ranked[i]);
        next[ranked[i].kind] = i + 1;
      }
  std::stable_sort(finalists.begin(), finalists.end(),
                   [](const Finalist& a, const Finalist& b) { return a.quick < b.quick; });
  std::vector<int> over(kinds.size(), 0);
  for (const Finalist& f : finalists)
    if (score(f) == BestPlan::Seen::Over) ++over[f.kind];
  // Memory is a constraint: a finalist over memory does not count, and the
  // next of its kind is scored instead, until one fits or the kind runs out.
  // The caps past the finalists are ranked by their own scores: the deferred
  // ones are scheduled first (none of them is a finalist, so only the ranks
  // past those move).
  if (over[0] > 0 && scheduleDeferredCaps) {
    scheduleDeferredCaps();
    for (Finalist& f : kinds[0]) f.quick = caps[f.made].first;
    std::sort(kinds[0].begin() + std::ptrdiff_t(next[0]), kinds[0].end(), [](const Finalist& a, const Finalist& b) {
      return a.quick < b.quick || (a.quick == b.quick && a.made < b.made);
    });
  }
  for (size_t k = 0; k < kinds.size(); ++k)
    for (size_t i = next[k]; i < kinds[k].size() && over[k] > 0; ++i)
      if (score(kinds[k][i]) != BestPlan::Seen::Over) --over[k];
}

// The caps' candidates of planBatch: the cap on the time one rank spends on
// a sequence sets its split (pickSplit); each cap's splits are scheduled
// (schedule.cc) and screened by quick(), once per distinct set of splits.
// A cap whose screening score cannot make it the best cap nor a finalist
// (scoreFinalists) is not scheduled unless the memory rule reaches it
// (scheduleDeferred): its entry in caps holds a lower bound of its score
// and no schedule.
class CapSearch {
 public:
  CapSearch(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
            const PlanOptions& opt, const std::vector<std::vector<SplitOption>>& options,
            const std::vector<size_t>& byLength, bool thorough)
      : lens_(lens), causal_(causal), shape_(shape), c_(c), opt_(opt), options_(options), byLength_(byLength),
        thorough_(thorough), splits_(lens.size()), piece_(lens.size()), back_(lens.size()) {}

  // Screening scores (attention makespans, plus for groups the linear
  // layers' imbalance).
  double quick(const Schedule& s) const { return opt_.forwardPasses * s.forward + s.backward + s.linearExcess; }

  // The cap's screening score (or, deferred, a lower bound of it that is
  // no better than the best cap so far, so that a search goes as it would
  // with its score). `from` chooses the splits (the unrouted options choose
  // them as if routing were off); the schedule always takes the times the
  // executor will run them in (options' own, or splitOption's).
  double tryCap(double cap, const PlanOptions& o, const std::vector<std::vector<SplitOption>>& from) {
    splitAt(cap, o, from);
    for (const auto& [sp, score] : seen_)
      if (sp == splits_) return score;
    // A lower bound of the screening score: each pass takes at least the
    // longest piece, and at least the ranks' mean busy time (slack for
    // rounding: the schedule sums the same terms in another order).
    const int n = c_.ranks();
    double sumF = 0, sumB = 0, maxF = 0, maxB = 0;
    for (size_t i = 0; i < lens_.size(); ++i) {
      crosses = crosses || splits_[i].cls == SeqClass::InterNode;
      sumF += splits_[i].G * piece_[i];
      sumB += splits_[i].G * back_[i];
      maxF = std::max(maxF, piece_[i]);
      maxB = std::max(maxB, back_[i]);
    }
    const double bound = (opt_.forwardPasses * std::max(maxF, sumF / n) + std::max(maxB, sumB / n)) * (1 - 1e-9);
    // Deferred when two caps scheduled score no more (it can be neither
    // the best nor the runner-up: ties go to the first made) or, when not
    // thorough, when it is over 3% above the best (the runner-up is scored
    // only within 3%).
    if ((scheduled_ >= 2 && bound >= nextCap_) || (!thorough_ && scheduled_ >= 1 && bound > 1.03 * leastCap_)) {
      seen_.push_back({splits_, bound});
      deferred_.push_back({caps.size(), cap, o.maxRingNodes, &from});
      caps.push_back({bound, Schedule{}});
      return bound;
    }
    Schedule s = schedule(lens_, c_, o, splits_, piece_, back_, byLength_);
    const double score = quick(s);
    if (scheduled_ == 0 || score < leastCap_) nextCap_ = leastCap_, leastCap_ = score;
    else if (scheduled_ == 1 || score < nextCap_) nextCap_ = score;
    ++scheduled_;
    seen_.push_back({splits_, score});
    caps.push_back({score, std::move(s)});
    return score;
  }

  // Schedules the deferred caps, their entries in caps made as tryCap
  // would have made them.
  void scheduleDeferred() {
    for (const Deferred& d : deferred_) {
      PlanOptions o = opt_;
      o.maxRingNodes = d.maxRingNodes;
      splitAt(d.cap, o, *d.from);
      Schedule s = schedule(lens_, c_, o, splits_, piece_, back_, byLength_);
      caps[d.at] = {quick(s), std::move(s)};
    }
    deferred_.clear();
  }

  // (screening score, schedule) of each cap tried, in the order tried.
  std::vector<std::pair<double, Schedule>> caps;
  // Some cap's splits have a ring across nodes.
  bool crosses = false;

 private:
  void splitAt(double cap, const PlanOptions& o, const std::vector<std::vector<SplitOption>>& from) {
    for (size_t i = 0; i < lens_.size(); ++i) {
      const SplitOption& picked = pickSplit(from[i], cap, c_, o);
      const SplitOption pick =
          &from == &options_ ? picked : splitOption(lens_[i], causal_, picked.split, shape_, c_);
      splits_[i] = pick.split;
      piece_[i] = pick.seconds;
      back_[i] = pick.backward;
    }
  }

  struct Deferred {
    size_t at;  // in caps
    double cap;
    int maxRingNodes;
    const std::vector<std::vector<SplitOption>>* from;
  };
  const std::vector<int64_t>& lens_;
  const bool causal_;
  const AttnShape& shape_;
  const ClusterModel& c_;
  const PlanOptions& opt_;
  const std::vector<std::vector<SplitOption>>& options_;
  const std::vector<size_t>& byLength_;
  const bool thorough_;
  std::vector<Split> splits_;
  std::vector<double> piece_, back_;
  // The splits of each cap tried and its score (or bound).
  std::vector<std::pair<std::vector<Split>, double>> seen_;
  std::vector<Deferred> deferred_;
  double leastCap_ = 0, nextCap_ = 0;  // the two least scores of the caps scheduled
  size_t scheduled_ = 0;
};

}  // namespace

BatchPlan planBatch(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape,
                    const ClusterModel& c, const PlanOptions& opt) {
  validate(lens, shape, c);
  const int n = c.ranks();
  double total = 0;
  for (int64_t s : lens) total += attnComputeSeconds(attnFlops(s, causal, shape), double(s), c);
  const double mean = total / n;

  if (opt.legacy) return planLegacy(lens, causal, shape, c, opt, mean);

  // Every candidate is scheduled and the one with the shortest modelled step
  // kept: the splits of a range of caps (smaller pieces balance better but
  // communicate more and run shorter, less efficient kernels), with rings
  // across nodes and inside nodes only, and the placements of DP x CP
  // groups (BestPlan scores them).
  BestPlan bestPlan(lens, causal, shape, c, opt);
  // Candidates are screened by their attention makespans (plus, for groups,
  // the linear layers' imbalance); the few best of each kind are scored
  // fully, since building and scoring a plan costs more than scheduling it.
  auto quick = [&](const Schedule& s) { return opt.forwardPasses * s.forward + s.backward + s.linearExcess; };
  std::vector<std::pair<double, int>> groupSizes;  // (screening score, group size)
  std::vector<std::vector<SplitOption>> options(lens.size()), unrouted;
  const double minCap = opt.onlyCap > 0 ? mean * opt.onlyCap : mean * std::pow(0.5, 6);
  // Each sequence's options up to where no cap picks a later one; the
  // schedules sized to a target make the rest while they may take them.
  OptionTail tail = optionTail(lens, causal, shape, c, minCap, &options);
  // Sequences longest first (ties in index order): the guess of every
  // candidate's order (stableSortFromGuess).
  std::vector<size_t> byLength(lens.size());
  std::iota(byLength.begin(), byLength.end(), 0);
  std::stable_sort(byLength.begin(), byLength.end(), [&](size_t a, size_t b) { return lens[a] > lens[b]; });
  // The search is as thorough as a budget of scheduling work allows: with
  // up to 2,000 sequences every coarse cap, three probes inside nodes and
  // three unrouted, and both runners-up scored; with more, the coarse caps
  // stop two steps past the best and one probe of each kind is made.
  const bool thorough = lens.size() <= 2000;
  CapSearch capSearch(lens, causal, shape, c, opt, options, byLength, thorough);
  auto tryCap = [&](double cap, const PlanOptions& o, const std::vector<std::vector<SplitOption>>& from) {
    return capSearch.tryCap(cap, o, from);
  };
  std::vector<std::pair<double, Schedule>>& caps = capSearch.caps;
  if (opt.onlyCap > 0) {
    tryCap(mean * opt.onlyCap, opt, options);
    bestPlan.consider(caps.front().second);
    return bestPlan.finish();
  }
  // Caps halving from the mean load down to 1/64 of it, then a local search
  // around the best in steps of a half, a quarter and an eighth of an octave:
  // a step's makespan is not smooth in the cap (a long sequence's ring grows
  // by whole ranks), and the best cap is often between two octaves' steps.
  // Caps in eighths of an octave below the mean.
  auto capAt = [&](int eighths) { return mean * std::pow(0.5, eighths / 8.0); };
  constexpr int kLowest = 48;  // 1/64 of the mean
  int bestX = 0;
  double bestCap = 0;
  for (int x = 0, worse = 0; x <= kLowest && (thorough || worse < 2); x += 8) {
    const double score = tryCap(capAt(x), opt, options);
    worse = x == 0 || score < bestCap ? 0 : worse + 1;  // past the best, smaller caps only fragment more
    if (x == 0 || score < bestCap) bestCap = score, bestX = x;
  }
  for (int step : {4, 2, 1}) {
    const int around = bestX;
    for (int x : {around - step, around + step})
      if (x >= 0 && x <= kLowest) {
        const double score = tryCap(capAt(x), opt, options);
        if (score < bestCap) bestCap = score, bestX = x;
      }
  }
  // Rings sized to fill the schedule where they land (scheduleToTarget), for
  // targets from the least makespan possible (the mean load at whole-sequence
  // speed) up to 1.3 times it (larger targets won on under 2% of the batches
  // of the three length files, A800 at 64K and H800 at 16K tokens per rank);
  // when not thorough, every other one.
  std::vector<size_t> byWork = byLength;
  stableSortFromGuess(byWork, [&](size_t a, size_t b) { return options[a][0].seconds > options[b][0].seconds; });
  std::vector<std::pair<double, Schedule>> fits, joints;
  const double targets[] = {1.0, 1.05, 1.1, 1.15, 1.2, 1.3};
  for (size_t k = 0; k < std::size(targets) && opt.fitRings; k += thorough ? 1 : 2) {
    Schedule s = scheduleToTarget(lens, c, opt, options, mean * targets[k], byWork, &tail);
    const double score = quick(s);
    fits.push_back({score, std::move(s)});
  }
  // Rings sized with each sequence's linear layers folded into its time
  // (jointFits): for a plan that keeps the linear layers on its attention
  // layout, so that no remap is needed.
  if (opt.fitRings && opt.jointFits && opt.score && opt.linearSecondsPerToken > 0)
    jointFits(lens, c, opt, options, byWork, tail, thorough, quick, &joints);
  if (capSearch.crosses && opt.maxRingNodes != 1) {
    // Around the best cap again with every ring inside a node, and with the
    // splits chosen as if inter-node rings had one NIC per hop (routing
    // must not make a wider ring look free: its waits and remaps are not in
    // a ring's own time).
    PlanOptions o = opt;
    o.maxRingNodes = 1;
    ClusterModel oneNic = c;
    oneNic.routeEfficiency = 0;
    for (size_t i = 0; i < lens.size() && c.routeEfficiency > 0; ++i) {
      bool more = false;  // only caps pick from these: the rest is never needed
      unrouted.push_back(splitOptions(lens[i], causal, shape, oneNic, minCap, &more));
    }
    for (int x = thorough ? bestX - 4 : bestX; x <= (thorough ? bestX + 4 : bestX); x += 4)
      if (x >= 0 && x <= kLowest) {
        tryCap(capAt(x), o, options);
        if (!unrouted.empty()) tryCap(capAt(x), opt, unrouted);
      }
  }
  // What a tuned baseline would run: DP x CP groups, from one rank up while
  // a larger group still helps (past the best size, groups only communicate
  // more and run shorter kernels).
  double bestGroup = 0;
  std::map<int, std::pair<Schedule, std::vector<int>>> screened;  // each size's schedule and groups
  for (int g = 1, worse = 0; g <= n && n % g == 0 && worse < 2; g *= 2) {
    // Scored without its rings, which only the candidates kept need (made
    // from its groups, groupRanks, not by scheduling again).
    auto& [sized, groupOf] = screened[g];
    sized = groupSchedule(lens, causal, shape, c, opt, g, byLength, &groupOf);
    const double score = quick(sized);
    worse = g > 1 && score >= bestGroup ? worse + 1 : 0;
    bestGroup = g > 1 ? std::min(bestGroup, score) : score;
    groupSizes.push_back({score, g});
  }
  scoreCallersCandidates(opt.candidates, &bestPlan);
  scoreFinalists(
      caps, fits, joints, groupSizes, thorough,
      [&](int g) {
        const auto& [sized, groupOf] = screened.at(g);
        // Its rings are made only when the bound does not rule it out.
        if (bestPlan.boundedGroups(g, groupOf)) return BestPlan::Seen::Bounded;
        Schedule s = sized;
        groupRanks(&s, lens, causal, g, groupOf);
        return bestPlan.consider(s, true);
      },
      [&] { capSearch.scheduleDeferred(); },
      &bestPlan);
  scoreLateCandidates(&bestPlan);
  return bestPlan.finish();
}

}  // namespace zp::plan
