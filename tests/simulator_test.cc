// The full-step simulator (src/sim/simulator.h) and its calibration
// (src/sim/calibration.h): every baseline against a hand-computed case on a
// one-layer model with a constant attention efficiency and no latency, the
// memory-feasibility check, and that a calibration changes predictions the
// way it should (efficiency by chunk length, latency, routing).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/sim/calibration.h"
#include "src/plan/planner.h"
#include "tests/harness.h"
#include "tests/plan_fixtures.h"
#include "tests/sim_fixtures.h"
#include "src/sim/simulator.h"
#include "src/sim/step_model.h"
#include "src/util/heap.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace zp::plan {
namespace {

using namespace zp::sim;

ClusterModel node8(int nodes = 1) { return zptest::a800Model(nodes); }

// One layer, no recomputation, constant efficiencies: every term by hand.
StepConfig oneLayer() {
  StepConfig cfg;
  modelPreset("llama-8b", &cfg.model);
  cfg.model.layers = 1;
  cfg.recompute = false;
  cfg.linearEfficiency = 0.5;
  return cfg;
}

#define SEED_TRACE SCOPED_TRACE("seed " + std::to_string(zptest::testSeed()) + " (ZP_TEST_SEED repeats it)")

const StrategyResult& find(const std::vector<StrategyResult>& r, const std::string& name) {
  for (const auto& s : r)
    if (s.name == name) return s;
  throw std::runtime_error("no strategy " + name);
}

// Zeppelin's plan is feasible and within 0.1% of every feasible baseline
// that `counts` (a plan holds whole tokens; a baseline's model spreads them
// evenly).
template <class Counts>
void expectNoSlowerThanBaselines(const std::vector<StrategyResult>& r, Counts counts, const std::string& where) {
  const StrategyResult& z = find(r, "zeppelin");
  EXPECT_TRUE(z.feasible) << where;
  for (const auto& s : r)
    if (s.baseline && s.feasible && counts(s.name))
      EXPECT_LE(z.stepSeconds, s.stepSeconds * (1 + 1e-3)) << s.name << ", " << where;
}

// Seconds of the linear parts for `tokens` on one rank: forward, and twice that backward.
double linearStep(double tokens, const StepConfig& cfg, const ClusterModel& c) {
  return 3 * tokens * linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
}

// A packed ring of G ranks over sequences `lens` (intra-node link): the
// forward and backward attention seconds of one rank, from cost_model's
// steps as the docs state them.
double ringByHand(const std::vector<int64_t>& lens, int G, const StepConfig& cfg, const ClusterModel& c) {
  const AttnShape& sh = cfg.model.attn;
  double comp = 0, bytes = 0;
  for (int64_t l : lens) {
    comp += attnFlops(l, true, sh) / G / G / (c.tflops * 1e12 * c.efficiency);
    if (G > 1) bytes += kvBytes((l + G - 1) / G, sh);
  }
  double t = bytes / (c.intraNodeGBps * 1e9);
  double fwd = G * comp + (G - 1) * std::max(0.0, t - comp);
  double bwd = G * 2.5 * comp + (G - 1) * std::max(0.0, 2 * t - 2.5 * comp);
  return fwd + bwd;
}

TEST(Simulator, ModelPresets) {
  ModelShape m;
  ASSERT_TRUE(modelPreset("llama-8b", &m));
  EXPECT_NEAR(modelParams(m) / 1e9, 8.03, 0.01);  // Llama 3 8B: 8.03 B parameters
  EXPECT_DOUBLE_EQ(linearFlopsPerToken(m), 2.0 * (4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 14336));
  ASSERT_TRUE(modelPreset("llama-7b", &m));
  EXPECT_NEAR(modelParams(m) / 1e9, 6.74, 0.01);  // Llama 2 7B
  ASSERT_TRUE(modelPreset("llama-13b", &m));
  EXPECT_NEAR(modelParams(m) / 1e9, 13.0, 0.05);
  ASSERT_TRUE(modelPreset("llama-30b", &m));
  EXPECT_NEAR(modelParams(m) / 1e9, 32.5, 0.1);
  ASSERT_TRUE(modelPreset("llama-3b", &m));
  EXPECT_EQ(m.attn.qHeads, 24);
  EXPECT_FALSE(modelPreset("llama-9b", &m));
}

// Eight equal sequences on eight ranks: whole on a rank each is best, and
// every strategy but the world ring finds it.
TEST(Simulator, EqualSequencesByHand) {
  StepConfig cfg = oneLayer();
  ClusterModel c = node8();
  std::vector<int64_t> lens(8, 4096);
  auto r = simulateStep(lens, cfg, c);
  ASSERT_EQ(r.size(), strategyNames().size());
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i].name, strategyNames()[i]);
  const double local = linearStep(4096, cfg, c) + ringByHand({4096}, 1, cfg, c);
  for (const char* name : {"zeppelin", "zeppelin_noremap", "dp_cp", "allgather_cp", "dynamic_cp", "hybrid_dp"}) {
    SCOPED_TRACE(name);
    EXPECT_NEAR(find(r, name).stepSeconds, local, local * 1e-9);
    EXPECT_NEAR(find(r, name).parts.idle, 0, local * 1e-9);
    EXPECT_TRUE(find(r, name).feasible);
  }
  EXPECT_EQ(find(r, "zeppelin").remapSeconds, 0);
  EXPECT_EQ(find(r, "dp_cp").group, 1);
  EXPECT_EQ(find(r, "allgather_cp").group, 1);
  // The world ring: one packed ring of all eight sequences over eight ranks.
  const auto& ring = find(r, "ring_all");
  EXPECT_TRUE(ring.reference);
  EXPECT_FALSE(ring.baseline);
  EXPECT_TRUE(find(r, "dp_cp").baseline);
  EXPECT_NEAR(ring.stepSeconds, linearStep(4096, cfg, c) + ringByHand(lens, 8, cfg, c), local * 1e-9);
  // The parts add up to the step.
  for (const auto& s : r) {
    const Breakdown& p = s.parts;
    EXPECT_NEAR(p.attn + p.comm + p.remap + p.linear + p.idle, s.stepSeconds, s.stepSeconds * 1e-9) << s.name;
  }
}

