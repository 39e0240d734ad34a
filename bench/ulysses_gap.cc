// Where Zeppelin loses to the Ulysses baselines (hier_cp, usp_cp:
// Transformer Engine's a2a+p2p, USP). Plans split heads now (Ulysses
// inside a node, SeqPlacement::ulysses) and take usp_cp's placement over,
// so this lists no batch where that works (docs/simulator.md, "Results").
// For every batch where Zeppelin is below 0.99x of hier_cp or usp_cp it
// prints that baseline's step, the step of Zeppelin's plan of its groups
// as rings with every head on every rank (what a plan could express before
// it could split heads), and the attention compute of both.
//
// ulysses_gap LENGTHS PRESET TOKENS_PER_RANK RANKS [SEEDS BATCHES]: the
// batches zpplan draws (seeds from 1, batches one after another from a
// random document), Llama-3-8B.
#include <cstdio>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include "src/sim/calibration.h"
#include "src/sim/simulator.h"
#include "src/sim/step_model.h"

using namespace zp;

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: ulysses_gap LENGTHS PRESET TOKENS_PER_RANK RANKS [SEEDS BATCHES]\n");
    return 2;
  }
  std::vector<int64_t> all;
  try {
    all = sim::readLengths(argv[1]);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ulysses_gap: %s\n", e.what());
    return 2;
  }
  sim::Calibration cal;
  const int64_t perRank = std::atoll(argv[3]);
  const int ranks = std::atoi(argv[4]), seeds = argc > 5 ? std::atoi(argv[5]) : 5, batches = argc > 6 ? std::atoi(argv[6]) : 16;
  if (!sim::calibrationPreset(argv[2], &cal) || perRank < 1 || ranks < 1 || seeds < 1 || batches < 1 ||
      ranks % cal.cluster.ranksPerNode) {
    std::fprintf(stderr, "ulysses_gap: an unknown preset or a bad count\n");
    return 2;
  }
  plan::ClusterModel c = cal.cluster;
  c.nodes = ranks / c.ranksPerNode;
  sim::StepConfig cfg;
  sim::modelPreset("llama-8b", &cfg.model);
  cfg.linearEfficiency = cal.linearEfficiency;
  cfg.memoryBytes = cal.memoryGiB * double(1 << 30);
  int below = 0, draws = 0;
  std::printf("seed batch seqs | zeppelin s (attn) | baseline g u s (attn) zp/base | its groups as rings: zeppelin's plan s\n");
  for (int s = 0; s < seeds; ++s) {
    std::mt19937_64 rng(uint64_t(1 + s));
    size_t next = rng() % all.size();
    for (int b = 0; b < batches; ++b, ++draws) {
      const std::vector<int64_t> lens = sim::nextBatch(all, perRank * ranks, &next);
      const std::vector<sim::StrategyResult> r = sim::simulateStep(lens, cfg, c);
      const sim::StrategyResult& zp = r[0];
      bool counted = false;
      for (const sim::Tuned& t : sim::tunedBaselines(lens, cfg, c)) {
        if ((t.result.name != "hier_cp" && t.result.name != "usp_cp") || !t.result.feasible ||
            zp.stepSeconds * 0.99 <= t.result.stepSeconds)
          continue;
        below += !counted;
        counted = true;
        // Its groups and packing, every head on every rank of the group.
        sim::Placement rings = t.placement;
        for (sim::Ring& ring : rings.rings) ring.ulysses = 1;
        plan::PlanOptions::Candidate cand;
        double asPlan = 0;
        if (sim::candidateOf(rings, lens.size(), c.ranksPerNode, 0, &cand)) {
          plan::BatchPlan p = plan::planFromRings(lens, cfg.causal, cand.rings, c.ranks(), c.ranksPerNode);
          plan::setOrder(&p, cand.order);
          asPlan = sim::simulatePlan(p, cfg, c).stepSeconds;
        }
        std::printf("%d %2d %4zu | %.3f (%.3f) | %s %d %d %.3f (%.3f) %.3fx | %.3f\n", s + 1, b, lens.size(),
                    zp.stepSeconds, zp.parts.attn, t.result.name.c_str(), t.result.group, t.result.ulysses,
                    t.result.stepSeconds, t.result.parts.attn, t.result.stepSeconds / zp.stepSeconds, asPlan);
      }
    }
  }
  std::printf("%d of %d batches below 0.99x of hier_cp or usp_cp\n", below, draws);
  return 0;
}
