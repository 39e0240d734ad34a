// The router's assembly: proxies, a transfer's pieces from its segments,
// every mode's pieces from its choices, then loads and cost (see router.cc).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <utility>

#include "src/route/router_internal.h"

namespace zp {
namespace detail {
namespace {

// The proxy of rank self's traffic on NIC nic of node: self if it owns it,
// else the owner with the least shared-memory load (lowest local rank on ties).
int pickProxy(const Net& net, int node, int nic, int self, const std::vector<u64>& load) {
  if (net.node(self) == node && net.nic(self) == nic) return self;
  const std::vector<int>& o = net.owners[(size_t)net.g(node, nic)];
  int best = -1;
  for (int r : o)
    if (best < 0 || load[(size_t)r] < load[(size_t)best]) best = r;
  return best;
}

// The proxy of self's bytes on NIC nic of node (pickProxy), with the bytes
// it relays for self (none if it is self) counted in shmLoad.
int relayThrough(const Net& net, int node, int nic, int self, u64 bytes, std::vector<u64>* shmLoad) {
  const int proxy = pickProxy(net, node, nic, self, *shmLoad);
  if (proxy != self) (*shmLoad)[(size_t)proxy] += bytes;
  return proxy;
}

// The one segment of a transfer on its direct path.
Seg directSeg(const RT& r) {
  return Seg{r.dSend, r.dRecv, r.src, r.dst, r.nFull, r.tail != 0};
}

// Every mode's loop over the transfers: a direct transfer is its one
// direct segment; the others' segments come from relayed(i, r, &segs),
// the mode's own choice; then the transfer's pieces from its segments.
template <class Relayed>
void assembleEach(const RouteParams& params, const std::vector<RT>& rts, RoutePlan* plan, Relayed relayed) {
  const u64 C = params.chunkBytes;
  for (size_t i = 0; i < rts.size(); i++) {
    const RT& r = rts[i];
    std::vector<Seg> segs;
    if (r.direct) {
      segs.push_back(directSeg(r));
    } else {
      relayed(i, r, &segs);
    }
    addPieces(&plan->transfers[i], segs, C);
  }
}

// A side's chunks by NIC, with the tail's NIC (tailNic, -1: no tail) among
// them, with no full chunk if it carries none.
void addTailNic(std::vector<std::pair<int, u64>>* chunks, int tailNic) {
  if (tailNic >= 0 &&
      std::none_of(chunks->begin(), chunks->end(), [&](const std::pair<int, u64>& x) { return x.first == tailNic; }))
    chunks->push_back({tailNic, 0});
}

}  // namespace

void addPieces(Transfer* t, std::vector<Seg> segs, u64 C) {
  // The segment with the tail goes last, so that only the final piece is short.
  std::stable_sort(segs.begin(), segs.end(), [](const Seg& x, const Seg& y) { return !x.tail && y.tail; });
  u64 off = 0;
  for (const Seg& s : segs) {
    u64 bytes = s.chunks * C + (s.tail ? t->bytes % C : 0);
    if (!bytes) continue;
    Piece p;
    p.offset = off;
    p.bytes = bytes;
    p.srcProxy = s.srcProxy;
    p.sendNic = s.sendNic;
    p.dstProxy = s.dstProxy;
    p.recvNic = s.recvNic;
    if (!t->pieces.empty()) {
      Piece& q = t->pieces.back();
      if (q.srcProxy == p.srcProxy && q.sendNic == p.sendNic && q.dstProxy == p.dstProxy &&
          q.recvNic == p.recvNic) {
        q.bytes += p.bytes;
        off += bytes;
        continue;
      }
    }
    t->pieces.push_back(p);
    off += bytes;
  }
}

RoutePlan startPlan(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                    const std::vector<u64>& rankShm, u64 intra, double bound) {
  RoutePlan plan;
  plan.params = params;
  plan.nicBase = net.nicBase;
  plan.rankShmBytes = rankShm;
  plan.intraNodeBytes = intra;
  plan.rankRelayBytes.assign((size_t)net.nranks, 0);
  plan.lowerBound = bound;
  plan.transfers.resize(rts.size());
  for (size_t i = 0; i < rts.size(); i++) {
    Transfer& t = plan.transfers[i];
    t.src = rts[i].src;
    t.dst = rts[i].dst;
    t.srcNode = rts[i].a;
    t.dstNode = rts[i].b;
    t.bytes = rts[i].bytes;
    t.direct = rts[i].direct;
    plan.interNodeBytes += t.bytes;
  }
  return plan;
}

void assembleRailBalanced(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                          const RailChunks& rb, std::vector<u64>* shmLoad, RoutePlan* plan) {
  const u64 C = params.chunkBytes;
  assembleEach(params, rts, plan, [&](size_t i, const RT& r, std::vector<Seg>* segs) {
    std::vector<std::pair<int, u64>> rc(rb.chunks.begin() + rb.chunkBegin[i], rb.chunks.begin() + rb.chunkEnd[i]);
    int tr = r.tail ? rb.tailRail[i] : -1;
    addTailNic(&rc, tr);
    for (const auto& x : rc) {
      u64 bytes = x.second * C + (x.first == tr ? r.tail : 0);
      int sp = relayThrough(net, r.a, x.first, r.src, bytes, shmLoad);
      int dp = relayThrough(net, r.b, x.first, r.dst, bytes, shmLoad);
      segs->push_back({x.first, x.first, sp, dp, x.second, x.first == tr});
    }
  });
}

void assembleFabricBalanced(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                            const FabricChunks& fb, std::vector<u64>* shmLoad, RoutePlan* plan) {
  const u64 C = params.chunkBytes;
  assembleEach(params, rts, plan, [&](size_t i, const RT& r, std::vector<Seg>* segs) {
    // Each side's runs of full chunks (NIC, proxy, chunks), and its tail's
    // NIC and proxy; the two sides are zipped chunk by chunk.
    struct Run {
      int nic, proxy;
      u64 chunks;
    };
    std::vector<Run> runs[2];
    int tailNic[2] = {-1, -1}, tailProxy[2] = {-1, -1};
    for (int side = 0; side < 2; side++) {
      auto c = fb.chunks[side][i];
      int tn = r.tail ? fb.tailNic[side][i] : -1;
      addTailNic(&c, tn);
      std::stable_sort(c.begin(), c.end(), [&](const std::pair<int, u64>& x, const std::pair<int, u64>& y) {
        return x.first != tn && y.first == tn;
      });
      int node = side ? r.b : r.a, self = side ? r.dst : r.src;
      for (const auto& x : c) {
        u64 bytes = x.second * C + (x.first == tn ? r.tail : 0);
        int px = relayThrough(net, node, x.first, self, bytes, shmLoad);
        if (x.second) runs[side].push_back({x.first, px, x.second});
        if (x.first == tn) {
          tailNic[side] = tn;
          tailProxy[side] = px;
        }
      }
    }
    size_t si = 0, ri = 0;
    u64 sl = runs[0].empty() ? 0 : runs[0][0].chunks, rl = runs[1].empty() ? 0 : runs[1][0].chunks;
    while (si < runs[0].size() && ri < runs[1].size()) {
      u64 x = std::min(sl, rl);
      segs->push_back({runs[0][si].nic, runs[1][ri].nic, runs[0][si].proxy, runs[1][ri].proxy, x, false});
      sl -= x;
      rl -= x;
      if (!sl && ++si < runs[0].size()) sl = runs[0][si].chunks;
      if (!rl && ++ri < runs[1].size()) rl = runs[1][ri].chunks;
    }
    if (r.tail) segs->push_back({tailNic[0], tailNic[1], tailProxy[0], tailProxy[1], 0, true});
  });
}

void assembleUnbalanced(const Net& net, const RouteParams& params, const std::vector<RT>& rts,
                        std::vector<u64>* shmLoad, RoutePlan* plan) {
  assembleEach(params, rts, plan, [&](size_t i, const RT& r, std::vector<Seg>* segs) {
    if (params.railOnly) {  // rail mode
      int k;
      if (r.rd >= 0 && r.rd < net.K[(size_t)r.a] && net.owned(r.a, r.rd) && net.owned(r.b, r.rd)) {
        k = r.rd;
      } else if (r.rd >= 0 && r.rd < net.K[(size_t)r.a] && r.hasDirect) {
        k = -1;  // no owner of d's rail on node a: the direct path
      } else if (r.rs >= 0 && net.usable(r.a, r.b, r.rs)) {
        k = r.rs;
      } else {
        k = 0;
        while (!net.usable(r.a, r.b, k)) k++;  // classify saw one
      }
      if (k < 0) {
        segs->push_back(directSeg(r));
        plan->transfers[i].direct = true;
      } else {
        int sp = relayThrough(net, r.a, k, r.src, r.bytes, shmLoad);
        int dp = relayThrough(net, r.b, k, r.dst, r.bytes, shmLoad);
        segs->push_back({k, k, sp, dp, r.nFull, r.tail != 0});
      }
    } else {  // rail mode, full fabric
      int sk = r.rd, rk = r.rd;
      if (!(sk >= 0 && net.owned(r.a, sk))) {
        sk = r.rs >= 0 ? r.rs : -1;
        for (int k = 0; sk < 0 && k < net.K[(size_t)r.a]; k++)
          if (net.owned(r.a, k)) sk = k;
      }
      if (rk < 0)
        for (int k = 0; rk < 0 && k < net.K[(size_t)r.b]; k++)
          if (net.owned(r.b, k)) rk = k;
      int sp = relayThrough(net, r.a, sk, r.src, r.bytes, shmLoad);
      int dp = relayThrough(net, r.b, rk, r.dst, r.bytes, shmLoad);
      segs->push_back({sk, rk, sp, dp, r.nFull, r.tail != 0});
    }
  });
}

void addLoadsAndCost(const Net& net, const RouteParams& params, RoutePlan* plan) {
  plan->loads.resize((size_t)net.totalNics);
  for (int n = 0; n < net.N; n++)
    for (int k = 0; k < net.K[(size_t)n]; k++) {
      size_t gi = (size_t)net.g(n, k);
      NicLoad& l = plan->loads[gi];
      l.node = n;
      l.nic = k;
      l.bytesPerSec = net.bw[gi];
      l.rateKnown = net.known[gi];
      l.owners = (int)net.owners[gi].size();
    }
  for (const Transfer& t : plan->transfers)
    for (const Piece& p : t.pieces) {
      NicLoad& s = plan->loads[(size_t)net.g(t.srcNode, p.sendNic)];
      NicLoad& d = plan->loads[(size_t)net.g(t.dstNode, p.recvNic)];
      s.sendBytes += p.bytes;
      d.recvBytes += p.bytes;
      if (p.srcProxy != t.src) {
        s.relaySendBytes += p.bytes;
        plan->rankRelayBytes[(size_t)p.srcProxy] += p.bytes;
        plan->relayedBytes += p.bytes;
      }
      if (p.dstProxy != t.dst) {
        d.relayRecvBytes += p.bytes;
        plan->rankRelayBytes[(size_t)p.dstProxy] += p.bytes;
        plan->relayedBytes += p.bytes;
      }
    }
  for (NicLoad& l : plan->loads) {
    l.sendTime = (double)l.sendBytes / l.bytesPerSec;
    l.recvTime = (double)l.recvBytes / l.bytesPerSec;
    plan->maxNicTime = std::max(plan->maxNicTime, l.time());
  }
  double shm = 0;
  for (int r = 0; r < net.nranks; r++)
    shm = std::max(shm, (double)(plan->rankRelayBytes[(size_t)r] + plan->rankShmBytes[(size_t)r]) / net.rankBw(r));
  plan->shmTime = params.shmCost * shm;
  plan->cost = plan->maxNicTime + plan->shmTime;
}

}  // namespace detail
}  // namespace zp
