// The router's plans (src/route/router.h), as plain data: no byte moves.
// Every test draws fresh random inputs (the seed is printed; ZP_TEST_SEED=n
// repeats a run) on clusters built in code, up to 64 nodes x 8 ranks x 8 NICs:
//   - every mode (checkPlan): each inter-node transfer's pieces cover
//     [0, bytes) exactly once in whole chunks, proxies sit on the right nodes
//     and own the NICs of their relayed side (routed transfers: both sides),
//     rails are respected (sendNic == recvNic), loads, relayed bytes and the
//     shared-memory term add up, no NIC is below the bound; the same input
//     (also shuffled, as a sparse list) gives the same plan;
//   - off and rail modes take the paths router.h describes, small transfers
//     go direct, NICs without owners carry no routed traffic;
//   - balanced mode keeps every NIC's time within one chunk (chunk / its
//     bandwidth) of the lower bound, rail-only and full fabric, for random,
//     zipf-skewed, single-pair, incast, one-to-all, ring and adversarial
//     demands (single chunks forming regular multigraphs, crossed rails,
//     unsplittable crowds, many short last pieces), with equal rates, rates
//     per rail and rates per node;
//   - relays only where they pay, spread over the ranks sharing a NIC, away
//     from ranks busy with intra-node traffic;
//   - the bound itself on hand-computed cases, errors, pickPath, describe;
//   - a 64x8x8 dense demand's planning time is measured and printed.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/route/route_schedule.h"
#include "src/route/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "src/core/topology.h"

namespace {

using zp::ClusterTopology;
using zp::NicLoad;
using zp::Piece;
using zp::RoutePlan;
using zp::RouteMode;
using zp::RouteParams;
using zp::Transfer;
using zp::TransferDemand;
using Matrix = std::vector<std::vector<uint64_t>>;

constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// ---------------------------------------------------------------------------
// Randomness: one seed per run, printed; each test mixes in its own name.

uint64_t runSeed() {
  static uint64_t seed = [] {
    const char* env = getenv("ZP_TEST_SEED");
    uint64_t s = env && *env ? strtoull(env, nullptr, 0) : ((uint64_t)std::random_device{}() << 32) ^ std::random_device{}();
    printf("router_test: seed %llu (ZP_TEST_SEED=%llu repeats this run)\n", (unsigned long long)s,
           (unsigned long long)s);
    return s;
  }();
  return seed;
}

std::mt19937_64 testRng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  uint64_t h = 1469598103934665603ull;
  for (const char* p = info->name(); *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  uint64_t s = runSeed() ^ h;
  printf("  %s: seed %llu\n", info->name(), (unsigned long long)runSeed());
  return std::mt19937_64(s);
}

uint64_t uni(std::mt19937_64& g, uint64_t lo, uint64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<uint64_t>(lo, hi)(g);
}

// ---------------------------------------------------------------------------
// Clusters built in code.

// nodes x ranks x nics; rank i uses NIC i % nics unless affinity says; NIC k
// of node n runs at rate(n, k) bits/s.
ClusterTopology makeTopo(int nodes, int ranks, int nics,
                         std::function<double(int, int)> rate = nullptr,
                         std::function<int(int, int)> affinity = nullptr) {
  ClusterTopology t;
  int r = 0;
  for (int n = 0; n < nodes; n++) {
    zp::NodeTopology node;
    node.name = "node" + std::to_string(n);
    for (int k = 0; k < nics; k++) {
      zp::Nic nic;
      nic.name = "zpnic" + std::to_string(k);
      nic.bitsPerSec = rate ? rate(n, k) : 1e9;
      node.nics.push_back(nic);
    }
    t.node.push_back(node);
    t.nodeRanks.push_back({});
    for (int i = 0; i < ranks; i++, r++) {
      t.nodeRanks.back().push_back(r);
      t.rankNode.push_back(n);
      t.rankLocal.push_back(i);
      t.rankNic.push_back(nics ? (affinity ? affinity(n, i) : i % nics) : -1);
    }
  }
  return t;
}

int nodeOf(const ClusterTopology& t, int r) { return t.rankNode[(size_t)r]; }
int nicOf(const ClusterTopology& t, int r) { return t.rankNic[(size_t)r]; }
double rateOf(const ClusterTopology& t, int n, int k) {
  return t.node[(size_t)n].nics[(size_t)k].bitsPerSec / 8;
}
bool owns(const ClusterTopology& t, int r, int node, int nic) {
  return nodeOf(t, r) == node && nicOf(t, r) == nic;
}

// ---------------------------------------------------------------------------
// Demands.

Matrix zeros(const ClusterTopology& t) {
  return Matrix((size_t)t.nranks(), std::vector<uint64_t>((size_t)t.nranks(), 0));
}

// A transfer size: whole chunks, chunk +- a few bytes, less than a chunk, or anything.
uint64_t size(std::mt19937_64& g, uint64_t C, uint64_t maxBytes) {
  switch (uni(g, 0, 5)) {
    case 0: return uni(g, 1, C);                                 // cannot be split
    case 1: return C * uni(g, 1, std::max<uint64_t>(1, maxBytes / C));  // whole chunks
    case 2: return C * uni(g, 1, std::max<uint64_t>(1, maxBytes / C)) + uni(g, 0, 2) - 1;
    default: return uni(g, 1, maxBytes);
  }
}

Matrix randomDemand(std::mt19937_64& g, const ClusterTopology& t, double density, uint64_t C,
                    uint64_t maxBytes) {
  Matrix m = zeros(t);
  std::bernoulli_distribution on(density);
  for (int s = 0; s < t.nranks(); s++)
    for (int d = 0; d < t.nranks(); d++)
      if (s != d && on(g)) m[(size_t)s][(size_t)d] = size(g, C, maxBytes);
  return m;
}

// Zipf-skewed alltoallv: rank r's row and column weights ~ 1 / (rank of r)^s,
// over a random permutation of ranks.
Matrix zipfDemand(std::mt19937_64& g, const ClusterTopology& t, double s, uint64_t unit) {
  int n = t.nranks();
  std::vector<int> perm((size_t)n);
  for (int i = 0; i < n; i++) perm[(size_t)i] = i;
  std::shuffle(perm.begin(), perm.end(), g);
  std::vector<double> w((size_t)n);
  for (int i = 0; i < n; i++) w[(size_t)perm[(size_t)i]] = 1.0 / std::pow(i + 1, s);
  Matrix m = zeros(t);
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++)
      if (a != b) m[(size_t)a][(size_t)b] = (uint64_t)((double)unit * w[(size_t)a] * w[(size_t)b] * n) + uni(g, 0, 3);
  return m;
}

std::vector<TransferDemand> sparse(const Matrix& m) {
  std::vector<TransferDemand> v;
  for (size_t s = 0; s < m.size(); s++)
    for (size_t d = 0; d < m[s].size(); d++)
      if (m[s][d]) v.push_back({(int)s, (int)d, m[s][d]});
  return v;
}

// ---------------------------------------------------------------------------
// Checks every plan must pass.

