// The hierarchical partition planner (docs/design.md, ideas 1 and 3): turns a
// batch's sequence lengths into a BatchPlan (plan.h). Deterministic and
// local: every rank computes the same plan from the same input.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/plan/cost_model.h"
#include "src/plan/plan.h"

namespace zp::plan {

// What a caller may restrict (the simulator's variants use them).
struct PlanOptions {
  // Rings span at most this many nodes (0: any; 1: every ring inside a node).
  int maxRingNodes = 0;
  // Whole sequences go to nodes that have room under their share of the
  // batch's tokens, so the remap stays inside nodes where it can.
  bool nodeTokenBalance = true;
  // Forward passes per step: 2 with full recomputation. Weighs the
  // planner's own model of a candidate (attention makespans and remaps).
  int forwardPasses = 2;
  // Seconds of the linear layers per token and forward pass, if known: DP x
  // CP candidates weigh their groups' tokens by it.
  double linearSecondsPerToken = 0;
  // A step model: when set, candidates are ranked by it instead of the
  // planner's own model, and a plan may keep the linear layers on the
  // attention layout (linear == attention: the remap moves nothing). It is
  // asked about a plan once and answers for it as it is (remapped) and with
  // the linear layers on the attention layout (flat: the plan's linear
  // layout is to be taken as its attention layout, so the planner need not
  // copy it; one call, so that a model can share what both take). The
  // plan's linear layout is not built (BatchPlan::linear: remapSeconds and
  // balancedTokens cost it as built). The
  // simulator passes its full step (src/sim/simulator.h). Memory is a
  // constraint, not a cost: a plan that fits beats every plan that does
  // not, whatever their seconds, and a candidate over memory does not count
  // among the few of its kind scored in full (the next one is scored).
  struct Score {
    double seconds = 0;
    bool fits = true;
  };
  struct Scores {
    Score remapped, flat;
  };
  // sameLayouts: the plan differs from the one scored last only in its
  // head splits (a variant, headSplits), so that what a model makes of its
  // layouts alone (the remap) may be reused.
  std::function<Scores(const BatchPlan&, bool sameLayouts)> score;
  // Placements the caller wants scored in full whatever the screening keeps:
  // each sequence's ring (in ring order) and the order attention runs in
  // (every sequence once). The simulator passes the tuned baselines'
  // placements that a plan can express, so that no batch's plan is slower
  // than any of them by the step model (docs/simulator.md). Ignored with
  // onlyCap and legacy.
  // ulysses: each sequence's head split (SeqPlacement::ulysses; empty: none).
  struct Candidate {
    std::vector<std::vector<int>> rings;
    std::vector<int64_t> order;
    std::vector<int> ulysses;
  };
  std::vector<Candidate> candidates;
  // Placements the caller makes only once the planner's own candidates are
  // scored: called once, with the best score so far, it returns those that
  // could still beat it (a caller with a lower bound of a placement's score
  // need not make one that cannot), scored in full like `candidates`. The
  // simulator tunes its baselines here (docs/simulator.md). Ignored with
  // onlyCap and legacy.
  std::function<std::vector<Candidate>(const Score& bestSoFar)> lateCandidates;
  // With `score`, if set: a lower bound of score, either way, for any plan
  // whose rank r computes attention for at least attnForward[r] seconds in
  // a forward pass (over the rank's sequences, a ring's size times its
  // ringStep compute) and holds at least attnTokens[r] tokens for it. A
  // candidate that cannot beat the best one so far by it is not built.
  std::function<double(const std::vector<double>& attnForward, const std::vector<double>& attnTokens)> scoreBound;
  // With `score`: head-split degrees (headSplitDegrees) the planner also
  // tries on every plan it scores in full (splitHeadsBy: each ring's heads
  // split by the largest of its divisors the ring allows), keeping a variant
  // that scores better; a caller's candidate (`candidates`,
  // `lateCandidates`) is scored as it is, with the splits it names. Empty: no plan splits heads (the C API's: the attention
  // driver does not run head splits).
  std::vector<int> headSplits;
  // The planner before idle-aware scheduling: loads summed per rank, the cap
  // halved until their max/mean is within 2%, rings ordered by class and
  // size. For comparison only.
  bool legacy = false;
  // Also the candidates whose rings are sized to the time left where they
  // land (scheduleToTarget); false: caps and DP x CP groups only, as the
  // planner was before them. For comparison.
  bool fitRings = true;
  // With fitRings and a step model: also the joint candidates, rings sized
  // with each sequence's linear layers in its time, for a plan without a
  // remap (docs/planner.md). false: as the planner was before them. For
  // comparison.
  bool jointFits = true;
  // > 0: the splits of this one cap (a fraction of the mean attention load
  // per rank) and no other candidate. For tests and comparisons.
  double onlyCap = 0;
};

// Throws std::invalid_argument with a message naming the first problem
// (empty batch, a length below 1, a cluster without ranks or rates).
BatchPlan planBatch(const std::vector<int64_t>& seqLens, bool causal, const AttnShape& shape,
                    const ClusterModel& cluster, const PlanOptions& options = PlanOptions());

// The plan for rings the caller chose: sequence i on rings[i] (in ring
// order), chunked as plan.h says; a ring leaving its first rank's node (of
// ranksPerNode ranks; < 1: one node) is an inter-node ring. Its linear
// layout is balancedLinear's, or with `linear` false not built (the
// planner's candidates: BatchPlan::linear). Throws std::invalid_argument
// naming the first bad sequence.
BatchPlan planFromRings(const std::vector<int64_t>& seqLens, bool causal, std::vector<std::vector<int>> rings,
                        int nranks, int ranksPerNode, bool linear = true);

// The token-balanced linear layout of an attention layout (as planFromRings
// builds it): every rank within one token of the mean (balancedTokens),
// keeping the front of its attention tokens up to its share so that those
// do not move; the surplus fills the ranks that are short, from their own
// node (of ranksPerNode ranks) first, ranks in order.
Layout balancedLinear(const Layout& attention, int ranksPerNode);
// Each rank's tokens in it: the first total % n ranks one more.
std::vector<int64_t> balancedTokens(const Layout& attention);
// The pieces it moves, without building it: rank `to` takes `seg` from
// attention rank `from` (each piece lies inside one attention segment of
// that rank); by `to`, each rank's in the order of its linear segments.
// tokens, if the caller has them: each rank's tokens in the attention
// layout (rankTokens), so that only the segments past a rank's share are
// read (a DP x CP plan has millions).
struct BalancedMove {
  int to, from;
  Segment seg;
};
std::vector<BalancedMove> balancedMoves(const Layout& attention, int ranksPerNode,
                                        const std::vector<int64_t>* tokens = nullptr);
// Builds a plan's linear layout (balancedLinear) if it is not built (and
// the plan does not keep the linear layers on its attention layout).
void buildLinear(BatchPlan* plan, int ranksPerNode);

// Head splits (SeqPlacement::ulysses). The degrees a plan may split heads
// by: every u > 1 dividing the node's ranks and both head counts.
std::vector<int> headSplitDegrees(int ranksPerNode, const AttnShape& shape);
// Whether a ring (its ranks in ring order) can split heads u ways: u >= 1
// divides its size and each u consecutive ranks of it are in one node.
bool canSplitHeads(const std::vector<int>& ranks, int u, int ranksPerNode);
// Sets sequence i's head split to ulysses[i]. Throws std::invalid_argument
// naming the first sequence whose ring cannot split its heads so (or whose
// split does not divide both head counts), the plan unchanged. A plan that
// splits heads has no planned makespans (0): the planner's own model does
// not cost Ulysses, the simulator's step model does.
void setHeadSplit(BatchPlan* plan, const std::vector<int>& ulysses, int ranksPerNode, const AttnShape& shape);
// Splits every ring's heads by the largest divisor of u (u from
// headSplitDegrees, or 1: none) that the ring allows; returns whether any
// ring's heads are split. The planned makespans are left to the caller.
bool splitHeadsBy(BatchPlan* plan, int u, int ranksPerNode);
// A rank's attention compute (forward seconds) for a sequence on a ring of
// G ranks with its heads split u ways: the G / u steps of the ring over the
// positions, 1/u of the heads each (as the step model charges it). The
// planner's lower bounds take it; u = 1 is G * ringStep(G).compute.
double splitRingCompute(int64_t len, bool causal, int G, int u, const AttnShape& shape, const ClusterModel& c);

// Replaces the plan's order (plan.h) with `order`. Throws
// std::invalid_argument unless it names every sequence exactly once.
void setOrder(BatchPlan* plan, const std::vector<int64_t>& order);

// Reorders a plan as the simulator and the attention driver ran plans before
// plans carried an order (and as the legacy planner orders them): inter-node
// rings, intra-node rings, whole sequences; larger rings, then longer
// sequences first.
void orderByClassAndSize(BatchPlan* plan);

// The link a ring of this class runs on: Zeppelin's inter-node link across
// nodes, else the node's own links.
inline Link linkOf(SeqClass cls, const ClusterModel& c) {
  return cls == SeqClass::InterNode ? zeppelinInterLink(c) : Link::Intra;
}

// The attention makespan of a plan run in its order, forward (or, with
// `backward`, in the reverse order, backward): a ring starts when the last of
// its ranks is free and all of them finish together. It and
// rankAttnSeconds throw std::invalid_argument for a plan that splits heads
// (the step model of src/sim costs those).
double attnMakespan(const BatchPlan& plan, const AttnShape& shape, const ClusterModel& cluster,
                    bool backward = false);

// Modelled attention seconds of every rank under a plan (exposed
// communication included, see cost_model.h).
std::vector<double> rankAttnSeconds(const BatchPlan& plan, const AttnShape& shape,
                                    const ClusterModel& cluster);

// The remap between a plan's linear and attention layouts, modelled: the
// busiest rank's seconds to move q, k and v in (inBytesPerToken per moved
// token) and the output back (outBytesPerToken), and the bytes of both that
// cross nodes and that stay inside them. With routing (routeEfficiency > 0)
// what crosses nodes may go over all of its node's NICs, as the router
// sends the remap's alltoallv (docs/planner.md, the cost model). A sequence's attention segments
// must not overlap (as in every plan planFromRings makes). A plan whose
// linear layout is not built (BatchPlan::linear) is costed for
// balancedLinear's, from its moves, the same figures to the bit
// (attnTokens, if the caller has them: rankTokens of its attention layout,
// for balancedMoves).
struct RemapSeconds {
  double in = 0, out = 0;
  double nicBytes = 0, intraBytes = 0;
};
RemapSeconds remapSeconds(const BatchPlan& plan, const ClusterModel& cluster, double inBytesPerToken,
                          double outBytesPerToken, const std::vector<int64_t>* attnTokens = nullptr);

// max / mean of a per-rank quantity (1 when all are zero).
double imbalance(const std::vector<double>& perRank);

// Tokens each rank holds in a layout.
std::vector<int64_t> rankTokens(const Layout& layout);

}  // namespace zp::plan
