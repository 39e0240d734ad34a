// The float64 reference of whole attention (also used by attention_ref_test)
// and the distributed attention check shared by attention_test (one node) and
// zp_multinode_rank (emulated clusters): every rank draws the same random
// batch from a seed, runs the driver forward and backward on its tokens of
// the plan's attention layout with the reference block kernels, and compares
// out, lse, dq, dk and dv with a single-process float64 computation of whole
// sequences. Outputs are NaN before each call, so an element left unwritten
// fails the check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace zptest {

// Planner: for a cluster model of this shape; CommPlanner: for the
// communicator's own cluster (zpPlanBatch with no model); ShuffledOrder:
// shuffledOrderPlan (4 ranks or more).
enum class AttnPlanKind { RandomRings = 0, Planner = 1, OneRing = 2, CommPlanner = 3, ShuffledOrder = 4 };

struct AttnCase {
  bool causal = true;
  int qHeads = 4, kvHeads = 4, headDim = 8;
  AttnPlanKind plan = AttnPlanKind::RandomRings;
  bool accumulate = false;  // the forward kernel folds blocks in itself (zpAttnConfig_t.kernelAccumulates)
  // If set, called after the backward pass with the driver and the plan
  // ("" or what is wrong): attention_test checks the driver's run log.
  std::function<std::string(zpAttention_t, zpBatchPlan_t)> checkRun;
};

inline const char* planKindName(AttnPlanKind k) {
  return k == AttnPlanKind::RandomRings ? "random rings"
         : k == AttnPlanKind::Planner   ? "planner"
         : k == AttnPlanKind::OneRing   ? "one ring"
         : k == AttnPlanKind::ShuffledOrder ? "shuffled order"
                                        : "planner for the communicator";
}

