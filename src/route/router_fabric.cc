// The router's FabricBalancer: balanced mode on a full fabric, the send and
// receive sides of every node balanced on their own (see router.cc for the layout).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <utility>

#include "src/route/router_internal.h"

namespace zp {
namespace detail {
namespace {

class FabricBalancer {
 public:
  FabricBalancer(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound)
      : net_(net), p_(p), rts_(rts), bound_(bound) {}

  // Per routed transfer and side (0 send, 1 receive): full chunks by NIC,
  // and the NIC of the tail.
  std::vector<std::vector<std::pair<int, u64>>> chunks[2];
  std::vector<int> tailNic[2];

  void run() {
    size_t T = (size_t)net_.totalNics;
    std::vector<i64> fixed[2] = {std::vector<i64>(T, 0), std::vector<i64>(T, 0)};
    std::vector<std::vector<int>> byNode[2];
    byNode[0].assign((size_t)net_.N, {});
    byNode[1].assign((size_t)net_.N, {});
    for (size_t i = 0; i < rts_.size(); i++) {
      const RT& t = rts_[i];
      if (t.direct) {
        fixed[0][(size_t)net_.g(t.a, t.dSend)] += (i64)t.bytes;
        fixed[1][(size_t)net_.g(t.b, t.dRecv)] += (i64)t.bytes;
      } else {
        byNode[0][(size_t)t.a].push_back((int)i);
        byNode[1][(size_t)t.b].push_back((int)i);
      }
    }
    for (int side = 0; side < 2; side++) {
      chunks[side].assign(rts_.size(), {});
      tailNic[side].assign(rts_.size(), -1);
      for (int n = 0; n < net_.N; n++)
        if (!byNode[side][(size_t)n].empty()) balanceSide(side, n, byNode[side][(size_t)n], fixed[side]);
    }
  }

 private:
  const Net& net_;
  const RouteParams& p_;
  std::vector<RT>& rts_;
  const double bound_;

