// Candidates of Zeppelin's plan that balance each pass, not only their sum:
// the step is passes x the slowest rank's forward plus the slowest rank's
// backward, and the backward weighs attention (2.5x its forward) more than
// the linear layers (2x), so a rank heavy in attention and light in tokens
// that is balanced forward is the slowest backward. The planner's own
// candidates balance one load per rank; these place sequences on the rank
// that adds least to passes x max forward + max backward, and spread the
// sequences whose share would exceed a target over rings that split heads
// (as `bound` spreads them: src/sim/bound.cc). docs/simulator.md, "Results".
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

#include "src/plan/planner.h"
#include "src/sim/step_model.h"

namespace zp::sim {

using namespace zp::plan;

namespace {

// How one sequence runs: a ring of R positions of u ranks (R = u = 1: whole
// on one rank), and its forward attention and all-to-all seconds over all
// its ranks.
struct Spread {
  int R = 1, u = 1;
  double compute = 0, a2a = 0;
  int ranks() const { return R * u; }
};

// Per rank: the forward and backward pass's seconds so far.
struct Loads {
  std::vector<double> fwd, bwd;
  double maxFwd = 0, maxBwd = 0;
  double passes = 2;
  double key(int r) const { return passes * fwd[size_t(r)] + bwd[size_t(r)]; }
  void add(int r, double f, double b) {
    fwd[size_t(r)] += f;
    bwd[size_t(r)] += b;
    maxFwd = std::max(maxFwd, fwd[size_t(r)]);
    maxBwd = std::max(maxBwd, bwd[size_t(r)]);
  }
};

// The cheapest spread of a sequence whose backward share per rank (attention,
// all-to-alls, its tokens' linear layers) is within `target`, the ring
// within maxRanks; the widest ring if none is.
Spread spreadFor(int64_t len, double target, double linPerToken, int maxRanks, const std::vector<int>& us,
                 const StepConfig& cfg, const ClusterModel& c) {
  const AttnShape& sh = cfg.model.attn;
  const double l = double(len), flops = attnFlops(len, cfg.causal, sh) / (c.tflops * 1e12);
  const double passes = cfg.recompute ? 2 : 1;
  const double qkvo = 2.0 * sh.headDim * sh.elemBytes * (double(sh.qHeads) + sh.kvHeads);
  Spread best, widest;
  best.compute = flops / attnEfficiencyAt(l, c);
  if (kAttnBackwardFlops * best.compute + 2 * linPerToken * l <= target) return best;
  double bestWork = -1;
  for (int u : us) {
    const double a2a = u > 1 ? l * qkvo * (u - 1) / u / linkBytesPerSec(Link::Intra, c) : 0;
    for (int R = 1; R * u <= maxRanks; ++R) {
      const double C = flops / attnEfficiencyAt(l / R, c);
      if (R * u > widest.ranks()) widest = Spread{R, u, C, a2a};
      if (R * u < 2 || (kAttnBackwardFlops * C + a2a + 2 * linPerToken * l) / (R * u) > target) continue;
      const double work = (passes + kAttnBackwardFlops) * C + (passes + 1) * a2a;
      if (bestWork < 0 || work < bestWork) bestWork = work, best = Spread{R, u, C, a2a};
      break;
    }
  }
  return bestWork < 0 ? widest : best;
}

// One candidate: every sequence's spread for this target, then the
// sequences largest first, each on the ranks that add least to the step.
PlanOptions::Candidate balancedCandidate(const std::vector<int64_t>& lens, double target, int maxRingNodes,
                                         const std::vector<int>& us, const StepConfig& cfg, const ClusterModel& c) {
  const int n = c.ranks(), rpn = std::max(1, c.ranksPerNode);
  const double linPerToken = linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
  const double passes = cfg.recompute ? 2 : 1;
  std::vector<Spread> sp(lens.size());
  std::vector<double> work(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    sp[i] = spreadFor(lens[i], target, linPerToken, maxRingNodes == 1 ? rpn : n, us, cfg, c);
    work[i] = (passes + kAttnBackwardFlops) * sp[i].compute + (passes + 2) * linPerToken * double(lens[i]);
  }
  std::vector<int64_t> order(lens.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return work[size_t(a)] > work[size_t(b)]; });
  Loads ld;
  ld.fwd.assign(size_t(n), 0.0);
  ld.bwd.assign(size_t(n), 0.0);
  ld.passes = passes;
  std::set<std::pair<double, int>> byKey;  // the ranks, least loaded first
  for (int r = 0; r < n; ++r) byKey.insert({0.0, r});
  auto place = [&](int r, double f, double b) {
    byKey.erase({ld.key(r), r});
    ld.add(r, f, b);
    byKey.insert({ld.key(r), r});
  };
  PlanOptions::Candidate cand;
  cand.rings.resize(lens.size());
  std::vector<int> ulysses(lens.size(), 1);
  std::vector<double> ringAt(size_t(n), 0.0);  // per rank: when its rings over several ranks end, forward
  std::vector<int64_t> spreadOrder;
  for (int64_t i : order) {
    const Spread& s = sp[size_t(i)];
    const double l = double(lens[size_t(i)]), G = s.ranks();
    const double f = (s.compute + s.a2a + linPerToken * l) / G;
    const double b = (kAttnBackwardFlops * s.compute + s.a2a + 2 * linPerToken * l) / G;
    std::vector<int>& ring = cand.rings[size_t(i)];
    if (s.ranks() == 1) {
      // Of the least loaded ranks, the one that adds least to the step.
      int best = -1;
      double bestStep = 0;
      int k = 0;
      for (auto it = byKey.begin(); it != byKey.end() && k < 16; ++it, ++k) {
        const int r = it->second;
        const double step = passes * std::max(ld.maxFwd, ld.fwd[size_t(r)] + f) + std::max(ld.maxBwd, ld.bwd[size_t(r)] + b);
        if (best < 0 || step < bestStep) best = r, bestStep = step;
      }
      ring.push_back(best);
      place(best, f, b);
      continue;
    }
    // R blocks of u ranks (node-aligned, u divides the node's ranks): those
    // whose rings over several ranks end first (a ring starts when all its
    // ranks are free), then the least loaded; inside one node, the one
    // whose ranks' rings end first, where rings stay in one.
    int first = 0, last = n / s.u;
    if (maxRingNodes == 1) {
      int bestNode = 0;
      double bestAt = -1;
      for (int node = 0; node < n / rpn; ++node) {
        double at = 0;
        for (int r = node * rpn; r < (node + 1) * rpn; ++r) at += ringAt[size_t(r)];
        if (bestAt < 0 || at < bestAt) bestAt = at, bestNode = node;
      }
      first = bestNode * rpn / s.u, last = (bestNode + 1) * rpn / s.u;
    }
    std::vector<std::tuple<double, double, int>> blocks;
    for (int k = first; k < last; ++k) {
      double at = 0, w = 0;
      for (int j = 0; j < s.u; ++j) at = std::max(at, ringAt[size_t(k * s.u + j)]), w = std::max(w, ld.key(k * s.u + j));
      blocks.emplace_back(at, w, k);
    }
    std::partial_sort(blocks.begin(), blocks.begin() + s.R, blocks.end());
    double begin = 0;
    for (int p = 0; p < s.R; ++p) {
      begin = std::max(begin, std::get<0>(blocks[size_t(p)]));
      for (int j = 0; j < s.u; ++j) ring.push_back(std::get<2>(blocks[size_t(p)]) * s.u + j);
    }
    std::sort(ring.begin(), ring.end());
    const double ringFwd = (s.compute + s.a2a) / G;
    for (int r : ring) {
      place(r, f + begin - ringAt[size_t(r)], b);  // its wait for the ring's other ranks
      ringAt[size_t(r)] = begin + ringFwd;
    }
    ulysses[size_t(i)] = s.u;
    spreadOrder.push_back(i);
  }
  // The rings over several ranks first, in the order they were placed, then
  // the whole sequences.
  for (int64_t i : order)
    if (cand.rings[size_t(i)].size() == 1) spreadOrder.push_back(i);
  order = std::move(spreadOrder);
  cand.order = std::move(order);
  if (std::any_of(ulysses.begin(), ulysses.end(), [](int u) { return u > 1; })) cand.ulysses = std::move(ulysses);
  return cand;
}

}  // namespace

