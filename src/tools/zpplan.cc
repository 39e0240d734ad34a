// zpplan: simulates training steps (forward and backward, every layer) of
// variable-length batches on a modelled cluster, for Zeppelin's plan, its
// variants and the baselines (src/sim/simulator.h), over many batches and
// seeds, and prints each strategy's step time (median and 90% interval),
// where the time goes, its memory, and Zeppelin's speedup over the best
// feasible baseline. docs/simulator.md explains the model and the output.
//
//   zpplan --file prolong64k.txt --preset a800 --model llama-8b --ranks 16,64,256 [--json]
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/sim/calibration.h"
#include "src/plan/planner.h"
#include "src/sim/simulator.h"
#include "src/util/cli.h"
#include "src/util/heap.h"
#include "src/util/strings.h"

using namespace zp::plan;
using namespace zp::sim;
// Members in the order they are set (the strategies in strategyNames() order).
using Json = nlohmann::ordered_json;

namespace {

constexpr int kExitUsage = 2;

// The command line (CLI11, src/util/cli.h).
struct Options {
  std::string file;
  std::vector<int> rankList = {16, 32, 64, 128, 256};
  int64_t perRank = 65536;
  int batches = 16, seeds = 5;
  uint64_t seed = 1;
  bool full = false, json = false, noRecompute = false, noNodeBalance = false, legacyPlanner = false,
       noHeadSplit = false, noBalanced = false;
  std::string preset = "a800", calibrationFile, modelName = "llama-8b", writeCalibration;
  // Options given, applied over the preset, calibration file and model in
  // the order they stand.
  std::vector<std::function<void(Calibration*)>> clusterOverrides;
  std::vector<std::function<void(ModelShape*)>> modelOverrides;
};

long long integer(const char* name, const std::string& v, long long lo = 1, long long hi = INT_MAX) {
  long long x = 0;
  if (!zp::parseInt(v, lo, hi, &x))
    throw zp::cli::UsageError(std::string("bad value for ") + name + " (an integer from " + std::to_string(lo) + ")");
  return x;
}
double number(const char* name, const std::string& v, double lo, double hi) {
  double x = 0;
  if (!zp::parseDouble(v, lo, hi, &x) || !std::isfinite(x))
    throw zp::cli::UsageError(std::string("bad value for ") + name + " (a number from " + zp::strprintf("%g to %g", lo, hi) + ")");
  return x;
}

void defineOptions(CLI::App& app, Options* o) {
  zp::cli::configure(app, "usage: zpplan --file LENGTHS [options]\n", 27);
  app.description(
      "Simulates training steps (forward and backward, every layer) of\n"
      "variable-length batches on a modelled cluster, for Zeppelin, its variants\n"
      "and the baselines, over many batches and seeds; prints step times (median,\n"
      "90% interval), where the time goes, memory, and Zeppelin's speedup over\n"
      "the best feasible baseline. See docs/simulator.md.");
  using zp::cli::addValue;
  addValue(app, "--file", "PATH", "one sequence length per line", [o](const std::string& v) { o->file = v; });
  addValue(app, "--ranks", "LIST", "comma-separated rank counts (default 16,32,64,128,256)", [o](const std::string& v) {
    o->rankList.clear();
    std::stringstream ss(v);
    for (std::string x; std::getline(ss, x, ',');) o->rankList.push_back((int)integer("--ranks", x, 1, 1 << 22));
  });
  addValue(app, "--tokens-per-rank", "N", "batch budget per rank (default 65536)",
           [o](const std::string& v) { o->perRank = integer("--tokens-per-rank", v, 1, int64_t(1) << 40); });
  addValue(app, "--batches", "N", "batches per seed (default 16)",
           [o](const std::string& v) { o->batches = (int)integer("--batches", v); });
  addValue(app, "--seeds", "N", "seeds, from --seed on (default 5)",
           [o](const std::string& v) { o->seeds = (int)integer("--seeds", v); });
  addValue(app, "--seed", "N", "first batch draw seed (default 1)",
           [o](const std::string& v) { o->seed = (uint64_t)integer("--seed", v, 0, LLONG_MAX); });
  addValue(app, "--preset", "NAME", "machine: a800 (default), h800, h200; the options\nbelow override it",
           [o](const std::string& v) {
             Calibration unused;
             if (!calibrationPreset(v, &unused))
               throw zp::cli::UsageError("unknown preset '" + v + "' (" + calibrationPresetNames() + ")");
             o->preset = v;
             o->calibrationFile.clear();
           });
  addValue(app, "--calibration", "FILE", "machine from a calibration file (bench/calibrate.py\nwrites one) instead of a preset",
           [o](const std::string& v) { o->calibrationFile = v; });
  addValue(app, "--write-calibration", "FILE", "write the machine in use (preset, file, options) as\na calibration file and exit",
           [o](const std::string& v) { o->writeCalibration = v; });
  // A machine option: read now, applied over the preset later.
  auto machine = [&](const char* name, const char* value, const char* help, double lo, double hi,
                     std::function<void(Calibration*, double)> set) {
    addValue(app, name, value, help, [o, name, lo, hi, set](const std::string& v) {
      double x = number(name, v, lo, hi);
      o->clusterOverrides.push_back([set, x](Calibration* c) { set(c, x); });
    });
  };
  machine("--ranks-per-node", "N", "ranks per node (8)", 1, 1 << 16, [](Calibration* c, double x) { c->cluster.ranksPerNode = int(x); });
  machine("--nics", "N", "NICs per node (a800: 4, h800, h200: 8)", 1, 1024, [](Calibration* c, double x) { c->cluster.nicsPerNode = int(x); });
  machine("--nic-gbps", "X", "Gbit/s per NIC (a800: 200, h800, h200: 400)", 1e-3, 1e9, [](Calibration* c, double x) { c->cluster.nicGbps = x; });
  machine("--intra-gbps", "X", "GB/s per rank within a node, each way (200; h200: 450)", 1e-3, 1e9,
          [](Calibration* c, double x) { c->cluster.intraNodeGBps = x; });
  machine("--tflops", "X", "dense bf16 peak per rank (a800: 312; h800, h200: 989)", 1e-6, 1e9,
          [](Calibration* c, double x) { c->cluster.tflops = x; });
  machine("--efficiency", "X", "attention efficiency for every chunk length (replaces\nthe preset's table)", 1e-6, 1,
          [](Calibration* c, double x) {
            c->cluster.efficiency = x;
            c->cluster.attnEfficiency.clear();
          });
  machine("--linear-efficiency", "X", "fraction of peak of projections and MLP (0.65)", 1e-6, 1,
          [](Calibration* c, double x) { c->linearEfficiency = x; });
  machine("--route-efficiency", "X", "share of a node's NICs a routed ring hop gets (0.8;\n0: no routing)", 0, 1,
          [](Calibration* c, double x) { c->cluster.routeEfficiency = x; });
  machine("--intra-latency-us", "X", "per message within a node (10)", 0, 1e9, [](Calibration* c, double x) { c->cluster.intraLatency = x * 1e-6; });
  machine("--inter-latency-us", "X", "per message across nodes (20)", 0, 1e9, [](Calibration* c, double x) { c->cluster.interLatency = x * 1e-6; });
  machine("--memory-gib", "X", "memory per rank (a800, h800: 80; h200: 141)", 1e-3, 1e9, [](Calibration* c, double x) { c->memoryGiB = x; });
  addValue(app, "--model", "NAME", "llama-3b, llama-7b, llama-8b (default), llama-13b,\nllama-30b; the options below override it",
           [o](const std::string& v) {
             ModelShape unused;
             if (!modelPreset(v, &unused))
               throw zp::cli::UsageError("unknown model '" + v + "' (" + modelPresetNames() + ")");
             o->modelName = v;
           });
  auto model = [&](const char* name, const char* help, std::function<void(ModelShape*, int)> set) {
    addValue(app, name, "N", help, [o, name, set](const std::string& v) {
      int x = (int)integer(name, v, 1, 1 << 24);
      o->modelOverrides.push_back([set, x](ModelShape* m) { set(m, x); });
    });
  };
  model("--hidden", "hidden size", [](ModelShape* m, int x) { m->hidden = x; });
  model("--ffn", "MLP inner size", [](ModelShape* m, int x) { m->ffn = x; });
  model("--layers", "layers", [](ModelShape* m, int x) { m->layers = x; });
  model("--q-heads", "query heads", [](ModelShape* m, int x) { m->attn.qHeads = x; });
  model("--kv-heads", "key/value heads", [](ModelShape* m, int x) { m->attn.kvHeads = x; });
  model("--head-dim", "head dimension", [](ModelShape* m, int x) { m->attn.headDim = x; });
  model("--elem-bytes", "bytes per element (2)", [](ModelShape* m, int x) { m->attn.elemBytes = x; });
  zp::cli::addFlag(app, "--no-recompute", &o->noRecompute, "keep every layer's activations (default: full\nrecomputation)");
  zp::cli::addFlag(app, "--no-node-balance", &o->noNodeBalance, "the planner balances no tokens across nodes (to\nsee what that balance does)");
  zp::cli::addFlag(app, "--no-head-split", &o->noHeadSplit, "Zeppelin's plans split no heads (Ulysses inside a\nnode; to see what splitting them does). Head splits\nare modelled only: the attention driver does not run\nthem");
  zp::cli::addFlag(app, "--no-balanced-candidates", &o->noBalanced, "Zeppelin's plans without the candidates that balance\neach pass (forward and backward) rather than their sum,\nnor their whole sequences placed again so (for\ncomparison)");
  zp::cli::addFlag(app, "--legacy-planner", &o->legacyPlanner, "Zeppelin's rows with the planner before idle-aware\nscheduling (for comparison)");
  zp::cli::addFlag(app, "--full", &o->full, "non-causal attention (default causal)");
  zp::cli::addFlag(app, "--json", &o->json, "JSON output (keys in docs/simulator.md)");
}

// The q-th quantile of v (linear between order statistics).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t i = size_t(pos);
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (pos - i) * (v[i + 1] - v[i]);
}