// A plan for n >= 4 ranks whose order (zpPlanSetRingOrder) is not the
// default one, drawn from rng (alike on every rank). With h = n/2 and
// ranksPerNode h unless given below n: rings A = [0, h] (sequences 0 and 5,
// 5 short: empty chunks) and B = [n-1, 1] (2 and 10) across "nodes", C =
// [0, 1] (3) within one, D = every rank in reverse (6), and local sequences
// on every rank, two on rank 0 (1 and 9). The order is a shuffle, then fixed
// so that C runs before D (ranks 0 and 1 run an intra-node ring before an
// inter-node one), 5 before 0 (A is named by 5) and local 9 before local 1.
// NULL (zpGetLastError says why) if a call fails.
inline zpBatchPlan_t shuffledOrderPlan(int n, int causal, int ranksPerNode, std::mt19937_64& rng) {
  if (n < 4) return nullptr;
  const int h = n / 2;
  if (ranksPerNode < 1 || ranksPerNode >= n) ranksPerNode = h;
  std::vector<std::vector<int>> rings = {{0, h}, {0}, {n - 1, 1}, {0, 1}, {1}, {0, h}, {}, {h}, {n - 1}, {0},
                                         {n - 1, 1}, {2}};
  for (int r = n - 1; r >= 0; r--) rings[6].push_back(r);
  for (int r = 3; r < n - 1; r++)
    if (r != h) rings.push_back({r});
  std::vector<int64_t> lens;
  for (const auto& ring : rings)
    lens.push_back(ring.size() > 1 ? 20 + (int64_t)(rng() % 200) : 1 + (int64_t)(rng() % 100));
  lens[5] = 1 + (int64_t)(rng() % 4);
  std::vector<size_t> offs = {0};
  std::vector<int> ranks;
  for (const auto& ring : rings) {
    ranks.insert(ranks.end(), ring.begin(), ring.end());
    offs.push_back(ranks.size());
  }
  zpBatchPlan_t plan = nullptr;
  if (zpPlanCreate(&plan, (int)lens.size(), lens.data(), causal, n, ranksPerNode, offs.data(), ranks.data()) !=
      zpSuccess)
    return nullptr;
  std::vector<int64_t> order(lens.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  auto before = [&](int64_t first, int64_t second) {
    auto a = std::find(order.begin(), order.end(), first), b = std::find(order.begin(), order.end(), second);
    if (a > b) std::iter_swap(a, b);
  };
  before(3, 6);
  before(5, 0);
  before(9, 1);
  if (zpPlanSetRingOrder(plan, (int)order.size(), order.data()) != zpSuccess) {
    zpPlanDestroy(plan);
    return nullptr;
  }
  return plan;
}

// What rank's run log (collectives/ext/ext.h, zpx::attentionRunLog) must
// show for a pass under plan: its rings (each named by its first sequence in
// the plan's order) in the plan's order, and its local sequences in the
// plan's order, both reversed backward. Where the locals fall between the
// rings is the driver's choice (they fill the waits), so the two are
// compared apart, and the log must hold nothing else. "" or what is wrong.
inline std::string runOrderError(zpBatchPlan_t plan, int rank, const std::vector<int64_t>& ran, bool backward) {
  const int64_t* order = nullptr;
  int n = 0;
  if (zpPlanRingOrder(plan, &order, &n) != zpSuccess) return std::string("zpPlanRingOrder: ") + zpGetLastError(nullptr);
  std::vector<int64_t> groups, locals;
  std::set<std::vector<int>> seen;
  for (int i = 0; i < n; i++) {
    int cls = 0, G = 0;
    const int* rr = nullptr;
    if (zpPlanSequence(plan, order[i], &cls, &G, &rr) != zpSuccess)
      return std::string("zpPlanSequence: ") + zpGetLastError(nullptr);
    std::vector<int> ring(rr, rr + G);
    if (std::find(ring.begin(), ring.end(), rank) == ring.end()) continue;
    if (G == 1)
      locals.push_back(order[i]);
    else if (seen.insert(ring).second)
      groups.push_back(order[i]);
  }
  if (backward) {
    std::reverse(groups.begin(), groups.end());
    std::reverse(locals.begin(), locals.end());
  }
  const std::set<int64_t> isGroup(groups.begin(), groups.end());
  std::vector<int64_t> ranGroups, ranLocals;
  for (int64_t s : ran) (isGroup.count(s) ? ranGroups : ranLocals).push_back(s);
  if (ranGroups == groups && ranLocals == locals) return "";
  auto list = [](const std::vector<int64_t>& v) {
    std::string t;
    for (int64_t s : v) t += (t.empty() ? "" : " ") + std::to_string(s);
    return "[" + t + "]";
  };
  return "rank " + std::to_string(rank) + (backward ? ", backward" : ", forward") + ": ran " + list(ran) +
         ", the plan's order wants rings " + list(groups) + " and locals " + list(locals);
}

// Lengths that the issue names: 1, shorter than a ring, not divisible by
// 2G, and one long sequence among short ones.
inline std::vector<int64_t> drawLengths(std::mt19937_64& rng, int n) {
  std::vector<int64_t> lens;
  int count = 4 + (int)(rng() % 9);
  for (int i = 0; i < count; i++) {
    switch (rng() % 4) {
      case 0: lens.push_back(1); break;
      case 1: lens.push_back(1 + (int64_t)(rng() % std::max(1, 2 * n - 1))); break;
      default: lens.push_back(2 + (int64_t)(rng() % 70)); break;
    }
  }
  lens.insert(lens.begin() + (rng() % (lens.size() + 1)), 150 + (int64_t)(rng() % 250));
  return lens;
}

// Whole-sequence attention in float64: out [L, H, D], lse [H, L]; with dout,
// also dq [L, H, D], dk and dv [L, Hk, D].
struct RefSeq {
  std::vector<double> out, lse, dq, dk, dv;
};

inline RefSeq referenceAttention(const float* q, const float* k, const float* v, const float* dout, int64_t L, int H,
                                 int Hk, int D, double scale, bool causal) {
  RefSeq r;
  r.out.assign(L * H * D, 0);
  r.lse.assign(H * L, 0);
  r.dq.assign(L * H * D, 0);
  r.dk.assign(L * Hk * D, 0);
  r.dv.assign(L * Hk * D, 0);
  const int g = H / Hk;
  std::vector<double> s(L), p(L);
  for (int h = 0; h < H; h++) {
    const int hk = h / g;
    for (int64_t i = 0; i < L; i++) {
      const int64_t n = causal ? i + 1 : L;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; j++) {
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)q[(i * H + h) * D + d] * k[(j * Hk + hk) * D + d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; j++) sum += std::exp(s[j] - mx);
      const double lse = mx + std::log(sum);
      r.lse[h * L + i] = lse;
      double* o = &r.out[(i * H + h) * D];
      for (int64_t j = 0; j < n; j++) {
        p[j] = std::exp(s[j] - lse);
        for (int d = 0; d < D; d++) o[d] += p[j] * v[(j * Hk + hk) * D + d];
      }
      const float* go = dout + (i * H + h) * D;
      double Di = 0;
      for (int d = 0; d < D; d++) Di += go[d] * o[d];
      for (int64_t j = 0; j < n; j++) {
        double dp = 0;
        for (int d = 0; d < D; d++) dp += (double)go[d] * v[(j * Hk + hk) * D + d];
        const double ds = p[j] * (dp - Di) * scale;
        for (int d = 0; d < D; d++) {
          r.dq[(i * H + h) * D + d] += ds * k[(j * Hk + hk) * D + d];
          r.dk[(j * Hk + hk) * D + d] += ds * q[(i * H + h) * D + d];
          r.dv[(j * Hk + hk) * D + d] += p[j] * go[d];
        }
      }
    }
  }
  return r;
}