std::vector<PlanOptions::Candidate> balancedCandidates(const std::vector<int64_t>& lens, const StepConfig& cfg,
                                                       const ClusterModel& c, int maxRingNodes) {
  std::vector<PlanOptions::Candidate> out;
  const int n = c.ranks();
  if (lens.empty() || n < 1) return out;
  // Rings with every head on every rank; and, where plans may split heads,
  // rings that may (the step counts what the estimates here leave out: ring
  // transfers not hidden, waits).
  std::vector<std::vector<int>> degrees = {{1}};
  if (cfg.headSplit) {
    degrees.push_back({1});
    for (int u : headSplitDegrees(c.ranksPerNode, cfg.model.attn)) degrees.back().push_back(u);
    if (degrees.back().size() == 1) degrees.pop_back();
  }
  // The target: a fraction of the mean backward pass (attention at
  // whole-sequence efficiency, the linear layers balanced).
  const double linPerToken = linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
  double attn = 0, tokens = 0;
  for (int64_t l : lens) {
    attn += attnComputeSeconds(attnFlops(l, cfg.causal, cfg.model.attn), double(l), c);
    tokens += double(l);
  }
  const double meanBwd = (kAttnBackwardFlops * attn + 2 * linPerToken * tokens) / n;
  for (const std::vector<int>& us : degrees)
    for (double f : {0.5, 0.75, 1.0}) out.push_back(balancedCandidate(lens, f * meanBwd, maxRingNodes, us, cfg, c));
  return out;
}

}  // namespace zp::sim