struct Spread {
  double median, lo, hi;
};
Spread spread(const std::vector<double>& v) { return {quantile(v, 0.5), quantile(v, 0.05), quantile(v, 0.95)}; }

Json jsonSpread(const Spread& s) { return {{"median", s.median}, {"p5", s.lo}, {"p95", s.hi}}; }

// What one strategy did over all batches of one rank count.
struct Tally {
  std::vector<double> step, speedup, memGiB;
  Breakdown parts;  // summed
  int feasible = 0;
  std::map<int, int> groups;
  std::vector<double> limits;  // token limits chosen
  bool baseline = false, reference = false;
};

// What every strategy did over all draws of one rank count.
struct RankCount {
  int nranks = 0, nodes = 0, ranksPerNode = 0;
  std::vector<Tally> tally;  // by strategy, in strategyNames() order
  std::vector<double> planMs, bestSpeedup, bestSpeedupCharged, ofBound, ofIdeal;
  std::map<std::string, int> bestCount;
  size_t seqs = 0, draws = 0;
  int zeppelinInfeasible = 0;
  int zeppelinHeadSplit = 0;  // batches whose plan splits some sequence's heads
  // Tokens of the documents the batches passed over in the file, and of
  // those planned (every one: a document over the budget is a batch of its
  // own); documents over the budget, and batches no strategy fits.
  double tokensRead = 0, tokensPlanned = 0;
  int longDocs = 0, noneFeasible = 0;
};