void checkPlan(const ClusterTopology& t, const Matrix& demand, const RouteParams& p, const RoutePlan& plan) {
  SCOPED_TRACE(std::string("mode ") + zp::routeModeName(p.mode) + (p.railOnly ? " rail-only" : " full fabric"));
  const uint64_t C = p.chunkBytes;
  // The transfers are exactly the inter-node entries, by (src, dst).
  size_t i = 0;
  uint64_t inter = 0, intra = 0;
  for (int s = 0; s < t.nranks(); s++)
    for (int d = 0; d < t.nranks(); d++) {
      uint64_t b = demand[(size_t)s][(size_t)d];
      if (!b || s == d) continue;
      if (nodeOf(t, s) == nodeOf(t, d)) {
        intra += b;
        continue;
      }
      inter += b;
      ASSERT_LT(i, plan.transfers.size());
      const Transfer& x = plan.transfers[i++];
      ASSERT_EQ(x.src, s);
      ASSERT_EQ(x.dst, d);
      ASSERT_EQ(x.bytes, b);
      ASSERT_EQ(x.srcNode, nodeOf(t, s));
      ASSERT_EQ(x.dstNode, nodeOf(t, d));
    }
  ASSERT_EQ(i, plan.transfers.size());
  ASSERT_EQ(plan.interNodeBytes, inter);
  ASSERT_EQ(plan.intraNodeBytes, intra);

  // Pieces: exact cover in whole chunks; proxies and NICs where they may be.
  std::vector<NicLoad> loads(plan.loads.size());
  uint64_t relayed = 0;
  for (const Transfer& x : plan.transfers) {
    SCOPED_TRACE(std::to_string(x.src) + " -> " + std::to_string(x.dst));
    ASSERT_FALSE(x.pieces.empty());
    uint64_t off = 0;
    for (size_t k = 0; k < x.pieces.size(); k++) {
      const Piece& pc = x.pieces[k];
      ASSERT_EQ(pc.offset, off) << "gap or overlap";
      ASSERT_GT(pc.bytes, 0u);
      ASSERT_EQ(pc.offset % C, 0u) << "piece not on a chunk boundary";
      if (k + 1 < x.pieces.size()) { ASSERT_EQ(pc.bytes % C, 0u) << "short piece before the last"; }
      off += pc.bytes;
      ASSERT_TRUE(pc.srcProxy >= 0 && pc.srcProxy < t.nranks());
      ASSERT_TRUE(pc.dstProxy >= 0 && pc.dstProxy < t.nranks());
      ASSERT_EQ(nodeOf(t, pc.srcProxy), x.srcNode);
      ASSERT_EQ(nodeOf(t, pc.dstProxy), x.dstNode);
      ASSERT_TRUE(pc.sendNic >= 0 && pc.sendNic < (int)t.node[(size_t)x.srcNode].nics.size());
      ASSERT_TRUE(pc.recvNic >= 0 && pc.recvNic < (int)t.node[(size_t)x.dstNode].nics.size());
      if (p.railOnly) { ASSERT_EQ(pc.sendNic, pc.recvNic) << "crosses rails"; }
      if (pc.srcProxy != x.src) { ASSERT_TRUE(owns(t, pc.srcProxy, x.srcNode, pc.sendNic)) << "proxy does not own its NIC"; }
      if (pc.dstProxy != x.dst) { ASSERT_TRUE(owns(t, pc.dstProxy, x.dstNode, pc.recvNic)) << "proxy does not own its NIC"; }
      if (!x.direct) {  // routed: whoever drives a NIC owns it
        ASSERT_TRUE(owns(t, pc.srcProxy, x.srcNode, pc.sendNic));
        ASSERT_TRUE(owns(t, pc.dstProxy, x.dstNode, pc.recvNic));
      }
      NicLoad& s = loads[(size_t)(plan.nicBase[(size_t)x.srcNode] + pc.sendNic)];
      NicLoad& d = loads[(size_t)(plan.nicBase[(size_t)x.dstNode] + pc.recvNic)];
      s.sendBytes += pc.bytes;
      d.recvBytes += pc.bytes;
      if (pc.srcProxy != x.src) s.relaySendBytes += pc.bytes, relayed += pc.bytes;
      if (pc.dstProxy != x.dst) d.relayRecvBytes += pc.bytes, relayed += pc.bytes;
    }
    ASSERT_EQ(off, x.bytes) << "pieces do not add up";
    if (x.direct) {
      ASSERT_EQ(x.pieces.size(), 1u);
      const Piece& pc = x.pieces[0];
      EXPECT_EQ(pc.srcProxy, x.src);
      EXPECT_EQ(pc.dstProxy, x.dst);
      EXPECT_EQ(pc.recvNic, nicOf(t, x.dst));
      EXPECT_EQ(pc.sendNic, p.railOnly ? nicOf(t, x.dst) : nicOf(t, x.src));
    }
  }
  // Loads as the pieces say, times as the rates say.
  double maxTime = 0;
  ASSERT_EQ(plan.loads.size(), loads.size());
  for (size_t k = 0; k < loads.size(); k++) {
    const NicLoad& l = plan.loads[k];
    ASSERT_EQ(l.sendBytes, loads[k].sendBytes);
    ASSERT_EQ(l.recvBytes, loads[k].recvBytes);
    ASSERT_EQ(l.relaySendBytes, loads[k].relaySendBytes);
    ASSERT_EQ(l.relayRecvBytes, loads[k].relayRecvBytes);
    ASSERT_EQ(&plan.load(l.node, l.nic), &l);
    double rate = rateOf(t, l.node, l.nic);
    if (rate > 0) { ASSERT_DOUBLE_EQ(l.bytesPerSec, rate); }
    ASSERT_DOUBLE_EQ(l.sendTime, (double)l.sendBytes / l.bytesPerSec);
    ASSERT_DOUBLE_EQ(l.recvTime, (double)l.recvBytes / l.bytesPerSec);
    maxTime = std::max(maxTime, l.time());
  }
  ASSERT_EQ(plan.relayedBytes, relayed);
  ASSERT_DOUBLE_EQ(plan.maxNicTime, maxTime);
  // Shared memory: intra-node demand and relays by rank, and the shm term.
  std::vector<uint64_t> shm((size_t)t.nranks(), 0), relay((size_t)t.nranks(), 0);
  for (int s = 0; s < t.nranks(); s++)
    for (int d = 0; d < t.nranks(); d++)
      if (s != d && nodeOf(t, s) == nodeOf(t, d)) {
        shm[(size_t)s] += demand[(size_t)s][(size_t)d];
        shm[(size_t)d] += demand[(size_t)s][(size_t)d];
      }
  for (const Transfer& x : plan.transfers)
    for (const Piece& pc : x.pieces) {
      if (pc.srcProxy != x.src) relay[(size_t)pc.srcProxy] += pc.bytes;
      if (pc.dstProxy != x.dst) relay[(size_t)pc.dstProxy] += pc.bytes;
    }
  ASSERT_EQ(plan.rankShmBytes, shm);
  ASSERT_EQ(plan.rankRelayBytes, relay);
  double shmMax = 0;
  for (int r = 0; r < t.nranks(); r++) {
    int k = nicOf(t, r);
    double rate = k >= 0 ? plan.load(nodeOf(t, r), k).bytesPerSec : 0;
    if (rate > 0) shmMax = std::max(shmMax, (double)(shm[(size_t)r] + relay[(size_t)r]) / rate);
  }
  if (shmMax > 0) { ASSERT_DOUBLE_EQ(plan.shmTime, p.shmCost * shmMax); }
  ASSERT_DOUBLE_EQ(plan.cost, plan.maxNicTime + plan.shmTime);
  ASSERT_GE(plan.maxNicTime * (1 + 1e-9), plan.lowerBound) << "below the lower bound";
}

// Balanced: every NIC within one chunk (in its own time) of the bound.
void checkNearBound(const RoutePlan& plan) {
  double C = (double)plan.params.chunkBytes;
  for (const NicLoad& l : plan.loads) {
    double limit = plan.lowerBound + C / l.bytesPerSec;
    if (l.time() > limit * (1 + 1e-9)) {
      ADD_FAILURE() << "node " << l.node << " NIC " << l.nic << ": time " << l.time() << " s > bound "
                    << plan.lowerBound << " s + one chunk (" << C / l.bytesPerSec << " s)\n"
                    << zp::describe(plan, 0);
      return;
    }
  }
}

// The planner's tests route transfers of every size (directBelow = 0) unless
// they are about the threshold; the library's default is measured (router.h).
RouteParams allRouted() {
  RouteParams p;
  p.directBelow = 0;
  return p;
}

RoutePlan planOf(const ClusterTopology& t, const Matrix& m, const RouteParams& p) {
  RoutePlan plan;
  std::string why;
  zpResult_t r = zp::planRoutes(t, m, p, &plan, &why);
  EXPECT_EQ(r, zpSuccess) << why;
  return plan;
}

