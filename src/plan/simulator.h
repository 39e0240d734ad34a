// The cluster simulator: one layer's forward attention step of a batch on a
// modelled cluster (cost_model.h), for Zeppelin's plan and four baselines.
// What a step counts: attention compute plus the transfers it does not hide,
// on the busiest rank; for Zeppelin also the remap of q, k, v into the
// attention layout and of the output back (none of the baselines change
// layout). Linear layers are left out: every strategy but local packing
// keeps them token balanced, and packing balances tokens too.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "src/plan/cost_model.h"
#include "src/plan/plan.h"

namespace zp::plan {

struct StrategyResult {
  std::string name;        // zeppelin, ring, allgather, dynamic_cp, packing
  double stepSeconds = 0;  // busiest rank, remap included
  double remapSeconds = 0;  // part of stepSeconds: Zeppelin's remap in and out
  double attnImbalance = 1;  // max / mean of per-rank attention seconds
  double nicBytes = 0;     // over all NICs
  double intraBytes = 0;   // over intra-node links
};

// Zeppelin first, then ring, allgather, dynamic_cp, packing.
std::vector<StrategyResult> simulateStep(const std::vector<int64_t>& seqLens, bool causal,
                                         const AttnShape& shape, const ClusterModel& cluster);

// The batching rule: from a random start in `all` (wrapping), consecutive
// lengths, skipping any above the budget, until the next would not fit.
std::vector<int64_t> formBatch(const std::vector<int64_t>& all, int64_t budget,
                               std::mt19937_64& rng);

}  // namespace zp::plan