// The simulator's input: the machine, the model and the step, from the
// options; 0, or the exit code after saying why.
int setUp(const Options& opt, Calibration* cal, StepConfig* cfg) {
  calibrationPreset(opt.preset, cal);
  if (!opt.calibrationFile.empty()) {
    try {
      *cal = readCalibration(opt.calibrationFile);
    } catch (const std::exception& e) {
      fprintf(stderr, "zpplan: %s\n", e.what());
      return kExitUsage;
    }
  }
  for (const auto& set : opt.clusterOverrides) set(cal);
  modelPreset(opt.modelName, &cfg->model);
  for (const auto& set : opt.modelOverrides) set(&cfg->model);
  if (cfg->model.attn.qHeads % cfg->model.attn.kvHeads) {
    fprintf(stderr, "zpplan: %d key/value heads do not divide %d query heads\n", cfg->model.attn.kvHeads, cfg->model.attn.qHeads);
    return kExitUsage;
  }
  cfg->causal = !opt.full;
  cfg->recompute = !opt.noRecompute;
  cfg->nodeTokenBalance = !opt.noNodeBalance;
  cfg->legacyPlanner = opt.legacyPlanner;
  cfg->headSplit = !opt.noHeadSplit;
  cfg->balancedCandidates = !opt.noBalanced;
  cfg->linearEfficiency = cal->linearEfficiency;
  cfg->memoryBytes = cal->memoryGiB * double(1 << 30);
  return 0;
}