// Memory for 8192 tokens per rank exactly: one sequence of 32768 tokens
// needs four ranks at least.
TEST(Simulator, LongSequenceByHand) {
  StepConfig cfg = oneLayer();
  ClusterModel c = node8();
  const double perToken = activationBytesPerToken(cfg) + 4 * kvBytes(1, cfg.model.attn);
  cfg.memoryBytes = (stateBytesPerRank(cfg, 8) + 8192 * perToken) / cfg.usableMemory * (1 + 1e-9);
  ASSERT_EQ(tokenCapacity(cfg, 8), 8192);
  std::vector<int64_t> lens = {32768};
  auto r = simulateStep(lens, cfg, c);
  const double step4 = linearStep(8192, cfg, c) + ringByHand(lens, 4, cfg, c);
  const double step8 = linearStep(4096, cfg, c) + ringByHand(lens, 8, cfg, c);
  // DP x CP: groups of 1 and 2 cannot hold it; 4 and 8 can, the faster wins.
  const auto& dp = find(r, "dp_cp");
  EXPECT_TRUE(dp.feasible);
  EXPECT_EQ(dp.group, step8 < step4 ? 8 : 4);
  EXPECT_NEAR(dp.stepSeconds, std::min(step4, step8), step4 * 1e-9);
  // Dynamic CP and hybrid DP: the split length is tuned; four or eight ranks.
  for (const char* name : {"dynamic_cp", "hybrid_dp"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(find(r, name).feasible);
    EXPECT_NEAR(find(r, name).stepSeconds, std::min(step4, step8), step4 * 1e-9);
  }
  // All-gather in a group of 8: 7/8 of the K and V in, not hidden, and the
  // same again backward; the rank's eighth of the compute.
  const auto& ag = find(r, "allgather_cp");
  double kv = kvBytes(32768, cfg.model.attn), comp = attnFlops(32768, true, cfg.model.attn) / 8 / (c.tflops * 1e12 * 0.5);
  double ag8 = linearStep(4096, cfg, c) + comp * 3.5 + 3 * (kv * 7 / 8 / 200e9);
  double ag4 = linearStep(8192, cfg, c) + comp * 2 * 3.5 + 3 * (kv * 3 / 4 / 200e9);
  EXPECT_NEAR(ag.stepSeconds, std::min(ag4, ag8), ag8 * 1e-9);
  EXPECT_EQ(ag.group, ag8 < ag4 ? 8 : 4);
}

// The feasibility check: below what any layout needs, every strategy,
// Zeppelin's too, is reported infeasible; the peak memory is the formula's.
TEST(Simulator, FeasibilityCheck) {
  StepConfig cfg = oneLayer();
  ClusterModel c = node8();
  std::vector<int64_t> lens(8, 4096);
  const double states = stateBytesPerRank(cfg, 8), act = activationBytesPerToken(cfg);
  cfg.memoryBytes = (states + 4096 * act) / cfg.usableMemory * 1.0001;
  auto r = simulateStep(lens, cfg, c);
  EXPECT_TRUE(find(r, "zeppelin").feasible);
  EXPECT_NEAR(find(r, "zeppelin").peakMemoryBytes, states + 4096 * act, 1);
  cfg.memoryBytes = (states + 4000 * act) / cfg.usableMemory;
  r = simulateStep(lens, cfg, c);
  for (const auto& s : r) EXPECT_FALSE(s.feasible) << s.name;
  // One sequence three times what a rank holds: Zeppelin's plan splits it
  // and fits; DP x CP needs groups of four at least.
  cfg = oneLayer();
  cfg.memoryBytes = (states + 20000 * (act + 4 * kvBytes(1, cfg.model.attn))) / cfg.usableMemory;
  std::vector<int64_t> skew = {60000, 100, 100};
  r = simulateStep(skew, cfg, c);
  EXPECT_TRUE(find(r, "zeppelin").feasible);
  EXPECT_TRUE(find(r, "dp_cp").feasible);
  EXPECT_GE(find(r, "dp_cp").group, 4);
}

// Zeppelin's remap: with a skewed batch the no-remap variant leaves tokens
// imbalanced for the linear layers and the remap balances them (linear
// imbalance 1 within a token). The planner of record (legacy) always remaps;
// today's picks per batch what the step model says is fastest, never slower
// than the plan without a remap.
TEST(Simulator, RemapBalancesLinearLayers) {
  StepConfig cfg = oneLayer();
  ClusterModel c = node8(1);
  // One of 8192 tokens costs as much as 64 of 1024: balanced attention
  // gives four ranks 8192 tokens and four others 65536.
  std::vector<int64_t> lens(4, 8192);
  lens.resize(4 + 256, 1024);
  auto today = simulateStep(lens, cfg, c);
  EXPECT_LE(find(today, "zeppelin").stepSeconds, find(today, "zeppelin_noremap").stepSeconds * (1 + 1e-9));
  EXPECT_NEAR(find(today, "zeppelin").linearImbalance, 1, 1e-3);
  cfg.legacyPlanner = true;
  auto r = simulateStep(lens, cfg, c);
  const auto &z = find(r, "zeppelin"), &nr = find(r, "zeppelin_noremap");
  EXPECT_GT(z.remapSeconds, 0);
  EXPECT_EQ(nr.remapSeconds, 0);
  EXPECT_NEAR(z.linearImbalance, 1, 1e-3);
  EXPECT_GT(nr.linearImbalance, 1.5);
  EXPECT_GT(z.nicBytes + z.intraBytes, nr.nicBytes + nr.intraBytes);
}

// The planner's node-level token balance: on two nodes the same batch's
// remap crosses the NICs without it and stays inside the nodes with it
// (the legacy planner, which always remaps; today's moves no more).
TEST(Simulator, NodeTokenBalanceKeepsRemapInsideNodes) {
  StepConfig cfg = oneLayer();
  ClusterModel c = node8(2);
  std::vector<int64_t> lens(8, 8192);
  lens.resize(8 + 512, 1024);
  cfg.legacyPlanner = true;
  cfg.nodeTokenBalance = false;
  auto off = find(simulateStep(lens, cfg, c), "zeppelin");
  cfg.nodeTokenBalance = true;
  auto on = find(simulateStep(lens, cfg, c), "zeppelin");
  printf("  NIC bytes of one forward: %.3g without node balance, %.3g with; remap %.3g s and %.3g s; attention "
         "imbalance %.4f and %.4f\n", off.nicBytes, on.nicBytes, off.remapSeconds, on.remapSeconds, off.attnImbalance,
         on.attnImbalance);
  EXPECT_GT(off.nicBytes, 1e8);
  EXPECT_LT(on.nicBytes, off.nicBytes / 10);
  EXPECT_LT(on.remapSeconds, off.remapSeconds / 2);
  EXPECT_LT(on.attnImbalance, 1.05);
  EXPECT_NEAR(on.linearImbalance, 1, 1e-3);
  cfg.legacyPlanner = false;
  auto today = find(simulateStep(lens, cfg, c), "zeppelin");
  EXPECT_LE(today.nicBytes, on.nicBytes);
  EXPECT_LE(today.stepSeconds, on.stepSeconds * (1 + 1e-9));
}

using zptest::lengthsOf;

// The one reader of length files (zpplan, the benchmarks, these tests):
// every whitespace-separated integer from 1 to 2^40, in order; anything else
// refused with a message naming the file, the line and the word; a missing
// or empty file refused too.
TEST(Simulator, ReadLengthsReadsEveryLengthAndRefusesTheRest) {
  const std::string dir = testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + name) << text;
    return dir + name;
  };
  EXPECT_EQ(readLengths(write("lens_ok.txt", "3\n 1099511627776\n\n7 9\n")),
            (std::vector<int64_t>{3, int64_t(1) << 40, 7, 9}));
  auto refusal = [](const std::string& file) {
    try {
      readLengths(file);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(read)");
  };
  EXPECT_EQ(refusal(write("lens_zero.txt", "5\n0\n")),
            "'" + dir + "lens_zero.txt' line 2: '0' is not a sequence length (an integer from 1 to 2^40)");
  for (const char* bad : {"-4", "12x", "1099511627777", "4.5", "99999999999999999999"})
    EXPECT_NE(refusal(write("lens_bad.txt", std::string("8\n9\n") + bad + "\n")).find("line 3: '" + std::string(bad) + "'"),
              std::string::npos)
        << bad;
  EXPECT_EQ(refusal(write("lens_empty.txt", " \n\n")), "no lengths read from '" + dir + "lens_empty.txt'");
  EXPECT_EQ(refusal(dir + "lens_missing.txt"), "cannot read '" + dir + "lens_missing.txt'");
}

