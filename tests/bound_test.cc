// The step's lower bound `bound` (src/sim/bound.cc): on fresh random batches
// (several length distributions, presets, models, rank counts and token
// budgets) no strategy's step is below it, Zeppelin's variants and every
// baseline, feasible or not; nor is the step of a random placement (rings of
// random sizes, head splits and links, packed or not, remapped or not) that
// no planner made. And it is never below the whole-sequence bound `ideal`,
// and above it where a long sequence must be spread.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "src/plan/planner.h"
#include "src/sim/calibration.h"
#include "src/sim/simulator.h"
#include "src/sim/step_model.h"
#include "tests/harness.h"
#include "tests/sim_fixtures.h"

namespace zp::sim {
namespace {

using plan::ClusterModel;

const StrategyResult& named(const std::vector<StrategyResult>& r, const std::string& name) {
  for (const auto& s : r)
    if (s.name == name) return s;
  throw std::runtime_error("no strategy " + name);
}

// One random step: machine, model, ranks, budget.
struct StepSetup {
  ClusterModel c;
  StepConfig cfg;
  int64_t perRank = 0;
  std::string what;
};

StepSetup randomSetup(std::mt19937_64& rng) {
  const char* presets[] = {"a800", "h800", "h200"};
  const char* models[] = {"llama-8b", "llama-30b", "llama-3b", "llama-7b"};
  const int ranks[] = {16, 32, 64};
  const int64_t perRank[] = {4096, 16384, 65536};
  StepSetup s;
  const char* preset = presets[rng() % 3];
  const int n = ranks[rng() % 3];
  s.cfg = zptest::presetStep(preset, &s.c, n);
  const char* model = models[rng() % 4];
  modelPreset(model, &s.cfg.model);
  s.cfg.recompute = rng() % 4 != 0;
  s.cfg.causal = rng() % 5 != 0;
  s.perRank = perRank[rng() % 3];
  s.what = std::string(preset) + " " + model + " " + std::to_string(n) + " ranks " + std::to_string(s.perRank) +
           " tokens/rank" + (s.cfg.recompute ? "" : " no-recompute") + (s.cfg.causal ? "" : " full");
  return s;
}

// A batch of `budget` tokens from one of several length distributions.
std::vector<int64_t> randomBatch(int64_t budget, std::mt19937_64& rng, std::string* what) {
  static const std::vector<int64_t> prolong = zptest::lengthsOf("prolong64k.txt");
  static const std::vector<int64_t> longtail = zptest::lengthsOf("longtail_mix.txt");
  std::uniform_real_distribution<double> U(0, 1);
  auto logUniform = [&](double lo, double hi) { return int64_t(std::exp(std::log(lo) + U(rng) * std::log(hi / lo))); };
  const int kind = int(rng() % 6);
  const char* names[] = {"prolong64k", "longtail_mix", "log-uniform 16-64K", "bimodal 1-4K / 128K-1M",
                         "long 32K-256K", "pareto"};
  *what = names[kind];
  if (kind < 2) return formBatch(kind == 0 ? prolong : longtail, budget, rng);
  std::vector<int64_t> all;
  int64_t total = 0;
  while (total < 2 * budget) {
    int64_t l = 0;
    if (kind == 2) l = logUniform(16, 65536);
    if (kind == 3) l = U(rng) < 0.99 ? logUniform(1024, 4096) : logUniform(131072, 1048576);
    if (kind == 4) l = logUniform(32768, 262144);
    if (kind == 5) l = std::min<int64_t>(int64_t(512 / std::pow(1 - U(rng), 1 / 1.2)), 1 << 20);
    all.push_back(std::max<int64_t>(1, l));
    total += all.back();
  }
  return formBatch(all, budget, rng);
}

// Every strategy simulateStep runs, on random batches: none below `bound`,
// and `bound` never below `ideal` (the presets' efficiency tables grow with
// the chunk, where `ideal` is a lower bound too).
TEST(SimulatorBound, NoStrategyIsBelowTheBound) {
  std::mt19937_64 rng(zptest::testCaseSeed());
  int tighter = 0, trials = 150;
  for (int k = 0; k < trials; ++k) {
    StepSetup s = randomSetup(rng);
    std::string dist;
    const std::vector<int64_t> lens = randomBatch(s.perRank * s.c.ranks(), rng, &dist);
    SCOPED_TRACE(s.what + ", " + dist + ", " + std::to_string(lens.size()) + " sequences");
    const std::vector<StrategyResult> r = simulateStep(lens, s.cfg, s.c);
    const StrategyResult& bound = named(r, "bound");
    const StrategyResult& ideal = named(r, "ideal");
    EXPECT_TRUE(bound.reference);
    EXPECT_FALSE(bound.baseline);
    EXPECT_GE(bound.stepSeconds, ideal.stepSeconds * (1 - 1e-8));
    tighter += bound.stepSeconds > ideal.stepSeconds * (1 + 1e-4);
    for (const StrategyResult& x : r)
      if (x.name != "bound" && x.name != "ideal") EXPECT_LE(bound.stepSeconds, x.stepSeconds) << x.name;
  }
  RecordProperty("tighter", tighter);
  EXPECT_GT(tighter, 0) << "no batch where the bound is above ideal: the test says nothing of what it adds";
}

// A random placement no planner made: each sequence on a ring of R
// positions of u ranks (u dividing the node's ranks and both head counts,
// positions node-aligned), sometimes packed with the one before, sometimes
// an all-gather group; links at random; the linear layers on the attention
// layout, or balanced with a remap.
Placement randomPlacement(const std::vector<int64_t>& lens, const StepSetup& s, std::mt19937_64& rng) {
  const int n = s.c.ranks(), rpn = s.c.ranksPerNode;
  std::vector<int> us = {1};
  for (int u : plan::headSplitDegrees(rpn, s.cfg.model.attn)) us.push_back(u);
  Placement pl;
  pl.attnTokens.assign(size_t(n), 0.0);
  for (size_t i = 0; i < lens.size(); ++i) {
    if (!pl.rings.empty() && rng() % 3 == 0) {  // packed with the sequence before
      Ring& last = pl.rings.back();
      last.lens.push_back(lens[i]);
      last.seqs.push_back(int64_t(i));
      for (int r : last.ranks) pl.attnTokens[size_t(r)] += double(lens[i]) / last.ranks.size();
      continue;
    }
    Ring ring;
    ring.ulysses = us[rng() % us.size()];
    const int blocks = n / ring.ulysses;
    // Small rings mostly, now and then one over many positions.
    const int R = 1 + int(rng() % (rng() % 4 == 0 ? blocks : std::min(blocks, 8)));
    std::vector<int> pick(static_cast<size_t>(blocks));
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng);
    for (int p = 0; p < R; ++p)
      for (int j = 0; j < ring.ulysses; ++j) ring.ranks.push_back(pick[size_t(p)] * ring.ulysses + j);
    const bool oneNode = ring.ranks.front() / rpn == ring.ranks.back() / rpn &&
                         std::all_of(ring.ranks.begin(), ring.ranks.end(),
                                     [&](int r) { return r / rpn == ring.ranks.front() / rpn; });
    const Link links[] = {Link::Inter, Link::Routed, Link::PerGpu};
    ring.link = oneNode ? Link::Intra : links[rng() % 3];
    ring.allgather = ring.ulysses == 1 && rng() % 5 == 0;
    ring.lens.push_back(lens[i]);
    ring.seqs.push_back(int64_t(i));
    for (int r : ring.ranks) pl.attnTokens[size_t(r)] += double(lens[i]) / ring.ranks.size();
    pl.rings.push_back(std::move(ring));
  }
  std::shuffle(pl.rings.begin(), pl.rings.end(), rng);
  pl.remap = rng() % 2 == 0;
  if (pl.remap) {
    const double total = std::accumulate(lens.begin(), lens.end(), 0.0);
    pl.linTokens.assign(size_t(n), total / n);
    pl.remapIn = pl.remapOut = 1e-6 * (rng() % 100);
  } else {
    pl.linTokens = pl.attnTokens;
  }
  return pl;
}

TEST(SimulatorBound, NoRandomPlacementIsBelowTheBound) {
  std::mt19937_64 rng(zptest::testCaseSeed());
  for (int k = 0; k < 400; ++k) {
    StepSetup s = randomSetup(rng);
    std::string dist;
    // Smaller batches: a few to a few hundred sequences.
    const std::vector<int64_t> lens = randomBatch(std::min<int64_t>(s.perRank * s.c.ranks(), 1 << 20), rng, &dist);
    SCOPED_TRACE(s.what + ", " + dist + ", " + std::to_string(lens.size()) + " sequences, placement " +
                 std::to_string(k));
    const StrategyResult bound = spreadBound(lens, s.cfg, s.c);
    for (int j = 0; j < 4; ++j) {
      const StrategyResult x = evaluate("random", randomPlacement(lens, s, rng), s.cfg, s.c);
      EXPECT_LE(bound.stepSeconds, x.stepSeconds);
    }
  }
}

// The candidates that balance each pass (src/sim/balanced.cc): on ProLong
// at h800, 16K tokens per rank, 256 ranks (three batches of seed 1, as
// zpplan draws them), Zeppelin's plan was 4-8% above `bound`, the slowest
// rank of the backward pass holding much attention and few tokens; with
// them it is never slower, over 3% faster on a batch, and within 4% of the
// bound on each.
TEST(SimulatorBound, CandidatesThatBalanceEachPassComeWithin4PercentOfTheBound) {
  const std::vector<int64_t> all = zptest::lengthsOf("prolong64k.txt");
  ClusterModel c;
  StepConfig cfg = zptest::presetStep("h800", &c, 256);
  StepConfig without = cfg;
  without.balancedCandidates = false;
  std::mt19937_64 rng(1);
  size_t next = rng() % all.size();
  double gain = 0;
  for (int b = 0; b < 3; ++b) {
    const std::vector<int64_t> lens = nextBatch(all, int64_t(256) * 16384, &next);
    const std::vector<StrategyResult> r = simulateStep(lens, cfg, c);
    const double with = named(r, "zeppelin").stepSeconds, bound = named(r, "bound").stepSeconds;
    const double before = named(simulateStep(lens, without, c), "zeppelin").stepSeconds;
    printf("  batch %d: %.3f s, without them %.3f s, bound %.3f s\n", b, with, before, bound);
    EXPECT_TRUE(named(r, "zeppelin").feasible);
    EXPECT_LE(with, before * (1 + 1e-9)) << "batch " << b;
    EXPECT_GE(bound / with, 0.96) << "batch " << b;
    gain = std::max(gain, before / with);
  }
  EXPECT_GT(gain, 1.03);
}

// The plan's whole sequences placed again the same way (rebalanceWhole):
// on the long-tail mix at h800, 16K tokens per rank, 256 ranks, the
// planner's own plans win over the candidates, and their slowest ranks per
// pass are 2.4% above the mean; placing their whole sequences again, the
// rings kept, makes them faster on some batches and never slower.
TEST(SimulatorBound, WholeSequencesPlacedAgainBalanceEachPass) {
  const std::vector<int64_t> all = zptest::lengthsOf("longtail_mix.txt");
  ClusterModel c;
  StepConfig cfg = zptest::presetStep("h800", &c, 256);
  StepConfig without = cfg;
  without.rebalanceWhole = false;
  std::mt19937_64 rng(1);
  size_t next = rng() % all.size();
  double gain = 0;
  for (int b = 0; b < 4; ++b) {
    const std::vector<int64_t> lens = nextBatch(all, int64_t(256) * 16384, &next);
    const double with = simulatePlan(planForStep(lens, cfg, c), cfg, c).stepSeconds;
    const double before = simulatePlan(planForStep(lens, without, c), without, c).stepSeconds;
    printf("  batch %d: %.3f s, without %.3f s\n", b, with, before);
    EXPECT_LE(with, before * (1 + 1e-9)) << "batch " << b;
    gain = std::max(gain, before / with);
  }
  EXPECT_GT(gain, 1.005);
}

}  // namespace
}  // namespace zp::sim
