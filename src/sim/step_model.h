// Internal to the simulator (src/sim): a strategy's placement of one batch,
// the step model that times it (simulator.cc), and the baselines that make
// placements (baselines.cc). simulator.h is the interface.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "src/plan/planner.h"
#include "src/sim/simulator.h"

namespace zp::sim {

using plan::Link;

// One ring of attention: the sequences it carries together (one packed
// ring, as Transformer Engine runs a packed batch; Zeppelin's rings carry one
// sequence), its ranks in ring order and its link; or an all-gather group
// (K and V gathered from the group, the rank's share of the queries).
struct Ring {
  std::vector<int64_t> lens;
  std::vector<int> ranks;
  Link link = Link::Intra;
  bool allgather = false;
  std::vector<int64_t> seqs;  // the sequences' ids (lens[k] is sequence seqs[k]'s length)
  // > 1: Ulysses inside each ring position of this many consecutive ranks
  // (one node's), heads split among them, the ring over G / ulysses
  // positions (hierarchical context parallelism, USP).
  int ulysses = 1;
};

// A strategy's placement of one batch.
struct Placement {
  std::vector<Ring> rings;          // in the order they run forward
  std::vector<double> linTokens;    // per rank, linear layout
  std::vector<double> attnTokens;   // per rank, attention layout
  bool remap = false;
  double remapIn = 0, remapOut = 0;  // seconds of one forward remap phase (q, k, v in; output back)
  double remapNic = 0, remapIntra = 0;  // bytes of both
  bool infeasibleAssignment = false;    // the baseline could not keep within its token capacity
};

// Seconds a rank of a ring spends on it in one pass of a layer.
struct Cost {
  double compute = 0, exposed = 0;
  double total() const { return compute + exposed; }
};
// What a placement's step takes from its rings alone, whatever its linear
// layout and remap: each ring's seconds forward and backward and the bytes
// each of its ranks holds for it (held: 0 for a ring of one rank), each
// rank's most held (extra), and the rings' bytes on NICs and intra-node
// links (left 0 without `traffic`: the step's seconds and memory do not
// take them). The step model's score of a plan (PlanScorer) asks for the
// same rings with and without the remap, and makes these once.
// The rings' ranks are kept here too, one array for all (ring i's are
// ranks[firstRank[i] .. firstRank[i + 1]]): a step runs every ring three
// times and the step model scores each placement twice, and the rings'
// own vectors, one allocation each, are scattered in memory.
struct RingCosts {
  std::vector<Cost> fwd, bwd;
  std::vector<double> held;
  std::vector<int> ranks;
  std::vector<size_t> firstRank;
  std::vector<double> extra;
  double nicBytes = 0, intraBytes = 0;
};
RingCosts ringCosts(const Placement& pl, const StepConfig& cfg, const ClusterModel& c, bool traffic = true);
// evaluate() with the rings' costs made (ringCosts of the same rings). With
// `stepOnly`, only stepSeconds, the memory and feasible are set (the
// planner's score reads no more; the parts are left at zero).
StrategyResult evaluateCosted(const std::string& name, const Placement& pl, const StepConfig& cfg,
                              const ClusterModel& c, const RingCosts& costs, bool stepOnly = false);

// The step model's score of the planner's candidates (PlanOptions::score):
// a plan as it runs, remapped (unless `remap` is false or the plan keeps
// the linear layers on its attention layout), and with the linear layers on
// its attention layout (flat). A head-split variant of the plan scored last
// (sameLayouts) takes that plan's layouts (tokens and remap); and when the
// last plan scored without sameLayouts split no heads, also its rings and
// their costs, costing again only the rings the variant splits (a variant
// splits a ring's sequences alike: splitHeadsBy), the same figures as
// scoring the variant afresh.
class PlanScorer {
 public:
  PlanScorer(const StepConfig& cfg, const ClusterModel& c, bool remap) : cfg_(cfg), c_(c), remap_(remap) {}
  plan::PlanOptions::Scores operator()(const plan::BatchPlan& p, bool sameLayouts);

 private:
  bool variantCosts(const plan::BatchPlan& p);
  plan::PlanOptions::Scores scores(const RingCosts& costs);

