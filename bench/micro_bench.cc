// micro_bench: Google Benchmark micro-benchmarks of the pieces that run on
// the CPU for every batch or call, on inputs of production size:
//   - the planner (planBatch) at 16 to 1024 ranks on batches of 64K tokens
//     per rank drawn from prolong64k.txt, and one full simulated step;
//   - the router's plan of a uniform alltoallv at 64 and 512 ranks (8 per
//     node, 4 NICs per node), the size of plan a 512-rank zpAlltoallv makes;
//   - the check of a 512-rank layout (zpLayoutCreate: every token once);
//   - the log-sum-exp merge of a block's partial attention output;
//   - the reference attention kernel by chunk length (the machine's own
//     attention efficiency curve, for bench/calibrate.py).
// CTest runs it briefly as a smoke test (micro_bench_smoke). The remap's and
// Ulysses' index building and the alltoallv count check need a live
// communicator of that many ranks and are not here.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/plan/planner.h"
#include "src/sim/calibration.h"
#include "src/sim/simulator.h"
#include "src/route/router.h"
#include "src/util/heap.h"

namespace {

// A length file of tests/data (readLengths throws, naming the file, if it
// is missing or malformed).
std::vector<int64_t> readLengths(const std::string& name) {
  return zp::sim::readLengths(ZP_SOURCE_DIR "/tests/data/" + name);
}

const std::vector<int64_t>& lengths() {
  static const std::vector<int64_t> all = readLengths("prolong64k.txt");
  return all;
}

std::vector<int64_t> batch(int ranks) {
  std::mt19937_64 rng(1);
  return zp::sim::formBatch(lengths(), int64_t(65536) * ranks, rng);
}

zp::plan::ClusterModel cluster(int ranks) {
  zp::plan::ClusterModel c;
  c.ranksPerNode = 8;
  c.nodes = ranks / 8;
  return c;
}

void BM_PlanBatch(benchmark::State& state) {
  const int ranks = int(state.range(0));
  auto lens = batch(ranks);
  auto c = cluster(ranks);
  for (auto _ : state) benchmark::DoNotOptimize(zp::plan::planBatch(lens, true, zp::plan::AttnShape(), c));
  state.counters["seqs"] = double(lens.size());
}
BENCHMARK(BM_PlanBatch)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// The planner as zpplan's "zeppelin" runs it: candidates ranked by the whole
// step model (planForStep); NoFit without the candidates whose rings are
// sized to their slot (PlanOptions::fitRings), for what they cost; and the
// planner before idle-aware scheduling.
void planForStep(benchmark::State& state, bool fitRings) {
  const int ranks = int(state.range(0));
  auto lens = batch(ranks);
  auto c = cluster(ranks);
  zp::sim::StepConfig cfg;
  cfg.fitRings = fitRings;
  for (auto _ : state) benchmark::DoNotOptimize(zp::sim::planForStep(lens, cfg, c));
  state.counters["seqs"] = double(lens.size());
}
void BM_PlanForStep(benchmark::State& state) { planForStep(state, true); }
void BM_PlanForStepNoFit(benchmark::State& state) { planForStep(state, false); }
BENCHMARK(BM_PlanForStep)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanForStepNoFit)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);

// The plan zpplan charges to Zeppelin, as zpplan makes it: the h800 preset
// (src/sim/calibration.cc), Llama-8B, the long-tail mix at 16K tokens per
// rank, the first batch of seed 1; at 256, 4,096 and 16,384 ranks. CPU time
// (one thread).
void BM_PlanPresetH800(benchmark::State& state) {
  const int ranks = int(state.range(0));
  static const std::vector<int64_t> mix = readLengths("longtail_mix.txt");
  std::mt19937_64 rng(1);
  size_t next = rng() % mix.size();
  const auto lens = zp::sim::nextBatch(mix, int64_t(16384) * ranks, &next);
  zp::sim::Calibration cal;
  zp::sim::calibrationPreset("h800", &cal);
  zp::plan::ClusterModel c = cal.cluster;
  c.nodes = ranks / c.ranksPerNode;
  zp::sim::StepConfig cfg;
  zp::sim::modelPreset("llama-8b", &cfg.model);
  cfg.linearEfficiency = cal.linearEfficiency;
  cfg.memoryBytes = cal.memoryGiB * double(1 << 30);
  for (auto _ : state) benchmark::DoNotOptimize(zp::sim::planForStep(lens, cfg, c));
  state.counters["seqs"] = double(lens.size());
}
BENCHMARK(BM_PlanPresetH800)->Arg(256)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();

void BM_PlanBatchLegacy(benchmark::State& state) {
  const int ranks = int(state.range(0));
  auto lens = batch(ranks);
  auto c = cluster(ranks);
  zp::plan::PlanOptions legacy;
  legacy.legacy = true;
  for (auto _ : state) benchmark::DoNotOptimize(zp::plan::planBatch(lens, true, zp::plan::AttnShape(), c, legacy));
}
BENCHMARK(BM_PlanBatchLegacy)->Arg(16)->Arg(64)->Arg(256)->Unit(benchmark::kMillisecond);