  // One node's send (side 0) or receive (side 1) side: the chunks of its
  // routed transfers over its owned NICs. Counts per NIC by water-filling
  // (each NIC at most one chunk past the bound where possible); every NIC may
  // then keep its owners' chunks up to the level reached, and the rest fills
  // the others; tails last, largest first.
  void balanceSide(int side, int n, const std::vector<int>& items, const std::vector<i64>& fixed) {
    int K = net_.K[(size_t)n];
    i64 C = (i64)p_.chunkBytes;
    std::vector<int> nics;
    for (int k = 0; k < K; k++)
      if (net_.owned(n, k)) nics.push_back(k);
    size_t m = nics.size();
    std::vector<i64> L((size_t)K);
    std::vector<double> bw((size_t)K), capB((size_t)K);
    for (int k = 0; k < K; k++) {
      L[(size_t)k] = fixed[(size_t)net_.g(n, k)];
      bw[(size_t)k] = net_.bw[(size_t)net_.g(n, k)];
      capB[(size_t)k] = (bound_ * bw[(size_t)k] + (double)C) * (1 + 1e-12);
    }
    auto capCount = [&](int k, i64 base) {
      double room = capB[(size_t)k] - (double)base;
      return room <= 0 ? i64(0) : room >= 4e18 ? (i64)4e18 : (i64)(room / (double)C);
    };
    auto own = [&](int i) { return side ? rts_[(size_t)i].rd : rts_[(size_t)i].rs; };
    std::vector<int> order = items;  // by own NIC, then transfer
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      int ox = own(x), oy = own(y);
      if (ox != oy) return ox < oy;
      return x < y;
    });
    i64 total = 0;
    std::vector<i64> ownChunks((size_t)K, 0);
    for (int i : order) {
      total += (i64)rts_[(size_t)i].nFull;
      int o = own(i);
      if (o >= 0 && net_.owned(n, o)) ownChunks[(size_t)o] += (i64)rts_[(size_t)i].nFull;
    }
    auto fill = [&](const std::vector<i64>& base, const std::vector<i64>& caps, i64 count, std::vector<i64>* cnt) {
      Fill f;
      f.A.resize(m);
      f.u.resize(m);
      f.pen.assign(m, 0);
      f.cap = caps;
      for (size_t i = 0; i < m; i++) {
        int k = nics[i];
        f.A[i] = (double)base[i] / bw[(size_t)k];
        f.u[i] = (double)C / bw[(size_t)k];
      }
      f.B = f.A;
      f.v = f.u;
      f.run(count, cnt);
      return f;
    };
    std::vector<i64> base(m), caps(m), quota;
    for (size_t i = 0; i < m; i++) {
      base[i] = L[(size_t)nics[i]];
      caps[i] = capCount(nics[i], base[i]);
    }
    Fill f = fill(base, caps, total, &quota);
    double level = 0;
    for (size_t i = 0; i < m; i++)
      if (quota[i]) level = std::max(level, f.level(i, (double)quota[i]));
    std::vector<i64> allow(m), keep((size_t)K, 0), extra((size_t)K, 0);
    i64 excess = total;
    for (size_t i = 0; i < m; i++) {
      int k = nics[i];
      allow[i] = std::max(quota[i], std::min(f.take(i, level * (1 + 1e-12), total), caps[i]));
      keep[(size_t)k] = std::min(ownChunks[(size_t)k], allow[i]);
      excess -= keep[(size_t)k];
      base[i] += keep[(size_t)k] * C;
      caps[i] = allow[i] - keep[(size_t)k];
    }
    std::vector<i64> cnt;
    fill(base, caps, excess, &cnt);
    for (size_t i = 0; i < m; i++) extra[(size_t)nics[i]] = cnt[i];
    // Hand out: each item takes its own NIC's kept chunks first, then extras.
    std::vector<i64> keepLeft = keep, extraLeft = extra;
    size_t ei = 0;
    for (int i : order) {
      i64 need = (i64)rts_[(size_t)i].nFull;
      int o = own(i);
      auto& out = chunks[side][(size_t)i];
      if (o >= 0 && o < K && keepLeft[(size_t)o] > 0) {
        i64 x = std::min(need, keepLeft[(size_t)o]);
        out.push_back({o, (u64)x});
        keepLeft[(size_t)o] -= x;
        need -= x;
      }
      while (need > 0 && ei < m) {
        int k = nics[ei];
        i64 x = std::min(need, extraLeft[(size_t)k]);
        if (x) {
          bool merged = false;
          for (auto& c : out)
            if (c.first == k) {
              c.second += (u64)x;
              merged = true;
            }
          if (!merged) out.push_back({k, (u64)x});
          extraLeft[(size_t)k] -= x;
          need -= x;
        }
        if (!extraLeft[(size_t)k]) ei++;
      }
      std::sort(out.begin(), out.end());
    }
    for (int k = 0; k < K; k++) L[(size_t)k] += (keep[(size_t)k] + extra[(size_t)k]) * C;
    // Tails, largest first, where they finish first (relay hops charged),
    // within the caps first.
    std::vector<int> tails;
    for (int i : items)
      if (rts_[(size_t)i].tail) tails.push_back(i);
    std::sort(tails.begin(), tails.end(), [&](int x, int y) {
      u64 tx = rts_[(size_t)x].tail, ty = rts_[(size_t)y].tail;
      if (tx != ty) return tx > ty;
      return x < y;
    });
    for (int i : tails) {
      u64 t = rts_[(size_t)i].tail;
      int best = -1;
      bool bestFits = false;
      double bl = 0;
      for (int k : nics) {
        double l = (double)(L[(size_t)k] + (i64)t) / bw[(size_t)k] +
                   p_.shmCost * (k != own(i)) * (double)t / bw[(size_t)k];
        bool ok = (double)(L[(size_t)k] + (i64)t) <= capB[(size_t)k];
        if (best < 0 || (ok && !bestFits) || (ok == bestFits && l < bl)) {
          bl = l;
          best = k;
          bestFits = ok;
        }
      }
      tailNic[side][(size_t)i] = best;
      L[(size_t)best] += (i64)t;
    }
  }
};

}  // namespace

FabricChunks balanceFabric(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound) {
  FabricBalancer fb(net, p, rts, bound);
  fb.run();
  FabricChunks out;
  for (int side = 0; side < 2; side++) {
    out.chunks[side] = std::move(fb.chunks[side]);
    out.tailNic[side] = std::move(fb.tailNic[side]);
  }
  return out;
}

}  // namespace detail
}  // namespace zp
