// Head splits of a plan's rings (SeqPlacement::ulysses, planner.h): Ulysses
// inside each ring position of u ranks of one node, a ring over the
// positions. The layout does not change (plan.h), so a split is a number per
// sequence, checked here; the simulator's step model costs it as it costs
// the hier_cp and usp_cp baselines (src/sim/simulator.cc, ringCost).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "src/plan/planner.h"

namespace zp::plan {

std::vector<int> headSplitDegrees(int ranksPerNode, const AttnShape& shape) {
  std::vector<int> out;
  for (int u = 2; u <= ranksPerNode; ++u)
    if (ranksPerNode % u == 0 && shape.qHeads % u == 0 && shape.kvHeads % u == 0) out.push_back(u);
  return out;
}

bool canSplitHeads(const std::vector<int>& ranks, int u, int ranksPerNode) {
  if (u < 1 || ranks.size() % size_t(u) != 0) return false;
  if (ranksPerNode < 1) return true;  // one node
  // Each position's ranks in the first one's node: the ranks r with
  // r / ranksPerNode == q, a range compared against rather than a division
  // per rank (a usp_cp candidate names every rank of its group for every
  // sequence). Division truncates: node 0 holds -(rpn - 1) .. rpn - 1.
  const int64_t rpn = ranksPerNode;
  for (size_t p = 0; p < ranks.size(); p += size_t(u)) {
    const int64_t q = ranks[p] / ranksPerNode;
    const int64_t lo = q > 0 ? q * rpn : q * rpn - (rpn - 1), hi = q < 0 ? q * rpn : q * rpn + (rpn - 1);
    for (size_t j = p + 1; j < p + size_t(u); ++j)
      if (ranks[j] < lo || ranks[j] > hi) return false;
  }
  return true;
}

void setHeadSplit(BatchPlan* plan, const std::vector<int>& ulysses, int ranksPerNode, const AttnShape& shape) {
  if (ulysses.size() != plan->seqs.size())
    throw std::invalid_argument("setHeadSplit: " + std::to_string(ulysses.size()) + " head splits for " +
                                std::to_string(plan->seqs.size()) + " sequences");
  bool any = false;
  for (size_t i = 0; i < ulysses.size(); ++i) {
    const int u = ulysses[i];
    const std::vector<int>& ranks = plan->seqs[i].ranks;
    if (u < 1 || shape.qHeads % u != 0 || shape.kvHeads % u != 0 || !canSplitHeads(ranks, u, ranksPerNode))
      throw std::invalid_argument("setHeadSplit: sequence " + std::to_string(i) + ": its ring of " +
                                  std::to_string(ranks.size()) + " ranks cannot split " +
                                  std::to_string(shape.qHeads) + "/" + std::to_string(shape.kvHeads) +
                                  " heads " + std::to_string(u) +
                                  " ways (u must divide the ring, both head counts, and each u consecutive "
                                  "ranks of the ring must be in one node)");
    any = any || u > 1;
  }
  for (size_t i = 0; i < ulysses.size(); ++i) plan->seqs[i].ulysses = ulysses[i];
  if (any) plan->plannedForward = plan->plannedBackward = 0;
}

bool splitHeadsBy(BatchPlan* plan, int u, int ranksPerNode) {
  bool any = false;
  for (SeqPlacement& s : plan->seqs) {
    int d = s.ranks.size() > 1 ? u : 1;
    // The largest divisor of u the ring allows (u's divisors divide
    // whatever u divides: the node's ranks and the head counts).
    while (d > 1 && (u % d != 0 || !canSplitHeads(s.ranks, d, ranksPerNode))) --d;
    s.ulysses = d;
    any = any || d > 1;
  }
  return any;
}

double splitRingCompute(int64_t len, bool causal, int G, int u, const AttnShape& shape, const ClusterModel& c) {
  const int R = G / u;
  return R * ringStepCompute(len, causal, R, shape, c) / u;
}

}  // namespace zp::plan