using zptest::presetStep;

StepConfig a800Step(ClusterModel* c, int nranks) { return presetStep("a800", c, nranks); }

// The regime Zeppelin was built for (the long-tail mix, 64K tokens per rank,
// A800): it never loses to a baseline whose placement it can express (by
// more than 0.1%, the rounding of tokens to ranks) and to the hierarchical
// ones (hier_cp, usp_cp: Ulysses inside the node, longer kernel calls than
// any ring of whole sequences) by at most 1.2% (the worst of 320 batches at
// 16-256 ranks was 0.991x, docs/simulator.md), idles less than 3% of the
// step, and sits within 5% of the lower bound. The planner before
// idle-aware scheduling lost 0.53x here at 256 ranks (8-47 s of idle).
TEST(Simulator, ZeppelinNeverLosesOnTheLongTail) {
  SEED_TRACE;
  std::mt19937_64 rng(zptest::testSeed());
  auto all = lengthsOf("longtail_mix.txt");
  ASSERT_FALSE(all.empty());
  for (int nranks : {64, 256}) {
    ClusterModel c;
    StepConfig cfg = a800Step(&c, nranks);
    auto lens = formBatch(all, int64_t(nranks) * 65536, rng);
    auto r = simulateStep(lens, cfg, c);
    const StrategyResult& z = find(r, "zeppelin");
    double best = 0, expressible = 0;
    for (const auto& s : r) {
      if (!s.baseline || !s.feasible) continue;
      if (best == 0 || s.stepSeconds < best) best = s.stepSeconds;
      const bool rings = s.name == "dp_cp" || s.name == "dynamic_cp" || s.name == "hybrid_dp";
      if (rings && (expressible == 0 || s.stepSeconds < expressible)) expressible = s.stepSeconds;
    }
    printf("  %d ranks: zeppelin %.2f s (idle %.2f), best baseline %.2f s, of rings %.2f s, lower bound %.2f s\n", nranks,
           z.stepSeconds, z.parts.idle, best, expressible, find(r, "ideal").stepSeconds);
    EXPECT_TRUE(z.feasible);
    EXPECT_LE(z.stepSeconds, expressible * (1 + 1e-3));  // a rank holds whole tokens: rounding
    EXPECT_LE(z.stepSeconds, best * 1.012);
    EXPECT_LT(z.parts.idle, 0.03 * z.stepSeconds);
    EXPECT_GE(find(r, "ideal").stepSeconds / z.stepSeconds, 0.95);
  }
}

