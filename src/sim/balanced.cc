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

// The blocks of u consecutive ranks (node-aligned) for each degree u, in
// the order a ring takes them: by when the rings over several ranks on
// them end (their latest rank's), then by load (their most loaded rank's),
// then by index; kept in order as ranks change, so that placing a ring
// does not look at every rank.
class Blocks {
 public:
  using Entry = std::tuple<double, double, int>;
  Blocks(const std::vector<int>& us, int n) : us_(us), sets_(us.size()), vals_(us.size()) {
    for (size_t d = 0; d < us.size(); ++d)
      for (int k = 0; k < n / us[d]; ++k) {
        vals_[d].push_back({0.0, 0.0, k});
        sets_[d].insert(vals_[d].back());
      }
  }
  // Rank r's ring end (ringAt) or load changed.
  void update(int r, const std::vector<double>& ringAt, const Loads& ld) {
    for (size_t d = 0; d < us_.size(); ++d) {
      const int u = us_[d], k = r / u;
      Entry& e = vals_[d][size_t(k)];
      sets_[d].erase(e);
      double at = 0, w = 0;
      for (int j = k * u; j < (k + 1) * u; ++j) at = std::max(at, ringAt[size_t(j)]), w = std::max(w, ld.key(j));
      e = {at, w, k};
      sets_[d].insert(e);
    }
  }
  const std::set<Entry>& ordered(int u) const { return sets_[degree(u)]; }
  const Entry& block(int u, int k) const { return vals_[degree(u)][size_t(k)]; }

