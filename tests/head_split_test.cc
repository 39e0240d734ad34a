// Plans that split heads (SeqPlacement::ulysses, src/plan/head_split.cc):
// what a ring can split and what it cannot, that the layout of a split ring
// is its positions' zigzag, and that the simulator's planner splits heads
// where that is faster and is then never slower than the Ulysses baselines
// (hier_cp, usp_cp) it used to lose to (docs/simulator.md).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/plan/planner.h"
#include "src/sim/simulator.h"
#include "src/sim/step_model.h"
#include "tests/harness.h"
#include "tests/plan_fixtures.h"
#include "tests/sim_fixtures.h"

namespace zp::plan {
namespace {

using namespace zp::sim;

std::string refusal(BatchPlan* p, const std::vector<int>& u, int rpn, const AttnShape& sh) {
  try {
    setHeadSplit(p, u, rpn, sh);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

// Two nodes of four ranks: a ring over both (two positions of four, one per
// node), a ring of two ranks across the nodes (no position of two inside a
// node), a ring of two inside node 0, a local sequence.
TEST(HeadSplit, ARingSplitsHeadsOnlyOverPositionsInsideANode) {
  const std::vector<int64_t> lens = {4096, 1024, 512, 100};
  BatchPlan p = planFromRings(lens, true, {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 4}, {2, 3}, {5}}, 8, 4);
  AttnShape sh;
  sh.qHeads = 32;
  sh.kvHeads = 8;
  EXPECT_TRUE(canSplitHeads({0, 1, 2, 3, 4, 5, 6, 7}, 4, 4));
  EXPECT_FALSE(canSplitHeads({0, 1, 2, 4, 3, 5, 6, 7}, 4, 4));  // position 0 has rank 4 of node 1
  EXPECT_FALSE(canSplitHeads({0, 4}, 2, 4));
  EXPECT_FALSE(canSplitHeads({0, 1, 2, 3, 4, 5, 6, 7}, 3, 4));
  EXPECT_FALSE(canSplitHeads({0, 1}, 0, 4));
  EXPECT_EQ(headSplitDegrees(8, sh), (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(headSplitDegrees(8, AttnShape{52, 52, 128, 2}), (std::vector<int>{2, 4}));

  // Refused, the plan unchanged, naming the sequence.
  EXPECT_NE(refusal(&p, {4, 2, 1, 1}, 4, sh).find("sequence 1:"), std::string::npos);
  EXPECT_NE(refusal(&p, {3, 1, 1, 1}, 4, sh).find("sequence 0:"), std::string::npos);
  EXPECT_NE(refusal(&p, {1, 1, 1, 0}, 4, sh).find("sequence 3:"), std::string::npos);
  EXPECT_NE(refusal(&p, {1, 1, 1}, 4, sh).find("3 head splits for 4 sequences"), std::string::npos);
  AttnShape twoKv = sh;
  twoKv.kvHeads = 2;
  EXPECT_NE(refusal(&p, {4, 1, 1, 1}, 4, twoKv).find("sequence 0:"), std::string::npos);
  for (const SeqPlacement& s : p.seqs) EXPECT_EQ(s.ulysses, 1);

  p.plannedForward = p.plannedBackward = 1;
  EXPECT_EQ(refusal(&p, {4, 1, 2, 1}, 4, sh), "(accepted)");
  EXPECT_EQ(p.seqs[0].ulysses, 4);
  EXPECT_EQ(p.seqs[2].ulysses, 2);
  EXPECT_EQ(p.plannedForward, 0);  // the planner's model does not cost a split
  EXPECT_THROW(attnMakespan(p, sh, zptest::a800Model(2)), std::invalid_argument);
  EXPECT_THROW(rankAttnSeconds(p, sh, zptest::a800Model(2)), std::invalid_argument);

  // The planner's variant: each ring by the largest divisor of u it allows.
  EXPECT_TRUE(splitHeadsBy(&p, 8, 4));
  EXPECT_EQ(p.seqs[0].ulysses, 4);
  EXPECT_EQ(p.seqs[1].ulysses, 1);
  EXPECT_EQ(p.seqs[2].ulysses, 2);
  EXPECT_EQ(p.seqs[3].ulysses, 1);
  EXPECT_FALSE(splitHeadsBy(&p, 1, 4));
  for (const SeqPlacement& s : p.seqs) EXPECT_EQ(s.ulysses, 1);
}

// canSplitHeads compares each rank against its position's node as a range
// of ranks: the same answer as a division per rank (C++'s, truncating, so
// node 0 holds -3 .. 3 with 4 ranks a node), for every pair of ranks of a
// position, negative ones and node edges included, and for positions of
// three.
TEST(HeadSplit, APositionsNodeIsTheRangeADivisionGives) {
  for (int rpn : {1, 2, 3, 4, 8})
    for (int a = -20; a <= 20; ++a)
      for (int b = -20; b <= 20; ++b) {
        EXPECT_EQ(canSplitHeads({a, b}, 2, rpn), a / rpn == b / rpn) << a << " " << b << " rpn " << rpn;
        EXPECT_EQ(canSplitHeads({7, 7, a, b, 7, b}, 3, rpn), a / rpn == b / rpn && a / rpn == 7 / rpn)
            << a << " " << b << " rpn " << rpn;
      }
}

// The layout does not change with a split (plan.h): the chunks the u ranks
// of position p hold in a ring of G are the chunks position p holds in a
// ring of G / u, so the all-to-all inside a position gathers exactly the
// tokens a ring over the positions needs.
TEST(HeadSplit, APositionsRanksHoldThePositionsChunks) {
  for (bool causal : {true, false})
    for (int64_t len : {1, 7, 100, 4097, 65536})
      for (int G : {2, 4, 8, 16, 24})
        for (int u : {2, 4, 8})
          if (G % u == 0)
            for (int p = 0; p < G / u; ++p) {
              std::multiset<int64_t> ofRanks, ofPosition;
              for (int j = p * u; j < (p + 1) * u; ++j)
                for (const ChunkSpan& c : ringChunks(len, G, causal, j))
                  for (int64_t t = c.begin; t < c.end; ++t) ofRanks.insert(t);
              for (const ChunkSpan& c : ringChunks(len, G / u, causal, p))
                for (int64_t t = c.begin; t < c.end; ++t) ofPosition.insert(t);
              ASSERT_EQ(ofRanks, ofPosition) << "len " << len << " G " << G << " u " << u << " position " << p;
            }
}

bool splitsHeads(const BatchPlan& p) {
  for (const SeqPlacement& s : p.seqs)
    if (s.ulysses > 1) return true;
  return false;
}

const StrategyResult& named(const std::vector<StrategyResult>& r, const std::string& name) {
  for (const auto& s : r)
    if (s.name == name) return s;
  throw std::runtime_error("no strategy " + name);
}

// A constructed batch where splitting heads wins: h800, 64 ranks (8
// nodes), three documents of 256K tokens and 256 of 1K (a quarter of the
// tokens). The long ones span nodes, whose chunks are short: Ulysses'
// chunks are u times longer (faster kernels) and its hops carry 1/u of the
// bytes. The plan splits heads and is over 5% faster than the best plan
// that does not (9% when written); it does so from the planner's own
// candidates too (without the baselines' placements among them).
TEST(HeadSplit, ThePlannerSplitsHeadsWhereThatIsFaster) {
  ClusterModel c;
  StepConfig cfg = zptest::presetStep("h800", &c, 64);
  // The planner's candidates and the baselines' (the candidates that
  // balance each pass, balanced.cc, found 7.383 s here without splitting
  // heads at aa8d0b5, 8.038 s at 1a1a94e: this test is about the planner's
  // own splits; HeadSplit.NeverSlowerThanTheUlyssesBaselines has them).
  cfg.balancedCandidates = false;
  std::vector<int64_t> lens = {262144, 262144, 262144};
  while (lens.size() < 3 + 256) lens.push_back(1024);
  StepConfig unsplit = cfg;
  unsplit.headSplit = false;
  const BatchPlan before = planForStep(lens, unsplit, c);
  const double without = simulatePlan(before, unsplit, c).stepSeconds;
  EXPECT_FALSE(splitsHeads(before));
  for (bool baselines : {true, false}) {
    SCOPED_TRACE(baselines ? "with the baselines' placements" : "the planner's own candidates");
    cfg.baselineCandidates = unsplit.baselineCandidates = baselines;
    const BatchPlan p = planForStep(lens, cfg, c);
    const double with = simulatePlan(p, cfg, c).stepSeconds;
    printf("  %s: %.3f s with head splits, %.3f s without\n", baselines ? "baselines" : "own", with, without);
    EXPECT_TRUE(splitsHeads(p));
    EXPECT_LT(with, 0.95 * simulatePlan(planForStep(lens, unsplit, c), unsplit, c).stepSeconds);
  }
}

// A random plan on 4 nodes of 8 ranks (h800): whole sequences, rings inside
// a node (some with a position across nodes' worth of ranks out of order),
// rings over whole nodes, several sequences on some rings; its linear
// layout built or not.
BatchPlan randomPlan(std::mt19937_64& rng, int nranks, int rpn) {
  std::vector<std::vector<int>> pool;  // rings that several sequences share
  auto ring = [&]() {
    std::vector<int> r;
    const int kind = int(rng() % 4);
    if (kind == 0) {
      r = {int(rng() % nranks)};
    } else if (kind == 1) {  // inside a node, in some order
      const int node = int(rng() % (nranks / rpn)), G = 2 + int(rng() % (rpn - 1));
      for (int j = 0; j < rpn; ++j) r.push_back(node * rpn + j);
      std::shuffle(r.begin(), r.end(), rng);
      r.resize(size_t(G));
      if (rng() % 2) std::sort(r.begin(), r.end());
    } else if (kind == 2) {  // whole nodes
      const int k = 2 + int(rng() % (nranks / rpn - 1));
      for (int nd = 0; nd < k; ++nd)
        for (int j = 0; j < rpn; ++j) r.push_back(nd * rpn + j);
    } else {  // across nodes, no position of one node
      r = {0, rpn, 2 * rpn, 3 * rpn};
    }
    return r;
  };
  for (int k = 0; k < 6; ++k) pool.push_back(ring());
  const size_t m = 20 + rng() % 40;
  std::vector<int64_t> lens(m);
  std::vector<std::vector<int>> rings(m);
  for (size_t i = 0; i < m; ++i) {
    lens[i] = 100 + int64_t(rng() % 300000);
    rings[i] = rng() % 3 == 0 ? pool[rng() % pool.size()] : ring();
  }
  BatchPlan p = planFromRings(lens, true, rings, nranks, rpn, rng() % 2 == 0);
  std::vector<int64_t> order(m);
  for (size_t i = 0; i < m; ++i) order[i] = int64_t(i);
  std::shuffle(order.begin(), order.end(), rng);
  setOrder(&p, order);
  return p;
}

// The step model's score of a head-split variant (PlanScorer with
// sameLayouts: the rings of the plan scored before, only the split ones
// costed again) is the score of the variant made afresh, and simulatePlan's
// step, remapped and flat; so is whether it fits, with the memory set at
// the variant's peak and just below it (a ring's buffers costed wrong
// moves the peak).
TEST(HeadSplit, AVariantScoresAsTheVariantScoredAfresh) {
  ClusterModel c;
  const StepConfig preset = zptest::presetStep("h800", &c, 32);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    BatchPlan p = randomPlan(rng, c.ranks(), c.ranksPerNode);
    for (int u : headSplitDegrees(c.ranksPerNode, preset.model.attn)) {
      splitHeadsBy(&p, 1, c.ranksPerNode);
      StepConfig cfg = preset;
      PlanScorer incremental(cfg, c, true);
      incremental(p, false);
      if (!splitHeadsBy(&p, u, c.ranksPerNode)) continue;
      for (bool remapped : {true, false}) {
        const StrategyResult sim = simulatePlan(p, preset, c, remapped);
        for (double memory : {preset.memoryBytes, sim.peakMemoryBytes, std::nextafter(sim.peakMemoryBytes, 0.0)}) {
          SCOPED_TRACE("trial " + std::to_string(trial) + " u " + std::to_string(u) +
                       (remapped ? " remapped" : " flat") + " memory " + std::to_string(memory));
          cfg.memoryBytes = memory;
          cfg.usableMemory = memory == preset.memoryBytes ? preset.usableMemory : 1.0;
          PlanScorer fresh(cfg, c, true);
          const PlanOptions::Scores a = incremental(p, true), b = fresh(p, false);
          const PlanOptions::Score& x = remapped ? a.remapped : a.flat;
          const PlanOptions::Score& y = remapped ? b.remapped : b.flat;
          EXPECT_EQ(x.seconds, y.seconds);
          EXPECT_EQ(x.fits, y.fits);
          EXPECT_EQ(x.seconds, simulatePlan(p, cfg, c, remapped).stepSeconds);
          EXPECT_EQ(x.fits, simulatePlan(p, cfg, c, remapped).feasible);
        }
      }
    }
  }
}

// A variant that splits a ring's sequences unlike, or one of a plan that
// split heads, is scored afresh: the same figures.
TEST(HeadSplit, AnUnevenVariantScoresAsTheVariantScoredAfresh) {
  ClusterModel c;
  const StepConfig cfg = zptest::presetStep("h800", &c, 16);
  // Two sequences on one ring of a node, one on a ring over both nodes.
  const std::vector<int64_t> lens = {40000, 30000, 200000, 500};
  std::vector<int> both(16);
  for (int r = 0; r < 16; ++r) both[size_t(r)] = r;
  BatchPlan p = planFromRings(lens, true, {{0, 1, 2, 3}, {0, 1, 2, 3}, both, {5}}, 16, 8, false);
  PlanScorer scorer(cfg, c, true);
  scorer(p, false);
  for (const std::vector<int>& u : {std::vector<int>{2, 4, 8, 1}, {4, 4, 1, 1}, {1, 1, 8, 1}}) {
    setHeadSplit(&p, u, c.ranksPerNode, cfg.model.attn);
    const PlanOptions::Scores a = scorer(p, true), b = PlanScorer(cfg, c, true)(p, false);
    EXPECT_EQ(a.remapped.seconds, b.remapped.seconds);
    EXPECT_EQ(a.flat.seconds, b.flat.seconds);
    EXPECT_EQ(a.flat.seconds, simulatePlan(p, cfg, c, false).stepSeconds);
  }
}

// The batches where Zeppelin lost to hier_cp and usp_cp before plans could
// split heads (bench/ulysses_gap: on the long-tail mix, h800 16K, 64 ranks,
// 29 of 80 batches below 0.99x, the worst 0.932x; on the bimodal file at
// 128 ranks 73 of 80, the worst 0.890x), drawn as zpplan draws them: the 16
// of seed 1 of the first, and two of seed 1 of the second where the
// planner's own candidates, split, are still 2-3% slower than hier_cp (the
// tuned usp_cp placement among the candidates closes that). Zeppelin is now
// never slower than either baseline (within 0.1%: a plan holds whole
// tokens); without head splits it is over 1% slower in some of them.
TEST(HeadSplit, NeverSlowerThanTheUlyssesBaselines) {
  struct Case {
    const char* file;
    int ranks;
    std::set<int> batches;
  };
  int lostBefore = 0;
  for (const Case& k : {Case{"longtail_mix.txt", 64, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}},
                        Case{"bimodal_1m.txt", 128, {7, 15}}}) {
    const std::vector<int64_t> all = zptest::lengthsOf(k.file);
    ClusterModel c;
    StepConfig cfg = zptest::presetStep("h800", &c, k.ranks);
    StepConfig unsplit = cfg;
    unsplit.headSplit = false;
    std::mt19937_64 rng(1);
    size_t next = rng() % all.size();
    for (int b = 0; b <= *k.batches.rbegin(); ++b) {
      const std::vector<int64_t> lens = nextBatch(all, int64_t(16384) * k.ranks, &next);
      if (!k.batches.count(b)) continue;
      const std::vector<StrategyResult> r = simulateStep(lens, cfg, c);
      const double zp = named(r, "zeppelin").stepSeconds;
      const double ulysses = std::min(named(r, "hier_cp").stepSeconds, named(r, "usp_cp").stepSeconds);
      const std::string where = std::string(k.file) + " batch " + std::to_string(b);
      // The zeppelin row (its plan given every baseline's placement) and
      // planForStep's plan (the baselines it can express, tuned against a
      // bound: what zpplan times and the benchmarks plan).
      const double planned = simulatePlan(planForStep(lens, cfg, c), cfg, c).stepSeconds;
      for (const char* name : {"hier_cp", "usp_cp"}) {
        EXPECT_LE(zp, named(r, name).stepSeconds * (1 + 1e-3)) << where << ", " << name;
        EXPECT_LE(planned, named(r, name).stepSeconds * (1 + 1e-3)) << where << ", " << name << ", planForStep";
      }
      const double old = simulatePlan(planForStep(lens, unsplit, c), unsplit, c).stepSeconds;
      printf("  %s: zeppelin %.3f s, without head splits %.3f s, hier_cp/usp_cp %.3f s\n", where.c_str(), zp, old,
             ulysses);
      lostBefore += old > 1.01 * ulysses;
    }
  }
  EXPECT_GT(lostBefore, 0) << "no batch lost without head splits: the test no longer guards anything";
}

}  // namespace
}  // namespace zp::plan