// Never below a baseline, by construction: every tuned baseline placement a
// plan can express (dp_cp, dynamic_cp, hybrid_dp) is one of the planner's
// candidates, scored in full whatever the batch's size. On the bimodal file
// (99% of documents 1-4K tokens, 1% 128K-1M), A800, 64K tokens per rank,
// 256 ranks, batches of over 2,000 sequences: the third and sixth batch of
// seed 1, where the planner's own candidates were 3.1% and 4.8% slower than
// dp_cp's groups of 64 (its group sizes were ranked by a quick estimate and
// the winning size never scored), and a batch of the test's seed. Within
// 0.1% (a plan holds whole tokens; dp_cp's model spreads them evenly).
TEST(Simulator, NeverSlowerThanABaselineItCanExpress) {
  SEED_TRACE;
  auto all = lengthsOf("bimodal_1m.txt");
  ASSERT_FALSE(all.empty());
  ClusterModel c;
  StepConfig cfg = a800Step(&c, 256);
  std::mt19937_64 fixed(1), rng(zptest::testSeed());
  std::vector<std::vector<int64_t>> batches;
  for (int b = 0; b < 6; ++b) {
    auto lens = formBatch(all, int64_t(256) * 65536, fixed);
    if (b == 2 || b == 5) batches.push_back(lens);
  }
  batches.push_back(formBatch(all, int64_t(256) * 65536, rng));
  auto expressible = [](const std::string& name) {
    return name == "dp_cp" || name == "dynamic_cp" || name == "hybrid_dp";
  };
  for (size_t b = 0; b < batches.size(); ++b) {
    auto r = simulateStep(batches[b], cfg, c);
    for (const char* name : {"dp_cp", "dynamic_cp", "hybrid_dp"}) ASSERT_TRUE(find(r, name).baseline) << name;
    expectNoSlowerThanBaselines(r, expressible, "batch " + std::to_string(b));
  }
}

// planForStep tunes the baselines whose placements are its candidates only
// after the planner's own candidates, and makes no setting (group size,
// split length) whose lower bound of the step cannot beat the best plan so
// far. That bound holds for every setting: with any `beat` above a
// baseline's tuned step, the bounded tuning finds that same setting; with
// `beat` below the lower bound `ideal`, it makes none. And the plan is the
// one the fully tuned baselines give simulateStep's `zeppelin` (the same
// step), never slower than any of them. Batches: the bimodal file's (A800,
// 64K, 256 ranks; the two where dp_cp's placement beats the planner's own
// candidates, Simulator.NeverSlowerThanABaselineItCanExpress), the long-tail
// mix's (h800, 16K, 64 ranks) and ProLong's (h800, 32K, 16 ranks: a tie
// between a baseline's plan and the planner's own).
TEST(Simulator, BaselinesTunedAgainstABoundAreTheTunedOnesThatCouldWin) {
  struct Case {
    const char* file;
    const char* preset;
    int64_t tokens;
    int ranks;
    std::vector<int64_t> lens;
  };
  std::vector<Case> cases;
  std::mt19937_64 fixed(1);
  auto bimodal = lengthsOf("bimodal_1m.txt");
  for (int b = 0; b < 6; ++b) {
    auto lens = formBatch(bimodal, int64_t(256) * 65536, fixed);
    if (b == 2 || b == 5) cases.push_back({"bimodal_1m", "a800", 65536, 256, lens});
  }
  for (auto [file, preset, tokens, ranks] : {std::make_tuple("longtail_mix.txt", "h800", 16384, 64),
                                              std::make_tuple("prolong64k.txt", "h800", 32768, 16)}) {
    size_t next = 7;
    cases.push_back({file, preset, tokens, ranks, nextBatch(lengthsOf(file), int64_t(tokens) * ranks, &next)});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.file) + " " + k.preset + " " + std::to_string(k.ranks) + " ranks");
    ASSERT_FALSE(k.lens.empty());
    ClusterModel c;
    StepConfig cfg = presetStep(k.preset, &c, k.ranks);
    const std::vector<Tuned> full = tunedBaselines(k.lens, cfg, c, true);
    ASSERT_EQ(full.size(), 4u);  // dp_cp, dynamic_cp, hybrid_dp, usp_cp
    for (const Tuned& t : full) {
      const std::vector<Tuned> bounded = tunedBaselines(k.lens, cfg, c, true, t.result.stepSeconds * (1 + 1e-7));
      auto same = std::find_if(bounded.begin(), bounded.end(), [&](const Tuned& b) { return b.result.name == t.result.name; });
      ASSERT_NE(same, bounded.end()) << t.result.name << ": its tuned setting was not made";
      EXPECT_EQ(same->result.stepSeconds, t.result.stepSeconds) << t.result.name;
      EXPECT_EQ(same->result.group, t.result.group) << t.result.name;
      EXPECT_EQ(same->result.ulysses, t.result.ulysses) << t.result.name;
      EXPECT_EQ(same->result.limitTokens, t.result.limitTokens) << t.result.name;
    }
    const std::vector<StrategyResult> r = simulateStep(k.lens, cfg, c);
    EXPECT_TRUE(tunedBaselines(k.lens, cfg, c, true, find(r, "ideal").stepSeconds * 0.999).empty());
    const StrategyResult planned = simulatePlan(planForStep(k.lens, cfg, c), cfg, c);
    EXPECT_EQ(planned.stepSeconds, find(r, "zeppelin").stepSeconds);
    for (const Tuned& t : full)
      if (t.result.feasible) EXPECT_LE(planned.stepSeconds, t.result.stepSeconds * (1 + 1e-3)) << t.result.name;
  }
}

