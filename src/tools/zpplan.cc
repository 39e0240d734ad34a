// zpplan: simulates one layer's forward attention step of variable-length
// batches on a modelled cluster, for Zeppelin's plan and the baselines
// (src/plan/simulator.h), and prints the step times and Zeppelin's speedups.
//
//   zpplan --file prolong64k.txt --preset a800 --ranks 16,32,64,128 [--json] [--time]
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/plan/planner.h"
#include "src/plan/simulator.h"

using namespace zp::plan;

namespace {

void usage() {
  fprintf(stderr,
          "usage: zpplan --file LENGTHS [options]\n"
          "  --file PATH            one sequence length per line\n"
          "  --ranks LIST           comma-separated rank counts (default 16,32,64,128)\n"
          "  --tokens-per-rank N    batch budget per rank (default 65536)\n"
          "  --batches N            batches per rank count (default 8)\n"
          "  --seed N               batch draw seed (default 1)\n"
          "  --preset a800|h200     cluster preset (default a800)\n"
          "  --ranks-per-node N --nics N --nic-gbps X --intra-gbps X --tflops X --efficiency X\n"
          "  --q-heads N --kv-heads N --head-dim N --elem-bytes N   (default 32, 8, 128, 2)\n"
          "  --full                 non-causal attention (default causal)\n"
          "  --json                 JSON output (keys in docs/planner.md)\n"
          "  --time                 also time planning (best of 20, ms)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string file;
  std::vector<int> rankList = {16, 32, 64, 128};
  int64_t perRank = 65536;
  int batches = 8;
  uint64_t seed = 1;
  bool causal = true, json = false, timing = false;
  std::string preset = "a800";
  ClusterModel base;  // a800 defaults
  AttnShape sh;
  // Options after --preset override it, so presets are applied first.
  for (int i = 1; i + 1 < argc; ++i)
    if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
  if (preset == "h200") {
    base.nicsPerNode = 8;
    base.nicGbps = 400;
    base.intraNodeGBps = 450;
    base.tflops = 989;
  } else if (preset != "a800") {
    fprintf(stderr, "zpplan: unknown preset '%s' (a800 or h200)\n", preset.c_str());
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "zpplan: %s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--file") file = val();
      else if (a == "--ranks") {
        rankList.clear();
        std::stringstream ss(val());
        std::string x;
        while (std::getline(ss, x, ',')) rankList.push_back(std::stoi(x));
      } else if (a == "--tokens-per-rank") perRank = std::stoll(val());
      else if (a == "--batches") batches = std::stoi(val());
      else if (a == "--seed") seed = std::stoull(val());
      else if (a == "--preset") val();
      else if (a == "--ranks-per-node") base.ranksPerNode = std::stoi(val());
      else if (a == "--nics") base.nicsPerNode = std::stoi(val());
      else if (a == "--nic-gbps") base.nicGbps = std::stod(val());
      else if (a == "--intra-gbps") base.intraNodeGBps = std::stod(val());
      else if (a == "--tflops") base.tflops = std::stod(val());
      else if (a == "--efficiency") base.efficiency = std::stod(val());
      else if (a == "--q-heads") sh.qHeads = std::stoi(val());
      else if (a == "--kv-heads") sh.kvHeads = std::stoi(val());
      else if (a == "--head-dim") sh.headDim = std::stoi(val());
      else if (a == "--elem-bytes") sh.elemBytes = std::stoi(val());
      else if (a == "--full") causal = false;
      else if (a == "--json") json = true;
      else if (a == "--time") timing = true;
      else if (a == "-h" || a == "--help") { usage(); return 0; }
      else {
        fprintf(stderr, "zpplan: unknown option '%s'\n", a.c_str());
        usage();
        return 2;
      }
    } catch (const std::exception&) {
      fprintf(stderr, "zpplan: bad value for %s\n", a.c_str());
      return 2;
    }
  }
  if (file.empty()) {
    usage();
    return 2;
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
