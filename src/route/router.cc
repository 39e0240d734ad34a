// The router's planning part: see router.h for the model, the modes, the
// cost and the bound. Its sections, by file (their shared declarations are in
// router_internal.h, namespace detail):
//   Net            router_net.cc: a validated view of the topology (rates,
//                  owners of NICs), the params checked, the demand normalized
//   classify       router_classify.cc: which transfers are direct, and the
//                  direct path; the lower bound
//   Fill           router_fill.cc: water-filling of unit items over rails
//                  (for both balancers and pickPath)
//   RailBalancer   router_rail.cc: balanced mode on rail-only networks: a node-
//                  pair level assignment of chunks to rails (greedy water-
//                  filling, then a local search with alternating-path moves),
//                  then, per pair, the rails' chunks handed to transfers with
//                  the fewest relays
//   FabricBalancer router_fabric.cc: balanced mode on a full fabric: send and
//                  receive sides of every node balanced independently, then
//                  paired per transfer
//   assembly       router_assembly.cc: proxies, pieces, loads, cost
//   plan()         this file: the entry, in steps (check and classify the
//                  input, balance, assemble, loads and cost), with planRoutes,
//                  lowerBound, pickPath (point to point) and describe
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/route/router.h"

#include <algorithm>
#include <utility>

#include "src/route/router_internal.h"

namespace zp {

// The planner's internals (router_internal.h), as before the split into files.
using namespace detail;

const char* routeModeName(RouteMode mode) {
  switch (mode) {
    case RouteMode::kOff: return "off";
    case RouteMode::kRail: return "rail";
    case RouteMode::kBalanced: return "balanced";
  }
  return "?";
}

bool RoutePlan::operator==(const RoutePlan& o) const {
  return params.mode == o.params.mode && params.chunkBytes == o.params.chunkBytes &&
         params.shmCost == o.params.shmCost && params.directBelow == o.params.directBelow &&
         params.railOnly == o.params.railOnly && transfers == o.transfers && nicBase == o.nicBase &&
         loads == o.loads && rankRelayBytes == o.rankRelayBytes && rankShmBytes == o.rankShmBytes &&
         interNodeBytes == o.interNodeBytes && intraNodeBytes == o.intraNodeBytes &&
         relayedBytes == o.relayedBytes && maxNicTime == o.maxNicTime && shmTime == o.shmTime &&
         cost == o.cost && lowerBound == o.lowerBound;
}

namespace {

// A plan's input, checked: the network, the intra-node demand (by rank and in
// all), the inter-node transfers as the mode classifies them, and the bound.
struct PlanInput {
  Net net;
  std::vector<u64> rankShm;
  u64 intra = 0;
  std::vector<RT> rts;
  double bound = 0;
};

// Checks the params, the topology and the demand; classifies the transfers
// and computes the lower bound.
zpResult_t checkAndClassify(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                            const RouteParams& params, PlanInput* in, std::string* why) {
  zpResult_t res = checkParams(params, why);
  if (res != zpSuccess) return res;
  Net& net = in->net;
  if ((res = buildNet(topo, &net, why)) != zpSuccess) return res;
  std::vector<Item> items;
  if ((res = normalize(net, demand, &items, &in->rankShm, &in->intra, why)) != zpSuccess) return res;
  if ((res = makeRTs(net, params, items, params.mode, &in->rts, why)) != zpSuccess) return res;
  // The bound is the balanced mode's, whatever the mode.
  if (params.mode == RouteMode::kBalanced) {
    in->bound = boundOf(net, params, in->rts);
  } else {
    std::vector<RT> b;
    if ((res = makeRTs(net, params, items, RouteMode::kBalanced, &b, why)) != zpSuccess) return res;
    in->bound = boundOf(net, params, b);
  }
  return zpSuccess;
}

// Balances the routed transfers' chunks (balanced mode) and gives every
// transfer its pieces, picking proxies by their shared-memory load.
void balanceAndAssemble(PlanInput* in, const RouteParams& params, RoutePlan* plan) {
  std::vector<u64> shmLoad = in->rankShm;  // for picking proxies
  if (params.mode == RouteMode::kBalanced && params.railOnly) {
    RailChunks rb = balanceRails(in->net, params, in->rts, in->bound);
    assembleRailBalanced(in->net, params, in->rts, rb, &shmLoad, plan);
  } else if (params.mode == RouteMode::kBalanced) {
    FabricChunks fb = balanceFabric(in->net, params, in->rts, in->bound);
    assembleFabricBalanced(in->net, params, in->rts, fb, &shmLoad, plan);
  } else {
    assembleUnbalanced(in->net, params, in->rts, &shmLoad, plan);
  }
}

zpResult_t plan(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                const RouteParams& params, RoutePlan* out, std::string* why) {
  if (!out) return bad(why, "router: out is NULL");
  PlanInput in;
  zpResult_t res = checkAndClassify(topo, demand, params, &in, why);
  if (res != zpSuccess) return res;
  RoutePlan plan = startPlan(in.net, params, in.rts, in.rankShm, in.intra, in.bound);
  balanceAndAssemble(&in, params, &plan);
  addLoadsAndCost(in.net, params, &plan);
  *out = std::move(plan);
  return zpSuccess;
}

}  // namespace

zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                      const RouteParams& params, RoutePlan* out, std::string* why) {
  return plan(topo, demand, params, out, why);
}

zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                      const RouteParams& params, RoutePlan* out, std::string* why) {
  Net net;
  zpResult_t res = buildNet(topo, &net, why);
  if (res != zpSuccess) return res;
  std::vector<TransferDemand> d;
  if ((res = denseToSparse(net, bytes, &d, why)) != zpSuccess) return res;
  return plan(topo, d, params, out, why);
}

double lowerBound(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                  const RouteParams& params) {
  Net net;
  std::vector<Item> items;
  std::vector<u64> rankShm;
  u64 intra = 0;
  std::vector<RT> rts;
  if (checkParams(params, nullptr) != zpSuccess || buildNet(topo, &net, nullptr) != zpSuccess ||
      normalize(net, demand, &items, &rankShm, &intra, nullptr) != zpSuccess ||
      makeRTs(net, params, items, RouteMode::kBalanced, &rts, nullptr) != zpSuccess)
    return -1;
  return boundOf(net, params, rts);
}

double lowerBound(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                  const RouteParams& params) {
  Net net;
  std::vector<TransferDemand> d;
  if (buildNet(topo, &net, nullptr) != zpSuccess || denseToSparse(net, bytes, &d, nullptr) != zpSuccess)
    return -1;
  return lowerBound(topo, d, params);
}

// ---------------------------------------------------------------------------
// Point to point

zpResult_t pickPath(const ClusterTopology& topo, int src, int dst, uint64_t bytes,
                    const std::vector<uint64_t>& queuedBytes, const RouteParams& params,
                    std::vector<Piece>* out, std::string* why) {
  if (!out) return bad(why, "pickPath: out is NULL");
  zpResult_t res = checkParams(params, why);
  if (res != zpSuccess) return res;
  Net net;
  if ((res = buildNet(topo, &net, why)) != zpSuccess) return res;
  if (src < 0 || src >= net.nranks || dst < 0 || dst >= net.nranks)
    return bad(why, strf("pickPath: %d -> %d: ranks must be in [0, %d)", src, dst, net.nranks));
  if (net.node(src) == net.node(dst))
    return bad(why, strf("pickPath: %d and %d are on one node (%d): not routed", src, dst, net.node(src)));
  if (!bytes) return bad(why, "pickPath: bytes is 0");
  if (bytes > kMaxTotalBytes) return bad(why, "pickPath: bytes beyond 2^62");
  std::vector<RT> rts;
  if ((res = makeRTs(net, params, {{src, dst, bytes}}, params.mode, &rts, why)) != zpSuccess) return res;
  const RT& r = rts[0];
  const u64 C = params.chunkBytes;
  int a = r.a, b = r.b;
  auto queued = [&](int k) { return (size_t)k < queuedBytes.size() ? (double)queuedBytes[(size_t)k] : 0.0; };
  // Proxies from local indices: spread without load information.
  auto proxy = [&](int node, int nic, int self, int salt) {
    if (net.node(self) == node && net.nic(self) == nic) return self;
    const std::vector<int>& o = net.owners[(size_t)net.g(node, nic)];
    return o[(size_t)salt % o.size()];
  };
  int salt = topo.rankLocal[(size_t)src] + topo.rankLocal[(size_t)dst];
  std::vector<Seg> segs;
  if (r.direct) {
    segs.push_back({r.dSend, r.dRecv, src, dst, r.nFull, r.tail != 0});
  } else if (params.mode == RouteMode::kRail) {
    // The same choices as planRoutes' rail mode, proxies by index.
    RoutePlan p;
    if ((res = plan(topo, {{src, dst, bytes}}, params, &p, why)) != zpSuccess) return res;
    Piece x = p.transfers[0].pieces[0];
    if (x.srcProxy != src) x.srcProxy = proxy(a, x.sendNic, src, salt);
    if (x.dstProxy != dst) x.dstProxy = proxy(b, x.recvNic, dst, salt);
    out->assign(1, x);
    return zpSuccess;
  } else {
    // Balanced: water-fill the chunks over the paths, from the queued bytes.
    std::vector<int> sendK, recvK;
    if (params.railOnly) {
      int kab = std::min(net.K[(size_t)a], net.K[(size_t)b]);
      for (int k = 0; k < kab; k++)
        if (net.usable(a, b, k)) {
          sendK.push_back(k);
          recvK.push_back(k);
        }
    } else {
      for (int k = 0; k < net.K[(size_t)a]; k++)
        if (net.owned(a, k)) {
          sendK.push_back(k);
          recvK.push_back(net.owned(b, k) ? k : (r.rd >= 0 ? r.rd : -1));
        }
      for (size_t i = 0; i < recvK.size(); i++)
        if (recvK[i] < 0)
          for (int k = 0; recvK[i] < 0 && k < net.K[(size_t)b]; k++)
            if (net.owned(b, k)) recvK[i] = k;
    }
    size_t m = sendK.size();
    Fill f;
    f.A.resize(m);
    f.B.assign(m, 0);
    f.u.resize(m);
    f.v.resize(m);
    f.pen.resize(m);
    for (size_t i = 0; i < m; i++) {
      double bs = net.bw[(size_t)net.g(a, sendK[i])], br = net.bw[(size_t)net.g(b, recvK[i])];
      f.A[i] = queued(sendK[i]) / bs;
      f.u[i] = (double)C / bs;
      f.v[i] = (double)C / br;
      int hops = (sendK[i] != r.rs) + (recvK[i] != r.rd);
      f.pen[i] = params.shmCost * hops * 0.5 * (f.u[i] + f.v[i]);
    }
    std::vector<i64> cnt;
    f.run((i64)r.nFull, &cnt);
    int tailAt = -1;
    if (r.tail) {
      double bl = 0, x = (double)r.tail / (double)C;
      for (size_t i = 0; i < m; i++) {
        double l = f.level(i, (double)cnt[i] + x);
        if (tailAt < 0 || l < bl) {
          bl = l;
          tailAt = (int)i;
        }
      }
    }
    for (size_t i = 0; i < m; i++) {
      if (!cnt[i] && (int)i != tailAt) continue;
      segs.push_back({sendK[i], recvK[i], proxy(a, sendK[i], src, salt), proxy(b, recvK[i], dst, salt),
                      (u64)cnt[i], (int)i == tailAt});
    }
  }
  Transfer t;
  t.bytes = bytes;
  addPieces(&t, segs, C);
  *out = std::move(t.pieces);
  return zpSuccess;
}