// A plan whose linear layers run on its attention layout says so
// (BatchPlan::linearOnAttention) rather than carry a copy of it: its linear
// layout (linearLayout) is the attention layout, its remap moves nothing,
// and the step model runs it as the same plan with the copy built. Batches
// of the long-tail mix, h800 at 16K tokens per rank, 64 ranks, where some
// plans keep the linear layers there and some remap.
TEST(Simulator, APlanOnItsAttentionLayoutRunsAsWithACopyOfIt) {
  ClusterModel c;
  const StepConfig cfg = zptest::presetStep("h800", &c, 64);
  const std::vector<int64_t> mix = zptest::lengthsOf("longtail_mix.txt");
  std::mt19937_64 rng(3);
  int flat = 0, remapped = 0;
  for (int b = 0; b < 12; ++b) {
    const BatchPlan p = planForStep(formBatch(mix, int64_t(16384) * c.ranks(), rng), cfg, c);
    if (!p.linearOnAttention) {
      ++remapped;
      EXPECT_EQ(&linearLayout(p), &p.linear);
      continue;
    }
    ++flat;
    EXPECT_EQ(&linearLayout(p), &p.attention);
    EXPECT_TRUE(p.linear.ranks.empty());
    const RemapSeconds none = remapSeconds(p, c, 1, 1);
    EXPECT_EQ(none.in + none.out + none.nicBytes + none.intraBytes, 0);
    BatchPlan copy = p;  // as plans were: the attention layout copied
    copy.linearOnAttention = false;
    copy.linear = p.attention;
    for (bool remap : {true, false}) {
      const StrategyResult a = simulatePlan(p, cfg, c, remap), b = simulatePlan(copy, cfg, c, remap);
      EXPECT_EQ(a.stepSeconds, b.stepSeconds);
      EXPECT_EQ(a.remapSeconds, b.remapSeconds);
      EXPECT_EQ(a.peakMemoryBytes, b.peakMemoryBytes);
    }
  }
  printf("  %d plans on their attention layout, %d remapped\n", flat, remapped);
  EXPECT_GT(flat, 0);
  EXPECT_GT(remapped, 0);
}

// Memory is a constraint: on the 30B model with the pretraining corpus's
// lengths (tests/data/pretrain_hist.txt), A800 at 64K tokens per rank, 128
// ranks, where most baselines run over memory, Zeppelin's plan fits and is
// no slower than any baseline that fits.
TEST(Simulator, MemoryTightPlansFit) {
  SEED_TRACE;
  auto all = lengthsOf("pretrain_hist.txt");
  ASSERT_FALSE(all.empty());
  ClusterModel c;
  StepConfig cfg = a800Step(&c, 128);
  modelPreset("llama-30b", &cfg.model);
  std::mt19937_64 rng(zptest::testSeed());
  auto r = simulateStep(formBatch(all, int64_t(128) * 65536, rng), cfg, c);
  expectNoSlowerThanBaselines(r, [](const std::string&) { return true; }, "30B");
}

// The simulator runs a plan's rings in the plan's order: the same rings in
// the order it used before plans carried one (inter-node rings, intra-node
// rings, whole sequences, larger first) wait for each other longer.
TEST(Simulator, RunsRingsInThePlansOrder) {
  SEED_TRACE;
  std::mt19937_64 rng(zptest::testSeed());
  auto all = lengthsOf("longtail_mix.txt");
  ClusterModel c;
  StepConfig cfg = a800Step(&c, 256);
  auto lens = formBatch(all, int64_t(256) * 65536, rng);
  PlanOptions o;
  o.onlyCap = std::pow(0.5, 2.5);  // many rings
  BatchPlan p = planBatch(lens, true, cfg.model.attn, c, o);
  BatchPlan sorted = p;
  orderByClassAndSize(&sorted);
  const StrategyResult inOrder = simulatePlan(p, cfg, c), other = simulatePlan(sorted, cfg, c);
  printf("  idle %.2f s in the plan's order, %.2f s in the old one; step %.2f s and %.2f s\n", inOrder.parts.idle,
         other.parts.idle, inOrder.stepSeconds, other.stepSeconds);
  EXPECT_LT(inOrder.parts.idle, 0.8 * other.parts.idle);
  EXPECT_LT(inOrder.stepSeconds, other.stepSeconds);
}

// The cap is chosen by the step, not by a summed imbalance: no single cap
// the planner tries, planned alone, makes a faster step than its pick (2%
// allowed: only the best few candidates are scored with the whole step).
TEST(Simulator, PlanIsAsFastAsAnyOfItsCaps) {
  SEED_TRACE;
  std::mt19937_64 rng(zptest::testSeed());
  auto all = lengthsOf("longtail_mix.txt");
  ClusterModel c;
  StepConfig cfg = a800Step(&c, 64);
  for (int b = 0; b < 2; ++b) {
    auto lens = formBatch(all, int64_t(64) * 65536, rng);
    const double chosen = find(simulateStep(lens, cfg, c), "zeppelin").stepSeconds;
    for (int k = 0; k <= 12; ++k) {
      StepConfig one = cfg;
      one.planCap = std::pow(0.5, 0.5 * k);
      const double alone = find(simulateStep(lens, one, c), "zeppelin").stepSeconds;
      EXPECT_LE(chosen, alone * 1.02) << "cap 2^-" << k / 2.0 << " of the mean";
    }
  }
}