// The sequence lengths of the file (readLengths); 0, or the exit code after
// saying why.
int readLengthsFile(const std::string& file, std::vector<int64_t>* all) {
  try {
    *all = zp::sim::readLengths(file);
  } catch (const std::invalid_argument& e) {
    fprintf(stderr, "zpplan: %s\n", e.what());
    return kExitUsage;
  }
  return 0;
}

// Plans and simulates every draw (seeds x batches) for nranks ranks; 0, or
// the exit code after saying why.
int simulateRankCount(const Options& opt, const StepConfig& cfg, const Calibration& cal,
                      const std::vector<int64_t>& all, int nranks, RankCount* out) {
  ClusterModel c = cal.cluster;
  c.nodes = nranks / c.ranksPerNode;
  RankCount& rc = *out;
  rc.nranks = nranks;
  rc.nodes = c.nodes;
  rc.ranksPerNode = c.ranksPerNode;
  rc.tally.assign(strategyNames().size(), Tally());
  const int64_t budget = opt.perRank * nranks;
  for (int s = 0; s < opt.seeds; ++s) {
    // Each seed: batches one after another through the file from a random
    // document on, so every document passed over is planned.
    std::mt19937_64 rng(opt.seed + s);
    size_t next = rng() % all.size();
    double prevStep = 0;  // Zeppelin's step before this batch's (none for the first)
    for (int b = 0; b < opt.batches; ++b, ++rc.draws) {
      const size_t from = next;
      auto lens = nextBatch(all, budget, &next);
      // The documents the batch passed over (all of them, when one batch
      // takes the whole file).
      size_t passed = (next + all.size() - from) % all.size();
      if (passed == 0 && !lens.empty()) passed = all.size();
      for (size_t j = 0; j < passed; ++j) rc.tokensRead += double(all[(from + j) % all.size()]);
      for (int64_t l : lens) rc.tokensPlanned += double(l);
      if (lens.size() == 1 && lens[0] > budget) ++rc.longDocs;
      rc.seqs += lens.size();
      std::vector<StrategyResult> r;
      double ms = 0;
      try {
        auto t0 = std::chrono::steady_clock::now();
        planForStep(lens, cfg, c);
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        r = simulateStep(lens, cfg, c);
      } catch (const std::invalid_argument& e) {
        fprintf(stderr, "zpplan: %s\n", e.what());
        return kExitUsage;
      }
      rc.planMs.push_back(ms);
      const double zt = r[0].stepSeconds;
      int best = -1;
      for (size_t k = 0; k < r.size(); ++k) {
        Tally& t = rc.tally[k];
        t.step.push_back(r[k].stepSeconds);
        t.speedup.push_back(r[k].stepSeconds / zt);
        t.memGiB.push_back(r[k].peakMemoryBytes / double(1 << 30));
        t.parts.attn += r[k].parts.attn;
        t.parts.comm += r[k].parts.comm;
        t.parts.remap += r[k].parts.remap;
        t.parts.linear += r[k].parts.linear;
        t.parts.idle += r[k].parts.idle;
        t.feasible += r[k].feasible;
        if (r[k].group) t.groups[r[k].group]++;
        if (r[k].limitTokens) t.limits.push_back(double(r[k].limitTokens));
        t.baseline = r[k].baseline;
        t.reference = r[k].reference;
        if (r[k].baseline && r[k].feasible && (best < 0 || r[k].stepSeconds < r[best].stepSeconds)) best = int(k);
      }
      if (!r[0].feasible) ++rc.zeppelinInfeasible;
      if (r[0].ulysses > 1) ++rc.zeppelinHeadSplit;
      // The lower bound ("bound") comes last, the whole-sequence bound
      // ("ideal") before it.
      rc.ofBound.push_back(r.back().stepSeconds / zt);
      rc.ofIdeal.push_back(r[r.size() - 2].stepSeconds / zt);
      if (best >= 0) {
        rc.bestCount[r[best].name]++;
        rc.bestSpeedup.push_back(r[best].stepSeconds / zt);
        // Planned ahead (zpPlanBatchAhead): batch b is planned while step
        // b - 1 runs, so only what planning takes beyond that step is
        // charged (all of it for a seed's first batch).
        rc.bestSpeedupCharged.push_back(r[best].stepSeconds / (zt + std::max(0.0, ms * 1e-3 - prevStep)));
      } else {
        rc.bestCount["(none feasible)"]++;
      }
      if (!r[0].feasible && best < 0) ++rc.noneFeasible;
      prevStep = zt;
    }
  }
  return 0;
}

