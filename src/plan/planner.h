// The hierarchical partition planner (docs/design.md, ideas 1 and 3): turns a
// batch's sequence lengths into a BatchPlan (plan.h). Deterministic and
// local: every rank computes the same plan from the same input.
#pragma once

#include <cstdint>
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
};

// Throws std::invalid_argument with a message naming the first problem
// (empty batch, a length below 1, a cluster without ranks or rates).
BatchPlan planBatch(const std::vector<int64_t>& seqLens, bool causal, const AttnShape& shape,
                    const ClusterModel& cluster, const PlanOptions& options = PlanOptions());

// The plan for rings the caller chose: sequence i on rings[i] (in ring
// order), chunked as plan.h says; a ring leaving its first rank's node (of
// ranksPerNode ranks; < 1: one node) is an inter-node ring. Throws
// std::invalid_argument naming the first bad sequence.
BatchPlan planFromRings(const std::vector<int64_t>& seqLens, bool causal, const std::vector<std::vector<int>>& rings,
                        int nranks, int ranksPerNode);

// Replaces the plan's order (plan.h) with `order`. Throws
// std::invalid_argument unless it names every sequence exactly once.
void setOrder(BatchPlan* plan, const std::vector<int64_t>& order);

// Modelled attention seconds of every rank under a plan (exposed
// communication included, see cost_model.h).
std::vector<double> rankAttnSeconds(const BatchPlan& plan, const AttnShape& shape,
                                    const ClusterModel& cluster);

// max / mean of a per-rank quantity (1 when all are zero).
double imbalance(const std::vector<double>& perRank);

// Tokens each rank holds in a layout.
std::vector<int64_t> rankTokens(const Layout& layout);

}  // namespace zp::plan