// Plans m in every mode (and both fabrics if asked), checks all; for balanced
// rail-only plans also the bound when nearBound. Returns the balanced plan.
RoutePlan planAll(const ClusterTopology& t, const Matrix& m, RouteParams p, bool nearBound = true,
             bool fabrics = true) {
  RoutePlan balanced;
  for (int fabric = 0; fabric < (fabrics ? 2 : 1); fabric++) {
    p.railOnly = fabric == 0;
    for (RouteMode mode : {RouteMode::kOff, RouteMode::kRail, RouteMode::kBalanced}) {
      p.mode = mode;
      RoutePlan plan = planOf(t, m, p);
      checkPlan(t, m, p, plan);
      if (::testing::Test::HasFatalFailure()) return plan;
      if (mode == RouteMode::kBalanced) {
        if (nearBound) checkNearBound(plan);
        EXPECT_DOUBLE_EQ(plan.lowerBound, zp::lowerBound(t, m, p));
        if (fabric == 0) balanced = plan;
      }
    }
  }
  return balanced;
}

// ---------------------------------------------------------------------------
// Bound and basic paths on hand-computed cases.

TEST(Router, SinglePairSplitsOverAllRails) {
  ClusterTopology t = makeTopo(2, 4, 4);  // zprun --nodes 2 --ranks-per-node 4 --nics-per-node 4
  Matrix m = zeros(t);
  m[0][4] = 256 * MiB;
  RouteParams p = allRouted();
  RoutePlan plan = planAll(t, m, p);
  double rate = 1e9 / 8;
  EXPECT_DOUBLE_EQ(plan.lowerBound, 256.0 * MiB / (4 * rate));
  EXPECT_DOUBLE_EQ(plan.maxNicTime, plan.lowerBound);  // 512 chunks split 4 ways exactly
  for (int n = 0; n < 2; n++)
    for (int k = 0; k < 4; k++) {
      EXPECT_EQ(plan.load(n, k).sendBytes + plan.load(n, k).recvBytes, 64 * MiB);
    }
  // Rank 0 and 4 own rail 0: that part is not relayed; the rest is, on both sides.
  EXPECT_EQ(plan.relayedBytes, 2 * 192 * MiB);
  // Routing off: everything on rail 0.
  p.mode = RouteMode::kOff;
  RoutePlan off = planOf(t, m, p);
  EXPECT_DOUBLE_EQ(off.maxNicTime, 256.0 * MiB / rate);
  EXPECT_EQ(off.relayedBytes, 0u);
  EXPECT_EQ(off.transfers[0].pieces.size(), 1u);
  EXPECT_GT(off.cost, plan.cost * 3.5);
}

TEST(Router, LowerBoundByHand) {
  // 3 nodes x 2 ranks x 2 NICs, NIC 1 twice as fast.
  ClusterTopology t = makeTopo(3, 2, 2, [](int, int k) { return k ? 16e9 : 8e9; });
  RouteParams p = allRouted();
  p.chunkBytes = 1000;
  std::vector<TransferDemand> d = {{0, 2, 30000}, {1, 4, 6000}, {5, 2, 900}};
  // Node 0 sends 36000 B over 1e9 + 2e9 B/s; node 1 receives 30900 B.
  EXPECT_DOUBLE_EQ(zp::lowerBound(t, d, p), 36000.0 / 3e9);
  // One unsplittable transfer bigger than everything else shares: 900 B over
  // the fastest rail at both ends, vs. its nodes' totals.
  d = {{0, 2, 900}};
  EXPECT_DOUBLE_EQ(zp::lowerBound(t, d, p), 900.0 / 2e9);
  // Forced direct: 0 -> 3 (rank 3 is on NIC 1) sits on NIC 1 of both nodes;
  // 0 -> 2 (NIC 0) routed, fills the rest.
  p.directBelow = 5000;
  d = {{0, 3, 4000}, {0, 2, 5000}};
  // Send side of node 0: fixed 4000 on NIC 1 (2e9), 5000 routed: water level
  // T with T*1e9 + (T*2e9 - 4000) = 5000 -> T = 3e-6.
  EXPECT_DOUBLE_EQ(zp::lowerBound(t, d, p), 9000.0 / 3e9);
  d = {{0, 3, 4999}, {1, 3, 4999}};  // 9998 fixed on NIC 1 of both nodes
  EXPECT_DOUBLE_EQ(zp::lowerBound(t, d, p), 9998.0 / 2e9);
  // Intra-node traffic does not count.
  d = {{0, 1, 1 << 30}};
  EXPECT_DOUBLE_EQ(zp::lowerBound(t, d, p), 0);
  // Ranks fewer than NICs: only owned NICs carry routed traffic.
  ClusterTopology t2 = makeTopo(2, 2, 4);
  RouteParams q = allRouted();
  EXPECT_DOUBLE_EQ(zp::lowerBound(t2, std::vector<TransferDemand>{{0, 2, 8 * MiB}}, q), 8.0 * MiB / (2 * 1e9 / 8));
  // Bad input.
  EXPECT_EQ(zp::lowerBound(t2, std::vector<TransferDemand>{{0, 9, 1}}, q), -1);
}

TEST(Router, OffAndRailPaths) {
  auto g = testRng();
  for (int trial = 0; trial < 20; trial++) {
    int nodes = (int)uni(g, 2, 6), ranks = (int)uni(g, 1, 8), nics = (int)uni(g, 1, 8);
    ClusterTopology t = makeTopo(nodes, ranks, nics);
    RouteParams p = allRouted();
    p.chunkBytes = uni(g, 1, 64) * KiB;
    Matrix m = randomDemand(g, t, 0.5, p.chunkBytes, 8 * p.chunkBytes);
    for (int fabric = 0; fabric < 2; fabric++) {
      p.railOnly = !fabric;
      p.mode = RouteMode::kOff;
      RoutePlan off = planOf(t, m, p);
      checkPlan(t, m, p, off);
      for (const Transfer& x : off.transfers) {
        ASSERT_TRUE(x.direct);
        ASSERT_EQ(x.pieces.size(), 1u);
        const Piece& pc = x.pieces[0];
        EXPECT_EQ(pc.srcProxy, x.src);
        EXPECT_EQ(pc.dstProxy, x.dst);
        EXPECT_EQ(pc.recvNic, nicOf(t, x.dst));
        // Rail-only: the sender's NIC if the rails match, else d's rail.
        EXPECT_EQ(pc.sendNic, p.railOnly ? nicOf(t, x.dst) : nicOf(t, x.src));
      }
      EXPECT_EQ(off.relayedBytes, 0u);
      p.mode = RouteMode::kRail;
      RoutePlan rail = planOf(t, m, p);
      checkPlan(t, m, p, rail);
      for (const Transfer& x : rail.transfers) {
        ASSERT_EQ(x.pieces.size(), 1u);
        const Piece& pc = x.pieces[0];
        // Through the proxy that owns d's rail on s's node, straight to d.
        EXPECT_EQ(pc.sendNic, nicOf(t, x.dst));
        EXPECT_EQ(pc.recvNic, nicOf(t, x.dst));
        EXPECT_EQ(pc.dstProxy, x.dst);
        EXPECT_TRUE(owns(t, pc.srcProxy, x.srcNode, pc.sendNic));
        if (nicOf(t, x.src) == nicOf(t, x.dst)) { EXPECT_EQ(pc.srcProxy, x.src); }
      }
      // Same NIC loads as off: only who drives the NIC differs.
      if (p.railOnly)
        for (size_t k = 0; k < off.loads.size(); k++) {
          EXPECT_EQ(off.loads[k].sendBytes, rail.loads[k].sendBytes);
          EXPECT_EQ(off.loads[k].recvBytes, rail.loads[k].recvBytes);
        }
    }
  }
}

TEST(Router, RailModeWithUnownedRailGoesDirect) {
  // 2 ranks, 4 NICs: NICs 2 and 3 have no owner. A rank on NIC 0 sending to a
  // rank whose NIC is 1 has an owner; to make an unowned destination rail,
  // give node 1 a different affinity.
  ClusterTopology t = makeTopo(2, 2, 4, nullptr, [](int n, int i) { return n == 0 ? i : 2 + i; });
  Matrix m = zeros(t);
  m[0][2] = 10 * MiB;  // to rank 2 on NIC 2: node 0 has no owner of NIC 2
  RouteParams p = allRouted();
  p.mode = RouteMode::kRail;
  RoutePlan plan = planOf(t, m, p);
  checkPlan(t, m, p, plan);
  EXPECT_TRUE(plan.transfers[0].direct);
  EXPECT_EQ(plan.transfers[0].pieces[0].sendNic, 2);
  // Balanced: no rail has owners on both nodes: the direct path.
  p.mode = RouteMode::kBalanced;
  plan = planOf(t, m, p);
  checkPlan(t, m, p, plan);
  EXPECT_TRUE(plan.transfers[0].direct);
}