// The group size a strategy chose most often (0: none).
int groupOf(const Tally& t) {
  int g = 0, most = 0;
  for (const auto& [size, cnt] : t.groups)
    if (cnt > most) g = size, most = cnt;
  return g;
}

// The run's header: the machine, the model, the step and the draws.
Json headerJson(const Options& opt, const Calibration& cal, const StepConfig& cfg) {
  const ModelShape& m = cfg.model;
  return {{"machine", cal.name},
          {"source", cal.source},
          {"model",
           {{"name", m.name},
            {"hidden", m.hidden},
            {"ffn", m.ffn},
            {"layers", m.layers},
            {"q_heads", m.attn.qHeads},
            {"kv_heads", m.attn.kvHeads},
            {"head_dim", m.attn.headDim}}},
          {"causal", cfg.causal},
          {"recompute", cfg.recompute},
          {"tokens_per_rank", opt.perRank},
          {"node_balance", cfg.nodeTokenBalance},
          {"batches", opt.batches},
          {"seeds", opt.seeds},
          {"seed", opt.seed},
          {"results", Json::array()}};
}

// One rank count's results: the draws, planning time, the best baseline and
// Zeppelin's speedup over it, and every strategy's figures.
Json rankCountJson(const RankCount& rc) {
  const double nb = double(rc.draws);
  const std::vector<std::string>& names = strategyNames();
  Json best = Json::object();
  for (const auto& [name, cnt] : rc.bestCount) best[name] = cnt;
  Json strategies = Json::object();
  for (size_t k = 0; k < names.size(); ++k) {
    const Tally& t = rc.tally[k];
    strategies[names[k]] = {
        {"baseline", t.baseline},
        {"reference", t.reference},
        {"step_s", jsonSpread(spread(t.step))},
        {"breakdown_s",
         {{"attn", t.parts.attn / nb},
          {"comm", t.parts.comm / nb},
          {"remap", t.parts.remap / nb},
          {"linear", t.parts.linear / nb},
          {"idle", t.parts.idle / nb}}},
        {"feasible", t.feasible / nb},
        {"peak_mem_gib", jsonSpread(spread(t.memGiB))},
        {"group", groupOf(t)},
        {"limit_tokens", quantile(t.limits, 0.5)},
        {"zeppelin_speedup", jsonSpread(spread(t.speedup))}};
  }
  return {{"ranks", rc.nranks},
          {"nodes", rc.nodes},
          {"draws", rc.draws},
          {"mean_seqs", rc.seqs / nb},
          {"plan_ms", jsonSpread(spread(rc.planMs))},
          {"zeppelin_infeasible", rc.zeppelinInfeasible},
          {"zeppelin_head_split", rc.zeppelinHeadSplit},
          {"tokens_read", rc.tokensRead},
          {"tokens_planned", rc.tokensPlanned},
          {"long_documents", rc.longDocs},
          {"none_feasible", rc.noneFeasible},
          {"best_baseline", best},
          {"speedup_over_best", jsonSpread(spread(rc.bestSpeedup))},
          // The worst batch: Zeppelin over every feasible baseline is at least this.
          {"speedup_over_best_min", rc.bestSpeedup.empty() ? 0.0 : *std::min_element(rc.bestSpeedup.begin(), rc.bestSpeedup.end())},
          {"speedup_over_best_planning_charged", jsonSpread(spread(rc.bestSpeedupCharged))},
          {"bound_over_zeppelin", jsonSpread(spread(rc.ofBound))},
          {"ideal_over_zeppelin", jsonSpread(spread(rc.ofIdeal))},
          {"strategies", strategies}};
}