void BM_SimulateStep(benchmark::State& state) {
  const int ranks = int(state.range(0));
  auto lens = batch(ranks);
  auto c = cluster(ranks);
  zp::sim::StepConfig cfg;
  for (auto _ : state) benchmark::DoNotOptimize(zp::sim::simulateStep(lens, cfg, c));
}
BENCHMARK(BM_SimulateStep)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond);

zp::ClusterTopology topology(int nodes, int ranksPerNode, int nics) {
  zp::ClusterTopology t;
  int r = 0;
  for (int n = 0; n < nodes; n++) {
    zp::NodeTopology node;
    node.name = "node" + std::to_string(n);
    for (int k = 0; k < nics; k++) {
      zp::Nic nic;
      nic.name = "nic" + std::to_string(k);
      nic.bitsPerSec = 200e9;
      node.nics.push_back(nic);
    }
    t.node.push_back(node);
    t.nodeRanks.push_back({});
    for (int i = 0; i < ranksPerNode; i++, r++) {
      t.nodeRanks.back().push_back(r);
      t.rankNode.push_back(n);
      t.rankLocal.push_back(i);
      t.rankNic.push_back(i % nics);
    }
  }
  return t;
}

void BM_PlanRoutesUniform(benchmark::State& state) {
  const int ranks = int(state.range(0));
  zp::ClusterTopology topo = topology(ranks / 8, 8, 4);
  std::vector<std::vector<uint64_t>> bytes(ranks, std::vector<uint64_t>(ranks, 1 << 20));
  zp::RouteParams params;
  for (auto _ : state) {
    zp::RoutePlan plan;
    if (zp::planRoutes(topo, bytes, params, &plan) != zpSuccess) state.SkipWithError("planRoutes failed");
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(BM_PlanRoutesUniform)->Arg(64)->Arg(512)->Unit(benchmark::kMillisecond);

void BM_LayoutCheck512(benchmark::State& state) {
  auto lens = batch(512);
  zp::plan::BatchPlan p = zp::plan::planBatch(lens, true, zp::plan::AttnShape(), cluster(512));
  std::vector<size_t> offsets = {0};
  std::vector<zpSegment_t> segs;
  for (const auto& rank : p.attention.ranks) {
    for (const auto& s : rank) segs.push_back({s.seq, s.start, s.count});
    offsets.push_back(segs.size());
  }
  for (auto _ : state) {
    zpLayout_t layout = nullptr;
    if (zpLayoutCreate(&layout, int(lens.size()), lens.data(), 512, offsets.data(), segs.data()) != zpSuccess)
      state.SkipWithError("zpLayoutCreate failed");
    zpLayoutDestroy(layout);
  }
  state.counters["segments"] = double(segs.size());
}
BENCHMARK(BM_LayoutCheck512)->Unit(benchmark::kMillisecond);

void BM_AttnMergeLse(benchmark::State& state) {
  const int64_t sq = state.range(0);
  const int heads = 32, dim = 128;
  std::vector<float> out(sq * heads * dim, 0.5f), part(out.size(), 0.25f), lse(sq * heads, 1.0f), plse(lse.size(), 0.5f);
  for (auto _ : state) {
    zpAttnMergeLse(out.data(), lse.data(), part.data(), plse.data(), sq, heads, dim, nullptr);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(out.size()) * 3 * sizeof(float));
}
BENCHMARK(BM_AttnMergeLse)->Arg(1024)->Arg(8192);

// The reference attention kernel (CPU) on a causal block of `chunk` query
// and key tokens: FLOP/s by chunk length, the curve bench/calibrate.py turns
// into a calibration's attention efficiency for the machine at hand.
void BM_AttnRefCausal(benchmark::State& state) {
  const int64_t chunk = state.range(0);
  const int qHeads = 2, kvHeads = 1, dim = 64;
  std::vector<float> q(chunk * qHeads * dim, 0.01f), k(chunk * kvHeads * dim, 0.02f), v(k.size(), 0.03f),
      out(q.size()), lse(chunk * qHeads);
  zpAttnBlock_t b = {};
  b.q = q.data();
  b.k = k.data();
  b.v = v.data();
  b.out = out.data();
  b.lse = lse.data();
  b.sq = b.sk = chunk;
  b.qHeads = qHeads;
  b.kvHeads = kvHeads;
  b.headDim = dim;
  b.scale = 1.0f / std::sqrt(float(dim));
  b.mask = zpMaskCausal;
  b.datatype = zpFloat32;
  for (auto _ : state)
    if (zpAttnRefForward(&b, nullptr) != zpSuccess) state.SkipWithError("zpAttnRefForward failed");
  // 4 * s^2 * heads * dim, halved for the causal mask (cost_model.h).
  state.counters["flops"] = benchmark::Counter(2.0 * chunk * chunk * qHeads * dim, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttnRefCausal)->Arg(16)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// BM_PlanPresetH800 in a process that keeps its freed heap, as zpplan's
// does (keepFreedHeap, src/util/heap.h). The setting is the process's and
// lasts, so this case is registered, and runs, after every other.
void BM_PlanPresetH800KeptHeap(benchmark::State& state) {
  zp::keepFreedHeap();
  BM_PlanPresetH800(state);
}
BENCHMARK(BM_PlanPresetH800KeptHeap)
    ->Arg(256)
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime();

}  // namespace

BENCHMARK_MAIN();