TEST(Router, SmallTransfersGoDirect) {
  auto g = testRng();
  ClusterTopology t = makeTopo(4, 8, 4);
  RouteParams p = allRouted();
  p.chunkBytes = 64 * KiB;
  p.directBelow = 200 * KiB;
  Matrix m = randomDemand(g, t, 0.7, p.chunkBytes, 1 * MiB);
  for (RouteMode mode : {RouteMode::kRail, RouteMode::kBalanced}) {
    p.mode = mode;
    RoutePlan plan = planOf(t, m, p);
    checkPlan(t, m, p, plan);
    for (const Transfer& x : plan.transfers) {
      if (x.bytes < p.directBelow) {
        EXPECT_TRUE(x.direct) << x.bytes;
      } else if (mode == RouteMode::kBalanced) {
        EXPECT_FALSE(x.direct) << x.bytes;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Balanced within one chunk of the bound, on many demands.

struct Shape {
  int nodes, ranks, nics;
};

std::vector<Shape> shapes(std::mt19937_64& g, int count) {
  std::vector<Shape> v = {{2, 4, 4}, {2, 8, 8}, {4, 8, 4}, {3, 2, 4}, {64, 8, 8}};
  while ((int)v.size() < count) v.push_back({(int)uni(g, 2, 16), (int)uni(g, 1, 8), (int)uni(g, 1, 8)});
  return v;
}

// Rates: all equal, or each rail its own rate (the same on every node), or
// each node its own rate: the cases where the bound is reachable.
std::function<double(int, int)> rates(std::mt19937_64& g, int kind) {
  if (kind == 0) return nullptr;
  std::vector<double> r(64);
  for (double& x : r) x = 1e9 * (double)uni(g, 1, 8);
  if (kind == 1) return [r](int, int k) { return r[(size_t)k]; };
  return [r](int n, int) { return r[(size_t)n % r.size()]; };
}

TEST(Router, BalancedRandom) {
  auto g = testRng();
  for (const Shape& s : shapes(g, 12)) {
    for (int kind = 0; kind < 3; kind++) {
      ClusterTopology t = makeTopo(s.nodes, s.ranks, s.nics, rates(g, kind));
      RouteParams p = allRouted();
      p.chunkBytes = uni(g, 1, 128) * KiB;
      double density = s.nodes * s.ranks > 128 ? 0.05 : std::uniform_real_distribution<double>(0.05, 1)(g);
      Matrix m = randomDemand(g, t, density, p.chunkBytes, uni(g, 1, 40) * p.chunkBytes);
      SCOPED_TRACE(testing::Message() << s.nodes << "x" << s.ranks << "x" << s.nics << " rates " << kind
                                      << " chunk " << p.chunkBytes);
      planAll(t, m, p, true, s.nodes <= 16);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Router, BalancedZipf) {
  auto g = testRng();
  for (const Shape& s : shapes(g, 10)) {
    ClusterTopology t = makeTopo(s.nodes, s.ranks, s.nics);
    RouteParams p = allRouted();
    p.chunkBytes = uni(g, 4, 64) * KiB;
    double skew = std::uniform_real_distribution<double>(0.5, 2)(g);
    Matrix m = zipfDemand(g, t, skew, uni(g, 1, 4) * MiB);
    SCOPED_TRACE(testing::Message() << s.nodes << "x" << s.ranks << "x" << s.nics << " zipf " << skew);
    RoutePlan b = planAll(t, m, p, true, s.nodes <= 16);
    if (HasFatalFailure()) return;
    // Skew makes some NIC hot with routing off; balanced is never worse.
    p.mode = RouteMode::kOff;
    EXPECT_LE(b.maxNicTime, planOf(t, m, p).maxNicTime * (1 + 1e-12));
  }
}

TEST(Router, BalancedPatterns) {
  auto g = testRng();
  for (const Shape& s : shapes(g, 8)) {
    ClusterTopology t = makeTopo(s.nodes, s.ranks, s.nics, rates(g, (int)uni(g, 0, 2)));
    RouteParams p = allRouted();
    p.chunkBytes = uni(g, 1, 64) * KiB;
    int n = t.nranks(), R = s.ranks;
    int victim = (int)uni(g, 0, (uint64_t)n - 1);
    std::map<std::string, Matrix> pats;
    Matrix m = zeros(t);
    // Single pair, any size.
    int dst = (victim + R) % n;
    m[(size_t)victim][(size_t)dst] = size(g, p.chunkBytes, 300 * p.chunkBytes);
    pats["single pair"] = m;
    // Incast: every rank to one.
    m = zeros(t);
    for (int r = 0; r < n; r++)
      if (r != victim) m[(size_t)r][(size_t)victim] = size(g, p.chunkBytes, 20 * p.chunkBytes);
    pats["incast"] = m;
    // One to all.
    m = zeros(t);
    for (int r = 0; r < n; r++)
      if (r != victim) m[(size_t)victim][(size_t)r] = size(g, p.chunkBytes, 20 * p.chunkBytes);
    pats["one to all"] = m;
    // Ring hops between nodes: rank i of node n to rank (i + shift) of node n+1.
    m = zeros(t);
    int shift = (int)uni(g, 0, (uint64_t)R - 1);
    uint64_t hop = uni(g, 1, 100) * p.chunkBytes + uni(g, 0, p.chunkBytes);
    for (int node = 0; node < s.nodes; node++)
      for (int i = 0; i < R; i++)
        m[(size_t)(node * R + i)][(size_t)(((node + 1) % s.nodes) * R + (i + shift) % R)] = hop;
    pats["ring"] = m;
    // One ring hop only (one rank per node pair busy).
    m = zeros(t);
    for (int node = 0; node < s.nodes; node++)
      m[(size_t)(node * R)][(size_t)(((node + 1) % s.nodes) * R)] = hop;
    pats["ring, one rank per node"] = m;
    for (const auto& pat : pats) {
      SCOPED_TRACE(testing::Message() << s.nodes << "x" << s.ranks << "x" << s.nics << " " << pat.first);
      planAll(t, pat.second, p, true, s.nodes <= 16);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Router, BalancedAdversarial) {
  auto g = testRng();
  for (int trial = 0; trial < 12; trial++) {
    int nodes = (int)uni(g, 2, 12), R = (int)uni(g, 2, 8), K = (int)uni(g, 2, 8);
    ClusterTopology t = makeTopo(nodes, R, K);
    RouteParams p = allRouted();
    p.chunkBytes = uni(g, 1, 32) * KiB;
    const uint64_t C = p.chunkBytes;
    int n = t.nranks();
    std::map<std::string, Matrix> pats;
    Matrix m = zeros(t);
    // Everything from rail 0 ranks to rail K-1 ranks of other nodes.
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (nodeOf(t, s) != nodeOf(t, d) && nicOf(t, s) == 0 && nicOf(t, d) == K - 1)
          m[(size_t)s][(size_t)d] = uni(g, 1, 50) * C + uni(g, 0, C - 1);
    pats["rail 0 to rail K-1"] = m;
    // Many unsplittable transfers of sizes just under a chunk, one big one.
    m = zeros(t);
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (nodeOf(t, s) != nodeOf(t, d) && uni(g, 0, 2) == 0) m[(size_t)s][(size_t)d] = C - uni(g, 0, C / 4);
    m[0][(size_t)(n - 1)] = 500 * C + 1;
    pats["unsplittable crowd + one big"] = m;
    // Crossed: node pairs whose heavy senders and heavy receivers sit on different rails.
    m = zeros(t);
    for (int a = 0; a < nodes; a++) {
      int b = (a + 1) % nodes;
      int rs = (int)uni(g, 0, (uint64_t)R - 1), rd = (int)uni(g, 0, (uint64_t)R - 1);
      m[(size_t)(a * R + rs)][(size_t)(b * R + rd)] = uni(g, 20, 80) * C + uni(g, 0, C - 1);
      m[(size_t)(b * R + rd)][(size_t)(a * R + rs)] = uni(g, 20, 80) * C;
      m[(size_t)(a * R + (rs + 1) % R)][(size_t)(((a + 2) % nodes) * R + rd)] = uni(g, 1, 10) * C + 7;
    }
    pats["crossed"] = m;
    // Everything into the ranks of one rail (every node's receive side hot on one NIC).
    m = zeros(t);
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (nodeOf(t, s) != nodeOf(t, d) && nicOf(t, d) == 0) m[(size_t)s][(size_t)d] = uni(g, 1, 8) * C + uni(g, 0, 3);
    pats["all into rail 0"] = m;
    // Sizes of 1 byte to 3 chunks, dense: many tails.
    m = zeros(t);
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (nodeOf(t, s) != nodeOf(t, d)) m[(size_t)s][(size_t)d] = uni(g, 1, 3 * C);
    pats["tails"] = m;
    // Single-chunk transfers (exactly C, or a little less) between random
    // ranks: a bipartite multigraph of unit edges to colour with K rails,
    // where greedy choices conflict (the edge-colouring worst case).
    for (uint64_t less : {uint64_t(0), C / 3}) {
      m = zeros(t);
      int edges = (int)uni(g, (uint64_t)nodes * K, (uint64_t)nodes * K * 6);
      for (int e = 0; e < edges; e++) {
        int s = (int)uni(g, 0, (uint64_t)n - 1), d = (int)uni(g, 0, (uint64_t)n - 1);
        if (nodeOf(t, s) != nodeOf(t, d) && !m[(size_t)s][(size_t)d]) m[(size_t)s][(size_t)d] = C - uni(g, 0, less);
      }
      pats[less ? "single chunks, sizes vary" : "single chunks"] = m;
    }
    // Regular: every node sends and receives exactly d chunks (d a multiple
    // of K), one random node permutation at a time, so the bound is tight at
    // every node and greedy colouring leaves rails one chunk too full.
    m = zeros(t);
    int d = K * (int)uni(g, 1, 6);
    for (int rep = 0; rep < d; rep++) {
      std::vector<int> perm((size_t)nodes);
      for (int a = 0; a < nodes; a++) perm[(size_t)a] = a;
      do std::shuffle(perm.begin(), perm.end(), g);
      while ([&] {
        for (int a = 0; a < nodes; a++)
          if (perm[(size_t)a] == a) return true;
        return false;
      }());
      for (int a = 0; a < nodes; a++) {
        int s = a * R + (int)uni(g, 0, (uint64_t)R - 1), dd = perm[(size_t)a] * R + (int)uni(g, 0, (uint64_t)R - 1);
        m[(size_t)s][(size_t)dd] += C;
      }
    }
    pats["regular chunks"] = m;
    // Pairs of nodes with a few chunks each, all pairs: the greedy order
    // (largest pair first) fills rails unevenly for the small ones.
    m = zeros(t);
    for (int a = 0; a < nodes; a++)
      for (int b = 0; b < nodes; b++)
        if (a != b) {
          int s = a * R + (int)uni(g, 0, (uint64_t)R - 1), d = b * R + (int)uni(g, 0, (uint64_t)R - 1);
          m[(size_t)s][(size_t)d] = C * uni(g, 1, (uint64_t)K + 1);
        }
    pats["few chunks per node pair"] = m;
    for (const auto& pat : pats) {
      SCOPED_TRACE(testing::Message() << nodes << "x" << R << "x" << K << " chunk " << C << " " << pat.first);
      planAll(t, pat.second, p);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Router, FewerRanksThanNicsAndUnknownRates) {
  auto g = testRng();
  for (int trial = 0; trial < 10; trial++) {
    int nodes = (int)uni(g, 2, 8), R = (int)uni(g, 1, 3), K = (int)uni(g, R, 8);
    // Unknown rates (0) count with the mean of the known ones.
    ClusterTopology t = makeTopo(nodes, R, K, [](int, int k) { return k == 1 ? 0 : 1e9; });
    RouteParams p = allRouted();
    p.chunkBytes = 16 * KiB;
    Matrix m = randomDemand(g, t, 0.8, p.chunkBytes, 40 * p.chunkBytes);
    RoutePlan plan = planAll(t, m, p);
    if (HasFatalFailure()) return;
    for (const NicLoad& l : plan.loads) {
      if (l.owners == 0) { EXPECT_EQ(l.sendBytes + l.recvBytes, 0u) << "routed over an unowned NIC"; }
      EXPECT_EQ(l.rateKnown, l.nic != 1);
      EXPECT_DOUBLE_EQ(l.bytesPerSec, 1e9 / 8);
    }
  }
}

TEST(Router, RelaysOnlyWhenTheyPay) {
  auto g = testRng();
  // Rank i of every node sends the same to rank i of every other node: every
  // NIC is already balanced, so balanced mode relays nothing.
  ClusterTopology t = makeTopo(8, 8, 8);
  RouteParams p = allRouted();
  p.chunkBytes = 64 * KiB;
  Matrix m = zeros(t);
  uint64_t bytes = uni(g, 1, 64) * p.chunkBytes;
  for (int s = 0; s < t.nranks(); s++)
    for (int d = 0; d < t.nranks(); d++)
      if (nodeOf(t, s) != nodeOf(t, d) && s % 8 == d % 8) m[(size_t)s][(size_t)d] = bytes;
  RoutePlan plan = planAll(t, m, p);
  EXPECT_EQ(plan.relayedBytes, 0u);
  EXPECT_DOUBLE_EQ(plan.maxNicTime, plan.lowerBound);
  // Uniform all-to-all over 4 ranks and 4 NICs: one relay hop for every
  // transfer between different rails (rail-only needs it), none for the rest.
  ClusterTopology u = makeTopo(4, 4, 4);
  m = zeros(u);
  uint64_t need = 0;
  for (int s = 0; s < u.nranks(); s++)
    for (int d = 0; d < u.nranks(); d++)
      if (nodeOf(u, s) != nodeOf(u, d)) {
        m[(size_t)s][(size_t)d] = bytes;
        if (s % 4 != d % 4) need += bytes;
      }
  plan = planAll(u, m, p);
  EXPECT_EQ(plan.relayedBytes, need);
  EXPECT_DOUBLE_EQ(plan.maxNicTime, plan.lowerBound);
}

TEST(Router, RelayChargeDecidesWithinTheCaps) {
  // Two transfers that fit their own rails within one chunk of the bound:
  // with a relay charge they stay there; without one, the first idle rail
  // (rail 0) takes the larger, relayed on both sides.
  ClusterTopology t = makeTopo(2, 4, 4);
  RouteParams p = allRouted();
  p.chunkBytes = 100 * KiB;
  Matrix m = zeros(t);
  m[3][7] = 90 * KiB;  // rail 3
  m[1][5] = 10 * KiB;  // rail 1
  RoutePlan plan = planAll(t, m, p);
  EXPECT_EQ(plan.relayedBytes, 0u) << zp::describe(plan);
  p.shmCost = 0;
  plan = planOf(t, m, p);
  checkPlan(t, m, p, plan);
  EXPECT_EQ(plan.relayedBytes, 2 * 90 * KiB) << zp::describe(plan);
  EXPECT_EQ(plan.transfers[1].pieces[0].sendNic, 0);
}

TEST(Router, ProxiesAvoidRanksBusyOnSharedMemory) {
  // 2 nodes x 4 ranks x 2 NICs: ranks 0, 2 own NIC 0 and 1, 3 own NIC 1 on
  // node 0 (4..7 likewise on node 1). Rank 0 sends 64 chunks to rank 4 (both
  // on rail 0): half goes over rail 1, through a proxy on each side. Ranks 1
  // and 7 are busy with intra-node traffic, so the proxies are 3 and 5.
  ClusterTopology t = makeTopo(2, 4, 2);
  RouteParams p = allRouted();
  p.chunkBytes = 64 * KiB;
  Matrix m = zeros(t);
  m[0][4] = 64 * p.chunkBytes;
  m[1][2] = 1 * MiB;
  m[6][7] = 1 * MiB;
  RoutePlan plan = planAll(t, m, p);
  ASSERT_EQ(plan.transfers.size(), 1u);
  ASSERT_EQ(plan.transfers[0].pieces.size(), 2u) << zp::describe(plan);
  const Piece& r1 = plan.transfers[0].pieces[0].sendNic == 1 ? plan.transfers[0].pieces[0] : plan.transfers[0].pieces[1];
  EXPECT_EQ(r1.bytes, 32 * p.chunkBytes);
  EXPECT_EQ(r1.srcProxy, 3);
  EXPECT_EQ(r1.dstProxy, 5);
  // shmTime: rank 1's 1 MiB of intra-node traffic vs. rank 3's 2 MiB relayed.
  EXPECT_DOUBLE_EQ(plan.shmTime, p.shmCost * 2 * MiB / (1e9 / 8));
  EXPECT_EQ(plan.intraNodeBytes, 2 * MiB);
}

TEST(Router, RelaysSpreadOverRanksSharingANic) {
  // 8 ranks over 2 NICs: 4 owners each. One rank sends to all ranks of 3
  // other nodes; the relays on its node and the combines on the others use
  // several owners.
  ClusterTopology t = makeTopo(4, 8, 2);
  RouteParams p = allRouted();
  p.chunkBytes = 64 * KiB;
  Matrix m = zeros(t);
  for (int d = 8; d < 32; d++) m[0][(size_t)d] = 10 * p.chunkBytes;
  for (int s = 8; s < 32; s++) m[(size_t)s][1] = 10 * p.chunkBytes;
  RoutePlan plan = planAll(t, m, p);
  int relayingOnNode0 = 0;
  for (int r = 0; r < 8; r++) relayingOnNode0 += plan.rankRelayBytes[(size_t)r] > 0;
  EXPECT_GE(relayingOnNode0, 3) << zp::describe(plan);
}

TEST(Router, HeterogeneousNodes) {
  // Nodes with different NIC counts and rates: every mode stays correct
  // (rail-only uses the rails both nodes have); the bound need not be reachable.
  auto g = testRng();
  for (int trial = 0; trial < 10; trial++) {
    int nodes = (int)uni(g, 2, 8), R = (int)uni(g, 1, 8);
    ClusterTopology t = makeTopo(nodes, R, 8, [&](int, int) { return 1e9 * (double)uni(g, 1, 4); });
    std::vector<int> K((size_t)nodes);
    for (int n = 0; n < nodes; n++) {
      K[(size_t)n] = (int)uni(g, 1, 8);
      t.node[(size_t)n].nics.resize((size_t)K[(size_t)n]);
      for (int i = 0; i < R; i++) t.rankNic[(size_t)(n * R + i)] = i % K[(size_t)n];
    }
    RouteParams p = allRouted();
    p.chunkBytes = 32 * KiB;
    Matrix m = randomDemand(g, t, 0.6, p.chunkBytes, 20 * p.chunkBytes);
    // Off mode fails where a destination's rail is missing on the source node.
    bool offPossible = true;
    for (int s = 0; s < t.nranks(); s++)
      for (int d = 0; d < t.nranks(); d++)
        if (m[(size_t)s][(size_t)d] && nodeOf(t, s) != nodeOf(t, d) && nicOf(t, d) >= K[(size_t)nodeOf(t, s)])
          offPossible = false;
    for (int fabric = 0; fabric < 2; fabric++) {
      p.railOnly = !fabric;
      for (RouteMode mode : {RouteMode::kOff, RouteMode::kRail, RouteMode::kBalanced}) {
        p.mode = mode;
        RoutePlan plan;
        std::string why;
        zpResult_t r = zp::planRoutes(t, m, p, &plan, &why);
        if (mode == RouteMode::kOff && p.railOnly && !offPossible) {
          EXPECT_EQ(r, zpInvalidArgument);
          EXPECT_NE(why.find("no direct path"), std::string::npos) << why;
          continue;
        }
        ASSERT_EQ(r, zpSuccess) << why;
        checkPlan(t, m, p, plan);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(Router, FullFabricBalancedNearBound) {
  auto g = testRng();
  for (int trial = 0; trial < 20; trial++) {
    int nodes = (int)uni(g, 2, 10), R = (int)uni(g, 1, 8), K = (int)uni(g, 1, 8);
    ClusterTopology t = makeTopo(nodes, R, K, rates(g, (int)uni(g, 0, 2)));
    RouteParams p = allRouted();
    p.railOnly = false;
    p.chunkBytes = uni(g, 1, 64) * KiB;
    Matrix m = trial % 2 ? randomDemand(g, t, 0.5, p.chunkBytes, 30 * p.chunkBytes)
                         : zipfDemand(g, t, 1.2, 2 * MiB);
    RoutePlan plan = planOf(t, m, p);
    checkPlan(t, m, p, plan);
    checkNearBound(plan);
    if (HasFatalFailure()) return;
  }
}

// ---------------------------------------------------------------------------
// Determinism, errors, pickPath, describe, speed.

TEST(Router, Deterministic) {
  auto g = testRng();
  for (int trial = 0; trial < 6; trial++) {
    int nodes = (int)uni(g, 2, 16), R = (int)uni(g, 1, 8), K = (int)uni(g, 1, 8);
    ClusterTopology t = makeTopo(nodes, R, K, rates(g, (int)uni(g, 0, 2)));
    RouteParams p = allRouted();
    p.chunkBytes = uni(g, 1, 64) * KiB;
    Matrix m = trial % 2 ? zipfDemand(g, t, 1.0, 4 * MiB) : randomDemand(g, t, 0.4, p.chunkBytes, 50 * p.chunkBytes);
    std::vector<TransferDemand> v = sparse(m);
    for (int fabric = 0; fabric < 2; fabric++) {
      p.railOnly = !fabric;
      for (RouteMode mode : {RouteMode::kOff, RouteMode::kRail, RouteMode::kBalanced}) {
        p.mode = mode;
        RoutePlan a = planOf(t, m, p);
        // The same demand as a shuffled sparse list, planned on a copy.
        std::vector<TransferDemand> w = v;
        std::shuffle(w.begin(), w.end(), g);
        ClusterTopology copy = t;
        RoutePlan b;
        std::string why;
        ASSERT_EQ(zp::planRoutes(copy, w, p, &b, &why), zpSuccess) << why;
        EXPECT_TRUE(a == b) << "mode " << zp::routeModeName(mode);
        EXPECT_EQ(zp::describe(a, 1000), zp::describe(b, 1000));
      }
    }
  }
}

TEST(Router, Errors) {
  ClusterTopology t = makeTopo(2, 2, 2);
  RouteParams p = allRouted();
  RoutePlan plan;
  plan.maxNicTime = 42;
  std::string why;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{0, 4, 1}}, p, &plan, &why), zpInvalidArgument);
  EXPECT_NE(why.find("[0, 4)"), std::string::npos) << why;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{-1, 2, 1}}, p, &plan, &why), zpInvalidArgument);
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{0, 2, 1}, {0, 2, 5}}, p, &plan, &why), zpInvalidArgument);
  EXPECT_NE(why.find("twice"), std::string::npos) << why;
  EXPECT_EQ(zp::planRoutes(t, Matrix(3, std::vector<uint64_t>(4)), p, &plan, &why), zpInvalidArgument);
  EXPECT_EQ(zp::planRoutes(t, Matrix(4, std::vector<uint64_t>(3)), p, &plan, &why), zpInvalidArgument);
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{0, 2, 1ull << 62}, {1, 3, 1}}, p, &plan, &why),
            zpInvalidArgument);
  EXPECT_NE(why.find("2^62"), std::string::npos) << why;
  RouteParams q = p;
  q.chunkBytes = 0;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{}, q, &plan, &why), zpInvalidArgument);
  q = p;
  q.shmCost = -1;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{}, q, &plan, &why), zpInvalidArgument);
  q.shmCost = NAN;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{}, q, &plan, &why), zpInvalidArgument);
  q = p;
  q.mode = (RouteMode)7;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{}, q, &plan, &why), zpInvalidArgument);
  // Inconsistent topologies.
  ClusterTopology u = t;
  u.rankNic[1] = 5;
  EXPECT_EQ(zp::planRoutes(u, std::vector<TransferDemand>{}, p, &plan, &why), zpInvalidArgument);
  u = t;
  u.rankNode.pop_back();
  EXPECT_EQ(zp::planRoutes(u, std::vector<TransferDemand>{}, p, &plan, &why), zpInvalidArgument);
  u = t;
  std::swap(u.nodeRanks[0][0], u.nodeRanks[0][1]);
  EXPECT_EQ(zp::planRoutes(u, std::vector<TransferDemand>{}, p, &plan, &why), zpInvalidArgument);
  // A node without NICs cannot take part in inter-node traffic.
  u = makeTopo(2, 2, 0);
  EXPECT_EQ(zp::planRoutes(u, std::vector<TransferDemand>{{0, 2, 1}}, p, &plan, &why), zpInvalidArgument);
  EXPECT_NE(why.find("no path"), std::string::npos) << why;
  EXPECT_EQ(zp::planRoutes(u, std::vector<TransferDemand>{{0, 1, 1}}, p, &plan, &why), zpSuccess) << why;
  EXPECT_EQ(plan.intraNodeBytes, 1u);
  plan.maxNicTime = 42;
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{0, 2, 1}}, p, nullptr, &why), zpInvalidArgument);
  // Untouched on error.
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{0, 9, 1}}, p, &plan, nullptr), zpInvalidArgument);
  EXPECT_EQ(plan.maxNicTime, 42);
  // Empty demand: an empty plan.
  EXPECT_EQ(zp::planRoutes(t, std::vector<TransferDemand>{{0, 2, 0}, {1, 1, 7}}, p, &plan, &why), zpSuccess);
  EXPECT_TRUE(plan.transfers.empty());
  EXPECT_EQ(plan.maxNicTime, 0);
  EXPECT_EQ(plan.loads.size(), 4u);
}

