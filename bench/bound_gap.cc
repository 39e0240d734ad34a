// bound_gap: where Zeppelin's step stands against the lower bound `bound`
// (src/sim/bound.cc), batch by batch, in three parts that the step model
// adds up: the plan's own work (each rank's attention compute at its
// rings' chunks and its linear layers, as the mean over ranks: what the
// plan would take perfectly balanced, with no waits or transfers), the
// passes' slowest ranks (passes x the slowest forward + the slowest
// backward, from the same per-rank loads), and the step (waits, exposed
// transfers, Ulysses' all-to-alls and remaps on top). Prints the medians of
// bound / mean work, mean work / slowest ranks, slowest ranks / step and
// bound / step over the batches zpplan draws (seeds from 1, batches one
// after another from a random document).
//
// bound_gap LENGTHS PRESET TOKENS_PER_RANK RANKS [MODEL SEEDS BATCHES]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "src/plan/planner.h"
#include "src/sim/calibration.h"
#include "src/sim/simulator.h"
#include "src/sim/step_model.h"

using namespace zp;
using zpbench::median;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: bound_gap LENGTHS PRESET TOKENS_PER_RANK RANKS [MODEL SEEDS BATCHES]\n");
    return 2;
  }
  std::vector<int64_t> all;
  try {
    all = sim::readLengths(argv[1]);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bound_gap: %s\n", e.what());
    return 2;
  }
  sim::Calibration cal;
  sim::StepConfig cfg;
  const int64_t perRank = std::atoll(argv[3]);
  const int ranks = std::atoi(argv[4]), seeds = argc > 6 ? std::atoi(argv[6]) : 5, batches = argc > 7 ? std::atoi(argv[7]) : 16;
  if (!sim::calibrationPreset(argv[2], &cal) || !sim::modelPreset(argc > 5 ? argv[5] : "llama-8b", &cfg.model) ||
      perRank < 1 || ranks < 1 || seeds < 1 || batches < 1 || ranks % cal.cluster.ranksPerNode) {
    std::fprintf(stderr, "bound_gap: an unknown preset or model, or a bad count\n");
    return 2;
  }
  plan::ClusterModel c = cal.cluster;
  c.nodes = ranks / c.ranksPerNode;
  cfg.linearEfficiency = cal.linearEfficiency;
  cfg.memoryBytes = cal.memoryGiB * double(1 << 30);
  const double perToken = sim::linearSeconds(1, cfg, c), passes = cfg.recompute ? 2 : 1, layers = cfg.model.layers;
  std::vector<double> ofMean, meanOfMax, maxOfStep, ofStep;
  for (int s = 0; s < seeds; ++s) {
    std::mt19937_64 rng(uint64_t(1 + s));
    size_t next = rng() % all.size();
    for (int b = 0; b < batches; ++b) {
      const std::vector<int64_t> lens = sim::nextBatch(all, perRank * ranks, &next);
      const plan::BatchPlan p = sim::planForStep(lens, cfg, c);
      const double step = sim::simulatePlan(p, cfg, c).stepSeconds;
      const double bound = sim::spreadBound(lens, cfg, c).stepSeconds;
      std::vector<double> attn(size_t(ranks), 0.0);
      for (const plan::SeqPlacement& sp : p.seqs) {
        const int G = int(sp.ranks.size()), u = std::max(1, sp.ulysses), R = G / u;
        const double compute = R * plan::ringStep(sp.len, cfg.causal, R, plan::Link::Intra, cfg.model.attn, c).compute / u;
        for (int r : sp.ranks) attn[size_t(r)] += compute;
      }
      const std::vector<int64_t> lin = plan::rankTokens(plan::linearLayout(p));
      double fwd = 0, bwd = 0, sumAttn = 0, sumLin = 0;
      for (int r = 0; r < ranks; ++r) {
        fwd = std::max(fwd, attn[size_t(r)] + perToken * lin[size_t(r)]);
        bwd = std::max(bwd, plan::kAttnBackwardFlops * attn[size_t(r)] + 2 * perToken * lin[size_t(r)]);
        sumAttn += attn[size_t(r)];
        sumLin += perToken * lin[size_t(r)];
      }
      const double mean = layers * (passes * (sumAttn + sumLin) + plan::kAttnBackwardFlops * sumAttn + 2 * sumLin) / ranks;
      const double slowest = layers * (passes * fwd + bwd);
      ofMean.push_back(bound / mean);
      meanOfMax.push_back(mean / slowest);
      maxOfStep.push_back(slowest / step);
      ofStep.push_back(bound / step);
    }
  }
  std::printf("%zu batches, medians: bound / mean work %.4f, mean work / slowest ranks %.4f, slowest ranks / step %.4f; bound / step %.4f\n",
              ofStep.size(), median(ofMean), median(meanOfMax), median(maxOfStep), median(ofStep));
  return 0;
}