void printHeader(const Calibration& cal, const StepConfig& cfg) {
  const ModelShape& m = cfg.model;
  printf("# machine %s (%s)\n# model %s: hidden %d, ffn %d, %d layers, %d/%d heads of %d; %s, %s\n", cal.name.c_str(),
         cal.source.empty() ? "no source given" : cal.source.c_str(), m.name.c_str(), m.hidden, m.ffn, m.layers,
         m.attn.qHeads, m.attn.kvHeads, m.attn.headDim, cfg.causal ? "causal" : "full attention",
         cfg.recompute ? "full recomputation" : "no recomputation");
}

void printRankCount(const Options& opt, const RankCount& rc) {
  const double nb = double(rc.draws);
  const std::vector<std::string>& names = strategyNames();
  const Spread plan = spread(rc.planMs), sp = spread(rc.bestSpeedup), spc = spread(rc.bestSpeedupCharged),
               bound = spread(rc.ofBound), whole = spread(rc.ofIdeal);
  std::string bestList;
  for (const auto& [name, cnt] : rc.bestCount) bestList += (bestList.empty() ? "" : ", ") + name + " " + std::to_string(cnt);
  printf("\n%d ranks (%d nodes x %d), %zu batches (%d seeds x %d) of %lld tokens/rank, mean %.0f seqs; planning %.2f ms "
         "[%.2f, %.2f]\n",
         rc.nranks, rc.nodes, rc.ranksPerNode, rc.draws, opt.seeds, opt.batches, (long long)opt.perRank, rc.seqs / nb,
         plan.median, plan.lo, plan.hi);
  printf("  %-19s %22s | %6s %6s %6s %6s %6s | %7s %5s %5s | %s\n", "strategy", "step s: median [90%]", "attn", "comm",
         "remap", "linear", "idle", "mem GiB", "fits", "g/lim", "zp speedup");
  for (size_t k = 0; k < names.size(); ++k) {
    const Tally& t = rc.tally[k];
    Spread st = spread(t.step), su = spread(t.speedup);
    int g = groupOf(t);
    std::string gs = g ? std::to_string(g) : t.limits.empty() ? "-" : zp::strprintf("%.0fK", quantile(t.limits, 0.5) / 1024);
    printf("  %-19s %6.2f [%6.2f, %6.2f] | %6.2f %6.2f %6.2f %6.2f %6.2f | %7.1f %4.0f%% %5s | %5.2fx [%.2f, %.2f]\n",
           (names[k] + (t.reference ? " (ref)" : "")).c_str(), st.median, st.lo, st.hi, t.parts.attn / nb,
           t.parts.comm / nb, t.parts.remap / nb, t.parts.linear / nb, t.parts.idle / nb, quantile(t.memGiB, 0.5),
           100.0 * t.feasible / nb, gs.c_str(), su.median, su.lo, su.hi);
  }
  printf("  best feasible baseline per batch: %s\n", bestList.c_str());
  if (!rc.bestSpeedup.empty())
    printf("  Zeppelin over the best feasible baseline: %.2fx [%.2f, %.2f], worst batch %.3fx; planning ahead, its unhidden time charged: %.2fx [%.2f, %.2f]%s\n",
           sp.median, sp.lo, sp.hi, *std::min_element(rc.bestSpeedup.begin(), rc.bestSpeedup.end()), spc.median, spc.lo, spc.hi,
           rc.zeppelinInfeasible ? zp::strprintf(" (Zeppelin over memory in %d batches)", rc.zeppelinInfeasible).c_str() : "");
  printf("  the lower bound over Zeppelin: %.3f [%.3f, %.3f] (the whole-sequence bound, ideal: %.3f); Zeppelin's plan "
         "splits heads in %d of %zu batches%s\n",
         bound.median, bound.lo, bound.hi, whole.median, rc.zeppelinHeadSplit, rc.draws,
         rc.zeppelinHeadSplit ? " (modelled only: the attention driver does not run head splits)" : "");
  printf("  tokens planned %.0f of %.0f read (%.2f%%); %d documents longer than the batch, each a batch of its own%s\n",
         rc.tokensPlanned, rc.tokensRead, rc.tokensRead > 0 ? 100.0 * rc.tokensPlanned / rc.tokensRead : 100.0,
         rc.longDocs,
         rc.noneFeasible ? zp::strprintf("; %d batches fit no strategy's memory", rc.noneFeasible).c_str() : "");
}

}  // namespace