TEST(Router, FromATopologyFile) {
  // The documented 2x4x4 cluster, as zptopo and zprun see it.
  ClusterTopology t;
  std::string text = R"({"nodes": 2, "ranksPerNode": 4, "nics": [
      {"name": "zpnic0", "bandwidth": "1gbit"}, {"name": "zpnic1", "bandwidth": "1gbit"},
      {"name": "zpnic2", "bandwidth": "1gbit"}, {"name": "zpnic3", "bandwidth": "1gbit"}]})";
  ASSERT_EQ(zp::parseTopo(text, "test", &t), zpSuccess);
  Matrix m = zeros(t);
  m[1][6] = 256 * MiB;
  RoutePlan plan = planAll(t, m, allRouted());
  EXPECT_DOUBLE_EQ(plan.maxNicTime, 256.0 * MiB / (4 * 125e6));
}

TEST(Router, PickPath) {
  auto g = testRng();
  ClusterTopology t = makeTopo(3, 4, 4);
  RouteParams p = allRouted();
  p.chunkBytes = 64 * KiB;
  auto check = [&](int s, int d, uint64_t bytes, const std::vector<Piece>& v) {
    uint64_t off = 0;
    for (size_t i = 0; i < v.size(); i++) {
      EXPECT_EQ(v[i].offset, off);
      EXPECT_EQ(v[i].offset % p.chunkBytes, 0u);
      if (i + 1 < v.size()) { EXPECT_EQ(v[i].bytes % p.chunkBytes, 0u); }
      off += v[i].bytes;
      if (p.railOnly) { EXPECT_EQ(v[i].sendNic, v[i].recvNic); }
      EXPECT_EQ(nodeOf(t, v[i].srcProxy), nodeOf(t, s));
      EXPECT_EQ(nodeOf(t, v[i].dstProxy), nodeOf(t, d));
      if (v[i].srcProxy != s) { EXPECT_TRUE(owns(t, v[i].srcProxy, nodeOf(t, s), v[i].sendNic)); }
      if (v[i].dstProxy != d) { EXPECT_TRUE(owns(t, v[i].dstProxy, nodeOf(t, d), v[i].recvNic)); }
    }
    EXPECT_EQ(off, bytes);
  };
  std::vector<Piece> v;
  std::string why;
  for (int trial = 0; trial < 200; trial++) {
    int s = (int)uni(g, 0, 11), d = (int)uni(g, 0, 11);
    if (nodeOf(t, s) == nodeOf(t, d)) continue;
    uint64_t bytes = size(g, p.chunkBytes, 100 * p.chunkBytes);
    std::vector<uint64_t> q(4);
    for (auto& x : q) x = uni(g, 0, 3) ? 0 : uni(g, 0, 50) * p.chunkBytes;
    for (int fabric = 0; fabric < 2; fabric++) {
      p.railOnly = !fabric;
      for (RouteMode mode : {RouteMode::kOff, RouteMode::kRail, RouteMode::kBalanced}) {
        p.mode = mode;
        ASSERT_EQ(zp::pickPath(t, s, d, bytes, q, p, &v, &why), zpSuccess) << why;
        check(s, d, bytes, v);
        if (mode != RouteMode::kBalanced) {
          ASSERT_EQ(v.size(), 1u);
          EXPECT_EQ(v[0].recvNic, nicOf(t, d));
          EXPECT_EQ(v[0].dstProxy, d);
          EXPECT_EQ(v[0].srcProxy == s, mode == RouteMode::kOff || nicOf(t, s) == v[0].sendNic);
        }
      }
    }
  }
  p = allRouted();
  p.chunkBytes = 64 * KiB;
  // An idle node: a big transfer spreads evenly over the 4 rails.
  ASSERT_EQ(zp::pickPath(t, 0, 4, 400 * p.chunkBytes, {}, p, &v, &why), zpSuccess) << why;
  std::vector<uint64_t> per(4);
  for (const Piece& x : v) per[(size_t)x.sendNic] += x.bytes;
  for (uint64_t x : per) EXPECT_EQ(x, 100 * p.chunkBytes);
  // NIC 1 busy with 200 chunks: it gets none of 300 chunks, the others 100 each.
  ASSERT_EQ(zp::pickPath(t, 0, 4, 300 * p.chunkBytes, {0, 200 * p.chunkBytes, 0, 0}, p, &v, &why), zpSuccess);
  per.assign(4, 0);
  for (const Piece& x : v) per[(size_t)x.sendNic] += x.bytes;
  EXPECT_EQ(per, (std::vector<uint64_t>{100 * p.chunkBytes, 0, 100 * p.chunkBytes, 100 * p.chunkBytes}));
  // Small: one chunk on the rails' own path, no relay when the rails match.
  ASSERT_EQ(zp::pickPath(t, 0, 4, 100, {}, p, &v, &why), zpSuccess);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].srcProxy, 0);
  EXPECT_EQ(v[0].dstProxy, 4);
  EXPECT_EQ(v[0].sendNic, 0);
  // Errors.
  EXPECT_EQ(zp::pickPath(t, 0, 1, 10, {}, p, &v, &why), zpInvalidArgument);
  EXPECT_NE(why.find("one node"), std::string::npos) << why;
  EXPECT_EQ(zp::pickPath(t, 0, 12, 10, {}, p, &v, &why), zpInvalidArgument);
  EXPECT_EQ(zp::pickPath(t, 0, 4, 0, {}, p, &v, &why), zpInvalidArgument);
  EXPECT_EQ(zp::pickPath(t, 0, 4, 10, {}, p, nullptr, &why), zpInvalidArgument);
}