 private:
  size_t degree(int u) const { return size_t(std::find(us_.begin(), us_.end(), u) - us_.begin()); }
  std::vector<int> us_;
  std::vector<std::set<Entry>> sets_;
  std::vector<std::vector<Entry>> vals_;
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
// *floor: a lower bound of the candidate's step (its score, remapped or
// not): each pass takes at least any rank's attention compute, all-to-all
// waits and linear layers, on its attention tokens (at least l / G - 2 of a
// sequence on G ranks: zigzag chunks of whole tokens) or on the balanced
// layout (at least the mean - 1), the remap aside.
PlanOptions::Candidate balancedCandidate(const std::vector<int64_t>& lens, double target, int maxRingNodes,
                                         const std::vector<int>& us, const StepConfig& cfg, const ClusterModel& c,
                                         double* floor) {
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
  std::vector<double> ringAt(size_t(n), 0.0);  // per rank: when its rings over several ranks end, forward
  Blocks blocks(us, n);
  std::set<std::pair<double, int>> nodes;  // where rings stay in one node: by the sum of their ranks' ringAt
  std::vector<double> nodeAt(size_t(n / rpn), 0.0);
  if (maxRingNodes == 1)
    for (int node = 0; node < n / rpn; ++node) nodes.insert({0.0, node});
  // Ranks whose blocks are out of order: refreshed before a ring is placed
  // (most of the rings come first, the whole sequences after them).
  std::vector<char> stale(size_t(n), 0);
  std::vector<int> staleRanks;
  auto place = [&](int r, double f, double b) {
    byKey.erase({ld.key(r), r});
    ld.add(r, f, b);
    byKey.insert({ld.key(r), r});
    if (!stale[size_t(r)]) stale[size_t(r)] = 1, staleRanks.push_back(r);
  };
  PlanOptions::Candidate cand;
  cand.rings.resize(lens.size());
  std::vector<int> ulysses(lens.size(), 1);
  std::vector<int64_t> spreadOrder;
  std::vector<double> comp(size_t(n), 0.0), waits(size_t(n), 0.0), held(size_t(n), 0.0);  // for *floor
  auto hold = [&](int r, const Spread& s, int64_t len) {
    comp[size_t(r)] += s.compute / s.ranks();
    waits[size_t(r)] += s.a2a / s.ranks();
    held[size_t(r)] += std::max(0.0, double(len) / s.ranks() - (s.ranks() > 1 ? 2 : 0));
  };
  for (int64_t i : order) {
    const Spread& s = sp[size_t(i)];
    const double l = double(lens[size_t(i)]), G = s.ranks();
    const double f = (s.compute + s.a2a + linPerToken * l) / G;
    const double b = (kAttnBackwardFlops * s.compute + s.a2a + 2 * linPerToken * l) / G;
    std::vector<int>& ring = cand.rings[size_t(i)];
    if (s.ranks() == 1) {
      // Of the 256 least loaded ranks (all of them up to 256 ranks), the one
      // that adds least to the step: a rank light in passes x forward +
      // backward may be the slowest backward (16 of them: 0.4% slower
      // plans on the 30B model at h800 16K, 256 ranks).
      int best = -1;
      double bestStep = 0;
      int k = 0;
      for (auto it = byKey.begin(); it != byKey.end() && k < 256; ++it, ++k) {
        const int r = it->second;
        const double step = passes * std::max(ld.maxFwd, ld.fwd[size_t(r)] + f) + std::max(ld.maxBwd, ld.bwd[size_t(r)] + b);
        if (best < 0 || step < bestStep) best = r, bestStep = step;
      }
      ring.push_back(best);
      place(best, f, b);
      hold(best, s, lens[size_t(i)]);
      continue;
    }
    // R blocks of u ranks (node-aligned, u divides the node's ranks): those
    // whose rings over several ranks end first (a ring starts when all its
    // ranks are free), then the least loaded; inside one node, the one
    // whose ranks' rings end first, where rings stay in one.
    for (int r : staleRanks) blocks.update(r, ringAt, ld), stale[size_t(r)] = 0;
    staleRanks.clear();
    std::vector<Blocks::Entry> chosen;
    if (maxRingNodes == 1) {
      const int node = nodes.begin()->second;
      for (int k = node * rpn / s.u; k < (node + 1) * rpn / s.u; ++k) chosen.push_back(blocks.block(s.u, k));
      std::partial_sort(chosen.begin(), chosen.begin() + s.R, chosen.end());
      chosen.resize(size_t(s.R));
    } else {
      for (auto it = blocks.ordered(s.u).begin(); int(chosen.size()) < s.R; ++it) chosen.push_back(*it);
    }
    double begin = 0;
    for (const Blocks::Entry& e : chosen) {
      begin = std::max(begin, std::get<0>(e));
      for (int j = 0; j < s.u; ++j) ring.push_back(std::get<2>(e) * s.u + j);
    }
    std::sort(ring.begin(), ring.end());
    const double ringFwd = (s.compute + s.a2a) / G;
    for (int r : ring) {
      const double wait = begin - ringAt[size_t(r)];  // for the ring's other ranks
      if (maxRingNodes == 1) {
        const int node = r / rpn;
        nodes.erase({nodeAt[size_t(node)], node});
        nodeAt[size_t(node)] += begin + ringFwd - ringAt[size_t(r)];
        nodes.insert({nodeAt[size_t(node)], node});
      }
      ringAt[size_t(r)] = begin + ringFwd;
      place(r, f + wait, b);
      hold(r, s, lens[size_t(i)]);
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
  const double mean = std::max(0.0, std::accumulate(lens.begin(), lens.end(), 0.0) / n - 1);
  double flat[2] = {0, 0}, remapped[2] = {0, 0};  // forward, backward
  for (int r = 0; r < n; ++r) {
    const double a = comp[size_t(r)], w = waits[size_t(r)], t = held[size_t(r)];
    flat[0] = std::max(flat[0], a + w + linPerToken * t);
    flat[1] = std::max(flat[1], kAttnBackwardFlops * a + w + 2 * linPerToken * t);
    remapped[0] = std::max(remapped[0], a + w + linPerToken * mean);
    remapped[1] = std::max(remapped[1], kAttnBackwardFlops * a + w + 2 * linPerToken * mean);
  }
  *floor = cfg.model.layers * std::min(passes * flat[0] + flat[1], passes * remapped[0] + remapped[1]) * (1 - 1e-9);
  return cand;
}

}  // namespace

std::vector<PlanOptions::Candidate> balancedCandidates(const std::vector<int64_t>& lens, const StepConfig& cfg,
                                                       const ClusterModel& c, int maxRingNodes, double beat) {
  std::vector<PlanOptions::Candidate> out;
  const int n = c.ranks();
  // Above this many sequences they are not made: their greedy, plans and
  // scores would take half again a plan's time at 4,096 ranks (8,304
  // sequences), where the planner's own candidates are lighter too, and
  // they gained least there (docs/simulator.md, "Planning time").
  if (lens.empty() || n < 1 || lens.size() > kBalancedMaxSeqs) return out;
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
    for (double f : {0.5, 0.75, 1.0}) {
      double floor = 0;
      PlanOptions::Candidate cand = balancedCandidate(lens, f * meanBwd, maxRingNodes, us, cfg, c, &floor);
      if (floor < beat) out.push_back(std::move(cand));  // else it cannot beat the best plan so far
    }
  return out;
}

PlanOptions::Candidate wholeRebalanced(const BatchPlan& plan, const StepConfig& cfg, const ClusterModel& c) {
  const int n = c.ranks();
  const AttnShape& sh = cfg.model.attn;
  const double linPerToken = linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
  const double passes = cfg.recompute ? 2 : 1;
  const double qkvo = 2.0 * sh.headDim * sh.elemBytes * (double(sh.qHeads) + sh.kvHeads);
  Loads ld;
  ld.fwd.assign(size_t(n), 0.0);
  ld.bwd.assign(size_t(n), 0.0);
  ld.passes = passes;
  PlanOptions::Candidate cand;
  cand.rings.resize(plan.seqs.size());
  cand.ulysses.assign(plan.seqs.size(), 1);
  std::vector<size_t> whole;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const SeqPlacement& s = plan.seqs[i];
    const int G = int(s.ranks.size()), u = std::max(1, s.ulysses);
    cand.rings[i] = s.ranks;
    cand.ulysses[i] = u;
    if (G == 1) {
      whole.push_back(i);
      continue;
    }
    // The ring as the step model costs it (ringCost): compute, all-to-alls.
    const double compute = splitRingCompute(s.len, cfg.causal, G, u, sh, c);
    const double a2a = u > 1 ? double(s.len) / G * qkvo * (u - 1) / u / linkBytesPerSec(Link::Intra, c) : 0;
    const double tokens = double(s.len) / G;
    for (int r : s.ranks) ld.add(r, compute + a2a + linPerToken * tokens, kAttnBackwardFlops * compute + a2a + 2 * linPerToken * tokens);
  }
  std::stable_sort(whole.begin(), whole.end(), [&](size_t a, size_t b) { return plan.seqs[a].len > plan.seqs[b].len; });
  std::set<std::pair<double, int>> byKey;
  for (int r = 0; r < n; ++r) byKey.insert({ld.key(r), r});
  for (size_t i : whole) {
    const int64_t len = plan.seqs[i].len;
    const double compute = attnComputeSeconds(attnFlops(len, cfg.causal, sh), double(len), c);
    const double f = compute + linPerToken * double(len), b = kAttnBackwardFlops * compute + 2 * linPerToken * double(len);
    int best = -1, k = 0;
    double bestStep = 0;
    for (auto it = byKey.begin(); it != byKey.end() && k < 256; ++it, ++k) {
      const int r = it->second;
      const double step = passes * std::max(ld.maxFwd, ld.fwd[size_t(r)] + f) + std::max(ld.maxBwd, ld.bwd[size_t(r)] + b);
      if (best < 0 || step < bestStep) best = r, bestStep = step;
    }
    byKey.erase({ld.key(best), best});
    ld.add(best, f, b);
    byKey.insert({ld.key(best), best});
    cand.rings[i] = {best};
  }
  cand.order = plan.order;
  if (std::all_of(cand.ulysses.begin(), cand.ulysses.end(), [](int u) { return u == 1; })) cand.ulysses.clear();
  return cand;
}

}  // namespace zp::sim