int main(int argc, char** argv) {
  zp::keepFreedHeap();  // it plans batch after batch, and charges the time
  Options opt;
  CLI::App app("", "zpplan");
  defineOptions(app, &opt);
  int code = 0;
  if (!zp::cli::parseOptionsOnly(app, argc, argv, "unknown option '%s'", &code)) return code;
  Calibration cal;
  StepConfig cfg;
  if (int bad = setUp(opt, &cal, &cfg)) return bad;
  if (!opt.writeCalibration.empty()) {
    std::ofstream out(opt.writeCalibration);
    out << calibrationJson(cal);
    if (!out) {
      fprintf(stderr, "zpplan: cannot write '%s'\n", opt.writeCalibration.c_str());
      return 1;
    }
    return 0;
  }
  if (opt.file.empty()) {
    fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  std::vector<int64_t> all;
  if (int bad = readLengthsFile(opt.file, &all)) return bad;
  for (int nranks : opt.rankList)
    if (nranks % cal.cluster.ranksPerNode != 0) {
      fprintf(stderr, "zpplan: %d ranks is not a multiple of %d ranks per node\n", nranks, cal.cluster.ranksPerNode);
      return kExitUsage;
    }

  Json report = headerJson(opt, cal, cfg);
  if (!opt.json) printHeader(cal, cfg);
  for (int nranks : opt.rankList) {
    RankCount rc;
    if (int bad = simulateRankCount(opt, cfg, cal, all, nranks, &rc)) return bad;
    if (opt.json)
      report["results"].push_back(rankCountJson(rc));
    else
      printRankCount(opt, rc);
  }
  if (opt.json) printf("%s\n", report.dump(2).c_str());
  return 0;
}