TEST(Router, Describe) {
  ClusterTopology t = makeTopo(2, 2, 2);
  Matrix m = zeros(t);
  m[0][3] = 3 * MiB + 5;
  m[0][1] = 100;
  RoutePlan plan = planOf(t, m, allRouted());
  std::string s = zp::describe(plan);
  EXPECT_NE(s.find("mode balanced (rail-only)"), std::string::npos) << s;
  EXPECT_NE(s.find("1 inter-node transfers"), std::string::npos) << s;
  EXPECT_NE(s.find("0 (node 0) -> 3 (node 1)"), std::string::npos) << s;
  EXPECT_EQ(s.back(), '\n');
}

TEST(Router, Speed64x8x8Dense) {
  // Not asserted: printed, to keep an eye on it.
  auto g = testRng();
  ClusterTopology t = makeTopo(64, 8, 8);
  RouteParams p = allRouted();
  Matrix m = zeros(t);
  for (int s = 0; s < t.nranks(); s++)
    for (int d = 0; d < t.nranks(); d++)
      if (s != d) m[(size_t)s][(size_t)d] = uni(g, 0, 4 * MiB);
  for (int zipf = 0; zipf < 2; zipf++) {
    if (zipf) m = zipfDemand(g, t, 1.1, 2 * MiB);
    for (RouteMode mode : {RouteMode::kOff, RouteMode::kRail, RouteMode::kBalanced}) {
      p.mode = mode;
      auto t0 = std::chrono::steady_clock::now();
      RoutePlan plan = planOf(t, m, p);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      printf("  64x8x8 dense %s, %s: %.1f ms, %zu transfers, max NIC %.4g s, bound %.4g s (x%.5f), relayed %.3g%%\n",
             zipf ? "zipf" : "uniform random", zp::routeModeName(mode), ms, plan.transfers.size(),
             plan.maxNicTime, plan.lowerBound, plan.maxNicTime / plan.lowerBound,
             100.0 * (double)plan.relayedBytes / (double)plan.interNodeBytes);
      checkPlan(t, m, p, plan);
      if (mode == RouteMode::kBalanced) checkNearBound(plan);
    }
  }
}

}  // namespace

