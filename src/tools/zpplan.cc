// zpplan: simulates one layer's forward attention step of variable-length
// batches on a modelled cluster, for Zeppelin's plan and the baselines
// (src/plan/simulator.h), and prints the step times and Zeppelin's speedups.
//
//   zpplan --file prolong64k.txt --preset a800 --ranks 16,32,64,128 [--json] [--time]
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <cfloat>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "src/plan/planner.h"
#include "src/plan/simulator.h"
#include "src/util/cli.h"
#include "src/util/strings.h"

using namespace zp::plan;

namespace {

constexpr int kExitUsage = 2;

// The command line (CLI11, src/util/cli.h).
struct Options {
  std::string file;
  std::vector<int> rankList = {16, 32, 64, 128};
  int64_t perRank = 65536;
  int batches = 8;
  uint64_t seed = 1;
  bool full = false, json = false, timing = false;
  std::string preset = "a800";
  // The cluster options given, applied over the preset wherever they stand.
  std::vector<std::function<void(ClusterModel*)>> clusterOverrides;
  AttnShape shape;
};

// The cluster model of a preset; false if there is no such preset.
bool presetModel(const std::string& name, ClusterModel* out) {
  ClusterModel m;  // a800 defaults
  if (name == "h200") {
    m.nicsPerNode = 8;
    m.nicGbps = 400;
    m.intraNodeGBps = 450;
    m.tflops = 989;
  } else if (name != "a800") {
    return false;
  }
  *out = m;
  return true;
}

// An option's value, read by zp's parsers; "bad value for <name>" if it is
// not one.
long long integer(const char* name, const std::string& v, long long lo = INT_MIN, long long hi = INT_MAX) {
  long long x = 0;
  if (!zp::parseInt(v, lo, hi, &x)) throw zp::cli::UsageError(std::string("bad value for ") + name);
  return x;
}
double number(const char* name, const std::string& v) {
  double x = 0;
  if (!zp::parseDouble(v, -DBL_MAX, DBL_MAX, &x)) throw zp::cli::UsageError(std::string("bad value for ") + name);
  return x;
}
std::function<void(const std::string&)> intValue(const char* name, int* out) {
  return [=](const std::string& v) { *out = (int)integer(name, v); };
}

void defineOptions(CLI::App& app, Options* o) {
  zp::cli::configure(app, "usage: zpplan --file LENGTHS [options]\n", 25);
  app.description(
      "Simulates one layer's forward attention step of variable-length batches on\n"
      "a modelled cluster, for Zeppelin's plan and the baselines, and prints the\n"
      "step times and Zeppelin's speedups.");
  using zp::cli::addValue;
  addValue(app, "--file", "PATH", "one sequence length per line", [o](const std::string& v) { o->file = v; });
  addValue(app, "--ranks", "LIST", "comma-separated rank counts (default 16,32,64,128)", [o](const std::string& v) {
    o->rankList.clear();
    std::stringstream ss(v);
    for (std::string x; std::getline(ss, x, ',');) o->rankList.push_back((int)integer("--ranks", x));
  });
  addValue(app, "--tokens-per-rank", "N", "batch budget per rank (default 65536)",
           [o](const std::string& v) { o->perRank = integer("--tokens-per-rank", v, LLONG_MIN, LLONG_MAX); });
  addValue(app, "--batches", "N", "batches per rank count (default 8)", intValue("--batches", &o->batches));
  addValue(app, "--seed", "N", "batch draw seed (default 1)",
           [o](const std::string& v) { o->seed = (uint64_t)integer("--seed", v, 0, LLONG_MAX); });
  addValue(app, "--preset", "a800|h200", "cluster preset (default a800); the options below\noverride it",
           [o](const std::string& v) {
             ClusterModel unused;
             if (!presetModel(v, &unused))
               throw zp::cli::UsageError("unknown preset '" + v + "' (a800 or h200)");
             o->preset = v;
           });
  // A cluster option: its value read now, applied over the preset later.
  auto cluster = [&](const char* name, const char* value, const char* help, auto field) {
    addValue(app, name, value, help, [o, name, field](const std::string& v) {
      using T = std::remove_reference_t<decltype(ClusterModel().*field)>;
      T x;
      if constexpr (std::is_same<T, int>::value)
        x = (int)integer(name, v);
      else
        x = number(name, v);
      o->clusterOverrides.push_back([field, x](ClusterModel* m) { m->*field = x; });
    });
  };
  cluster("--ranks-per-node", "N", "ranks per node (a800, h200: 8)", &ClusterModel::ranksPerNode);
  cluster("--nics", "N", "NICs per node (a800: 4, h200: 8)", &ClusterModel::nicsPerNode);
  cluster("--nic-gbps", "X", "Gbit/s per NIC (a800: 200, h200: 400)", &ClusterModel::nicGbps);
  cluster("--intra-gbps", "X", "GB/s per rank within a node (a800: 200, h200: 450)", &ClusterModel::intraNodeGBps);
  cluster("--tflops", "X", "dense bf16 peak per rank (a800: 312, h200: 989)", &ClusterModel::tflops);
  cluster("--efficiency", "X", "fraction of peak attention kernels reach (0.5)", &ClusterModel::efficiency);
  addValue(app, "--q-heads", "N", "query heads (default 32)", intValue("--q-heads", &o->shape.qHeads));
  addValue(app, "--kv-heads", "N", "key/value heads (default 8)", intValue("--kv-heads", &o->shape.kvHeads));
  addValue(app, "--head-dim", "N", "head dimension (default 128)", intValue("--head-dim", &o->shape.headDim));
  addValue(app, "--elem-bytes", "N", "bytes per element (default 2)", intValue("--elem-bytes", &o->shape.elemBytes));
  zp::cli::addFlag(app, "--full", &o->full, "non-causal attention (default causal)");
  zp::cli::addFlag(app, "--json", &o->json, "JSON output (keys in docs/planner.md)");
  zp::cli::addFlag(app, "--time", &o->timing, "also time planning (best of 20, ms)");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app("", "zpplan");
  defineOptions(app, &opt);
  int code = 0;
  if (!zp::cli::parseOptionsOnly(app, argc, argv, "unknown option '%s'", &code)) return code;
  ClusterModel base;
  presetModel(opt.preset, &base);
  for (const auto& set : opt.clusterOverrides) set(&base);
  const std::string& file = opt.file;
  const std::vector<int>& rankList = opt.rankList;
  const int64_t perRank = opt.perRank;
  const int batches = opt.batches;
  const uint64_t seed = opt.seed;
  const bool causal = !opt.full, json = opt.json, timing = opt.timing;
  const std::string& preset = opt.preset;
  const AttnShape& sh = opt.shape;
  if (file.empty()) {
    fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  std::ifstream f(file);
  std::vector<int64_t> all;
  int64_t x;
  while (f >> x) all.push_back(x);
  if (all.empty()) {
    fprintf(stderr, "zpplan: no lengths read from '%s'\n", file.c_str());
    return 2;
  }
  if (batches < 1 || perRank < 1) {
    fprintf(stderr, "zpplan: --batches and --tokens-per-rank must be at least 1\n");
    return 2;
  }

  if (json) printf("{\"preset\": \"%s\", \"causal\": %s, \"tokens_per_rank\": %lld, \"batches\": %d, \"seed\": %llu, \"results\": [",
                   preset.c_str(), causal ? "true" : "false", (long long)perRank, batches, (unsigned long long)seed);
  bool firstRow = true;
  for (int nranks : rankList) {
    ClusterModel c = base;
    if (nranks < 1 || nranks % c.ranksPerNode != 0) {
      fprintf(stderr, "zpplan: %d ranks is not a multiple of %d ranks per node\n", nranks, c.ranksPerNode);
      return 2;
    }
    c.nodes = nranks / c.ranksPerNode;
    std::mt19937_64 rng(seed);
    std::vector<StrategyResult> sum;
    double planMs = 0;
    size_t seqs = 0;
    for (int b = 0; b < batches; ++b) {
      auto lens = formBatch(all, perRank * nranks, rng);
      seqs += lens.size();
      std::vector<StrategyResult> r;
      try {
        r = simulateStep(lens, causal, sh, c);
      } catch (const std::invalid_argument& e) {
        fprintf(stderr, "zpplan: %s\n", e.what());
        return 2;
      }
      if (timing) {
        double best = 1e30;
        for (int k = 0; k < 20; ++k) {
          auto t0 = std::chrono::steady_clock::now();
          planBatch(lens, causal, sh, c);
          best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        planMs = std::max(planMs, best);
      }
      if (sum.empty()) {
        sum = r;
        for (auto& s : sum) s.attnImbalance /= batches, s.stepSeconds = s.stepSeconds, s.nicBytes /= batches, s.intraBytes /= batches;
      } else {
        for (size_t k = 0; k < r.size(); ++k) {
          sum[k].stepSeconds += r[k].stepSeconds;
          sum[k].remapSeconds += r[k].remapSeconds;
          sum[k].attnImbalance += r[k].attnImbalance / batches;
          sum[k].nicBytes += r[k].nicBytes / batches;
          sum[k].intraBytes += r[k].intraBytes / batches;
        }
      }
    }
    // Step times are summed over the batches, so speedups are ratios of total
    // time; printed per batch as means.
    const double zt = sum[0].stepSeconds;
    if (json) {
      printf("%s\n  {\"ranks\": %d, \"nodes\": %d, \"mean_seqs\": %.1f, \"plan_ms\": %.3f, \"strategies\": {", firstRow ? "" : ",",
             nranks, c.nodes, double(seqs) / batches, planMs);
      for (size_t k = 0; k < sum.size(); ++k)
        printf("%s\"%s\": {\"step_ms\": %.4f, \"remap_ms\": %.4f, \"attn_imbalance\": %.4f, \"nic_bytes\": %.0f, \"intra_bytes\": %.0f, \"zeppelin_speedup\": %.4f}",
               k ? ", " : "", sum[k].name.c_str(), sum[k].stepSeconds / batches * 1e3,
               sum[k].remapSeconds / batches * 1e3, sum[k].attnImbalance,
               sum[k].nicBytes, sum[k].intraBytes, sum[k].stepSeconds / zt);
      printf("}}");
    } else {
      printf("%d ranks (%d nodes x %d), %s, %d batches of %lld tokens/rank, mean %.0f seqs%s\n", nranks, c.nodes,
             c.ranksPerNode, preset.c_str(), batches, (long long)perRank, double(seqs) / batches,
             timing ? (", planning " + std::to_string(planMs) + " ms (worst batch, best of 20)").c_str() : "");
      printf("  %-11s %10s %9s %9s %12s %12s %9s\n", "strategy", "step ms", "remap ms", "attn imb", "NIC GB", "intra GB", "zp speedup");
      for (const auto& s : sum)
        printf("  %-11s %10.3f %9.3f %9.3f %12.3f %12.3f %9.2fx\n", s.name.c_str(), s.stepSeconds / batches * 1e3,
               s.remapSeconds / batches * 1e3, s.attnImbalance, s.nicBytes / 1e9, s.intraBytes / 1e9, s.stepSeconds / zt);
    }
    firstRow = false;
  }
  if (json) printf("\n]}\n");
  return 0;
}