// Largest relative error of each tensor (max |got - want| / max |want|).
struct AttnErrors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  double max() const { return std::max({out, lse, dq, dk, dv}); }
};

// Runs one case; returns "" or what went wrong (with the errors in *errs).
inline std::string checkDistributedAttention(zpComm_t comm, int rank, int n, int ranksPerNode, uint64_t seed,
                                             const AttnCase& c, AttnErrors* errs) {
  std::mt19937_64 rng(seed);
  // The batch: drawn, or the shuffled-order plan's own.
  zpBatchPlan_t shuffled = nullptr;
  std::vector<int64_t> drawn;
  if (c.plan == AttnPlanKind::ShuffledOrder) {
    if (n < 4) return "a shuffled-order plan needs 4 ranks or more";
    shuffled = shuffledOrderPlan(n, c.causal ? 1 : 0, ranksPerNode, rng);
    if (!shuffled) return std::string("shuffledOrderPlan: ") + zpGetLastError(nullptr);
    int ns = 0;
    const int64_t* l = nullptr;
    zpPlanGetInfo(shuffled, nullptr, &ns, &l, nullptr);
    drawn.assign(l, l + ns);
  } else {
    drawn = drawLengths(rng, n);
  }
  const std::vector<int64_t> lens = drawn;
  const int nseq = (int)lens.size(), H = c.qHeads, Hk = c.kvHeads, D = c.headDim;
  std::vector<int64_t> cu(nseq + 1, 0);
  for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];
  const int64_t total = cu.back();
  zpBatchPlan_t plan = nullptr;
  zpResult_t pr;
  if (shuffled) {
    plan = shuffled;
    pr = zpSuccess;
  } else if (c.plan == AttnPlanKind::Planner || c.plan == AttnPlanKind::CommPlanner) {
    zpAttnShape_t shape = {H, Hk, D, 2, c.causal ? 1 : 0};
    zpClusterModel_t cluster = {n / ranksPerNode, ranksPerNode, 1, 100.0, 100.0, 100.0, 0.5};
    pr = zpPlanBatch(&plan, nseq, lens.data(), &shape, c.plan == AttnPlanKind::Planner ? &cluster : nullptr, comm);
  } else {
    std::vector<size_t> offs(nseq + 1, 0);
    std::vector<int> ranks;
    for (int s = 0; s < nseq; s++) {
      std::vector<int> all(n);
      for (int r = 0; r < n; r++) all[r] = r;
      if (c.plan == AttnPlanKind::RandomRings) {
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(1 + rng() % n);
      }
      ranks.insert(ranks.end(), all.begin(), all.end());
      offs[s + 1] = ranks.size();
    }
    pr = zpPlanCreate(&plan, nseq, lens.data(), c.causal ? 1 : 0, n, ranksPerNode, offs.data(), ranks.data());
  }
  if (pr != zpSuccess) return std::string("planning failed: ") + zpGetLastError(nullptr);

  // The whole batch (every rank draws it alike), then this rank's tokens.
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  auto fill = [&](size_t count) {
    std::vector<float> x(count);
    for (float& e : x) e = uni(rng);
    return x;
  };
  const std::vector<float> Q = fill(total * H * D), K = fill(total * Hk * D), V = fill(total * Hk * D),
                           DO = fill(total * H * D);
  const zpSegment_t* segs = nullptr;
  size_t nsegs = 0;
  zpPlanRankSegments(plan, zpAttentionLayout, rank, &segs, &nsegs);
  int64_t T = 0;
  for (size_t i = 0; i < nsegs; i++) T += segs[i].count;
  auto gather = [&](const std::vector<float>& all, int width) {
    std::vector<float> mine;
    for (size_t i = 0; i < nsegs; i++) {
      const float* b = &all[(cu[segs[i].seq] + segs[i].start) * width];
      mine.insert(mine.end(), b, b + segs[i].count * width);
    }
    return mine;
  };
  const std::vector<float> q = gather(Q, H * D), k = gather(K, Hk * D), v = gather(V, Hk * D),
                           dout = gather(DO, H * D);
  const float nan = std::nanf("");
  std::vector<float> out(T * H * D, nan), lse(H * T, nan), dq(T * H * D, nan), dk(T * Hk * D, nan),
      dv(T * Hk * D, nan);

  zpAttnConfig_t cfg = {H, Hk, D, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, c.accumulate ? 1 : 0, zpFloat32};
  zpAttention_t attn = nullptr;
  std::string err;
  if (zpAttentionCreate(&attn, plan, &cfg, comm) != zpSuccess)
    err = std::string("zpAttentionCreate: ") + zpGetLastError(nullptr);
  else if (zpAttentionForward(attn, q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr) != zpSuccess)
    err = std::string("forward: ") + zpGetLastError(nullptr);
  else if (zpAttentionBackward(attn, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                               dk.data(), dv.data(), nullptr) != zpSuccess)
    err = std::string("backward: ") + zpGetLastError(nullptr);
  else if (c.checkRun)
    err = c.checkRun(attn, plan);
  if (attn) zpAttentionDestroy(attn);
  if (!err.empty()) {
    zpPlanDestroy(plan);
    return err;
  }

  // Compare with the reference of every sequence this rank holds tokens of.
  const double scale = 1.0 / std::sqrt((double)D);
  double maxAbs[5] = {0, 0, 0, 0, 0}, maxDiff[5] = {0, 0, 0, 0, 0};
  int64_t unwritten = 0, off = 0;
  auto cmp = [&](int which, float got, double want) {
    if (std::isnan(got)) unwritten++;
    maxAbs[which] = std::max(maxAbs[which], std::fabs(want));
    maxDiff[which] = std::max(maxDiff[which], std::fabs(got - want));
  };
  int64_t lastSeq = -1;
  RefSeq ref;
  for (size_t i = 0; i < nsegs; i++) {
    const zpSegment_t& sg = segs[i];
    if (sg.seq != lastSeq) {
      const int64_t b = cu[sg.seq];
      ref = referenceAttention(&Q[b * H * D], &K[b * Hk * D], &V[b * Hk * D], &DO[b * H * D], lens[sg.seq], H, Hk,
                               D, scale, c.causal);
      lastSeq = sg.seq;
    }
    const int64_t L = lens[sg.seq];
    for (int64_t t = 0; t < sg.count; t++) {
      const int64_t tok = sg.start + t, mine = off + t;
      for (int e = 0; e < H * D; e++) {
        cmp(0, out[mine * H * D + e], ref.out[tok * H * D + e]);
        cmp(2, dq[mine * H * D + e], ref.dq[tok * H * D + e]);
      }
      for (int h = 0; h < H; h++) cmp(1, lse[h * T + mine], ref.lse[h * L + tok]);
      for (int e = 0; e < Hk * D; e++) {
        cmp(3, dk[mine * Hk * D + e], ref.dk[tok * Hk * D + e]);
        cmp(4, dv[mine * Hk * D + e], ref.dv[tok * Hk * D + e]);
      }
    }
    off += sg.count;
  }
  zpPlanDestroy(plan);
  double rel[5];
  for (int w = 0; w < 5; w++) rel[w] = maxAbs[w] > 0 ? maxDiff[w] / maxAbs[w] : maxDiff[w];
  *errs = {rel[0], rel[1], rel[2], rel[3], rel[4]};
  if (unwritten) return std::to_string(unwritten) + " output elements were not written (still NaN)";
  if (!(errs->max() < 1e-5)) {
    char buf[256];
    snprintf(buf, sizeof buf, "relative errors out %.2e lse %.2e dq %.2e dk %.2e dv %.2e (bound 1e-5)", rel[0],
             rel[1], rel[2], rel[3], rel[4]);
    return buf;
  }
  return "";
}

}  // namespace zptest