// The best cap is often between two of a coarse search's steps (a long
// sequence's ring grows by whole ranks as the cap falls): the plan is within
// 0.5% of the best cap of an eighth-of-an-octave grid on the sixth ProLong
// batch of seed 1 at 256 ranks, where sqrt(2) steps were 4% short. On a
// batch of the test's seed, within 3%: the planner scores only its two best
// caps by the whole step (the rest by their attention makespans), and on
// about a quarter of random batches another cap is 0.5-2.3% faster.
TEST(Simulator, PlanIsAsFastAsTheBestCapOfAFineGrid) {
  SEED_TRACE;
  auto all = lengthsOf("prolong64k.txt");
  ClusterModel c;
  StepConfig cfg = a800Step(&c, 256);
  std::mt19937_64 fixed(1), rng(zptest::testSeed());
  std::vector<int64_t> lens;
  for (int b = 0; b < 6; ++b) lens = formBatch(all, int64_t(256) * 65536, fixed);
  for (int run = 0; run < 2; ++run, lens = formBatch(all, int64_t(256) * 65536, rng)) {
    const double chosen = simulatePlan(planForStep(lens, cfg, c), cfg, c, true).stepSeconds;
    double best = chosen;
    for (int x = 0; x <= 48; ++x) {
      StepConfig one = cfg;
      one.planCap = std::pow(0.5, x / 8.0);
      const BatchPlan p = planForStep(lens, one, c);
      best = std::min({best, simulatePlan(p, cfg, c, true).stepSeconds, simulatePlan(p, cfg, c, false).stepSeconds});
    }
    EXPECT_LE(chosen, best * (run == 0 ? 1.005 : 1.03)) << (run == 0 ? "the fixed batch" : "the seed's batch");
  }
}

// The long tail at 16K tokens per rank on H800-class ranks, three batches
// of seed 1: the zeppelin row's step against the same planner with some
// candidates turned off (`off`). Never slower on a batch; returns the best
// gain. Plans without head splits: a split of the same batches' rings
// takes part of what these candidates gain (with splits, both gains below
// are 2.2%), and these tests are about the rings; nor the candidates that
// balance each pass (balanced.cc), which take part of it too.
static double gainOverThePlannerWithout(int ranks, void (*off)(StepConfig*), const char* what) {
  auto all = lengthsOf("longtail_mix.txt");
  ClusterModel c;
  StepConfig cfg = presetStep("h800", &c, ranks);
  cfg.headSplit = false;
  cfg.balancedCandidates = false;
  std::mt19937_64 fixed(1);
  double gain = 0;
  for (int b = 0; b < 3; ++b) {
    auto lens = formBatch(all, int64_t(ranks) * 16384, fixed);
    const double chosen = find(simulateStep(lens, cfg, c), "zeppelin").stepSeconds;
    StepConfig without = cfg;
    off(&without);
    const double before = find(simulateStep(lens, without, c), "zeppelin").stepSeconds;
    printf("  batch %d: %.3f s, without %s %.3f s\n", b, chosen, what, before);
    EXPECT_LE(chosen, before * (1 + 1e-9)) << "batch " << b;
    gain = std::max(gain, before / chosen);
  }
  return gain;
}

// Rings sized to the time left where they land (the planner's
// scheduleToTarget candidates): where a cap's rings all take about the
// cap's time and pack unevenly, the plan is faster by over 3% on a batch than
// the planner without them (caps and DP x CP groups), and never slower.
TEST(Simulator, RingsSizedToTheirSlotMakeFasterPlans) {
  EXPECT_GT(gainOverThePlannerWithout(128, [](StepConfig* c) { c->fitRings = false; }, "rings sized to their slot"),
            1.03);
}

// The joint candidates (rings sized with each sequence's linear layers in
// its time, for a plan without a remap): where the linear layers are a
// third of the step and a remap to balanced tokens costs more than it
// saves, the plan is over 3% faster on a batch than the planner's without
// them, and never slower.
TEST(Simulator, JointCandidatesBalanceAttentionAndLinearLayersTogether) {
  EXPECT_GT(gainOverThePlannerWithout(256, [](StepConfig* c) { c->jointFits = false; }, "the joint candidates"), 1.03);
}

