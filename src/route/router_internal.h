// The routing planner's internal declarations, shared by the files that
// implement router.h (router.cc lists them); not for use outside src/route/.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/route/router.h"

namespace zp {
namespace detail {

using u64 = uint64_t;
using i64 = int64_t;

constexpr u64 kMaxTotalBytes = u64(1) << 62;

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Sets *why (if given) to msg; returns zpInvalidArgument.
zpResult_t bad(std::string* why, const std::string& msg);

// ---------------------------------------------------------------------------
// Net (router_net.cc): the topology, validated, with rates and owners; the
// demand, normalized.

struct Net {
  const ClusterTopology* topo = nullptr;
  int N = 0, nranks = 0, totalNics = 0;
  std::vector<int> K;                    // by node
  std::vector<int> nicBase;              // by node
  std::vector<int> nicNode;              // by global NIC
  std::vector<double> bw;                // by global NIC: bytes/s used for times
  std::vector<char> known;               // by global NIC
  std::vector<std::vector<int>> owners;  // by global NIC: owning ranks, local order
  std::vector<double> nodeMeanBw;        // by node (0 if no NICs)
  double clusterMeanBw = 1;

  int g(int node, int k) const { return nicBase[node] + k; }
  bool owned(int node, int k) const {
    return k >= 0 && k < K[node] && !owners[(size_t)g(node, k)].empty();
  }
  int node(int r) const { return topo->rankNode[r]; }
  bool nicDown(int node, int k) const {
    return k >= 0 && k < K[node] && topo->node[(size_t)node].nics[(size_t)k].down;
  }
  // A rank whose NIC is down counts as having none.
  int nic(int r) const {
    int k = topo->rankNic[r];
    return nicDown(node(r), k) ? -1 : k;
  }
  bool lostNic(int r) const { return topo->rankNic[r] >= 0 && nic(r) < 0; }
  // railOnly: rail k can carry routed traffic from node a to node b.
  bool usable(int a, int b, int k) const { return owned(a, k) && owned(b, k); }
  // The rate of rank r's NIC, for its shared-memory time.
  double rankBw(int r) const {
    int n = node(r), k = nic(r);
    return (k >= 0 && k < K[n]) ? bw[(size_t)g(n, k)] : clusterMeanBw;
  }
};

zpResult_t buildNet(const ClusterTopology& t, Net* net, std::string* why);
zpResult_t checkParams(const RouteParams& p, std::string* why);

struct Item {
  int src, dst;
  u64 bytes;
};

// Inter-node items by (src, dst); intra-node bytes by rank.
zpResult_t normalize(const Net& net, std::vector<TransferDemand> d, std::vector<Item>* inter,
                     std::vector<u64>* rankShm, u64* intraTotal, std::string* why);
zpResult_t denseToSparse(const Net& net, const std::vector<std::vector<uint64_t>>& bytes,
                         std::vector<TransferDemand>* out, std::string* why);

// ---------------------------------------------------------------------------
// classify (router_classify.cc): direct or routed, and the lower bound.

// An inter-node transfer while planning.
struct RT {
  int src, dst, a, b, rs, rd;
  u64 bytes, nFull, tail;
  bool direct = false;
  int dSend = -1, dRecv = -1;  // the direct path, if any
  bool hasDirect = false;
};

// The transfers of items, each marked direct or routed as mode `mode` does
// (see router.h).
zpResult_t makeRTs(const Net& net, const RouteParams& p, const std::vector<Item>& items,
                   RouteMode mode, std::vector<RT>* out, std::string* why);
// The lower bound of router.h for transfers classified as balanced mode does.
double boundOf(const Net& net, const RouteParams& p, const std::vector<RT>& rts);

// ---------------------------------------------------------------------------
// Fill (router_fill.cc): water-filling of n unit items over rails. Rail i's
// level after x items is max(A_i + x u_i, B_i + x v_i) + pen_i. Each item goes
// where the level after it is lowest (lowest index on ties): first among the
// rails below their cap (cap_i items; no caps if cap is empty), then, for what
// is left, among all. Bulk: a binary search on the level, then the last few
// items one by one.

struct Fill {
  std::vector<double> A, B, u, v, pen;
  std::vector<i64> cap;
  double level(size_t i, double x) const { return std::max(A[i] + x * u[i], B[i] + x * v[i]) + pen[i]; }
  // Items rail i holds at or below level L, at most lim.
  i64 take(size_t i, double L, i64 lim) const {
    double xa = (L - pen[i] - A[i]) / u[i], xb = (L - pen[i] - B[i]) / v[i];
    double x = std::floor(std::min(xa, xb));
    if (!(x > 0)) return 0;
    if (x >= (double)lim) return lim;
    return (i64)x;
  }
  void run(i64 n, std::vector<i64>* cnt) const;
  // Places up to n more items on top of cnt; returns how many it placed.
  i64 place(i64 n, std::vector<i64>* cnt, bool capped) const;
};

// ---------------------------------------------------------------------------
// The balancers of balanced mode (router_rail.cc, router_fabric.cc). bound:
// the lower bound (seconds); every NIC is kept within one chunk of it where
// that is possible.

struct RailChunks {
  // Routed transfer i: its full chunks by rail are chunks[chunkBegin[i] ..
  // chunkEnd[i]) as (rail, count), its tail goes on rail tailRail[i].
  std::vector<std::pair<int, u64>> chunks;
  std::vector<int> chunkBegin, chunkEnd, tailRail;
};
// Rail-only networks.
RailChunks balanceRails(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound);

struct FabricChunks {
  // Per routed transfer and side (0 send, 1 receive): full chunks by NIC,
  // and the NIC of the tail.
  std::vector<std::vector<std::pair<int, u64>>> chunks[2];
  std::vector<int> tailNic[2];
};
// Full fabric: each node's send side and receive side on their own.
FabricChunks balanceFabric(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound);

// ---------------------------------------------------------------------------
// Assembly (router_assembly.cc): proxies, pieces, loads, cost.

struct Seg {
  int sendNic, recvNic, srcProxy, dstProxy;
  u64 chunks;
  bool tail;
};

// Appends the pieces of segs (in order, the one with the tail last) to t.
void addPieces(Transfer* t, std::vector<Seg> segs, u64 C);

// The plan's fields before any piece: params, bound, intra-node bytes and the
// transfers (without pieces).
RoutePlan startPlan(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                    const std::vector<u64>& rankShm, u64 intra, double bound);
// The pieces of every transfer, by mode; shmLoad: the shared-memory load of
// each rank so far (for picking proxies), updated with the relayed bytes.
void assembleRailBalanced(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                          const RailChunks& rb, std::vector<u64>* shmLoad, RoutePlan* plan);
void assembleFabricBalanced(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                            const FabricChunks& fb, std::vector<u64>* shmLoad, RoutePlan* plan);
void assembleUnbalanced(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                        std::vector<u64>* shmLoad, RoutePlan* plan);
// Every NIC's loads, the relayed bytes, the times and the cost, from the pieces.
void addLoadsAndCost(const Net& net, const RouteParams& params, RoutePlan* plan);

}  // namespace detail
}  // namespace zp