// The library's default threshold (measured, router.h): a transfer below it
// takes the direct path, one at or above it is spread over the rails.
TEST(Router, DefaultThresholdSendsSmallTransfersDirect) {
  ClusterTopology t = makeTopo(2, 4, 4);
  RouteParams p;  // the library's defaults
  ASSERT_GT(p.directBelow, 0u);
  std::vector<Piece> v;
  std::string why;
  ASSERT_EQ(zp::pickPath(t, 0, 4, p.directBelow - 1, {}, p, &v, &why), zpSuccess) << why;
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].srcProxy, 0);
  EXPECT_EQ(v[0].dstProxy, 4);
  ASSERT_EQ(zp::pickPath(t, 0, 4, 4 * p.directBelow, {}, p, &v, &why), zpSuccess) << why;
  std::set<int> rails;
  for (const Piece& x : v) rails.insert(x.sendNic);
  EXPECT_GT(rails.size(), 1u) << "a large transfer should use several rails";
  Matrix m(8, std::vector<uint64_t>(8, 0));
  m[0][4] = p.directBelow - 1;
  m[1][5] = 4 * p.directBelow;
  RoutePlan plan = planOf(t, m, p);
  ASSERT_EQ(plan.transfers.size(), 2u);
  EXPECT_TRUE(plan.transfers[0].direct);
  EXPECT_FALSE(plan.transfers[1].direct);
}

