// The step's lower bound `bound` (simulator.h): the whole-sequence bound
// `ideal` tightened by what the step model charges any placement that
// splits a sequence, for the sequences whose whole-sequence attention alone
// would make one rank slower than the mean. docs/simulator.md, "Results".
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "src/plan/planner.h"
#include "src/sim/step_model.h"

namespace zp::sim {

using namespace zp::plan;

namespace {

// The best kernel efficiency of any chunk of at most `chunk` query tokens:
// the efficiency table's running maximum (equal to the table itself where
// it grows with the chunk, as the presets' do). A ring's chunks are never
// longer than its sequence, so this bounds the efficiency of every split.
double bestEfficiencyUpTo(double chunk, const ClusterModel& c) {
  double e = attnEfficiencyAt(chunk, c);
  for (const auto& [len, eff] : c.attnEfficiency)
    if (len <= chunk) e = std::max(e, eff);
  return e;
}

// The Ulysses degrees a ring may split heads by: u ranks of a position in
// one node, u dividing both head counts (setHeadSplit's rule; the planner,
// hier_cp and usp_cp use divisors of the node's ranks among them).
std::vector<int> headDegrees(const ClusterModel& c, const AttnShape& sh) {
  std::vector<int> us;
  for (int u = 1; u <= std::max(1, c.ranksPerNode); ++u)
    if (sh.qHeads % u == 0 && sh.kvHeads % u == 0) us.push_back(u);
  return us;
}

}  // namespace

// Why this is a lower bound of the step of ANY placement the step model
// evaluates (evaluateCosted: rings of whole sequences over G = R * u ranks,
// R ring positions of u ranks each splitting heads u ways, u as
// headDegrees allows; all-gather groups; any linear layout holding every
// token once; a remap or none), feasible or not (memory is not used):
// 1. The step is the layers times the sum of the passes' times (passes
//    forward, one backward), and a pass takes at least what any one rank
//    spends in it: its linear layers plus, for each ring it is in, the
//    ring's compute and exposed time (waits and remaps only add). So a pass
//    takes at least the mean over ranks of that, and at least any one
//    rank's share of any one sequence.
// 2. A sequence of l tokens with forward FLOPs f on a ring of R positions
//    and head split u gives each of the G = R u ranks f / G FLOPs at the
//    efficiency of chunks of l / R tokens (ringCost; an all-gather group of
//    G ranks: chunks of l / G, as R = G, u = 1), so all its ranks together
//    compute f / eff(l / R) per forward (2.5 times that backward): at least
//    C(R) = f / (peak * best efficiency of a chunk up to l / R), which does
//    not fall as R grows. With u > 1 each rank also waits, every pass, for
//    Ulysses' all-to-alls of its l / G tokens (q, k, v, output; ringCost's
//    a2a, charged in full): l * beta_u over the ring's ranks, and on each
//    rank at least 2 (u - 1) intra-node latencies besides. Ring transfers
//    not hidden are at least 0.
// 3. Let t be the most any rank spends in the backward pass on one
//    sequence (its share, 2.5 C(R) / G plus the all-to-alls'). The backward
//    pass takes at least t, and at least the mean; the forward passes at
//    least their mean, which is at least `cst` / passes, the mean with
//    every sequence at its cheapest (whole). So the step / layers is at
//    least max(W(t), cst + t), W(t) = the least mean over ranks of all
//    passes' work when every sequence's share is at most t: each sequence
//    independently at its cheapest (R, u) with share <= t (the smallest
//    such R for each u, as C grows with R), plus the linear layers with
//    every token once. W falls as t grows, cst + t grows, so the least of
//    the two over all t is found by bisection, and cst + lo, with lo the
//    last t where W(t) > cst + t, is below the max at every t.
// With no sequence whose whole share exceeds the mean backward pass this is
// `ideal` (for an efficiency table that grows with the chunk); it is larger
// where a long sequence must be spread (costing efficiency at shorter
// chunks, or Ulysses' all-to-alls) or make one rank slower than the mean.
StrategyResult spreadBound(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c) {
  const int n = c.ranks();
  const ModelShape& m = cfg.model;
  const AttnShape& sh = m.attn;
  const double passes = cfg.recompute ? 2 : 1, peak = c.tflops * 1e12;
  const double linPerToken = linearFlopsPerToken(m) / (peak * cfg.linearEfficiency);
  const double qkvo = 2.0 * sh.headDim * sh.elemBytes * (double(sh.qHeads) + sh.kvHeads);  // 2q + 2kv bytes
  const std::vector<int> us = headDegrees(c, sh);
  double tokens = 0, whole = 0;
  std::vector<double> flops(lens.size()), cheapest(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    tokens += double(lens[i]);
    flops[i] = attnFlops(lens[i], cfg.causal, sh) / peak;
    cheapest[i] = flops[i] / bestEfficiencyUpTo(double(lens[i]), c);
    whole += cheapest[i];
  }
  const double linear = tokens / n * linPerToken;
  const double cst = passes * (whole / n + linear);
  const double atWhole = (passes + kAttnBackwardFlops) * whole / n + (passes + 2) * linear;
  // Sequences by their whole share, largest first: only those above t move.
  std::vector<size_t> order(lens.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cheapest[a] > cheapest[b]; });
  // The least work of sequence i (all passes, over all its ranks) with a
  // backward share of at most t; infinity if none.
  auto leastWork = [&](size_t i, double t) {
    const double l = double(lens[i]);
    double best = std::numeric_limits<double>::infinity();
    for (int u : us) {
      const double a2a = u > 1 ? l * qkvo * (u - 1) / u / linkBytesPerSec(Link::Intra, c) : 0;
      const double lat = u > 1 ? 2.0 * (u - 1) * c.intraLatency : 0;
      for (int R = 1; int64_t(R) * u <= n; ++R) {
        const double G = double(R) * u;
        if (G < 2) continue;
        const double C = flops[i] / bestEfficiencyUpTo(l / R, c);
        if ((kAttnBackwardFlops * C + a2a) / G + lat > t) continue;
        best = std::min(best, (passes + kAttnBackwardFlops) * C + (passes + 1) * a2a);
        break;  // a larger R costs at least as much
      }
    }
    return best;
  };
  auto W = [&](double t) {
    double extra = 0;
    for (size_t i : order) {
      if (kAttnBackwardFlops * cheapest[i] <= t) break;
      extra += leastWork(i, t) - (passes + kAttnBackwardFlops) * cheapest[i];
    }
    return atWhole + extra / n;
  };
  // W(t) >= atWhole = cst + lo at the start, and cst + t >= atWhole above it.
  double lo = std::max(0.0, atWhole - cst), hi = order.empty() ? 0 : kAttnBackwardFlops * cheapest[order[0]];
  if (hi > lo && W(lo) > cst + lo) {
    for (int it = 0; it < 50 && hi - lo > 1e-12 * hi; ++it) {
      const double mid = 0.5 * (lo + hi);
      (W(mid) > cst + mid ? lo : hi) = mid;
    }
  }
  StrategyResult r;
  r.name = "bound";
  // Slack for rounding: the step sums the same terms in another order.
  r.stepSeconds = m.layers * (cst + lo) * (1 - 1e-9);
  r.parts.linear = m.layers * (passes + 2) * linear;
  r.parts.attn = std::max(0.0, r.stepSeconds - r.parts.linear);
  r.peakMemoryBytes = stateBytesPerRank(cfg, n) + tokens / n * activationBytesPerToken(cfg);
  r.feasible = r.peakMemoryBytes <= cfg.memoryBytes * cfg.usableMemory;
  return r;
}

}  // namespace zp::sim