// Running a plan in its order, as the executor does (a ring starts when the
// last of its ranks is free; backward in the reverse order), takes exactly the
// makespans the planner scheduled it for: the order is the schedule. Every
// kind of candidate (caps, rings sized to their slot, DP x CP groups) wins
// somewhere among these batches, presets and variants.
TEST(Simulator, RunningAPlanInItsOrderTakesThePlannedMakespans) {
  SEED_TRACE;
  std::mt19937_64 rng(zptest::testSeed());
  for (const char* file : {"longtail_mix.txt", "prolong64k.txt", "pareto_code.txt"}) {
    auto all = lengthsOf(file);
    for (const auto& [preset, nranks, perRank] :
         {std::tuple{"h800", 256, 16384}, std::tuple{"h800", 64, 16384}, std::tuple{"a800", 64, 65536}}) {
      ClusterModel c;
      StepConfig cfg = presetStep(preset, &c, nranks);
      // The planner's own makespans do not cost head splits (setHeadSplit):
      // the plans of its schedules, as they are.
      cfg.headSplit = false;
      for (int b = 0; b < 4; ++b) {
        auto lens = formBatch(all, int64_t(nranks) * perRank, rng);
        for (bool fit : {true, false}) {
          cfg.fitRings = fit;
          const BatchPlan p = planForStep(lens, cfg, c);
          SCOPED_TRACE(std::string(file) + " " + preset + " " + std::to_string(nranks) + " batch " +
                       std::to_string(b) + (fit ? "" : " no fit"));
          ASSERT_GT(p.plannedForward, 0);
          EXPECT_NEAR(attnMakespan(p, cfg.model.attn, c), p.plannedForward, 1e-9 * p.plannedForward);
          EXPECT_NEAR(attnMakespan(p, cfg.model.attn, c, true), p.plannedBackward, 1e-9 * p.plannedBackward);
        }
      }
    }
  }
}

// The lower bound: linear layers token-balanced, attention balanced at
// whole-sequence efficiency, nothing else; below every strategy.
TEST(Simulator, IdealIsALowerBound) {
  SEED_TRACE;
  std::mt19937_64 rng(zptest::testSeed());
  auto all = lengthsOf("prolong64k.txt");
  ClusterModel c;
  StepConfig cfg = a800Step(&c, 32);
  auto lens = formBatch(all, int64_t(32) * 65536, rng);
  auto r = simulateStep(lens, cfg, c);
  const StrategyResult& ideal = find(r, "ideal");
  EXPECT_TRUE(ideal.reference);
  EXPECT_FALSE(ideal.baseline);
  EXPECT_EQ(ideal.parts.idle + ideal.parts.comm + ideal.parts.remap, 0);
  for (const auto& s : r) EXPECT_LE(ideal.stepSeconds, s.stepSeconds * (1 + 1e-9)) << s.name;
}

TEST(Calibration, EfficiencyByChunkLength) {
  ClusterModel c = node8();
  c.attnEfficiency = {{1000, 0.2}, {4000, 0.6}};
  EXPECT_DOUBLE_EQ(attnEfficiencyAt(500, c), 0.2);
  EXPECT_DOUBLE_EQ(attnEfficiencyAt(9000, c), 0.6);
  EXPECT_NEAR(attnEfficiencyAt(2000, c), 0.4, 1e-12);  // halfway in log(length)
  AttnShape sh;
  RingStep st = ringStep(8000, true, 4, Link::Intra, sh, c);  // chunks of 2000 tokens
  EXPECT_NEAR(st.compute, attnFlops(8000, true, sh) / 16 / (312e12 * 0.4), 1e-15);
  // Lower efficiency at short chunks makes splitting short sequences costlier:
  // the world ring slows down more than whole-sequence placement.
  StepConfig cfg = oneLayer();
  ClusterModel flat = node8(), curve = node8();
  curve.attnEfficiency = {{512, 0.1}, {8192, 0.5}};
  std::vector<int64_t> lens(8, 8192);
  auto a = simulateStep(lens, cfg, flat), b = simulateStep(lens, cfg, curve);
  EXPECT_NEAR(find(a, "dp_cp").stepSeconds, find(b, "dp_cp").stepSeconds, 1e-12);  // whole sequences at 0.5 both
  EXPECT_GT(find(b, "ring_all").parts.attn, 2 * find(a, "ring_all").parts.attn);     // chunks of 1024 at ~0.2
}

TEST(Calibration, LatencyAddsPerMessage) {
  StepConfig cfg = oneLayer();
  ClusterModel c = node8();
  std::vector<int64_t> lens(8, 512);  // short: every ring transfer exposed
  auto a = simulateStep(lens, cfg, c);
  c.intraLatency = 50e-6;
  auto b = simulateStep(lens, cfg, c);
  // The world ring: 7 exposed steps forward and 7 backward, each 50 us later.
  EXPECT_NEAR(find(b, "ring_all").stepSeconds - find(a, "ring_all").stepSeconds, 14 * 50e-6, 1e-9);
  EXPECT_NEAR(find(b, "dp_cp").stepSeconds, find(a, "dp_cp").stepSeconds, 1e-12);  // no messages at g = 1
  RingStep st = ringStep(4096, true, 4, Link::Intra, AttnShape(), c);
  c.intraLatency = 0;
  EXPECT_NEAR(st.transfer - ringStep(4096, true, 4, Link::Intra, AttnShape(), c).transfer, 50e-6, 1e-15);
}

TEST(Calibration, RoutingSpeedsUpZeppelinsInterNodeRings) {
  ClusterModel c = node8(2);
  EXPECT_DOUBLE_EQ(linkBytesPerSec(Link::Routed, c), linkBytesPerSec(Link::Inter, c));  // no routing: one NIC
  EXPECT_EQ(zeppelinInterLink(c), Link::Inter);
  c.routeEfficiency = 0.8;
  EXPECT_EQ(zeppelinInterLink(c), Link::Routed);
  EXPECT_DOUBLE_EQ(linkBytesPerSec(Link::Routed, c), 0.8 * 4 * 25e9);
  // One sequence that must span both nodes, short enough that one NIC
  // cannot hide its ring: routing lowers Zeppelin's time, not the baselines'.
  StepConfig cfg = oneLayer();
  std::vector<int64_t> lens = {32768};
  ClusterModel off = node8(2);
  auto a = simulateStep(lens, cfg, off), b = simulateStep(lens, cfg, c);
  EXPECT_LT(find(b, "zeppelin").stepSeconds, find(a, "zeppelin").stepSeconds);
  EXPECT_DOUBLE_EQ(find(b, "zeppelin_noroute").stepSeconds, find(a, "zeppelin").stepSeconds);
  EXPECT_DOUBLE_EQ(find(b, "dp_cp").stepSeconds, find(a, "dp_cp").stepSeconds);
}