// ---------------------------------------------------------------------------
// The relay schedule (src/route/route_schedule.h) that the host relay and the
// device routed alltoallv both execute: on the router's plans of random
// demands, every byte of every transfer is in exactly one chunk, each chunk
// is at most one chunk size and carried by the proxies of the piece it comes
// from, chunk k of every piece is in round k, and the schedule runs round by
// round. (Whether the executors deliver every byte along it is checked by
// the multinode tests: host routed alltoallv and send/recv, and
// RoutedDeviceAlltoallvOnTheDouble.)

namespace {

// "" if chunks are a schedule of t's pieces with chunk size C.
std::string scheduleError(const Transfer& t, const std::vector<zp::RouteChunk>& chunks, uint64_t C) {
  std::vector<zp::RouteChunk> byOffset = chunks;
  std::sort(byOffset.begin(), byOffset.end(),
            [](const zp::RouteChunk& a, const zp::RouteChunk& b) { return a.offset < b.offset; });
  uint64_t at = 0;
  for (const zp::RouteChunk& c : byOffset) {
    if (c.offset != at) return "a gap or overlap at byte " + std::to_string(at);
    if (c.bytes == 0 || c.bytes > C) return "a chunk of " + std::to_string(c.bytes) + " bytes";
    const Piece* from = nullptr;
    for (const Piece& p : t.pieces)
      if (c.offset >= p.offset && c.offset + c.bytes <= p.offset + p.bytes) from = &p;
    if (!from) return "a chunk at " + std::to_string(c.offset) + " outside every piece";
    if (c.srcProxy != from->srcProxy || c.dstProxy != from->dstProxy) return "a chunk with another piece's proxies";
    if ((uint64_t)c.round != (c.offset - from->offset) / C || (c.offset - from->offset) % C)
      return "chunk at " + std::to_string(c.offset) + " in round " + std::to_string(c.round);
    at += c.bytes;
  }
  if (at != t.bytes) return "the chunks cover " + std::to_string(at) + " of " + std::to_string(t.bytes) + " bytes";
  for (size_t i = 1; i < chunks.size(); i++)
    if (chunks[i].round < chunks[i - 1].round) return "round " + std::to_string(chunks[i].round) + " after a later one";
  return "";
}

}  // namespace

TEST(RouteSchedule, EveryByteOnceInChunksOfItsPieceRoundByRound) {
  std::mt19937_64 rng = testRng();
  for (int trial = 0; trial < 40; trial++) {
    const int nodes = 2 + trial % 3, ranks = 1 + trial % 4, nics = 1 + (trial / 3) % 4;
    // Uneven rails: pieces of different lengths.
    const ClusterTopology topo = makeTopo(nodes, ranks, nics, [](int n, int k) { return 1e9 * (1 + (n + k) % 3); });
    RouteParams params;
    params.mode = trial % 5 == 0 ? RouteMode::kRail : RouteMode::kBalanced;
    params.chunkBytes = 1 + rng() % (64 << 10);
    params.directBelow = rng() % 2 ? 0 : params.chunkBytes * 3;
    const int n = nodes * ranks;
    std::vector<std::vector<uint64_t>> bytes(n, std::vector<uint64_t>(n, 0));
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++)
        if (topo.rankNode[s] != topo.rankNode[d] && rng() % 3) bytes[s][d] = rng() % (params.chunkBytes * 40);
    RoutePlan plan;
    std::string why;
    ASSERT_EQ(zp::planRoutes(topo, bytes, params, &plan, &why), zpSuccess) << why;
    zp::scheduleTransfers(&plan.transfers, params.chunkBytes);
    for (const Transfer& t : plan.transfers) {
      const std::string err = scheduleError(t, t.chunks, params.chunkBytes);
      ASSERT_EQ(err, "") << "trial " << trial << ", transfer " << t.src << " -> " << t.dst << " of " << t.bytes
                         << " bytes, chunk " << params.chunkBytes;
    }
  }
}

TEST(RouteSchedule, RoundsInterleaveThePiecesAndAnEmptyPieceHasNoChunk) {
  // Three pieces of 2.5, 1 and 0 chunks (C = 100): round 0 holds each
  // non-empty piece's first chunk, round 1 the first piece's second, round 2
  // its short third.
  std::vector<Piece> pieces(3);
  pieces[0] = {0, 250, 0, 0, 4, 0};
  pieces[1] = {250, 100, 1, 1, 5, 1};
  pieces[2] = {350, 0, 2, 2, 6, 2};
  const std::vector<zp::RouteChunk> chunks = zp::scheduleChunks(pieces, 100);
  ASSERT_EQ(chunks.size(), 4u);
  const uint64_t offsets[4] = {0, 250, 100, 200}, sizes[4] = {100, 100, 100, 50};
  const int rounds[4] = {0, 0, 1, 2}, proxies[4] = {0, 1, 0, 0};
  for (int i = 0; i < 4; i++) {
    EXPECT_EQ(chunks[i].offset, offsets[i]) << i;
    EXPECT_EQ(chunks[i].bytes, sizes[i]) << i;
    EXPECT_EQ(chunks[i].round, rounds[i]) << i;
    EXPECT_EQ(chunks[i].srcProxy, proxies[i]) << i;
    EXPECT_EQ(chunks[i].dstProxy, proxies[i] + 4) << i;
  }
}
