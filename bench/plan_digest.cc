// plan_digest: a digest of every plan a planner change could alter, to show
// that a change meant to be exact leaves the plans as they were (or, where
// it alters them, which batches and by how many seconds of step). For each
// batch: planForStep's plan (each sequence's ring and head split, the order, the planned
// makespans, the linear layout) and its simulated step, and every tuned
// baseline (step, group, Ulysses degree, split length, rings in order).
//
// plan_digest LENGTHS PRESET TOKENS_PER_RANK MODEL RANKS BATCHES [FIRST]:
// BATCHES batches one after another from document FIRST (default 7) of the
// file, as zpplan draws them (nextBatch). One line per batch:
//   file preset tokens ranks batch seqs plan=<hex> step=<s> <baseline>=<hex>:<s> ... [heads_split=<u>]
// Run it at two commits and diff the outputs (docs/simulator.md, "Planning
// time", says how it was used).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/sim/calibration.h"
#include "src/sim/simulator.h"
#include "src/sim/step_model.h"

using namespace zp;

namespace {

// FNV-1a over the bytes of what is added: stable across runs and builds.
struct Digest {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <class T>
  void add(const T& v) {
    bytes(&v, sizeof v);
  }
  template <class T>
  void add(const std::vector<T>& v) {
    add(v.size());
    for (const T& x : v) add(x);
  }
};

uint64_t planDigest(const plan::BatchPlan& p, double step) {
  Digest d;
  for (const plan::SeqPlacement& s : p.seqs) {
    d.add(int(s.cls));
    d.add(s.ranks);
    if (s.ulysses > 1) d.add(s.ulysses);  // so plans without head splits digest as before they existed
  }
  d.add(p.order);
  d.add(p.plannedForward);
  d.add(p.plannedBackward);
  for (const auto& segs : plan::linearLayout(p).ranks) {
    d.add(segs.size());
    for (const plan::Segment& s : segs) d.add(s.seq), d.add(s.start), d.add(s.count);
  }
  d.add(step);
  return d.h;
}

uint64_t baselineDigest(const sim::Tuned& t) {
  Digest d;
  d.add(t.result.stepSeconds);
  d.add(t.result.group);
  d.add(t.result.ulysses);
  d.add(t.result.limitTokens);
  d.add(t.result.feasible);
  for (const sim::Ring& r : t.placement.rings) {
    d.add(r.ranks);
    d.add(r.seqs);
    d.add(int(r.link));
    d.add(r.ulysses);
  }
  return d.h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: plan_digest LENGTHS PRESET TOKENS_PER_RANK MODEL RANKS BATCHES [FIRST]\n");
    return 2;
  }
  std::vector<int64_t> all;
  try {
    all = sim::readLengths(argv[1]);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "plan_digest: %s\n", e.what());
    return 2;
  }
  sim::Calibration cal;
  sim::StepConfig cfg;
  const int64_t perRank = std::atoll(argv[3]);
  const int ranks = std::atoi(argv[5]), batches = std::atoi(argv[6]);
  size_t next = argc > 7 ? size_t(std::atoll(argv[7])) : 7;
  if (!sim::calibrationPreset(argv[2], &cal) || !sim::modelPreset(argv[4], &cfg.model) ||
      perRank < 1 || ranks < 1 || batches < 1 || ranks % cal.cluster.ranksPerNode) {
    std::fprintf(stderr, "plan_digest: an unknown preset or model, or a bad count\n");
    return 2;
  }
  plan::ClusterModel c = cal.cluster;
  c.nodes = ranks / c.ranksPerNode;
  cfg.linearEfficiency = cal.linearEfficiency;
  cfg.memoryBytes = cal.memoryGiB * double(1 << 30);
  const char* file = std::strrchr(argv[1], '/') ? std::strrchr(argv[1], '/') + 1 : argv[1];
  for (int b = 0; b < batches; ++b) {
    const std::vector<int64_t> lens = sim::nextBatch(all, perRank * ranks, &next);
    const plan::BatchPlan p = sim::planForStep(lens, cfg, c);
    const double step = sim::simulatePlan(p, cfg, c).stepSeconds;
    std::printf("%s %s %" PRId64 " %s %d %d %zu plan=%016" PRIx64 " step=%.9g", file, argv[2], perRank, argv[4], ranks,
                b, lens.size(), planDigest(p, step), step);
    for (const sim::Tuned& t : sim::tunedBaselines(lens, cfg, c))
      std::printf(" %s=%016" PRIx64 ":%.9g", t.result.name.c_str(), baselineDigest(t), t.result.stepSeconds);
    // Only a plan that splits heads says so: the lines of the others read
    // as they did before plans could.
    int split = 1;
    for (const plan::SeqPlacement& s : p.seqs) split = std::max(split, s.ulysses);
    if (split > 1) std::printf(" heads_split=%d", split);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