  const StepConfig& cfg_;
  const ClusterModel& c_;
  bool remap_;
  Placement pl_;            // the plan scored last without sameLayouts: its layouts and rings
  RingCosts costs_;         // of pl_'s rings
  bool unsplit_ = false;    // pl_'s rings split no heads
  size_t seqs_ = 0;         // pl_'s plan's sequences
  RingCosts variant_;       // a variant's costs of the same rings
  std::vector<Ring> spare_;  // rings of plans scored before, their vectors' room kept (addRings)
};

// Simulates a placement: one layer scheduled forward, (recomputed forward,)
// backward; per-rank parts times the layers.
StrategyResult evaluate(const std::string& name, const Placement& pl, const StepConfig& cfg, const ClusterModel& c);
// Seconds of the linear layers' forward for that many tokens.
double linearSeconds(int64_t tokens, const StepConfig& cfg, const ClusterModel& c);

// A baseline tuned for the batch (its group size or split length chosen by
// this step model) and the placement it runs.
struct Tuned {
  StrategyResult result;
  Placement placement;
};
constexpr double kNoBound = std::numeric_limits<double>::infinity();
// dp_cp, allgather_cp, dynamic_cp, hybrid_dp, hier_cp, usp_cp: every
// baseline, tuned, in strategyNames() order; with `expressible`, only those
// a plan can express (dp_cp, dynamic_cp, hybrid_dp: rings of whole
// sequences; with cfg.headSplit also usp_cp, whose settings include
// hier_cp's: the planner's candidates). With `beat`: a setting (group size,
// Ulysses degree, split length) of dp_cp, usp_cp, dynamic_cp or hybrid_dp whose lower bound of the
// step (any placement of its ring sizes, Zeppelin's plan of it included) is
// at least `beat` is not made, and a baseline none of whose settings is
// made is left out: each one returned is the best of the settings made,
// which is its tuned setting whenever that could be faster than `beat`.
std::vector<Tuned> tunedBaselines(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c,
                                  bool expressible = false, double beat = kNoBound);
// A result beats the best so far: feasible first, then faster.
inline bool fasterFeasible(const StrategyResult& r, const StrategyResult& best) {
  return (r.feasible && !best.feasible) || (r.feasible == best.feasible && r.stepSeconds < best.stepSeconds);
}
// Transformer Engine's ring over all ranks: a reference, not a competitor.
StrategyResult ringAll(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c);
// The lower bound "bound" (bound.cc, which says why it is one): `ideal`
// tightened by what spreading a long sequence over several ranks costs, for
// the sequences that would otherwise make one rank slower than the mean.
StrategyResult spreadBound(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c);
// Zeppelin's candidates that balance each pass, not only their sum
// (balanced.cc): for targets of a half, three quarters and all of the mean
// backward pass per rank, with every head on every rank and (with
// cfg.headSplit) with rings that may split heads; rings inside a node where
// maxRingNodes is 1; none for a batch of over kBalancedMaxSeqs sequences.
// Those whose step is at least `beat` by a lower bound
// (every pass takes at least any rank's compute, all-to-alls and linear
// layers) are left out: they cannot beat a plan of that step.
constexpr size_t kBalancedMaxSeqs = 4000;  // none for batches of more sequences
std::vector<plan::PlanOptions::Candidate> balancedCandidates(const std::vector<int64_t>& lens, const StepConfig& cfg,
                                                             const ClusterModel& c, int maxRingNodes,
                                                             double beat = kNoBound);
// A plan's rings over several ranks kept, its whole sequences placed again
// as balancedCandidates places them (each, longest first, on the rank of
// the 256 least loaded that adds least to passes x max forward + max
// backward), in the plan's order: its per-pass imbalance reduced where
// the whole sequences allow.
plan::PlanOptions::Candidate wholeRebalanced(const plan::BatchPlan& plan, const StepConfig& cfg,
                                             const ClusterModel& c);
// A baseline's placement as a plan's candidate (PlanOptions::Candidate):
// false when a plan cannot express it (all-gather), or when its rings leave
// a node and maxRingNodes is 1. Head splits (Ring::ulysses) are named in
// the candidate's ulysses only when some ring has one.
bool candidateOf(const Placement& pl, size_t seqs, int ranksPerNode, int maxRingNodes,
                 plan::PlanOptions::Candidate* out);

}  // namespace zp::sim
