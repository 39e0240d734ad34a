// The cluster simulator: one training step (forward and backward, every
// layer) of a variable-length batch on a modelled cluster (cost_model.h), for
// Zeppelin's plan, two variants of it, and the baselines a practitioner would
// run instead. docs/simulator.md describes the model and what it leaves out.
//
// A step, per layer: the linear part before attention (norm, QKV
// projection), attention, the linear part after it (output projection, MLP);
// the backward runs the same in reverse at twice the linear FLOPs and 2.5
// times the attention FLOPs; with full recomputation (the default: long
// sequences do not fit otherwise) each layer's forward runs again before its
// backward. Zeppelin adds the remap of q, k, v into the attention layout and
// of the output back (and of their gradients), an all-to-all every rank waits
// for. Attention is scheduled ring by ring (Zeppelin's in its plan's order,
// backward reversed): a ring starts when every rank of it is free, so ranks
// wait for each other (idle) as they would. The step is
// the layer time of the slowest rank times the number of layers (ranks meet
// at every layer: remaps and rings join them).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "src/plan/cost_model.h"
#include "src/plan/plan.h"

namespace zp::sim {

// The planner's types the simulator takes and returns.
using plan::AttnShape;
using plan::BatchPlan;
using plan::ClusterModel;

// The transformer whose step is simulated.
struct ModelShape {
  std::string name = "llama-8b";
  AttnShape attn;          // heads, head dimension, element bytes
  int hidden = 4096;
  int ffn = 14336;         // SwiGLU: gate, up and down projections
  int layers = 32;
  int64_t vocab = 128256;  // for the parameter count (memory) only
};
// Llama 3.2 3B, Llama 2 7B, Llama 3 8B, Llama 2 13B, LLaMA 30B (their
// published configurations); false for another name.
bool modelPreset(const std::string& name, ModelShape* out);
// The preset names, for messages.
const char* modelPresetNames();
// Forward FLOPs per token of one layer's linear parts (projections and MLP).
double linearFlopsPerToken(const ModelShape& m);
// Parameters of the whole model.
double modelParams(const ModelShape& m);

// What else a step depends on.
struct StepConfig {
  ModelShape model;
  bool causal = true;
  double linearEfficiency = 0.65;  // fraction of peak the projections and MLP reach
  double memoryBytes = 80.0 * (1 << 30);
  double usableMemory = 0.9;       // the rest: allocator, workspace, fragmentation
  bool recompute = true;           // full activation recomputation, layer by layer
  double stateBytesPerParam = 16;  // bf16 weights and gradients, fp32 master and Adam, sharded over all ranks
  bool nodeTokenBalance = true;    // the planner's option of that name (planner.h)
  bool legacyPlanner = false;      // the planner's `legacy` option, for comparison
  double planCap = 0;              // the planner's `onlyCap` option, for tests
  bool fitRings = true;            // the planner's `fitRings` option, for comparison
  bool jointFits = true;           // the planner's `jointFits` option, for comparison
  // The tuned baselines' placements among the plan's candidates (false: the
  // planner's own candidates only, for comparison and tests).
  bool baselineCandidates = true;
  // Zeppelin's plans may split heads (Ulysses inside a node, a ring across:
  // PlanOptions::headSplits, and usp_cp's placements among the candidates);
  // false: as before, for comparison and tests.
  bool headSplit = true;
  // Candidates that balance each pass (forward and backward) rather than
  // their sum, spreading long sequences over rings that split heads
  // (src/sim/balanced.cc); false: as before, for comparison and tests.
  bool balancedCandidates = true;
  // With balancedCandidates: the plan's whole sequences placed again the
  // same way where that is faster (src/sim/simulator.cc, rebalanceWhole);
  // false: not, for comparison and tests.
  bool rebalanceWhole = true;
};

// Bytes one rank needs: model states, stored activations of the tokens it
// holds for the linear layers, the working set of one layer, and what its
// attention holds on top (remapped copies, ring buffers, gathered K and V).
struct MemoryUse {
  double states = 0, activations = 0, attention = 0;
  double total() const { return states + activations + attention; }
};
double stateBytesPerRank(const StepConfig& cfg, int nranks);
// Stored bytes per token a rank holds in the linear layout (all layers plus
// one layer's working set).
double activationBytesPerToken(const StepConfig& cfg);
// Tokens a rank can hold for the linear layers within its usable memory,
// leaving the attention's extra buffers aside (the baselines size their
// groups by it; the check below is exact).
int64_t tokenCapacity(const StepConfig& cfg, int nranks);

// The mean over ranks of where a step's time goes; the parts add up to
// stepSeconds.
struct Breakdown {
  double attn = 0;    // attention kernels
  double comm = 0;    // ring or all-gather communication not hidden behind compute
  double remap = 0;   // Zeppelin's remaps
  double linear = 0;  // projections and MLP
  double idle = 0;    // waiting for other ranks
};

struct StrategyResult {
  std::string name;        // see strategyNames()
  bool baseline = false;   // a competitor (counted for the best feasible baseline)
  bool reference = false;  // shown for reference only (ring over all ranks)
  double stepSeconds = 0;  // forward and backward, every layer
  Breakdown parts;
  double remapSeconds = 0;   // = parts.remap
  double attnImbalance = 1;  // max / mean of per-rank attention time (compute and exposed communication)
  double linearImbalance = 1;  // max / mean of per-rank linear tokens
  double peakMemoryBytes = 0;  // the fullest rank
  bool feasible = true;        // peakMemoryBytes within the usable memory
  int group = 0;               // group size chosen (dp_cp, allgather_cp, hier_cp, usp_cp), else 0
  int ulysses = 0;             // Ulysses degree chosen (hier_cp, usp_cp; 1: none); Zeppelin's: its plan's largest head split
  int64_t limitTokens = 0;     // length split above, chosen (dynamic_cp, hybrid_dp), else 0
  double nicBytes = 0;         // one layer's forward, over all NICs
  double intraBytes = 0;       // the same over intra-node links
};

// zeppelin, zeppelin_noremap, zeppelin_intranode, zeppelin_noroute,
// dp_cp, allgather_cp, dynamic_cp, hybrid_dp, hier_cp, usp_cp, ring_all,
// ideal, bound: the order of simulateStep's results. ring_all, ideal (the
// whole-sequence bound: linear layers token-balanced, attention balanced at
// whole-sequence kernel efficiency, no communication, remap or idle) and
// bound (the lower bound: ideal tightened by what spreading a long sequence
// costs, below the step of any placement the step model evaluates;
// src/sim/bound.cc) are references, never a baseline.
const std::vector<std::string>& strategyNames();

// The plan of the "zeppelin" strategy: planBatch with this step model
// ranking its candidates (planner.h, PlanOptions::score).
BatchPlan planForStep(const std::vector<int64_t>& seqLens, const StepConfig& cfg, const ClusterModel& cluster);

// The step of a given plan, its rings run in the plan's order; with the
// remap unless `remap` is false or the plan's linear layout is its
// attention layout.
StrategyResult simulatePlan(const BatchPlan& plan, const StepConfig& cfg, const ClusterModel& cluster,
                            bool remap = true);

std::vector<StrategyResult> simulateStep(const std::vector<int64_t>& seqLens, const StepConfig& cfg,
                                         const ClusterModel& cluster);

// The batching rule: consecutive lengths of `all` from *next (wrapping)
// until the next would not fit, and *next moved past them; a length above
// the budget is a batch of its own (planned over as many ranks as it needs),
// never skipped. So batch after batch plans every token of `all`.
std::vector<int64_t> nextBatch(const std::vector<int64_t>& all, int64_t budget, size_t* next);
// The sequence lengths of a file: whitespace-separated integers from 1 to
// 2^40 (one per line in the project's files). Throws std::invalid_argument
// naming the file, the line and the word for anything else, and for a file
// that cannot be read or holds no lengths. The one reader of zpplan, the
// benchmarks and the tests.
std::vector<int64_t> readLengths(const std::string& file);
// nextBatch from a random start.
std::vector<int64_t> formBatch(const std::vector<int64_t>& all, int64_t budget,
                               std::mt19937_64& rng);

}  // namespace zp::sim