TEST(Calibration, FileRoundTripAndErrors) {
  Calibration h;
  ASSERT_TRUE(calibrationPreset("h200", &h));
  Calibration back = parseCalibration(calibrationJson(h), "x");
  EXPECT_EQ(back.name, "h200");
  EXPECT_EQ(back.cluster.nicsPerNode, 8);
  EXPECT_DOUBLE_EQ(back.cluster.intraNodeGBps, 450);
  EXPECT_DOUBLE_EQ(back.memoryGiB, 141);
  EXPECT_EQ(back.cluster.attnEfficiency, h.cluster.attnEfficiency);
  EXPECT_NEAR(back.cluster.interLatency, h.cluster.interLatency, 1e-15);
  // Keys replace the base preset's values; the rest stay.
  Calibration c = parseCalibration(R"({"base": "h800", "nic_gbps": 100, "attention_efficiency": [[100, 0.1], [1000, 0.3]]})", "x");
  EXPECT_DOUBLE_EQ(c.cluster.nicGbps, 100);
  EXPECT_DOUBLE_EQ(c.cluster.tflops, 989);
  EXPECT_DOUBLE_EQ(attnEfficiencyAt(1000, c.cluster), 0.3);
  auto error = [](const std::string& text) {
    try {
      parseCalibration(text, "cal.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(R"({"nic_gpbs": 100})").find("unknown key /nic_gpbs"), std::string::npos);
  EXPECT_NE(error(R"({"tflops": -1})").find("/tflops = -1 is out of range"), std::string::npos);
  EXPECT_NE(error(R"({"route_efficiency": 1.5})").find("/route_efficiency"), std::string::npos);
  EXPECT_NE(error(R"({"attention_efficiency": [[1000, 0.3], [100, 0.5]]})").find("/attention_efficiency/1"), std::string::npos);
  EXPECT_NE(error(R"({"attention_efficiency": [[1000, 1.3]]})").find("(0, 1]"), std::string::npos);
  EXPECT_NE(error(R"({"base": "v100"})").find("names no preset"), std::string::npos);
  EXPECT_NE(error("{\"tflops\": 1,\n}").find("line 2"), std::string::npos) << error("{\"tflops\": 1,\n}");
  EXPECT_NE(error("[1]").find("JSON object"), std::string::npos);
  EXPECT_THROW(readCalibration("/nonexistent/cal.json"), std::runtime_error);
}

// A calibration file is small and regular (issue 28, item 10: a 100 MB file
// took 503 MB to parse; a FIFO would block the read forever).
TEST(Calibration, FilesThatAreTooLargeOrNotRegularAreRefused) {
  const std::string dir = testing::TempDir();
  const std::string big = dir + "/zp_cal_big.json", fifo = dir + "/zp_cal_fifo.json";
  {
    std::ofstream f(big);
    f << "{\"name\": \"" << std::string(2 << 20, 'x') << "\"}";
  }
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto error = [](const std::string& path) {
    try {
      readCalibration(path);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(big).find("at most 1 MiB"), std::string::npos) << error(big);
  EXPECT_NE(error(fifo).find("not a regular file"), std::string::npos) << error(fifo);
  unlink(big.c_str());
  unlink(fifo.c_str());
}

// The planner refuses a bad efficiency table rather than dividing by zero.
TEST(Calibration, PlannerChecksTheModel) {
  ClusterModel c = node8();
  c.attnEfficiency = {{1000, 0.0}};
  EXPECT_THROW(planBatch({4096}, true, AttnShape(), c), std::invalid_argument);
  c.attnEfficiency = {};
  c.routeEfficiency = 2;
  EXPECT_THROW(planBatch({4096}, true, AttnShape(), c), std::invalid_argument);
}

}  // namespace
}  // namespace zp::plan

namespace {
// In a child (the setting is the process's): how far the heap's end moved
// down when 32 MiB of small blocks, allocated one after another, were freed.
long heapShrinkAfterFree(bool keep) {
  int fd[2];
  if (pipe(fd) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    if (keep) zp::keepFreedHeap();
    std::vector<void*> blocks;
    for (int i = 0; i < 4096; i++) blocks.push_back(malloc(8192));
    const char* before = static_cast<char*>(sbrk(0));
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free(*it);
    long shrink = long(before - static_cast<char*>(sbrk(0)));
    ssize_t w = write(fd[1], &shrink, sizeof shrink);
    _exit(w == sizeof shrink ? 0 : 1);
  }
  close(fd[1]);
  long shrink = -1;
  if (read(fd[0], &shrink, sizeof shrink) != sizeof shrink) shrink = -1;
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return shrink;
}
}  // namespace

// zpplan keeps its freed heap (src/util/heap.h): the pages a plan freed are
// the next plan's, not handed back to the kernel and faulted in again.
TEST(Heap, AProgramThatKeepsItsFreedHeapKeepsIt) {
  const long byDefault = heapShrinkAfterFree(false);
  ASSERT_GE(byDefault, 0);
  if (byDefault < (1 << 20))
    GTEST_SKIP() << "the heap shrank by " << byDefault << " bytes without the setting: not glibc's allocator "
                 << "(a sanitizer's?), so there is nothing to keep";
  EXPECT_EQ(heapShrinkAfterFree(true), 0);
}