// ---------------------------------------------------------------------------
// describe

std::string describe(const RoutePlan& plan, size_t maxTransfers) {
  std::string s;
  size_t direct = 0, pieces = 0;
  for (const Transfer& t : plan.transfers) {
    direct += t.direct;
    pieces += t.pieces.size();
  }
  s += strf("route plan: mode %s%s, chunk %llu B, shmCost %g, directBelow %llu B\n",
            routeModeName(plan.params.mode), plan.params.railOnly ? " (rail-only)" : " (full fabric)",
            (unsigned long long)plan.params.chunkBytes, plan.params.shmCost,
            (unsigned long long)plan.params.directBelow);
  s += strf("  %zu inter-node transfers (%zu direct), %zu pieces, %llu B; %llu B intra-node\n",
            plan.transfers.size(), direct, pieces, (unsigned long long)plan.interNodeBytes,
            (unsigned long long)plan.intraNodeBytes);
  s += strf("  max NIC time %.6g s, lower bound %.6g s (x%.4f), relayed %llu B, shm time %.6g s, "
            "cost %.6g s\n",
            plan.maxNicTime, plan.lowerBound,
            plan.lowerBound > 0 ? plan.maxNicTime / plan.lowerBound : 1.0,
            (unsigned long long)plan.relayedBytes, plan.shmTime, plan.cost);
  s += "  node nic  rate(B/s)   owners      send B (relayed)      recv B (relayed)   time s\n";
  for (const NicLoad& l : plan.loads)
    s += strf("  %4d %3d  %-10.4g%s %6d  %12llu (%llu)  %12llu (%llu)  %.6g\n", l.node, l.nic,
              l.bytesPerSec, l.rateKnown ? " " : "?", l.owners, (unsigned long long)l.sendBytes,
              (unsigned long long)l.relaySendBytes, (unsigned long long)l.recvBytes,
              (unsigned long long)l.relayRecvBytes, l.time());
  for (size_t i = 0; i < plan.transfers.size() && i < maxTransfers; i++) {
    const Transfer& t = plan.transfers[i];
    s += strf("  %d (node %d) -> %d (node %d): %llu B%s\n", t.src, t.srcNode, t.dst, t.dstNode,
              (unsigned long long)t.bytes, t.direct ? ", direct" : "");
    for (const Piece& p : t.pieces)
      s += strf("    [%llu, +%llu) %d -> nic %d -> nic %d -> %d\n", (unsigned long long)p.offset,
                (unsigned long long)p.bytes, p.srcProxy, p.sendNic, p.recvNic, p.dstProxy);
  }
  if (plan.transfers.size() > maxTransfers)
    s += strf("  ... %zu more transfers\n", plan.transfers.size() - maxTransfers);
  return s;
}

}  // namespace zp
